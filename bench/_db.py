"""Throwaway databases for benchmarks: a migrated SQLite file or PostgreSQL database."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.migrate import upgrade
from curvecast.service.schemas import TokenScope
from curvecast.service.store import tokens

PG_ADMIN = os.environ.get("CURVECAST_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


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
    name = f"curvecast_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{PG_ADMIN.rpartition('/')[0]}/{name}"
    try:
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create_token(database_url: str, project: str, scope: TokenScope) -> str:
    """A new API token (the secret) for ``project`` with ``scope``."""
    engine = make_engine(Settings(database_url=database_url))
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            return tokens.create_token(session, project=project, scope=scope, name="bench").token
    finally:
        engine.dispose()
