"""Liveness: running runs whose client is gone are marked ``lost`` with a reason, and come back
to ``running`` when their client is heard from again; on both backends, through a real server.
The check takes its ``now`` as an argument, so thresholds are crossed without waiting."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.migrate import upgrade
from curvecast.service.models import Run
from curvecast.service.store._common import utcnow
from curvecast.service.worker import LivenessTask, mark_silent_runs
from curvecast.service.worker.liveness import MAX_CHECK_INTERVAL_S
from tests.support import thread_server, wait_for

STALLED_S, GONE_S = 100.0, 300.0


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database of its own: the check marks every silent run it can see."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'liveness.db'}"
    else:
        url = str(request.getfixturevalue("fresh_pg_url"))
    upgrade(url)
    return url


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(database_url=db_url, worker_enabled=False, stalled_after_s=STALLED_S,
                    client_gone_after_s=GONE_S)


@pytest.fixture
def server(settings: Settings) -> Iterator[str]:
    with thread_server(settings) as url:
        yield url


def _put(server: str, **body: Any) -> str:
    run_id = str(uuid.uuid4())
    resp = httpx.put(f"{server}/api/v1/runs/{run_id}", json={"project": "live", **body})
    assert resp.status_code == 201, resp.text
    return run_id


def _run(server: str, run_id: str) -> dict[str, Any]:
    resp = httpx.get(f"{server}/api/v1/runs/{run_id}")
    resp.raise_for_status()
    return dict(resp.json())


def _post_point(server: str, run_id: str, step: int) -> None:
    resp = httpx.post(f"{server}/api/v1/runs/{run_id}/metrics",
                      json={"steps": [step], "values": {"loss": [1.0]}})
    assert resp.status_code == 200, resp.text


def _stamp(settings: Settings, run_id: str, **times: datetime | None) -> None:
    """Arrange a run's timestamps (what would otherwise take minutes of real silence)."""
    engine = make_engine(settings)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            session.execute(update(Run).where(Run.id == uuid.UUID(run_id)).values(**times))
    finally:
        engine.dispose()


def test_only_runs_silent_with_their_client_gone_are_marked_lost(
    server: str, settings: Settings
) -> None:
    now = utcnow()
    long_ago = now - timedelta(seconds=10 * GONE_S)
    runs = {name: _put(server) for name in ("gone", "heartbeat", "recent_points", "young")}
    finished = _put(server)
    assert httpx.patch(f"{server}/api/v1/runs/{finished}",
                       json={"status": "finished"}).status_code == 200
    _stamp(settings, runs["gone"], created_at=long_ago, last_seen_at=long_ago,
           last_ingest_at=long_ago)
    # Points stopped long ago but the client still says it is there: the stall alert's case
    # (a hung loop whose client thread still heartbeats), not a lost client.
    _stamp(settings, runs["heartbeat"], created_at=long_ago, last_ingest_at=long_ago,
           last_seen_at=now - timedelta(seconds=GONE_S / 2))
    _stamp(settings, runs["recent_points"], created_at=long_ago, last_seen_at=long_ago,
           last_ingest_at=now - timedelta(seconds=GONE_S / 2))
    _stamp(settings, finished, created_at=long_ago, last_seen_at=long_ago)

    factory = make_sessionmaker(make_engine(settings))
    assert mark_silent_runs(factory, settings, now=now) == 1
    assert mark_silent_runs(factory, settings, now=now) == 0  # already marked

    gone = _run(server, runs["gone"])
    assert gone["status"] == "lost"
    assert gone["status_reason"].startswith("nothing from its client for 5 min")
    assert gone["ended_at"] is not None
    page = httpx.get(f"{server}/runs/{runs['gone']}")
    assert page.status_code == 200
    assert 'id="run-status-reason">(nothing from its client' in page.text
    for name in ("heartbeat", "recent_points", "young"):
        assert _run(server, runs[name])["status"] == "running", name
        assert _run(server, runs[name])["status_reason"] is None, name
    assert _run(server, finished)["status"] == "finished"


def test_a_lost_run_comes_back_with_points_a_heartbeat_or_a_new_put(
    server: str, settings: Settings
) -> None:
    factory = make_sessionmaker(make_engine(settings))
    later = utcnow() + timedelta(seconds=10 * GONE_S)
    by_points, by_heartbeat, by_put = _put(server), _put(server), _put(server)
    assert mark_silent_runs(factory, settings, now=later) == 3
    assert {_run(server, r)["status"] for r in (by_points, by_heartbeat, by_put)} == {"lost"}

    _post_point(server, by_points, 7)
    back = _run(server, by_points)
    assert (back["status"], back["status_reason"], back["ended_at"]) == ("running", None, None)
    assert back["last_step"] == 7

    beat = httpx.patch(f"{server}/api/v1/runs/{by_heartbeat}", json={})
    assert beat.status_code == 200 and beat.json()["status"] == "running"
    assert beat.json()["last_seen_at"] is not None
    # A resumed client creates its run again (idempotent PUT): it is back too.
    again = httpx.put(f"{server}/api/v1/runs/{by_put}", json={"project": "live"})
    assert again.status_code == 200 and again.json()["status"] == "running", again.text
    assert again.json()["status_reason"] is None and again.json()["ended_at"] is None


