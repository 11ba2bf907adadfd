"""Helpers shared by the store modules."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

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
