"""Metric points: bulk, idempotent ingest (reads are in :mod:`.metric_reads`).

Ingest is set-based, inside one transaction (a batch is stored whole or not at all), and costs
the same few statements whatever the batch's size; the columns travel as numpy arrays, never as
one Python object per point on the way to the database.

PostgreSQL, three round trips:

1. ``UPDATE runs ... RETURNING`` joined with the batch's series: checks the run is visible,
   records progress, takes the run row's lock (concurrent batches of one run, from any number of
   service processes, are serialised and cannot deadlock; different runs go in parallel) and
   reads the series ids. Keys the run does not have yet cost one ``INSERT`` and one ``SELECT``
   more (a run's first batch).
2. One statement inserts the points (binary arrays, numpy-encoded, through ``unnest``, ``ON
   CONFLICT DO NOTHING``), folds them into every rollup level when every point was new (the
   common case; otherwise it returns which points were new and one more statement folds just
   those), and adds the count to ``runs.n_points``.
3. ``COMMIT``.

A batch of :data:`COPY_MIN_POINTS` or more whose every point lies past its series' newest stored
step (an import, a long run catching up) cannot hold a stored point: one more ``SELECT`` checks
that, then a binary ``COPY`` writes the points and one statement each the rollups and the count.

SQLite (in process, so the number of statements matters less than what each one does): the run
and its series in one ``SELECT``; the points in ``INSERT`` statements of 200 rows inside a
savepoint — if any point was already stored, the savepoint is rolled back and the batch is
inserted again, minus the points found stored; the rollups in one ``executemany``; the run's
row in one ``UPDATE``. The write transaction (``BEGIN IMMEDIATE``) excludes other writers.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

import numpy as np
from sqlalchemy import Dialect
from sqlalchemy.orm import Session

from curvecast.service.errors import InvalidInput, RunNotFound
from curvecast.service.models import Run
from curvecast.service.schemas import IngestResult, MetricBatch
from curvecast.service.store._common import (
    utcnow,
    write_connection,
)
from curvecast.service.store._key_budget import check_new_keys
from curvecast.service.store._pgcopy import (
    Float8Array,
    Int4Array,
    Int8Array,
    encode_rows,
    register_array_dumpers,
)
from curvecast.service.store.rollups import (
    PG_UPSERT,
    aggregate_levels,
    pg_params,
    update_rollups,
)
from curvecast.service.store.runs import revive_values

# --- PostgreSQL statements (psycopg placeholders; %(x)b is a binary PgArray) -------------------

#: Keys travel as one comma-separated text (KEY_PATTERN has no comma): no per-key parameter.
_PG_KEYS = "string_to_array(%(keys)s::text, ',')"
_PG_VISIBLE = " AND project_id = (SELECT id FROM projects WHERE name = %(project)s)"
_PG_TOUCH = (
    "WITH run AS (UPDATE runs SET updated_at = %(now)s, last_ingest_at = %(now)s,"
    " last_step = GREATEST(last_step, %(max_step)s::bigint), "
    + revive_values().replace("%", "%%")
    + " WHERE id = %(run)s{visible} RETURNING id)"
    " SELECT s.key, s.id FROM run LEFT JOIN series s ON s.run_id = run.id"
    f" AND s.key = ANY({_PG_KEYS})"
)
_PG_NEW_SERIES = (
    f"INSERT INTO series (run_id, key) SELECT %(run)s, unnest({_PG_KEYS})"
    " ON CONFLICT DO NOTHING"
)
_PG_SERIES = f"SELECT key, id FROM series WHERE run_id = %(run)s AND key = ANY({_PG_KEYS})"
_PG_POINTS = (
    "WITH new AS (INSERT INTO metric_points (series_id, step, value, wall_time)"
    " SELECT p_sid, p_step, NULLIF(p_value, 'NaN'::float8), NULLIF(p_wall, 'NaN'::float8)"
    " FROM unnest(%(p_sid)b, %(p_step)b, %(p_value)b, %(p_wall)b)"
    " AS p(p_sid, p_step, p_value, p_wall)"
    " ON CONFLICT DO NOTHING RETURNING series_id, step),"
    " counted AS (SELECT count(*) AS n FROM new),"
    # The rollups of the batch as computed in Python assume every point is new: folded in only
    # if that is so (else the caller folds the points that were).
    " rolled AS ("
    + PG_UPSERT.format(where=", counted WHERE counted.n = %(sent)s::bigint")
    + "),"
    " progress AS (UPDATE runs SET n_points = runs.n_points + counted.n FROM counted"
    " WHERE runs.id = %(run)s)"
    " SELECT counted.n,"
    " CASE WHEN counted.n <> %(sent)s::bigint THEN (SELECT array_agg(series_id) FROM new) END,"
    " CASE WHEN counted.n <> %(sent)s::bigint THEN (SELECT array_agg(step) FROM new) END"
    " FROM counted"
)

# --- SQLite statements (named parameters) ------------------------------------------------------

_SQLITE_VISIBLE = " AND r.project_id = (SELECT id FROM projects WHERE name = :project)"
_SQLITE_SERIES = (
    "SELECT s.key, s.id FROM runs r LEFT JOIN series s ON s.run_id = r.id"
    " AND s.key IN (SELECT value FROM json_each(:keys)) WHERE r.id = :run{visible}"
)
_SQLITE_NEW_SERIES = "INSERT INTO series (run_id, key) VALUES (?, ?) ON CONFLICT DO NOTHING"
_SQLITE_TOUCH = (
    "UPDATE runs SET updated_at = :now, last_ingest_at = :now, n_points = n_points + :accepted,"
    " last_step = CASE WHEN :max_step IS NULL THEN last_step"
    " WHEN last_step IS NULL OR last_step < :max_step THEN :max_step ELSE last_step END, "
    + revive_values()
    + " WHERE id = :run"
)
_SQLITE_INSERT = (
    "INSERT INTO metric_points (series_id, step, value, wall_time) VALUES (?, ?, ?, ?) "
    "ON CONFLICT DO NOTHING"
)
_EXISTING_SQL = "SELECT step FROM metric_points WHERE series_id = ? AND step >= ? AND step <= ?"
#: Rows per multi-row INSERT: one statement of many rows costs SQLite's writer less CPU than
#: ``executemany`` over the same rows (per-row statement resets and parameter binding from
#: tuples); 800 parameters stay under the 999 that SQLite before 3.32 allows.
_SQLITE_CHUNK = 200
_SQLITE_INSERT_CHUNK = (
    "INSERT INTO metric_points (series_id, step, value, wall_time) VALUES "
    + ", ".join(["(?, ?, ?, ?)"] * _SQLITE_CHUNK) + " ON CONFLICT DO NOTHING"
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

    def flat(self, mask: np.ndarray | None = None) -> list[Any]:
        """The (masked) points' parameters, row after row: series id, step, value, wall time
        (NaN → None)."""
        pick = slice(None) if mask is None else mask
        value = self.value[pick]
        out: list[Any] = [None] * (4 * len(value))
        out[0::4] = self.series_id[pick].tolist()
        out[1::4] = self.step[pick].tolist()
        out[2::4] = _nan_to_none(value)
        if self.wall is not None:
            out[3::4] = _nan_to_none(self.wall[pick])
        return out


def _flatten(batch: MetricBatch, series_ids: dict[str, int]) -> _Columns:
    """The batch as parallel arrays in (series, step) order, with a handful of numpy calls:
    Python work grows with the null and NaN entries only, not with the points."""
    keys = sorted(batch.values, key=series_ids.__getitem__)
    columns = [batch.values[key] for key in keys]
    n = len(batch.steps)
    # One conversion for all columns: numbers stay, "NaN"/"Infinity"/"-Infinity" parse, and a
    # null becomes NaN too; only NaN entries are then looked at to tell the two apart.
    values = np.array(columns, dtype=np.float64).reshape(len(keys), n)
    present = np.ones(values.shape, dtype=bool)
    rows, cols = np.nonzero(np.isnan(values))
    if len(rows):
        null = np.fromiter(
            (columns[r][c] is None for r, c in zip(rows.tolist(), cols.tolist(), strict=True)),
            dtype=bool, count=len(rows),
        )  # fmt: skip
        present[rows[null], cols[null]] = False
    steps = np.asarray(batch.steps, dtype=np.int64)
    wall = (
        None
        if batch.wall_time is None
        else np.array(batch.wall_time, dtype=np.float64)  # null → NaN, "missing"
    )
    sid = np.repeat(np.array([series_ids[key] for key in keys], dtype=np.int64), n)
    step = np.tile(steps, len(keys))
    walls = np.tile(wall, len(keys)) if wall is not None else None
    flat_present = present.ravel()
    all_present = bool(flat_present.all())
    if not all_present:
        sid, step = sid[flat_present], step[flat_present]
        walls = walls[flat_present] if walls is not None else None
    value = values.ravel() if all_present else values.ravel()[flat_present]
    n_sent = len(step)
    if n > 1 and not bool((steps[1:] > steps[:-1]).all()):
        # Steps out of order or repeated: stable sort, then drop repeats of a (series, step)
        # within the batch: the first occurrence wins, exactly like a point already stored.
        order = np.lexsort((step, sid))
        sid, step, value = sid[order], step[order], value[order]
        walls = walls[order] if walls is not None else None
        keep = np.ones(len(step), dtype=bool)
        keep[1:] = (sid[1:] != sid[:-1]) | (step[1:] != step[:-1])
        sid, step, value = sid[keep], step[keep], value[keep]
        walls = walls[keep] if walls is not None else None
    # (Strictly increasing steps, the client's case: keys in series order already give
    # (series, step) order, and there is nothing to drop.)
    return _Columns(series_id=sid, step=step, value=value, wall=walls, n_sent=n_sent)


def _nan_to_none(values: np.ndarray) -> list[float | None]:
    out: list[float | None] = values.tolist()
    for index in np.flatnonzero(np.isnan(values)).tolist():
        out[index] = None
    return out


def _member_mask(cols: _Columns, sid: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Mask of the batch's points whose (series, step) is among the given pairs."""
    pairs = set(zip(sid.tolist(), step.tolist(), strict=True))
    batch = zip(cols.series_id.tolist(), cols.step.tolist(), strict=True)
    return np.fromiter((pair in pairs for pair in batch), dtype=bool, count=len(cols.step))


