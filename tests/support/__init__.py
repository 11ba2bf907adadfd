"""Real servers and fresh databases, for the tests and the benches alike.

Everything here runs the real thing: uvicorn on a loopback port (in a thread: fast; or a
``curvecast serve`` subprocess: killable), and empty PostgreSQL databases on the shared server.
No pytest here: the tests' fixtures and the benches both build on these functions.

Also in this package: :mod:`~tests.support.pgcluster` (a private PostgreSQL cluster
that may be stopped), :mod:`~tests.support.tables` (what the tables hold, read
straight) and :mod:`~tests.support.synthetic` (a synthetic ScheduleFree+ run).
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import uvicorn
from fastapi import FastAPI

from curvecast.service.app import create_app
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.http_guard import protocol_for
from curvecast.service.schemas import TokenScope
from curvecast.service.store import tokens

__all__ = [
    "PG_ADMIN_URL",
    "PostgresUnavailable",
    "ServerProcess",
    "create_pg_database",
    "create_token",
    "drop_pg_database",
    "free_port",
    "serve_app",
    "start_server_process",
    "thread_server",
    "wait_for",
    "wait_until_healthy",
]

#: The shared PostgreSQL server's maintenance database, where fresh databases are created.
PG_ADMIN_URL = os.environ.get(
    "CURVECAST_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
# Health probes go straight to the loopback server, never through a proxy from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(
    condition: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "condition",
    *,
    every: float = 0.05,
    retry_on: tuple[type[Exception], ...] = (),
) -> Any:
    """Poll ``condition`` until it returns something truthy, and return that (synchronisation
    on state with a deadline, never a fixed sleep).

    Args:
        condition: the check; an exception of a type in ``retry_on`` counts as "not yet" (a
            server that is restarting), any other propagates.
        timeout: seconds before giving up.
        what: what is awaited, for the error message.
        every: seconds between checks.

    Raises:
        TimeoutError: not truthy within ``timeout``; says the last value (or error) seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        last_error: Exception | None = None
        try:
            value = condition()
        except retry_on as exc:
            value, last_error = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s (last: {value!r}, {last_error})")
        time.sleep(every)


def wait_until_healthy(
    url: str, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Poll ``/healthz`` until it answers 200 (a readiness condition, not a fixed sleep).

    Raises:
        RuntimeError: ``proc`` exited first.
        TimeoutError: no 200 within ``timeout`` seconds.
    """

    def healthy() -> bool:
        # A RuntimeError is not retried: a server that exited will not become healthy.
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before becoming healthy")
        with _DIRECT.open(f"{url}/healthz", timeout=1.0) as resp:
            return bool(resp.status == 200)

    # OSError / HTTPException: not listening yet, or not ready (503).
    wait_for(healthy, timeout, f"{url} to become healthy",
             retry_on=(OSError, http.client.HTTPException))


@contextmanager
def serve_app(app: FastAPI, port: int = 0) -> Iterator[str]:
    """Run ``app`` under uvicorn on a loopback port (``0``: a free one) in a background thread,
    with the request-head and connection limits of its settings, as ``curvecast serve``;
    yields its base URL once it is healthy."""
    # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on sockets it can tell are TCP,
    # and without it every small test request waits out a delayed ACK (~40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    # A given port may have just been used by a stopped server of the same test.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                           http=protocol_for(app.state.settings)))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextmanager
def thread_server(settings: Settings, port: int = 0) -> Iterator[str]:
    """Run the real app for ``settings`` on a loopback port in a background thread."""
    with serve_app(create_app(settings), port) as url:
        yield url


@dataclass
class ServerProcess:
    """A ``curvecast serve`` subprocess, its URL and where its output goes."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers run, like a crash."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Graceful stop (SIGTERM), a kill if that takes longer than 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        """What the server printed."""
        return self.log_path.read_text(errors="replace")


def start_server_process(
    database_url: str,
    log_dir: Path,
    *,
    port: int | None = None,
    env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
    healthy_within: float = 90.0,
) -> ServerProcess:
    """Start ``curvecast serve`` on a loopback port and wait until it is healthy.

    Args:
        database_url: the (migrated) database it serves.
        log_dir: where its output is written (``server-<port>-<n>.log``).
        port: the port (default: a free one).
        env: environment variables added to this process's.
        extra_args: more ``curvecast serve`` arguments.
        healthy_within: seconds it may take to answer ``/healthz`` (several processes start
            slower on a busy machine).

    Raises:
        RuntimeError: it did not become healthy; the message holds its output.
    """
    port = port or free_port()
    log_path = log_dir / f"server-{port}-{time.monotonic_ns()}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [
        sys.executable,
        "-m",
        "curvecast.service.cli",
        "serve",
        "--port",
        str(port),
        "--database-url",
        database_url,
        *(extra_args or []),
    ]
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(cmd, env=full_env, stdout=log_file, stderr=subprocess.STDOUT)
    server = ServerProcess(url=f"http://127.0.0.1:{port}", port=port, proc=proc, log_path=log_path)
    try:
        wait_until_healthy(server.url, timeout=healthy_within, proc=proc)
    except Exception:
        server.stop()
        raise RuntimeError(f"server failed to start:\n{server.log()}") from None
    return server


class PostgresUnavailable(RuntimeError):
    """The shared PostgreSQL server (:data:`PG_ADMIN_URL`) cannot be reached."""


def create_pg_database() -> str:
    """Create an empty (unmigrated), uniquely named database; returns its URL.

    Raises:
        PostgresUnavailable: the server cannot be reached.
    """
    name = f"curvecast_test_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        raise PostgresUnavailable(f"cannot connect to {PG_ADMIN_URL}: {exc}") from exc
    return f"{PG_ADMIN_URL.rpartition('/')[0]}/{name}"


def drop_pg_database(url: str) -> None:
    """Drop a database created by :func:`create_pg_database` (connections are closed)."""
    name = url.rpartition("/")[2]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create_token(database_url: str, project: str, scope: TokenScope, name: str = "test") -> str:
    """A new API token (the secret) for ``project`` with ``scope``, written straight into the
    database at ``database_url`` (as ``curvecast token create`` would)."""
    engine = make_engine(Settings(database_url=database_url))
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            return tokens.create_token(session, project=project, scope=scope, name=name).token
    finally:
        engine.dispose()
