"""Shared fixtures: real databases (a SQLite file and a fresh PostgreSQL database) and real
uvicorn servers on loopback ports.

Under ``CI=true`` PostgreSQL must be reachable: tests that need it fail instead of skipping.
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from curvecast.service.config import Settings
from curvecast.service.migrate import upgrade
from tests import support as testing
from tests.support import drop_pg_database, thread_server

__all__ = ["IN_CI", "create_pg_database", "drop_pg_database", "require"]

IN_CI = os.environ.get("CI", "").lower() == "true"
# The tests' webhook receivers listen on loopback, which webhooks may not reach by default
# (SSRF filter): every server the tests start, in this process or a child, allows it. The
# filter's own tests pass webhook_allow_private=False explicitly.
os.environ.setdefault("CURVECAST_WEBHOOK_ALLOW_PRIVATE", "true")
# Webhook secrets are sealed at rest; a PostgreSQL deployment needs a key for them (the tests
# of a missing key pass secret_key=None explicitly).
os.environ.setdefault("CURVECAST_SECRET_KEY", "test-only-secret-key-0123456789abcdef")
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


def require(module: str) -> ModuleType:
    """Import an optional library (an extra's: optuna, a framework); skip when it is missing,
    except under CI=true (the dev extra installs it, so missing there is a failure)."""
    if IN_CI:
        return importlib.import_module(module)
    return pytest.importorskip(module)


def create_pg_database() -> str:
    """An empty, uniquely named PostgreSQL database; its URL. Skips the test when PostgreSQL is
    unreachable, and fails it under ``CI=true``."""
    try:
        return testing.create_pg_database()
    except testing.PostgresUnavailable as exc:
        if IN_CI:
            pytest.fail(f"PostgreSQL is required under CI=true but {exc}", pytrace=False)
        pytest.skip(f"PostgreSQL not available: {exc}")


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
