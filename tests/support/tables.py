"""What the tables hold, read straight from the database (not through the API).

Tests and benches use these to check what was really stored: every row of a run, its counters,
and its rollups, whatever the service answered.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import create_engine, text

from curvecast.service.config import Settings
from curvecast.service.store.rollups import ROLLUP_WIDTHS

__all__ = ["KeyCount", "db_counts", "db_points", "db_run_totals"]

_COUNTS = text(
    "SELECT s.key, count(*), count(DISTINCT p.step), min(p.step), max(p.step)"
    " FROM series s JOIN metric_points p ON p.series_id = s.id"
    " WHERE s.run_id = :run GROUP BY s.key"
)
_POINTS = text(
    "SELECT s.key, p.step, p.value FROM series s JOIN metric_points p ON p.series_id = s.id"
    " WHERE s.run_id = :run ORDER BY s.key, p.step"
)
_ROLLUP_TOTAL = text(
    "SELECT coalesce(sum(r.n), 0) FROM metric_rollups r JOIN series s ON s.id = r.series_id"
    f" WHERE s.run_id = :run AND r.level = {len(ROLLUP_WIDTHS) - 1}"
)


@dataclass(frozen=True)
class KeyCount:
    """What the database holds for one (run, key)."""

    rows: int
    distinct_steps: int
    first: int
    last: int


def _engine(database_url: str) -> Any:
    return create_engine(Settings(database_url=database_url).database_url)


def _run_param(database_url: str, run_id: str) -> Any:
    # SQLite stores UUIDs as 32 hex characters, PostgreSQL as uuid.
    return uuid.UUID(run_id).hex if database_url.startswith("sqlite") else uuid.UUID(run_id)


def db_counts(database_url: str, run_id: str) -> dict[str, KeyCount]:
    """Rows per metric key of a run, read straight from ``metric_points`` (not the API)."""
    engine = _engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(_COUNTS, {"run": _run_param(database_url, run_id)}).all()
    finally:
        engine.dispose()
    return {str(k): KeyCount(int(n), int(d), int(lo), int(hi)) for k, n, d, lo, hi in rows}


def db_points(database_url: str, run_id: str) -> dict[str, dict[int, float | None]]:
    """Every stored point of a run: key -> step -> value (NULL is NaN)."""
    engine = _engine(database_url)
    out: dict[str, dict[int, float | None]] = {}
    try:
        with engine.connect() as conn:
            for key, step, value in conn.execute(
                _POINTS, {"run": _run_param(database_url, run_id)}
            ):
                out.setdefault(str(key), {})[int(step)] = value
    finally:
        engine.dispose()
    return out


def db_run_totals(database_url: str, run_id: str) -> tuple[int, int]:
    """(``runs.n_points``, points counted by the coarsest rollup level) of a run: both must
    equal the rows stored, or a duplicate was counted."""
    engine = _engine(database_url)
    param = _run_param(database_url, run_id)
    try:
        with engine.connect() as conn:
            n_points = conn.execute(
                text("SELECT n_points FROM runs WHERE id = :run"), {"run": param}
            ).scalar_one()
            rollup = conn.execute(_ROLLUP_TOTAL, {"run": param}).scalar_one()
    finally:
        engine.dispose()
    return int(n_points), int(rollup)
