"""Metric points: bulk, idempotent ingest and (downsampled) reads.

Ingest is set-based, inside one transaction — a batch is stored whole or not at all. On
PostgreSQL the points go in with one binary ``COPY`` (new points are the common case); only when
that hits a stored point do they go through a temporary staging table merged with ``INSERT ...
ON CONFLICT DO NOTHING``. On SQLite, one ``executemany`` of the points not stored yet. The run's
row is updated first, which takes its row lock: concurrent batches for the same run are
serialised (no deadlocks between overlapping batches), batches for different runs run in
parallel.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import case, select, text, update
from sqlalchemy.orm import Session

from curvecast.contract import MAX_STEP
from curvecast.service.errors import ReadTooLarge, RunNotFound
from curvecast.service.models import MetricPoint, Project, Run, Series
from curvecast.service.schemas import IngestResult, MetricBatch, MetricsOut, SeriesOut
from curvecast.service.store._common import insert_ignore, is_postgres, utcnow, write_connection
from curvecast.service.store._pgcopy import encode_rows
from curvecast.service.store.rollups import Buckets, choose_level, read_buckets, update_rollups
from curvecast.service.store.runs import revive_values

_COPY_POINTS = "COPY metric_points (series_id, step, value, wall_time) FROM STDIN (FORMAT BINARY)"
_STAGING = (
    "CREATE TEMP TABLE IF NOT EXISTS curvecast_ingest (series_id integer, step bigint,"
    " value double precision, wall_time double precision) ON COMMIT DELETE ROWS"
)
_COPY_STAGING = "COPY curvecast_ingest FROM STDIN (FORMAT BINARY)"
_MERGE_STAGING = (
    "INSERT INTO metric_points (series_id, step, value, wall_time)"
    " SELECT series_id, step, value, wall_time FROM curvecast_ingest ORDER BY series_id, step"
    " ON CONFLICT DO NOTHING RETURNING series_id, step"
)
_EXISTING_SQL = text(
    "SELECT step FROM metric_points WHERE series_id = :sid AND step >= :lo AND step <= :hi"
)
_SQLITE_INSERT = (
    "INSERT INTO metric_points (series_id, step, value, wall_time) VALUES (?, ?, ?, ?) "
    "ON CONFLICT DO NOTHING"
)


@dataclass(frozen=True)
class _Columns:
    """A batch flattened to parallel arrays, sorted by (series, step), without repeats.

    ``value`` NaN is stored as NULL (see models.MetricPoint); ``wall`` is None when the batch
    has no wall times, else NaN marks a missing one.
    """

    series_id: np.ndarray
    step: np.ndarray
    value: np.ndarray
    wall: np.ndarray | None
    n_sent: int  # points in the request, counting repeats within it

    def rows(self, mask: np.ndarray) -> list[tuple[int, int, float | None, float | None]]:
        """Python rows of the masked points for DB-API ``executemany`` (NaN → None)."""
        wall = self.wall if self.wall is not None else np.full(len(self.step), np.nan)
        return list(
            zip(
                self.series_id[mask].tolist(),
                self.step[mask].tolist(),
                _nan_to_none(self.value[mask]),
                _nan_to_none(wall[mask]),
                strict=True,
            )
        )


def _column_to_array(column: Sequence[float | str | None]) -> tuple[np.ndarray, np.ndarray]:
    """Values as float64 (strings "NaN"/"Infinity" parsed) and a mask of measured entries."""
    present = np.fromiter((v is not None for v in column), dtype=bool, count=len(column))
    if present.all():
        return np.asarray(column, dtype=np.float64), present
    filled = [0.0 if v is None else v for v in column]
    return np.asarray(filled, dtype=np.float64), present


def _flatten(batch: MetricBatch, series_ids: dict[str, int]) -> _Columns:
    steps = np.asarray(batch.steps, dtype=np.int64)
    wall = (
        np.asarray([math.nan if w is None else w for w in batch.wall_time], dtype=np.float64)
        if batch.wall_time is not None
        else None
    )
    sid_parts, step_parts, value_parts, wall_parts = [], [], [], []
    for key, column in batch.values.items():
        values, present = _column_to_array(column)
        sid_parts.append(np.full(int(present.sum()), series_ids[key], dtype=np.int64))
        step_parts.append(steps[present])
        value_parts.append(values[present])
        if wall is not None:
            wall_parts.append(wall[present])
    sid = np.concatenate(sid_parts)
    step = np.concatenate(step_parts)
    # Stable sort, then drop repeats of a (series, step) within the batch: the first
    # occurrence wins, exactly like a point that was already stored.
    order = np.lexsort((step, sid))
    sid, step = sid[order], step[order]
    keep = np.ones(len(step), dtype=bool)
    keep[1:] = (sid[1:] != sid[:-1]) | (step[1:] != step[:-1])
    return _Columns(
        series_id=sid[keep],
        step=step[keep],
        value=np.concatenate(value_parts)[order][keep],
        wall=np.concatenate(wall_parts)[order][keep] if wall is not None else None,
        n_sent=len(order),
    )


def _nan_to_none(values: np.ndarray) -> list[float | None]:
    out: list[float | None] = values.tolist()
    for index in np.flatnonzero(np.isnan(values)).tolist():
        out[index] = None
    return out


def _insert_postgres(dbapi: Any, cols: _Columns) -> np.ndarray:
    """Optimistic binary COPY straight into the table; on a duplicate, fall back to a staging
    table merged with ``ON CONFLICT DO NOTHING``. Returns the mask of points that were new.

    New points are the common case (a client sends each point once; duplicates come from
    retries), and COPY is the fastest way into PostgreSQL. The savepoint keeps the surrounding
    transaction (the run's row lock, the series rows) intact when the optimistic path fails.
    """
    import psycopg

    payload = encode_rows(cols.series_id, cols.step, cols.value, cols.wall)
    with dbapi.cursor() as cur:
        cur.execute("SAVEPOINT curvecast_copy")
        try:
            with cur.copy(_COPY_POINTS) as copy:
                copy.write(payload)
        except psycopg.errors.UniqueViolation:
            cur.execute("ROLLBACK TO SAVEPOINT curvecast_copy")
        else:
            cur.execute("RELEASE SAVEPOINT curvecast_copy")
            return np.ones(len(cols.step), dtype=bool)
        cur.execute(_STAGING)
        with cur.copy(_COPY_STAGING) as copy:
            copy.write(payload)
        cur.execute(_MERGE_STAGING)
        inserted = np.array(cur.fetchall(), dtype=np.int64).reshape(-1, 2)
    return _member_mask(cols, inserted[:, 0], inserted[:, 1])


def _member_mask(cols: _Columns, sid: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Mask of the batch's points whose (series, step) is among the given pairs."""
    pairs = set(zip(sid.tolist(), step.tolist(), strict=True))
    batch = zip(cols.series_id.tolist(), cols.step.tolist(), strict=True)
    return np.fromiter((pair in pairs for pair in batch), dtype=bool, count=len(cols.step))


def _insert_sqlite(session: Session, dbapi: Any, cols: _Columns) -> np.ndarray:
    """Insert the points not stored yet; returns the mask of those that were new.

    The write transaction (BEGIN IMMEDIATE) excludes other writers, so the points found
    missing here are exactly the ones the insert adds.
    """
    new = np.ones(len(cols.step), dtype=bool)
    bounds = np.flatnonzero(np.append(True, cols.series_id[1:] != cols.series_id[:-1]))
    for start, end in zip(bounds, np.append(bounds[1:], len(cols.step)), strict=True):
        sid = int(cols.series_id[start])
        lo, hi = int(cols.step[start]), int(cols.step[end - 1])
        stored = session.execute(_EXISTING_SQL, {"sid": sid, "lo": lo, "hi": hi}).scalars().all()
        if stored:
            new[start:end] = ~np.isin(cols.step[start:end], np.array(stored, dtype=np.int64))
    cursor = dbapi.cursor()
    try:
        cursor.executemany(_SQLITE_INSERT, cols.rows(new))
    finally:
        cursor.close()
    return new


def _series_ids(session: Session, run_id: uuid.UUID, keys: Sequence[str]) -> dict[str, int]:
    for key in keys:
        session.execute(insert_ignore(session, Series.__table__, run_id=run_id, key=key))  # type: ignore[arg-type]
    rows = session.execute(
        select(Series.key, Series.id).where(Series.run_id == run_id, Series.key.in_(keys))
    ).all()
    return {str(key): int(sid) for key, sid in rows}


def _touch_run(
    session: Session, run_id: uuid.UUID, max_step: int | None, allowed_project: str | None
) -> None:
    """Lock the run's row and record the ingest; raise RunNotFound if it is not visible."""
    now = utcnow()
    new_last = (
        Run.last_step
        if max_step is None
        else case(
            (Run.last_step.is_(None), max_step),
            (Run.last_step < max_step, max_step),
            else_=Run.last_step,
        )
    )
    stmt = update(Run).where(Run.id == run_id)
    if allowed_project is not None:
        stmt = stmt.where(
            Run.project_id
            == select(Project.id).where(Project.name == allowed_project).scalar_subquery()
        )
    result = session.execute(
        # revive_values: points from a run the service marked crashed (silent) mean it lives.
        stmt.values(updated_at=now, last_ingest_at=now, last_step=new_last, **revive_values()),
        execution_options={"synchronize_session": False},
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise RunNotFound(f"run {run_id} not found; create it with PUT /api/v1/runs/{run_id}")


def ingest_batch(
    session: Session, *, run_id: uuid.UUID, batch: MetricBatch, allowed_project: str | None
) -> IngestResult:
    """Store a columnar batch; points already stored are counted as duplicates and left as they
    are (the first value of a (run, key, step) wins)."""
    write_connection(session)
    _touch_run(session, run_id, max(batch.steps) if batch.steps else None, allowed_project)
    series_ids = _series_ids(session, run_id, list(batch.values))
    cols = _flatten(batch, series_ids)
    if cols.n_sent == 0:
        return IngestResult(accepted=0, duplicates=0)
    dbapi = session.connection().connection.dbapi_connection
    assert dbapi is not None
    postgres = is_postgres(session)
    new = _insert_postgres(dbapi, cols) if postgres else _insert_sqlite(session, dbapi, cols)
    accepted = int(new.sum())
    update_rollups(session, dbapi, cols.series_id[new], cols.step[new], cols.value[new], postgres)
    session.execute(
        update(Run).where(Run.id == run_id).values(n_points=Run.n_points + accepted),
        execution_options={"synchronize_session": False},
    )
    return IngestResult(accepted=accepted, duplicates=cols.n_sent - accepted)


def _check_run(session: Session, run_id: uuid.UUID, allowed_project: str | None) -> None:
    stmt = select(Run.id).where(Run.id == run_id)
    if allowed_project is not None:
        stmt = stmt.join(Project).where(Project.name == allowed_project)
    if session.scalar(stmt) is None:
        raise RunNotFound(f"run {run_id} not found")


def _floats(values: Sequence[Any]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


_RANGE = "series_id = :sid AND step >= :lo AND step <= :hi"
# Two separate single-aggregate queries: both databases answer each with one index probe
# (a combined min/max, or a count, would scan every point of the series).
_FIRST_STEP_SQL = text(f"SELECT min(step) FROM metric_points WHERE {_RANGE}")
_LAST_STEP_SQL = text(f"SELECT max(step) FROM metric_points WHERE {_RANGE}")
_ALL_SQL = text(f"SELECT step, value, wall_time FROM metric_points WHERE {_RANGE} ORDER BY step")
# Buckets of equal step width: bucket = (step - lo) * n_buckets // span, in integer arithmetic
# (the caller checks it cannot overflow). Per bucket: the extremes (spikes stay visible), the
# point count, and the last point, found through the primary key (one lookup per bucket).
_BUCKET_SQL = text(
    "WITH agg AS ("
    " SELECT (step - :lo) * :nb / :span AS b, min(value) AS vmin, max(value) AS vmax,"
    " max(step) AS last_step, count(*) AS n"
    f" FROM metric_points WHERE {_RANGE} GROUP BY (step - :lo) * :nb / :span)"
    " SELECT agg.last_step, mp.value, agg.vmin, agg.vmax, agg.n FROM agg"
    " JOIN metric_points mp ON mp.series_id = :sid AND mp.step = agg.last_step"
    " ORDER BY agg.last_step"
)


def _empty(key: str) -> SeriesOut:
    return SeriesOut(key=key, total_points=0, downsampled=False, steps=[], values=[])


class _Budget:
    """How many raw points a read may still return (``None``: any number)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.left = limit

    def take(self, rows: int) -> None:
        if self.left is None or self.limit is None:
            return
        self.left -= rows
        if self.left < 0:
            raise ReadTooLarge(
                f"this read would return more than {self.limit} raw points; pass max_points "
                "to downsample, narrow start/end or keys, or export with GET .../metrics.csv"
            )


def _read_all(
    session: Session, sid: int, key: str, lo: int, hi: int, budget: _Budget | None = None
) -> SeriesOut:
    sql = _ALL_SQL
    params: dict[str, Any] = {"sid": sid, "lo": lo, "hi": hi}
    if budget is not None and budget.left is not None:
        # Read one row past what is left: enough to know the read is too large, never more.
        sql = text(f"{_ALL_SQL.text} LIMIT :cap")
        params["cap"] = max(0, budget.left) + 1
    rows = session.execute(sql, params).all()
    if budget is not None:
        budget.take(len(rows))
    if not rows:
        return _empty(key)
    steps, values, walls = zip(*rows, strict=True)
    return SeriesOut(
        key=key,
        total_points=len(steps),
        downsampled=False,
        steps=list(steps),
        values=_floats(values),
        wall_time=list(walls) if any(w is not None for w in walls) else None,
    )


def _read_one(
    session: Session,
    sid: int,
    key: str,
    start: int,
    end: int,
    max_points: int | None,
    budget: _Budget | None = None,
) -> SeriesOut:
    params = {"sid": sid, "lo": start, "hi": end}
    lo = session.execute(_FIRST_STEP_SQL, params).scalar()
    if lo is None:
        return _empty(key)
    hi = int(session.execute(_LAST_STEP_SQL, params).scalar_one())
    lo = int(lo)
    span = hi - lo + 1
    # Steps are distinct integers, so a span that fits needs no downsampling.
    if max_points is None or span <= max_points:
        return _read_all(session, sid, key, lo, hi, budget)
    level = choose_level(span, max_points)
    if level is not None:
        buckets = read_buckets(session, sid, lo, hi, max_points, level)
    else:
        # Buckets narrower than the finest rollup block (span < 16 * max_points): aggregate the
        # raw points, at most a few hundred thousand.
        rows = session.execute(
            _BUCKET_SQL, {"sid": sid, "lo": lo, "hi": hi, "nb": max_points, "span": span}
        ).all()
        steps, last, vmin, vmax, count = zip(*rows, strict=True)
        buckets = Buckets(list(steps), _floats(last), _floats(vmin), _floats(vmax), list(count))
    if sum(buckets.count) <= max_points:  # sparse series: every point fits after all
        return _read_all(session, sid, key, lo, hi)
    return SeriesOut(
        key=key,
        total_points=sum(buckets.count),
        downsampled=True,
        steps=buckets.steps,
        values=buckets.values,
        min=buckets.vmin,
        max=buckets.vmax,
        count=buckets.count,
    )


def read_series(
    session: Session,
    *,
    run_id: uuid.UUID,
    keys: Sequence[str] | None,
    start: int | None,
    end: int | None,
    max_points: int | None,
    allowed_project: str | None,
    max_raw_points: int | None = None,
) -> MetricsOut:
    """Series of a run in ``[start, end]``; with ``max_points``, at most that many buckets each.

    Raises:
        ReadTooLarge: the raw points read (all series together, where no downsampling applies)
            would exceed ``max_raw_points``; nothing more than that is ever read.
    """
    _check_run(session, run_id, allowed_project)
    stmt = select(Series.key, Series.id).where(Series.run_id == run_id).order_by(Series.key)
    if keys:
        stmt = stmt.where(Series.key.in_(keys))
    found = dict(session.execute(stmt).all())
    lo = 0 if start is None else start
    hi = MAX_STEP if end is None else end
    budget = _Budget(max_raw_points)
    series = [
        _read_one(session, found[key], key, lo, hi, max_points, budget)
        if key in found
        else _empty(key)
        for key in (keys or sorted(found))
    ]
    return MetricsOut(run_id=run_id, series=series)


#: Points read per query by an export: bounds the memory an export holds at any moment.
EXPORT_PAGE = 20_000


def export_series(
    session: Session, *, run_id: uuid.UUID, keys: Sequence[str] | None, allowed_project: str | None
) -> list[tuple[str, int]]:
    """The (key, series id) pairs of a run an export covers, in key order (``keys`` only, if
    given). Raises RunNotFound for a run the caller may not see."""
    _check_run(session, run_id, allowed_project)
    stmt = select(Series.key, Series.id).where(Series.run_id == run_id).order_by(Series.key)
    if keys:
        stmt = stmt.where(Series.key.in_(keys))
    return [(str(k), int(i)) for k, i in session.execute(stmt)]


def export_page(
    session: Session, *, series_id: int, after_step: int, limit: int
) -> list[tuple[int, float, float | None]]:
    """Up to ``limit`` points of one series with step > ``after_step``, in step order, as
    (step, value, wall_time) with NaN for a stored NaN: one keyset page of the primary key."""
    stmt = (
        select(MetricPoint.step, MetricPoint.value, MetricPoint.wall_time)
        .where(MetricPoint.series_id == series_id, MetricPoint.step > after_step)
        .order_by(MetricPoint.step)
        .limit(limit)
    )
    return [(int(st), math.nan if v is None else float(v), w) for st, v, w in session.execute(stmt)]
