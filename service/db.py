"""Engine and session factory. The schema itself is owned by Alembic (``migrations/``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
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
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=20,
        # Fail fast while the database is down so requests answer 503 instead of hanging.
        pool_timeout=settings.db_connect_timeout_s,
        connect_args={"connect_timeout": settings.db_connect_timeout_s},
    )


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
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