def _not_found(run_id: uuid.UUID) -> RunNotFound:
    return RunNotFound(f"run {run_id} not found; create it with PUT /api/v1/runs/{run_id}")


def _joined_keys(keys: list[str]) -> str:
    # MetricBatch checks every key against KEY_PATTERN, which has no comma; a batch built
    # without that check must not smuggle one in.
    joined = ",".join(keys)
    if joined.count(",") != len(keys) - 1:
        raise InvalidInput("values: a metric key must not contain a comma")
    return joined


def _ingest_postgres(
    dbapi: Any, run_id: uuid.UUID, batch: MetricBatch, allowed_project: str | None,
    max_keys: int | None,
) -> tuple[int, int]:
    """(accepted, sent) of a batch on PostgreSQL, in the caller's transaction."""
    register_array_dumpers(dbapi)
    keys = list(batch.values)
    now = utcnow()
    params: dict[str, Any] = {
        "run": run_id, "now": now, "keys": _joined_keys(keys), "project": allowed_project,
        "max_step": batch.max_step(),
    }  # fmt: skip
    with dbapi.cursor() as cur:
        cur.execute(_PG_TOUCH.format(visible="" if allowed_project is None else _PG_VISIBLE),
                    params)
        rows = cur.fetchall()
        if not rows:
            raise _not_found(run_id)
        series_ids = {str(key): int(sid) for key, sid in rows if key is not None}
        missing = [key for key in keys if key not in series_ids]
        check_new_keys(cur, run_id=run_id, run_param=run_id, new=len(missing), limit=max_keys,
                       postgres=True)
        if missing:
            # A concurrent batch of this run cannot create them meanwhile (it waits on the run
            # row's lock), but another writer of series would only make ON CONFLICT skip them.
            new_keys = {"run": run_id, "keys": _joined_keys(missing)}
            cur.execute(_PG_NEW_SERIES, new_keys)
            cur.execute(_PG_SERIES, new_keys)
            series_ids.update((str(key), int(sid)) for key, sid in cur.fetchall())
        cols = _flatten(batch, series_ids)
        sent = len(cols.step)
        if sent == 0:
            return 0, cols.n_sent
        if sent >= COPY_MIN_POINTS and _all_past_stored(cur, cols):
            _copy_points(cur, run_id, cols)
            return sent, cols.n_sent
        wall = cols.wall if cols.wall is not None else np.full(sent, math.nan)
        cur.execute(
            _PG_POINTS,
            {
                "run": run_id, "sent": sent,
                "p_sid": Int4Array(cols.series_id), "p_step": Int8Array(cols.step),
                "p_value": Float8Array(cols.value), "p_wall": Float8Array(wall),
                **pg_params(aggregate_levels(cols.series_id, cols.step, cols.value)),
            },
        )  # fmt: skip
        row = cur.fetchone()
    assert row is not None
    accepted = int(row[0])
    if accepted != sent:
        # Some points were stored already (a retry): fold in only the ones that were new.
        new = _member_mask(cols, np.array(row[1] or [], dtype=np.int64),
                           np.array(row[2] or [], dtype=np.int64))
        update_rollups(dbapi, cols.series_id[new], cols.step[new], cols.value[new], True)
    return accepted, cols.n_sent


