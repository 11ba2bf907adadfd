"""Fixtures of the client tests: one real uvicorn server on the session's SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from curvecast.service.config import Settings
from tests.support import thread_server


@pytest.fixture(scope="session")
def sqlite_server(sqlite_url: str) -> Iterator[str]:
    """A real server (auth off, loopback) on the session's SQLite database; yields its URL."""
    with thread_server(Settings(database_url=sqlite_url, worker_enabled=False)) as url:
        yield url


@pytest.fixture
def spool_dir(tmp_path: Path) -> Path:
    """A fresh spool root for one test."""
    return tmp_path / "spool"
