"""Helpers shared by the store modules."""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Connection, Insert, Select, Table, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from curvecast.service.db import WRITE_OPTION
from curvecast.service.errors import NotFound
from curvecast.service.models import Project, Run, Series


def utcnow() -> datetime:
    """Timezone-aware current time in UTC."""
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """SQLite returns naive datetimes; everything curvecast stores is UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def write_connection(session: Session) -> Connection:
    """The session's connection, marked as a write transaction (BEGIN IMMEDIATE on SQLite).

    Call this before the first statement of a function that writes. Calling it again in the
    same transaction is fine; calling it after a read already began the transaction on SQLite
    is a bug (the transaction could not upgrade safely) and raises.
    """
    if not session.in_transaction():
        return session.connection(execution_options={WRITE_OPTION: True})
    conn = session.connection()
    if conn.dialect.name == "sqlite" and not conn.get_execution_options().get(WRITE_OPTION):
        raise RuntimeError("write_connection() must come before the transaction's first read")
    return conn


def is_postgres(session: Session) -> bool:
    """Whether the session talks to PostgreSQL (else SQLite)."""
    return session.get_bind().dialect.name == "postgresql"


def keep_run(session: Session, run_id: uuid.UUID) -> bool:
    """Whether the run exists, kept so until the transaction ends: on PostgreSQL a ``KEY
    SHARE`` lock on its row, which a deletion of the run waits for (ingest's ``UPDATE`` does
    not); on SQLite the write transaction the caller opened already excludes the deletion.
    For the derived rows a worker writes after reading the run (fits): a run deleted
    meanwhile is skipped instead of failing its foreign key and the worker's whole round."""
    found = session.scalar(
        select(Run.id).where(Run.id == run_id).with_for_update(key_share=True, read=True))
    return found is not None


def insert_ignore(session: Session, table: Table, **values: Any) -> Insert:
    """``INSERT ... ON CONFLICT DO NOTHING`` in the session's dialect."""
    dialect_insert = postgresql.insert if is_postgres(session) else sqlite.insert
    return dialect_insert(table).values(**values).on_conflict_do_nothing()


#: Keys a "no such series" message names at most (a run may log up to a thousand).
NAMED_KEYS = 20


def no_such_series(run_id: uuid.UUID, missing: Sequence[str], present: Sequence[str]) -> str:
    """The message of a read that names series the run does not have: which, and the keys it
    has (a typo is then plain), or that it has none yet. Every such read (points, export,
    forecast) answers it with 404."""
    what = ", ".join(repr(k) for k in missing)
    if not present:
        return f"run {run_id} has no series {what}: it has logged no points yet"
    shown = ", ".join(present[:NAMED_KEYS])
    more = f" and {len(present) - NAMED_KEYS} more" if len(present) > NAMED_KEYS else ""
    return f"run {run_id} has no series {what}; the keys it has: {shown}{more}"


def require_series(session: Session, run_id: uuid.UUID, keys: Sequence[str] | None,
                   found: Mapping[str, int]) -> None:
    """Raise NotFound, naming the run's keys, if ``keys`` names a series the run lacks
    (``found``: the run's series among ``keys``)."""
    missing = [k for k in dict.fromkeys(keys or ()) if k not in found]
    if missing:
        present = [k for k, _ in run_series(session, run_id)]
        raise NotFound(no_such_series(run_id, missing, present))


def run_created_at(session: Session, run_id: uuid.UUID, allowed_project: str | None
                   ) -> datetime | None:
    """The run's creation time; None when there is no such run, or ``allowed_project`` (if
    given) does not own it. The check every read of a run's data starts with."""
    created: datetime | None = session.scalar(
        _run_created_statement(allowed_project is not None),
        {"run_id": run_id, "project": allowed_project})
    return created


def run_series(session: Session, run_id: uuid.UUID, keys: Sequence[str] | None = None
               ) -> list[tuple[str, int]]:
    """The (key, series id) pairs of a run, in key order (``keys`` only, if given)."""
    rows = session.execute(_run_series_statement(bool(keys)),
                           {"run_id": run_id, "keys": list(keys or ())})
    return [(str(k), int(i)) for k, i in rows]


# The two statements above run at every page poll, read and alert round. Built once per shape:
# building a SELECT and its cache key cost more CPU than SQLite's execution of it (see
# ``store.forecasts``).

@cache
def _run_created_statement(by_project: bool) -> Select[Any]:
    """Parameters: ``run_id``, ``project``."""
    stmt = select(Run.created_at).where(Run.id == bindparam("run_id"))
    if by_project:
        stmt = stmt.join(Project).where(Project.name == bindparam("project"))
    return stmt


