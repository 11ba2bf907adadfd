"""Fixtures of the importers' tests: a migrated database per backend, and how to read back
every stored point of a run."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.import_cli import main as import_main
from curvecast.service.migrate import upgrade
from curvecast.service.store.export import ExportReader, export_series
from curvecast.service.store.runs import get_run
from tests.conftest import create_pg_database, drop_pg_database

Points = dict[str, list[tuple[int, float, float | None]]]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated database of each backend, for one test."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'imports.db'}"
        upgrade(url)
        yield url
        return
    url = create_pg_database()
    upgrade(url)
    yield url
    drop_pg_database(url)


def stored(database_url: str, run_id: uuid.UUID) -> tuple[Any, Points]:
    """The run (as the REST API answers it) and every point of every series:
    ``{key: [(step, value, wall_time), ...]}`` in step order."""
    engine = make_engine(Settings(database_url=database_url))
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            run = get_run(session, run_id=run_id, allowed_project=None)
            points: Points = {}
            reader = ExportReader(export_series(session, run_id=run_id, keys=None,
                                                allowed_project=None))
            while page := reader.next_page(session):
                for key, step, value, wall in page:
                    points.setdefault(key, []).append((step, value, wall))
            return run, points
    finally:
        engine.dispose()


def run_import(*argv: str) -> int:
    """``curvecast import ARGV...`` in this process (no progress bar)."""
    return import_main([*argv, "--no-progress"])


def same_value(a: float, b: float) -> bool:
    """Equal, NaN equal to NaN."""
    return (math.isnan(a) and math.isnan(b)) or a == b