#: Batches of at least this many points, every one past its series' newest stored step (an
#: import, a long run's catch-up), are written by binary ``COPY``: it costs PostgreSQL about
#: half the CPU per point of ``INSERT ... ON CONFLICT`` (BENCHMARKS.md, "Import from
#: TensorBoard, MLflow and W&B"). Smaller batches would not repay the extra round trips.
COPY_MIN_POINTS = 5_000
_PG_NEWEST = (
    "SELECT s.id, (SELECT max(step) FROM metric_points m WHERE m.series_id = s.id)"
    " FROM unnest(%(sids)b) AS s(id)"
)
_PG_COPY = "COPY metric_points (series_id, step, value, wall_time) FROM STDIN (FORMAT BINARY)"
_PG_COUNT = "UPDATE runs SET n_points = n_points + %(n)s WHERE id = %(run)s"


def _all_past_stored(cur: Any, cols: _Columns) -> bool:
    """Whether every point of the batch lies past its series' newest stored step (so none can
    be stored already), read under the run row's lock that ingest holds."""
    # cols is in (series, step) order without repeats: each series' first point is its least.
    first = np.ones(len(cols.step), dtype=bool)
    first[1:] = cols.series_id[1:] != cols.series_id[:-1]
    cur.execute(_PG_NEWEST, {"sids": Int4Array(cols.series_id[first])})
    newest = {int(sid): step for sid, step in cur.fetchall()}
    return all(newest[int(sid)] is None or int(step) > newest[int(sid)]
               for sid, step in zip(cols.series_id[first].tolist(), cols.step[first].tolist(),
                                    strict=True))


