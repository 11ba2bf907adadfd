"""Shared fixtures: real databases (a SQLite file and a fresh PostgreSQL database) and real
uvicorn servers on loopback ports.

Under ``CI=true`` PostgreSQL must be reachable: tests that need it fail instead of skipping.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from curvecast.service.config import Settings
from curvecast.service.migrate import upgrade
from tests._servers import thread_server

IN_CI = os.environ.get("CI", "").lower() == "true"
PG_ADMIN_URL = os.environ.get(
    "CURVECAST_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


def _pg_unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"PostgreSQL is required under CI=true but {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL not available: {reason}")


def _with_db(url: str, dbname: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{dbname}"


def create_pg_database() -> str:
    """Create an empty uniquely named database; returns its URL."""
    name = f"curvecast_test_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        _pg_unavailable(f"cannot connect to {PG_ADMIN_URL}: {exc}")
    return _with_db(PG_ADMIN_URL, name)


def drop_pg_database(url: str) -> None:
    """Drop a database created by :func:`create_pg_database`."""
    name = url.rpartition("/")[2]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def fresh_pg_url() -> Iterator[str]:
    """An empty (unmigrated) PostgreSQL database for one test."""
    url = create_pg_database()
    yield url
    drop_pg_database(url)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A migrated PostgreSQL database shared by the session (tests use fresh run ids)."""
    url = create_pg_database()
    upgrade(url)
    yield url
    drop_pg_database(url)


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated SQLite file shared by the session."""
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'curvecast.db'}"
    upgrade(url)
    return url


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each test using this runs on both backends."""
    return str(request.getfixturevalue(f"{'pg' if request.param == 'postgres' else 'sqlite'}_url"))


@pytest.fixture(scope="session")
def server(database_url: str) -> Iterator[str]:
    """A real uvicorn server (auth off, loopback) on each backend; yields its base URL."""
    settings = Settings(database_url=database_url, worker_enabled=False)
    with thread_server(settings) as url:
        yield url


@pytest.fixture
def project() -> str:
    """A project name unique to the test, so tests sharing a database never collide."""
    return f"p-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests leave files worth looking at (screenshots, logs)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
