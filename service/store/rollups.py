"""Multi-resolution rollups of metric points: what makes downsampled reads of long series fast.

For each series and each level ``L`` the table ``metric_rollups`` holds one row per block of
``ROLLUP_WIDTHS[L]`` steps (block = step // width): point count, min, max and the last point.
Ingest updates the rollups of the points it newly stored, in the same transaction. A read of
``max_points`` buckets over a span of S steps uses the coarsest level whose block is no wider
than S / max_points, so it touches between max_points and 8 × max_points rollup rows whatever
the length of the run, plus at most two partial blocks of raw points at the range's edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from curvecast.service.store._pgcopy import (
    Float8Array,
    Int2Array,
    Int4Array,
    Int8Array,
    register_array_dumpers,
)

#: Block widths in steps, one per level (a factor of 8 between levels).
ROLLUP_WIDTHS = (16, 128, 1024, 8192, 65536, 524288)


@dataclass(frozen=True)
class Blocks:
    """Per-block aggregates (parallel arrays), sorted by (series, block)."""

    series_id: np.ndarray
    block: np.ndarray
    n: np.ndarray
    vmin: np.ndarray  # NaN where every value of the block is NaN
    vmax: np.ndarray
    last_step: np.ndarray
    last_value: np.ndarray
    vsum: np.ndarray  # sum of the finite values
    nsum: np.ndarray  # how many values vsum adds up


def aggregate(series_id: np.ndarray, step: np.ndarray, value: np.ndarray, width: int) -> Blocks:
    """Aggregate points sorted by (series, step) into blocks of ``width`` steps (pure)."""
    block = step // width
    change = np.ones(len(step), dtype=bool)
    change[1:] = (series_id[1:] != series_id[:-1]) | (block[1:] != block[:-1])
    return _blocks(series_id, block, step, value, np.flatnonzero(change))


def _blocks(series_id: np.ndarray, block: np.ndarray, step: np.ndarray, value: np.ndarray,
            starts: np.ndarray) -> Blocks:
    """The aggregates of the runs of points that begin at ``starts`` (pure)."""
    ends = np.append(starts[1:], len(step)) - 1
    # fmin/fmax skip NaN (stored NaN values), so a spike next to a NaN stays visible; the
    # sum for block means takes finite values only (a mean of ±inf says nothing).
    finite = np.isfinite(value)
    return Blocks(
        series_id=series_id[starts],
        block=block[starts],
        n=np.diff(np.append(starts, len(step))),
        vmin=np.fmin.reduceat(value, starts),
        vmax=np.fmax.reduceat(value, starts),
        last_step=step[ends],
        last_value=value[ends],
        vsum=np.add.reduceat(np.where(finite, value, 0.0), starts),
        nsum=np.add.reduceat(finite.astype(np.int64), starts),
    )


@dataclass(frozen=True)
class LevelBlocks:
    """Per-block aggregates of every level at once (parallel arrays), what ingest folds in."""

    level: np.ndarray
    blocks: Blocks


_WIDTHS = np.array(ROLLUP_WIDTHS, dtype=np.int64)


def aggregate_levels(series_id: np.ndarray, step: np.ndarray, value: np.ndarray) -> LevelBlocks:
    """:func:`aggregate` for every level in one pass (pure): the points are repeated once per
    level, level after level, so a dozen array operations cover all levels (one call per level
    cost six times the numpy overhead, which dominates at a thousand points per batch)."""
    n, levels = len(step), len(ROLLUP_WIDTHS)
    if n == 0:
        ints, floats = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        return LevelBlocks(level=ints, blocks=Blocks(
            series_id=ints, block=ints, n=ints, vmin=floats, vmax=floats, last_step=ints,
            last_value=floats, vsum=floats, nsum=ints))  # fmt: skip
    block = (step[None, :] // _WIDTHS[:, None]).ravel()
    sid = np.tile(series_id, levels)
    steps = np.tile(step, levels)
    values = np.tile(value, levels)
    change = np.ones(n * levels, dtype=bool)
    change[1:] = (sid[1:] != sid[:-1]) | (block[1:] != block[:-1])
    change[::n] = True  # a level starts a block even where the series and block number repeat
    starts = np.flatnonzero(change)
    return LevelBlocks(level=starts // n, blocks=_blocks(sid, block, steps, values, starts))


#: How an incoming block (``excluded``) merges into a stored one. NaN stands for "no value"
#: (a block of NaN points has no extremes), stored as NULL.
_MERGE = (
    " ON CONFLICT (series_id, level, block) DO UPDATE SET "
    "n = metric_rollups.n + excluded.n, "
    "vsum = metric_rollups.vsum + excluded.vsum, "
    "nsum = metric_rollups.nsum + excluded.nsum, "
    "vmin = CASE WHEN metric_rollups.vmin IS NULL THEN excluded.vmin"
    " WHEN excluded.vmin IS NULL OR metric_rollups.vmin <= excluded.vmin THEN metric_rollups.vmin"
    " ELSE excluded.vmin END, "
    "vmax = CASE WHEN metric_rollups.vmax IS NULL THEN excluded.vmax"
    " WHEN excluded.vmax IS NULL OR metric_rollups.vmax >= excluded.vmax THEN metric_rollups.vmax"
    " ELSE excluded.vmax END, "
    "last_value = CASE WHEN excluded.last_step > metric_rollups.last_step"
    " THEN excluded.last_value ELSE metric_rollups.last_value END, "
    "last_step = CASE WHEN excluded.last_step > metric_rollups.last_step"
    " THEN excluded.last_step ELSE metric_rollups.last_step END"
)
_COLUMNS = "series_id, level, block, n, vmin, vmax, last_step, last_value, vsum, nsum"

#: The PostgreSQL upsert of :func:`pg_params`' arrays, and a condition placeholder ``{where}``
#: (ingest folds it into the points statement: "only if every point was new").
PG_UPSERT = (
    f"INSERT INTO metric_rollups ({_COLUMNS})"
    " SELECT r_sid, r_level, r_block, r_n, NULLIF(r_vmin, 'NaN'::float8),"
    " NULLIF(r_vmax, 'NaN'::float8), r_last_step, NULLIF(r_last_value, 'NaN'::float8),"
    " r_vsum, r_nsum"
    " FROM unnest(%(r_sid)b, %(r_level)b, %(r_block)b, %(r_n)b, %(r_vmin)b, %(r_vmax)b,"
    " %(r_last_step)b, %(r_last_value)b, %(r_vsum)b, %(r_nsum)b)"
    " AS r(r_sid, r_level, r_block, r_n, r_vmin, r_vmax, r_last_step, r_last_value, r_vsum,"
    " r_nsum){where}" + _MERGE
)
_SQLITE_UPSERT = (
    f"INSERT INTO metric_rollups ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)" + _MERGE
)


def pg_params(agg: LevelBlocks) -> dict[str, Any]:
    """The parameters of :data:`PG_UPSERT`: one binary array per column (numpy-encoded)."""
    b = agg.blocks
    return {
        "r_sid": Int4Array(b.series_id),
        "r_level": Int2Array(agg.level),
        "r_block": Int8Array(b.block),
        "r_n": Int8Array(b.n),
        "r_vmin": Float8Array(b.vmin),
        "r_vmax": Float8Array(b.vmax),
        "r_last_step": Int8Array(b.last_step),
        "r_last_value": Float8Array(b.last_value),
        "r_vsum": Float8Array(b.vsum),
        "r_nsum": Int8Array(b.nsum),
    }


def _none_for_nan(values: np.ndarray) -> list[float | None]:
    out: list[float | None] = values.tolist()
    for index in np.flatnonzero(np.isnan(values)).tolist():
        out[index] = None
    return out


def update_rollups(
    dbapi: Any, series_id: np.ndarray, step: np.ndarray, value: np.ndarray, postgres: bool
) -> None:
    """Fold newly stored points (sorted by (series, step)) into every level's rollups, with one
    statement on the session's DB-API connection."""
    if len(step) == 0:
        return
    agg = aggregate_levels(series_id, step, value)
    if postgres:
        register_array_dumpers(dbapi)
        with dbapi.cursor() as cur:
            cur.execute(PG_UPSERT.format(where=""), pg_params(agg))
        return
    b = agg.blocks
    rows = zip(
        b.series_id.tolist(), agg.level.tolist(), b.block.tolist(), b.n.tolist(),
        _none_for_nan(b.vmin), _none_for_nan(b.vmax), b.last_step.tolist(),
        _none_for_nan(b.last_value), b.vsum.tolist(), b.nsum.tolist(),
        strict=True,
    )  # fmt: skip
    cursor = dbapi.cursor()
    try:
        cursor.executemany(_SQLITE_UPSERT, rows)
    finally:
        cursor.close()