def _copy_points(cur: Any, run_id: uuid.UUID, cols: _Columns) -> None:
    """Write points none of which is stored yet: ``COPY`` (binary, numpy-encoded rows), then
    their rollups and the run's point count."""
    with cur.copy(_PG_COPY) as copy:
        copy.write(encode_rows(cols.series_id, cols.step, cols.value, cols.wall))
    cur.execute(PG_UPSERT.format(where=""),
                pg_params(aggregate_levels(cols.series_id, cols.step, cols.value)))
    cur.execute(_PG_COUNT, {"n": len(cols.step), "run": run_id})


@cache
def _stamp_processor(dialect: Dialect) -> Any:
    """How SQLAlchemy writes a timestamp on this dialect (SQLite keeps text in its own format:
    a hand-written statement must store the same)."""
    return Run.__table__.c.updated_at.type.bind_processor(dialect)


def _insert_sqlite(cur: Any, cols: _Columns) -> np.ndarray:
    """Insert the points not stored yet; returns the mask of those that were new.

    New points are the common case: inserted inside a savepoint (:func:`_insert_rows`), and
    the row count says whether every point was new. If not, the savepoint is rolled back, the
    points already stored are looked up per series, and only the others are inserted. The write
    transaction (BEGIN IMMEDIATE) excludes other writers, so what is found here is what the
    insert adds.
    """
    cur.execute("SAVEPOINT curvecast_points")
    if _insert_rows(cur, cols.flat()) == len(cols.step):
        cur.execute("RELEASE curvecast_points")
        return np.ones(len(cols.step), dtype=bool)
    cur.execute("ROLLBACK TO curvecast_points")
    cur.execute("RELEASE curvecast_points")
    new = np.ones(len(cols.step), dtype=bool)
    bounds = np.flatnonzero(np.append(True, cols.series_id[1:] != cols.series_id[:-1]))
    for start, end in zip(bounds, np.append(bounds[1:], len(cols.step)), strict=True):
        sid = int(cols.series_id[start])
        lo, hi = int(cols.step[start]), int(cols.step[end - 1])
        stored = [r[0] for r in cur.execute(_EXISTING_SQL, (sid, lo, hi)).fetchall()]
        if stored:
            new[start:end] = ~np.isin(cols.step[start:end], np.array(stored, dtype=np.int64))
    _insert_rows(cur, cols.flat(new))
    return new


