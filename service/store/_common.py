"""Helpers shared by the store modules."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Connection, Insert, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from curvecast.service.db import WRITE_OPTION


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


def insert_ignore(session: Session, table: Table, **values: Any) -> Insert:
    """``INSERT ... ON CONFLICT DO NOTHING`` in the session's dialect."""
    dialect_insert = postgresql.insert if is_postgres(session) else sqlite.insert
    return dialect_insert(table).values(**values).on_conflict_do_nothing()


def series_points(
    session: Session, *, series_id: int, lo: int | None = None, hi: int | None = None,
    skip_null: bool = False,
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Steps and values of one series with ``lo <= step <= hi`` (either bound optional), by step;
    a NULL value (a NaN that was sent) comes back as NaN, or is left out with ``skip_null``.

    The read the worker repeats every round (the alert rules' windows, a refit's series) goes
    through the session's own DB-API cursor: plain tuples, none of SQLAlchemy's per-row work
    (which was most of such a read), and the columns taken with ``np.fromiter``.
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
    if skip_null:
        where.append("value IS NOT NULL")
    sql = f"SELECT step, value FROM metric_points WHERE {' AND '.join(where)} ORDER BY step"
    dbapi: Any = session.connection().connection.dbapi_connection
    cursor = dbapi.cursor()
    try:
        cursor.execute(sql, tuple(params))
        rows = cursor.fetchall()
    finally:
        cursor.close()
    steps = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    values = np.fromiter((math.nan if r[1] is None else r[1] for r in rows),
                         dtype=np.float64, count=len(rows))
    return steps, values
