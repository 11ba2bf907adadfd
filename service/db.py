"""Engine and session factory. The schema itself is owned by Alembic (``migrations/``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from curvecast.service.config import Settings

#: Execution option a store function sets on its first connection to say "this transaction
#: writes". On SQLite it turns the transaction's BEGIN into BEGIN IMMEDIATE, which takes the
#: write lock up front (waiting up to busy_timeout) instead of failing with "database is
#: locked" when a read transaction later tries to upgrade to a write.
WRITE_OPTION = "curvecast_write"


class Base(DeclarativeBase):
    """Declarative base for all curvecast tables."""


def make_engine(settings: Settings) -> Engine:
    """Create the engine for the configured database, tuned per backend."""
    url = settings.database_url
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_pre_ping=False,
        )
        _configure_sqlite(engine)
        return engine
    engine = create_engine(
        url,
        pool_size=10,
        max_overflow=20,
        # Fail fast while the database is down so requests answer 503 instead of hanging.
        pool_timeout=settings.db_connect_timeout_s,
        connect_args={"connect_timeout": settings.db_connect_timeout_s},
    )
    _ping_when_idle(engine, settings.db_ping_after_idle_s)
    return engine


def _ping_when_idle(engine: Engine, idle_s: float) -> None:
    """Check a pooled connection with a round trip before handing it out, but only if it sat
    in the pool for more than ``idle_s`` seconds.

    SQLAlchemy's ``pool_pre_ping`` pings on every checkout: one more round trip per request
    (and per worker transaction), each costing the service and PostgreSQL CPU, although a
    connection checked in a moment ago is as good as the answer it just gave. A connection
    that went stale (the database restarted, a proxy dropped it) has almost always been idle
    for a while; one that breaks within ``idle_s`` of its last use fails its request with a
    503, and SQLAlchemy then invalidates every connection older than the failure, as it does
    for any disconnect (the client hook retries; nothing is lost).
    """

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["checked_in_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("checked_in_at")
        if since is None or time.monotonic() - since <= idle_s:
            return  # new, or back in the pool a moment ago
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            alive = False
            reason = str(exc)
        else:
            reason = "ping failed"
        if not alive:
            # The pool throws this connection away and hands out another (a new one if need
            # be), as pool_pre_ping does.
            raise DisconnectionError(reason)


#: SQLite's ``wal_autocheckpoint``, in pages of 4 KiB (see ``_configure_sqlite``).
SQLITE_WAL_AUTOCHECKPOINT_PAGES = 10_000


def _configure_sqlite(engine: Engine) -> None:
    """WAL for concurrent readers, a busy timeout, and explicit BEGIN handling.

    pysqlite's own transaction handling is switched off so that SQLAlchemy emits BEGIN itself
    (the recipe from SQLAlchemy's SQLite dialect documentation), which lets write transactions
    use BEGIN IMMEDIATE.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        # Copy the WAL back into the database every ~40 MB of it rather than every ~4 MB (the
        # default 1,000 pages): ingest rewrites each series' last pages at every batch, and a
        # longer WAL copies each page once for many commits: less CPU per batch, and the
        # commit that checkpoints waits longer but ten times less often.
        cursor.execute(f"PRAGMA wal_autocheckpoint={SQLITE_WAL_AUTOCHECKPOINT_PAGES}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Session factory; objects stay readable after commit (the store converts them anyway)."""
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A managed session: commit on success, roll back on any error, always close."""
    session = factory()
    try:
        yield session
    except BaseException:
        end_session(session, commit=False)
        raise
    end_session(session, commit=True)


#: ``Session.info`` key set once :func:`end_session` ended the session.
SESSION_ENDED = "curvecast.ended"


def end_session(session: Session, *, commit: bool) -> None:
    """Commit (or roll back) and close ``session``; it is closed even if the commit fails, and
    marked ended (``session.info[SESSION_ENDED]``) for whoever else would end it."""
    try:
        if commit:
            session.commit()
        else:
            session.rollback()
    finally:
        session.info[SESSION_ENDED] = True
        session.close()