def _insert_rows(cur: Any, flat: list[Any]) -> int:
    """Insert rows given as :meth:`_Columns.flat` parameters, ``_SQLITE_CHUNK`` rows a
    statement (the rest through ``executemany``); returns how many were new."""
    per = 4 * _SQLITE_CHUNK
    whole = len(flat) // per * per
    inserted = 0
    for start in range(0, whole, per):
        cur.execute(_SQLITE_INSERT_CHUNK, flat[start:start + per])
        inserted += cur.rowcount
    if whole < len(flat):
        rest = flat[whole:]
        cur.executemany(_SQLITE_INSERT, [rest[i:i + 4] for i in range(0, len(rest), 4)])
        inserted += cur.rowcount
    return int(inserted)


def _ingest_sqlite(
    dbapi: Any, dialect: Dialect, run_id: uuid.UUID, batch: MetricBatch,
    allowed_project: str | None, max_keys: int | None,
) -> tuple[int, int]:  # fmt: skip
    """(accepted, sent) of a batch on SQLite, in the caller's write transaction."""
    keys = list(batch.values)
    run = run_id.hex  # how the Uuid type stores it on SQLite
    cur = dbapi.cursor()
    try:
        rows = cur.execute(
            _SQLITE_SERIES.format(visible="" if allowed_project is None else _SQLITE_VISIBLE),
            {"run": run, "keys": json.dumps(keys), "project": allowed_project},
        ).fetchall()
        if not rows:
            raise _not_found(run_id)
        series_ids = {str(key): int(sid) for key, sid in rows if key is not None}
        missing = [key for key in keys if key not in series_ids]
        check_new_keys(cur, run_id=run_id, run_param=run, new=len(missing), limit=max_keys,
                       postgres=False)
        if missing:
            cur.executemany(_SQLITE_NEW_SERIES, [(run, key) for key in missing])
            found = cur.execute(
                "SELECT key, id FROM series WHERE run_id = ? AND key IN"
                " (SELECT value FROM json_each(?))", (run, json.dumps(missing))
            ).fetchall()
            series_ids.update((str(key), int(sid)) for key, sid in found)
        cols = _flatten(batch, series_ids)
        accepted = 0
        if len(cols.step):
            new = _insert_sqlite(cur, cols)
            accepted = int(new.sum())
            update_rollups(dbapi, cols.series_id[new], cols.step[new], cols.value[new], False)
        now: datetime = utcnow()
        processor = _stamp_processor(dialect)
        cur.execute(_SQLITE_TOUCH, {
            "run": run, "now": processor(now) if processor else now, "accepted": accepted,
            "max_step": batch.max_step(),
        })  # fmt: skip
    finally:
        cur.close()
    return accepted, cols.n_sent


def ingest_batch(
    session: Session, *, run_id: uuid.UUID, batch: MetricBatch, allowed_project: str | None,
    max_keys: int | None = None,
) -> IngestResult:
    """Store a columnar batch; points already stored are counted as duplicates and left as they
    are (the first value of a (run, key, step) wins).

    Raises:
        RunNotFound: the run does not exist, or ``allowed_project`` does not own it.
        TooManyKeys: the run would have more than ``max_keys`` keys (None: no limit).
    """
    conn = write_connection(session)
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None
    if conn.dialect.name == "postgresql":
        accepted, sent = _ingest_postgres(dbapi, run_id, batch, allowed_project, max_keys)
    else:
        accepted, sent = _ingest_sqlite(dbapi, conn.dialect, run_id, batch, allowed_project,
                                        max_keys)
    return IngestResult(accepted=accepted, duplicates=sent - accepted)
