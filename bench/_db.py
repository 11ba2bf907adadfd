"""Throwaway databases for benchmarks: a migrated SQLite file or PostgreSQL database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from curvecast.service.migrate import upgrade
from tests.support import create_pg_database, drop_pg_database


@contextmanager
def fresh_database(backend: str, workdir: Path) -> Iterator[str]:
    """A migrated, empty database of ``backend`` ("sqlite" or "postgres"); yields its URL and
    removes it afterwards."""
    if backend == "sqlite":
        path = workdir / f"bench-{uuid.uuid4().hex[:8]}.db"
        url = f"sqlite:///{path}"
        upgrade(url)
        try:
            yield url
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        return
    url = create_pg_database()
    try:
        upgrade(url)
        yield url
    finally:
        drop_pg_database(url)
