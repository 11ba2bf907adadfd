"""Metric reads: a run's series in a step range, raw or downsampled to at most ``max_points``
buckets each, and which keys runs log.

A read of several series costs the same few statements whatever their number (a page asks for
a dozen keys every few seconds). A span wider than the finest rollup block is read from the
rollups (:mod:`.rollups`); a narrower one aggregates the raw points, which a SQLite process
keeps held for series of at most ``HOLD_LIMIT`` points (:mod:`._held_points`). Ingest is
:mod:`.metrics`'.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Hashable, Sequence
from datetime import datetime
from itertools import groupby
from operator import itemgetter
from typing import Any

import numpy as np
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from curvecast.contract import MAX_STEP
from curvecast.service.errors import ReadTooLarge, RunNotFound
from curvecast.service.models import Series
from curvecast.service.schemas import MetricsOut, SeriesOut
from curvecast.service.store._common import (
    is_postgres,
    require_series,
    run_created_at,
    run_series,
    series_points,
)
from curvecast.service.store._held_points import HOLD_LIMIT, held_points, stored_count
from curvecast.service.store.rollups import (
    Buckets,
    bucket_points,
    choose_level,
    read_buckets,
)

__all__ = ["logged_keys", "read_series"]


def _check_run(session: Session, run_id: uuid.UUID, allowed_project: str | None
               ) -> tuple[uuid.UUID, datetime]:
    """The run's identity for held points (its id and creation time: see ``_held_points``).

    Raises:
        RunNotFound: no such run, or ``allowed_project`` does not own it.
    """
    created = run_created_at(session, run_id, allowed_project)
    if created is None:
        raise RunNotFound(f"run {run_id} not found")
    return run_id, created


def _floats(values: Sequence[Any]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


_RANGE = "series_id = :sid AND step >= :lo AND step <= :hi"
_ALL_SQL = text(f"SELECT step, value, wall_time FROM metric_points WHERE {_RANGE} ORDER BY step")
# A read of several series costs the same few statements whatever their number (a page asks for
# a dozen keys every 2 s): the bounds of every series in one, the points of every series that
# needs no downsampling in another. The series ids travel as one array (PostgreSQL) or one JSON
# text (SQLite). Each bound is a correlated single-aggregate subquery: both databases answer it
# with one index probe (a combined min/max, or a count, would scan every point of the series).
_PG_IDS = "unnest(CAST(:sids AS BIGINT[])) AS ids(sid)"
_SQLITE_IDS = "(SELECT value AS sid FROM json_each(:sids)) AS ids"
_BOUNDS = (
    "SELECT ids.sid,"
    " (SELECT min(step) FROM metric_points WHERE series_id = ids.sid AND step >= :lo"
    " AND step <= :hi),"
    " (SELECT max(step) FROM metric_points WHERE series_id = ids.sid AND step >= :lo"
    " AND step <= :hi)"
    " FROM {ids}"
)
_ALL_MANY = (
    "SELECT series_id, step, value, wall_time FROM metric_points"
    " WHERE series_id IN (SELECT ids.sid FROM {ids}) AND step >= :lo AND step <= :hi"
    " ORDER BY series_id, step"
)
_BOUNDS_SQL = {True: text(_BOUNDS.format(ids=_PG_IDS)),
               False: text(_BOUNDS.format(ids=_SQLITE_IDS))}
_ALL_MANY_SQL = {True: _ALL_MANY.format(ids=_PG_IDS), False: _ALL_MANY.format(ids=_SQLITE_IDS)}
# Buckets of equal step width: bucket = (step - lo) * n_buckets // span, in integer arithmetic
# (the caller checks it cannot overflow). Per bucket: the extremes (spikes stay visible), the
# point count, and the last point, found through the primary key (one lookup per bucket).
_BUCKET_ROWS = (
    "WITH agg AS ("
    " SELECT (step - :lo) * :nb / :span AS b, min(value) AS vmin, max(value) AS vmax,"
    " max(step) AS last_step, count(*) AS n"
    f" FROM metric_points WHERE {_RANGE} GROUP BY (step - :lo) * :nb / :span)"
    " SELECT agg.last_step, mp.value, agg.vmin, agg.vmax, agg.n FROM agg"
    " JOIN metric_points mp ON mp.series_id = :sid AND mp.step = agg.last_step"
)
# PostgreSQL: the same buckets as five bytea columns of big-endian int8/float8 (a NULL value,
# a stored NaN, as NaN), read with np.frombuffer: a page's buckets as Python row tuples cost the
# service more than the query (BENCHMARKS.md, "Reading a page's series at once, postgres").
# Through SQLAlchemy's text cursor, which decodes the bytea in C; a binary cursor would need a
# second copy of the SQL in the driver's placeholder style.
_PG_BUCKET_BINARY = text(
    f"WITH bucket AS ({_BUCKET_ROWS}) SELECT "
    + ", ".join(
        f"string_agg({send}, ''::bytea ORDER BY last_step)" for send in (
            "int8send(last_step)", "float8send(COALESCE(value, 'NaN'))",
            "float8send(COALESCE(vmin, 'NaN'))", "float8send(COALESCE(vmax, 'NaN'))",
            "int8send(n)"))
    + " FROM bucket"
)


def _raw_buckets(session: Session, run: Hashable, sid: int, lo: int, hi: int, n_buckets: int
                 ) -> Buckets:
    """Buckets aggregated from the raw points of ``[lo, hi]`` (narrower than a rollup block)
    of series ``sid`` of ``run`` (its id and creation time)."""
    params = {"sid": sid, "lo": lo, "hi": hi, "nb": n_buckets, "span": hi - lo + 1}
    if is_postgres(session):
        steps, last, vmin, vmax, count = (
            b or b"" for b in session.execute(_PG_BUCKET_BINARY, params).one())
        return Buckets(
            np.frombuffer(steps, ">i8").tolist(), np.frombuffer(last, ">f8").tolist(),
            np.frombuffer(vmin, ">f8").tolist(), np.frombuffer(vmax, ">f8").tolist(),
            np.frombuffer(count, ">i8").tolist(),
        )
    # SQLite: the raw points, bucketed by numpy. The same buckets in SQL (a GROUP BY into a
    # temporary b-tree, then a lookup per bucket for its last value) cost the service more
    # CPU. A series of at most HOLD_LIMIT points stays held in the process, so the next read
    # asks only for the steps after it (SQLite hands rows over one by one).
    points, count = held_points.update(session, run, sid)
    if points is None:
        if count is None:  # nothing was held, so the count was not read
            count = stored_count(session, sid)
        if count <= HOLD_LIMIT:
            points = series_points(session, series_id=sid)
    if points is None:
        steps, values = series_points(session, series_id=sid, lo=lo, hi=hi)
    else:
        if points[0].size <= HOLD_LIMIT:  # a series grown past it is let go
            held_points.keep(session, run, sid, points)
        first, last = np.searchsorted(points[0], [lo, hi + 1])
        steps, values = points[0][first:last], points[1][first:last]
    return bucket_points(steps, values, lo, hi - lo + 1, n_buckets)


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


def _read_all(session: Session, sid: int, key: str, lo: int, hi: int) -> SeriesOut:
    """Every point of one series in ``[lo, hi]`` (a sparse series a bucketed read found
    small enough after all)."""
    rows = session.execute(_ALL_SQL, {"sid": sid, "lo": lo, "hi": hi}).all()
    if not rows:
        return _empty(key)
    return _raw_series(key, *zip(*rows, strict=True))


def _raw_series(key: str, steps: Sequence[int], values: Sequence[Any], walls: Sequence[Any]
                ) -> SeriesOut:
    """A series read point by point (a NULL value is a stored NaN; wall times only if any)."""
    return SeriesOut(
        key=key,
        total_points=len(steps),
        downsampled=False,
        steps=list(steps),
        values=_floats(values),
        wall_time=list(walls) if any(w is not None for w in walls) else None,
    )


def _ids_param(session: Session, sids: Sequence[int]) -> Any:
    """Series ids as one parameter: an array on PostgreSQL, JSON text on SQLite."""
    return list(sids) if is_postgres(session) else json.dumps(list(sids))


def _bounds(session: Session, sids: Sequence[int], lo: int, hi: int) -> dict[int, tuple[int, int]]:
    """First and last step in ``[lo, hi]`` of each series that has a point there, in one
    statement."""
    if not sids:
        return {}
    rows = session.execute(_BOUNDS_SQL[is_postgres(session)],
                           {"sids": _ids_param(session, sids), "lo": lo, "hi": hi})
    return {int(sid): (int(first), int(last)) for sid, first, last in rows
            if first is not None}


def _read_all_many(
    session: Session, keys: dict[int, str], lo: int, hi: int, budget: _Budget
) -> dict[int, SeriesOut]:
    """Every point in ``[lo, hi]`` of the series ``keys`` names (id -> key), in one statement;
    the raw points of all of them count against ``budget`` together."""
    if not keys:
        return {}
    sql = _ALL_MANY_SQL[is_postgres(session)]
    params: dict[str, Any] = {"sids": _ids_param(session, list(keys)), "lo": lo, "hi": hi}
    if budget.left is not None:
        # Read one row past what is left: enough to know the read is too large, never more.
        sql += " LIMIT :cap"
        params["cap"] = max(0, budget.left) + 1
    rows = session.execute(text(sql), params).all()
    budget.take(len(rows))
    out: dict[int, SeriesOut] = {}
    for sid, group in groupby(rows, key=itemgetter(0)):  # rows come in series order
        _, steps, values, walls = zip(*group, strict=True)
        out[int(sid)] = _raw_series(keys[int(sid)], steps, values, walls)
    return out


def _read_downsampled(
    session: Session, run: Hashable, sid: int, key: str, lo: int, hi: int, max_points: int
) -> SeriesOut:
    """A series whose points in ``[lo, hi]`` (its first and last step there) span more than
    ``max_points`` steps, in at most that many buckets (all its points if they fit)."""
    span = hi - lo + 1
    level = choose_level(span, max_points)
    if level is not None:
        buckets = read_buckets(session, sid, lo, hi, max_points, level)
    else:
        # Buckets narrower than the finest rollup block (span < 16 * max_points): aggregate the
        # raw points, at most a few hundred thousand.
        buckets = _raw_buckets(session, run, sid, lo, hi, max_points)
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


def logged_keys(session: Session, *, run_ids: Sequence[uuid.UUID], keys: Sequence[str]
                ) -> dict[uuid.UUID, set[str]]:
    """Which of ``keys`` each of ``run_ids`` logs (one statement over the runs' series; the
    caller has checked that it may see the runs)."""
    out: dict[uuid.UUID, set[str]] = {run_id: set() for run_id in run_ids}
    if not run_ids or not keys:
        return out
    rows = session.execute(
        select(Series.run_id, Series.key).where(Series.run_id.in_(list(run_ids)),
                                                Series.key.in_(list(keys))))
    for run_id, key in rows:
        out[run_id].add(key)
    return out


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
    require_keys: bool = False,
) -> MetricsOut:
    """Series of a run in ``[start, end]``; with ``max_points``, at most that many buckets each.

    A key the run has no series of is an empty series, or with ``require_keys`` (REST's
    reads: a misspelt key must not read as "no points yet") a NotFound naming the run's keys.

    Raises:
        NotFound: with ``require_keys``, a key the run has no series of.
        ReadTooLarge: the raw points read (all series together, where no downsampling applies)
            would exceed ``max_raw_points``; nothing more than that is ever read.
    """
    run = _check_run(session, run_id, allowed_project)
    found = dict(run_series(session, run_id, keys))
    if require_keys:
        require_series(session, run_id, keys, found)
    lo = 0 if start is None else start
    hi = MAX_STEP if end is None else end
    order = list(keys or sorted(found))
    bounds = _bounds(session, list(dict.fromkeys(found[k] for k in order if k in found)), lo, hi)
    # Steps are distinct integers, so a span that fits needs no downsampling.
    raw = _read_all_many(session, {
        sid: key for key, sid in found.items()
        if sid in bounds and (max_points is None or bounds[sid][1] - bounds[sid][0] < max_points)
    }, lo, hi, _Budget(max_raw_points))
    series = []
    for key in order:
        sid = found.get(key)
        if sid is None or sid not in bounds:
            series.append(_empty(key))
        elif sid in raw:
            series.append(raw[sid])
        else:
            assert max_points is not None  # only a span beyond max_points is not read raw
            series.append(_read_downsampled(session, run, sid, key, *bounds[sid], max_points))
    return MetricsOut(run_id=run_id, series=series)