@cache
def _run_series_statement(by_keys: bool) -> Select[str, int]:
    """Parameters: ``run_id``, ``keys``."""
    stmt = (select(Series.key, Series.id).where(Series.run_id == bindparam("run_id"))
            .order_by(Series.key))
    if by_keys:
        stmt = stmt.where(Series.key.in_(bindparam("keys", expanding=True)))
    return stmt


def series_points(
    session: Session, *, series_id: int, lo: int | None = None, hi: int | None = None,
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Steps and values of one series with ``lo <= step <= hi`` (either bound optional), by step;
    a NULL value (a NaN that was sent) comes back as NaN.

    The read the worker repeats every round (the alert rules' windows, a refit's series), so it
    skips SQLAlchemy's per-row work and goes through the session's own DB-API cursor. On
    PostgreSQL each column comes back as one ``bytea`` of big-endian binary values, read with
    ``np.frombuffer``: building a Python tuple per row and parsing its text was most of the
    service's CPU in such a read, and cost PostgreSQL more CPU too. SQLite's rows are already
    native values: ``np.fromiter`` over them.
    """
    postgres = is_postgres(session)
    mark = "%s" if postgres else "?"
    where, params = [f"series_id = {mark}"], [series_id]
    if lo is not None:
        where.append(f"step >= {mark}")
        params.append(lo)
    if hi is not None:
        where.append(f"step <= {mark}")
        params.append(hi)
    if postgres:
        sql = f"SELECT {_BINARY_COLUMNS} FROM metric_points WHERE {' AND '.join(where)}"
        return _columns(*_fetch(session, sql, params, binary=True)[0])
    sql = f"SELECT step, value FROM metric_points WHERE {' AND '.join(where)} ORDER BY step"
    rows = _fetch(session, sql, params)
    steps = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    values = np.fromiter((math.nan if r[1] is None else r[1] for r in rows),
                         dtype=np.float64, count=len(rows))
    return steps, values


def series_points_many(
    session: Session, *, ranges: Mapping[int, tuple[int, int]]
) -> dict[int, tuple[NDArray[np.int64], NDArray[np.float64]]]:
    """:func:`series_points` of several series, each with its own ``(lo, hi)``: one statement
    on PostgreSQL (an alert round reads a run's watched series together). A series with no
    points in its range may be left out of the answer."""
    if not ranges:
        return {}
    if not is_postgres(session):
        return {sid: series_points(session, series_id=sid, lo=lo, hi=hi)
                for sid, (lo, hi) in ranges.items()}
    sql = (
        f"SELECT series_id, {_BINARY_COLUMNS}"
        " FROM unnest(%s::int4[], %s::int8[], %s::int8[]) AS r(sid, lo, hi)"
        " JOIN metric_points ON series_id = r.sid AND step BETWEEN r.lo AND r.hi"
        " GROUP BY series_id"
    )
    sids = list(ranges)
    params = [sids, [ranges[s][0] for s in sids], [ranges[s][1] for s in sids]]
    rows = _fetch(session, sql, params, binary=True)
    return {int(sid): _columns(steps, values) for sid, steps, values in rows}


#: A series' steps and values as two ``bytea`` columns of big-endian int8 and float8 (NULL
#: values as NaN), in no particular order: sorting in the aggregate costs PostgreSQL more than
#: numpy's check in :func:`_columns` (the rows nearly always arrive in index order already).
_BINARY_COLUMNS = (
    "string_agg(int8send(step), ''::bytea),"
    " string_agg(float8send(COALESCE(value, 'NaN')), ''::bytea)"
)


def _columns(steps_bytes: bytes | None, values_bytes: bytes | None
             ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Steps and values from :data:`_BINARY_COLUMNS` (NULL when no row matched), by step."""
    steps = np.frombuffer(steps_bytes or b"", dtype=">i8").astype(np.int64)
    values = np.frombuffer(values_bytes or b"", dtype=">f8").astype(np.float64)
    if steps.size > 1 and not bool(np.all(steps[1:] > steps[:-1])):
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order], values[order]
    return steps, values


def _fetch(session: Session, sql: str, params: list[Any], *, binary: bool = False) -> list[Any]:
    """All rows of ``sql`` from the session's DB-API connection (in its transaction)."""
    dbapi: Any = session.connection().connection.dbapi_connection
    cursor = dbapi.cursor(binary=True) if binary else dbapi.cursor()
    try:
        cursor.execute(sql, tuple(params))
        return list(cursor.fetchall())
    finally:
        cursor.close()
