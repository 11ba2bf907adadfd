"""The PostgreSQL pool checks a connection only when it sat idle (``db_ping_after_idle_s``), and a
request's session is committed before its answer leaves, rolled back when the route fails.

Real PostgreSQL: a pooled connection's server process is ended with ``pg_terminate_backend``, as
a database restart or a dropped proxy connection would end it.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import psycopg
import pytest
import sqlalchemy as sa
from fastapi.routing import APIRoute
from sqlalchemy.exc import OperationalError

from curvecast.service.app import create_app
from curvecast.service.config import Settings
from curvecast.service.db import make_engine
from curvecast.service.deps import SessionDep
from curvecast.service.errors import Conflict
from curvecast.service.routing import OneHopRoute
from curvecast.service.store._common import write_connection
from curvecast.service.store.projects import ensure_project
from tests.support import serve_app


def _backend_pid(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(pg_url: str, pid: int) -> None:
    with psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://"),
                         autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # Until the server process is gone, the pooled connection might still answer.
        for _ in range(500):
            if admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                             (pid,)).fetchone() == (0,):
                return
            time.sleep(0.01)
    raise AssertionError(f"backend {pid} did not exit")


def _pings(engine: sa.Engine) -> list[int]:
    """Counts the dialect's pings (the round trip the pool makes before handing out)."""
    calls = [0]
    original = engine.dialect.do_ping

    def counting(dbapi_connection: Any) -> bool:
        calls[0] += 1
        return original(dbapi_connection)

    engine.dialect.do_ping = counting  # type: ignore[method-assign]
    return calls


def test_a_connection_used_a_moment_ago_is_not_pinged(pg_url: str) -> None:
    engine = make_engine(Settings(database_url=pg_url, db_ping_after_idle_s=60.0))
    try:
        pings = _pings(engine)
        first = _backend_pid(engine)
        for _ in range(5):
            assert _backend_pid(engine) == first  # the same pooled connection
        assert pings[0] == 0
    finally:
        engine.dispose()


def test_an_idle_connection_that_died_is_replaced_before_use(pg_url: str) -> None:
    engine = make_engine(Settings(database_url=pg_url, db_ping_after_idle_s=0.0))
    try:
        pings = _pings(engine)
        dead = _backend_pid(engine)
        _terminate(pg_url, dead)
        # Idle for longer than 0 s: pinged, found dead, replaced; the caller sees nothing.
        assert _backend_pid(engine) != dead
        assert pings[0] >= 1
    finally:
        engine.dispose()


def test_a_connection_that_died_within_the_idle_limit_fails_once_then_the_pool_recovers(
    pg_url: str,
) -> None:
    engine = make_engine(Settings(database_url=pg_url, db_ping_after_idle_s=60.0))
    try:
        dead = _backend_pid(engine)
        _terminate(pg_url, dead)
        with pytest.raises(OperationalError):  # not pinged: its request fails (a 503)
            _backend_pid(engine)
        # SQLAlchemy saw a disconnect and dropped the pool's connections: the next is new.
        assert _backend_pid(engine) != dead
    finally:
        engine.dispose()


def test_a_request_commits_before_it_answers_and_a_failed_one_writes_nothing(
    database_url: str,
) -> None:
    # Two routes on the real app, each writing through the request's session (SessionDep):
    # one returns, one fails after its write.
    app = create_app(Settings(database_url=database_url, worker_enabled=False))
    tag = uuid.uuid4().hex[:12]
    _check_commits_and_rollbacks(app, database_url, tag, method="POST")


def test_a_read_route_commits_before_it_answers_and_a_failed_one_writes_nothing(
    database_url: str,
) -> None:
    # OneHopRoute (every GET of the API and the chart routes) commits and closes the session in
    # the endpoint's thread; what a client sees is what the dependency's teardown gave.
    app = create_app(Settings(database_url=database_url, worker_enabled=False))
    tag = uuid.uuid4().hex[:12]
    _check_commits_and_rollbacks(app, database_url, tag, method="GET", route_class=OneHopRoute)


def _check_commits_and_rollbacks(app: Any, database_url: str, tag: str, *, method: str,
                                 route_class: type[APIRoute] | None = None) -> None:
    def write(session: SessionDep, name: str) -> dict[str, str]:
        write_connection(session)
        ensure_project(session, name=name)
        return {"stored": name}

    def write_then_fail(session: SessionDep, name: str) -> dict[str, str]:
        write_connection(session)
        ensure_project(session, name=name)
        raise Conflict(f"{name} conflicts")

    for path, endpoint in (("/test/write", write), ("/test/write-then-fail", write_then_fail)):
        app.router.add_api_route(path, endpoint, methods=[method],
                                 route_class_override=route_class)
    engine = make_engine(Settings(database_url=database_url))

    def stored(name: str) -> bool:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT count(*) FROM projects WHERE name = :n"),
                                {"n": name}).scalar_one() == 1

    try:
        with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
            resp = client.request(method, "/test/write", params={"name": f"ok-{tag}"})
            assert resp.status_code == 200, resp.text
            assert stored(f"ok-{tag}")  # committed before the answer was sent
            resp = client.request(method, "/test/write-then-fail",
                                  params={"name": f"failed-{tag}"})
            assert resp.status_code == 409
            assert resp.json()["error_code"] == "conflict"
            assert not stored(f"failed-{tag}")  # rolled back
            # The session's connection went back to the pool clean: the next request works.
            again = client.request(method, "/test/write", params={"name": f"after-{tag}"})
            assert again.status_code == 200
            assert stored(f"after-{tag}")
    finally:
        engine.dispose()


def test_sqlite_connections_checkpoint_a_longer_wal(sqlite_url: str) -> None:
    """Every SQLite connection of the service writes ahead to a WAL of ~40 MB before copying it
    back (fewer copies of the pages each ingest batch rewrites), with the other settings."""
    from curvecast.service.db import SQLITE_WAL_AUTOCHECKPOINT_PAGES

    engine = make_engine(Settings(database_url=sqlite_url))
    try:
        with engine.connect() as conn:
            pragma = {name: conn.exec_driver_sql(f"PRAGMA {name}").scalar() for name in (
                "wal_autocheckpoint", "journal_mode", "synchronous", "foreign_keys")}
    finally:
        engine.dispose()
    assert pragma == {"wal_autocheckpoint": SQLITE_WAL_AUTOCHECKPOINT_PAGES,
                      "journal_mode": "wal", "synchronous": 1, "foreign_keys": 1}
    assert SQLITE_WAL_AUTOCHECKPOINT_PAGES > 1_000, "longer than SQLite's default"