@dataclass(frozen=True)
class Buckets:
    """A downsampled series: per bucket its last point, extremes and count."""

    steps: list[int]
    values: list[float]
    vmin: list[float]
    vmax: list[float]
    count: list[int]


def bucket_points(steps: np.ndarray, values: np.ndarray, lo: int, span: int, n_buckets: int
                  ) -> Buckets:
    """Raw points (by step; NaN for a logged NaN) in ``n_buckets`` buckets of equal step width
    over ``[lo, lo + span)`` (pure): bucket = (step - lo) * n_buckets // span, in integers. Per
    non-empty bucket: its last point, the extremes of its values (NaN left out; NaN if it has
    none) and its point count."""
    if not steps.size:
        return Buckets([], [], [], [], [])
    return _merge((steps - lo) * n_buckets // span, steps, values, values, values,
                  np.ones(steps.size, dtype=np.int64))


def _merge(bucket: np.ndarray, last_step: np.ndarray, last_value: np.ndarray,
           vmin: np.ndarray, vmax: np.ndarray, n: np.ndarray) -> Buckets:
    """Consecutive parts (points or blocks, by step) with the same ``bucket`` number merged:
    the last part's last point, the extremes (NaN left out) and the summed counts (pure)."""
    starts = np.flatnonzero(np.append(True, bucket[1:] != bucket[:-1]))
    ends = np.append(starts[1:], len(bucket)) - 1
    return Buckets(
        steps=last_step[ends].tolist(),
        values=last_value[ends].tolist(),
        vmin=np.fmin.reduceat(vmin, starts).tolist(),
        vmax=np.fmax.reduceat(vmax, starts).tolist(),
        count=np.add.reduceat(n, starts).tolist(),
    )