def test_lost_is_the_service_s_word_not_a_client_s(server: str) -> None:
    run_id = _put(server)
    resp = httpx.patch(f"{server}/api/v1/runs/{run_id}", json={"status": "lost"})
    assert resp.status_code == 422 and "status" in resp.json()["message"], resp.text
    listed = httpx.get(f"{server}/api/v1/runs", params={"status": "lost"})
    assert listed.status_code == 200 and listed.json()["runs"] == []


def test_by_default_a_silent_run_leaves_running_within_five_minutes() -> None:
    """The client heartbeats every minute; the service used to wait 30 minutes. Marked after
    client_gone_after_s of silence, by a check that runs at most a minute apart."""
    from curvecast.client._sender import HEARTBEAT_INTERVAL

    gone = Settings().client_gone_after_s
    assert gone + min(MAX_CHECK_INTERVAL_S, gone / 4) <= 300
    assert gone >= 3 * HEARTBEAT_INTERVAL  # a missed heartbeat or two is not a lost client


def test_a_status_the_client_set_is_never_revived(server: str) -> None:
    run_id = _put(server)
    resp = httpx.patch(f"{server}/api/v1/runs/{run_id}",
                       json={"status": "failed", "status_reason": "SIGTERM"})
    assert resp.status_code == 200
    assert (resp.json()["status"], resp.json()["status_reason"]) == ("failed", "SIGTERM")
    _post_point(server, run_id, 1)  # e.g. `curvecast sync` uploading spooled points later
    assert _run(server, run_id)["status"] == "failed"
    assert _run(server, run_id)["status_reason"] == "SIGTERM"
    crashed = _put(server)
    httpx.patch(f"{server}/api/v1/runs/{crashed}", json={"status": "crashed"})
    _post_point(server, crashed, 1)
    assert _run(server, crashed)["status"] == "crashed"


def test_the_reason_is_bounded_and_a_new_status_clears_it(server: str) -> None:
    run_id = _put(server)
    long = httpx.patch(f"{server}/api/v1/runs/{run_id}",
                       json={"status": "failed", "status_reason": "x" * 201})
    assert long.status_code == 422 and "status_reason" in long.json()["message"]
    httpx.patch(f"{server}/api/v1/runs/{run_id}",
                json={"status": "failed", "status_reason": "SIGTERM"})
    resp = httpx.patch(f"{server}/api/v1/runs/{run_id}", json={"status": "finished"})
    assert (resp.json()["status"], resp.json()["status_reason"]) == ("finished", None)
    alone = httpx.patch(f"{server}/api/v1/runs/{run_id}", json={"status_reason": "why"})
    assert alone.status_code == 422 and alone.json()["error_code"] == "invalid_request"
    assert "status_reason: give it together with the status" in alone.json()["message"]


def test_the_service_worker_marks_a_silent_run_lost(db_url: str) -> None:
    # The real worker thread, with thresholds small enough to cross while the test polls.
    settings = Settings(database_url=db_url, worker_interval_s=0.05, stalled_after_s=0.2,
                        client_gone_after_s=0.4)
    with thread_server(settings) as url:
        run_id = _put(url)
        _post_point(url, run_id, 1)
        run = wait_for(lambda: (r := _run(url, run_id))["status"] == "lost" and r, 30,
                       "the silent run marked lost")
        assert run["status_reason"].startswith("nothing from its client") and run["last_step"] == 1


def test_the_task_checks_at_most_every_minute_or_quarter_threshold(
    server: str, settings: Settings
) -> None:
    # The worker wakes its tasks on every ingest; this check runs at most every GONE_S / 4,
    # and at least every minute.
    every = min(MAX_CHECK_INTERVAL_S, GONE_S / 4)
    clock = [0.0]
    task = LivenessTask(clock=lambda: clock[0])
    factory = make_sessionmaker(make_engine(settings))
    long_ago = utcnow() - timedelta(seconds=10 * GONE_S)

    def silent_run() -> str:
        run_id = _put(server)
        _stamp(settings, run_id, created_at=long_ago, last_seen_at=long_ago)
        return run_id

    first = silent_run()
    assert task(factory, settings) == 0  # the first check waits: clients may be reconnecting
    assert _run(server, first)["status"] == "running"
    clock[0] = every
    assert task(factory, settings) == 0  # never "work found": the loop must not spin on it
    assert _run(server, first)["status"] == "lost"
    second = silent_run()
    clock[0] = 2 * every - 0.1
    task(factory, settings)
    assert _run(server, second)["status"] == "running"
    clock[0] = 2 * every
    task(factory, settings)
    assert _run(server, second)["status"] == "lost"
