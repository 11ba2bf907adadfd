"""A private, throwaway PostgreSQL cluster that a test or a bench may stop and start at will.

The shared server on 127.0.0.1:5432 serves every other test and must never be stopped; outage
tests create their own cluster in a temporary directory, on a free port, owned by the
``postgres`` OS user when running as root (``initdb`` refuses to run as root), and remove it
afterwards.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.support import free_port

__all__ = ["PrivateCluster", "find_bindir"]


def find_bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` live (``$CURVECAST_PG_BINDIR``, the Debian layout, or
    ``PATH``), or None."""
    candidates = [os.environ.get("CURVECAST_PG_BINDIR", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    which = shutil.which("initdb")
    if which:
        candidates.append(str(Path(which).parent))
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


class PrivateCluster:
    """``initdb`` + ``pg_ctl`` in a temporary directory. Use :meth:`create`, then
    :meth:`start` / :meth:`stop` as often as needed, and :meth:`destroy` at the end."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="curvecast-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0

    @property
    def admin_url(self) -> str:
        """The URL of the cluster's maintenance database."""
        return self.url("postgres")

    def url(self, dbname: str) -> str:
        """The URL of database ``dbname`` of this cluster."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _run(self, *args: str, timeout: float = 120) -> None:
        # initdb and pg_ctl refuse to run as root: run them as the postgres OS user there.
        prefix = ["runuser", "-u", "postgres", "--"] if self._as_postgres else []
        proc = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stderr}\n{log}")

    def create(self) -> PrivateCluster:
        """Initialise the cluster (trust auth, no fsync: a throwaway for tests) and start it."""
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
            "--no-sync", "-E", "UTF8",
        )
        self.start()
        return self

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off"
        )
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.log),
            "-w", "-t", "60", "start",
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.admin_url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnect clients, clean shutdown)."""
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"
        )

    def running(self) -> bool:
        """Whether the server runs (its pid file exists)."""
        return (self.data / "postmaster.pid").exists()

    def create_database(self, name: str) -> str:
        """Create database ``name``; returns its URL."""
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        """Stop the server if it runs and delete everything."""
        try:
            if self.running():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