def choose_level(span: int, max_points: int) -> int | None:
    """The coarsest level whose block is no wider than one bucket, or None (too fine)."""
    bucket = span / max_points
    levels = [lvl for lvl, width in enumerate(ROLLUP_WIDTHS) if width <= bucket]
    return levels[-1] if levels else None


_BLOCKS_SQL = text(
    "SELECT block, n, vmin, vmax, last_step, last_value, vsum, nsum FROM metric_rollups"
    " WHERE series_id = :sid AND level = :level AND block >= :first AND block <= :last"
    " ORDER BY block"
)
_RAW_SQL = text(
    "SELECT step, value FROM metric_points WHERE series_id = :sid AND step >= :lo"
    " AND step <= :hi ORDER BY step"
)


def _sorted_concat(parts: list[Blocks]) -> Blocks:
    """Concatenate block aggregates and sort them by block."""
    merged = {
        f: np.concatenate([getattr(p, f) for p in parts]) for f in Blocks.__dataclass_fields__
    }
    order = np.argsort(merged["block"], kind="stable")
    return Blocks(**{f: a[order] for f, a in merged.items()})


def _as_float(values: list[Any]) -> np.ndarray:
    return np.array([math.nan if v is None else v for v in values], dtype=np.float64)


def read_buckets(
    session: Session, sid: int, lo: int, hi: int, max_points: int, level: int
) -> Buckets:
    """Downsample the points of series ``sid`` in [lo, hi] to at most ``max_points`` buckets.

    Buckets are whole numbers of level-``level`` blocks; blocks cut by the range's edges are
    rebuilt from raw points so every count, extreme and last point is exact.
    """
    width = ROLLUP_WIDTHS[level]
    span = hi - lo + 1
    # Blocks per bucket, chosen so that even with bucket edges aligned to multiples of the
    # bucket width the range needs at most max_points buckets.
    per_bucket = max(1, math.ceil(span / (max(1, max_points - 1) * width)))
    first_full, last_full = -(-lo // width), (hi + 1) // width - 1
    parts: list[Blocks] = []
    rows = session.execute(
        _BLOCKS_SQL, {"sid": sid, "level": level, "first": first_full, "last": last_full}
    ).all()
    if rows:
        cols = [list(c) for c in zip(*rows, strict=True)]
        parts.append(
            Blocks(
                series_id=np.zeros(len(rows), dtype=np.int64),
                block=np.array(cols[0], dtype=np.int64),
                n=np.array(cols[1], dtype=np.int64),
                vmin=_as_float(cols[2]),
                vmax=_as_float(cols[3]),
                last_step=np.array(cols[4], dtype=np.int64),
                last_value=_as_float(cols[5]),
                vsum=_as_float(cols[6]),
                nsum=np.array(cols[7], dtype=np.int64),
            )
        )
    # choose_level guarantees span >= max_points * width, so whole blocks always exist.
    assert first_full <= last_full
    for edge_lo, edge_hi in ((lo, first_full * width - 1), ((last_full + 1) * width, hi)):
        if edge_lo > edge_hi:
            continue
        raw = session.execute(_RAW_SQL, {"sid": sid, "lo": edge_lo, "hi": edge_hi}).all()
        if raw:
            steps = np.array([r[0] for r in raw], dtype=np.int64)
            values = _as_float([r[1] for r in raw])
            parts.append(aggregate(np.zeros(len(steps), dtype=np.int64), steps, values, width))
    blocks = _sorted_concat(parts)
    return _merge(blocks.block // per_bucket, blocks.last_step, blocks.last_value, blocks.vmin,
                  blocks.vmax, blocks.n)


def read_block_means(
    session: Session, sid: int, lo: int, hi: int, min_blocks: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-block (centre step, mean value) of a series from the coarsest level that still has
    at least ``min_blocks`` blocks over [lo, hi]; None when even level 0 has fewer (short series:
    read the raw points instead). A forecast refit uses this so its cost does not grow with
    the run's length."""
    span = hi - lo + 1
    levels = [lvl for lvl, width in enumerate(ROLLUP_WIDTHS) if span / width >= min_blocks]
    if not levels:
        return None
    level = levels[-1]
    width = ROLLUP_WIDTHS[level]
    rows = session.execute(
        _BLOCKS_SQL, {"sid": sid, "level": level, "first": lo // width, "last": hi // width}
    ).all()
    block = np.array([r[0] for r in rows], dtype=np.float64)
    last_step = np.array([r[4] for r in rows], dtype=np.float64)
    vsum = _as_float([r[6] for r in rows])
    nsum = np.array([r[7] for r in rows], dtype=np.float64)
    keep = nsum > 0
    # A block's points are evenly spread from its start to its last step.
    centre = (np.maximum(block * width, lo) + last_step) / 2
    return centre[keep], vsum[keep] / nsum[keep]
