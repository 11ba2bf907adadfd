"""Alert lifecycle at the edges of a run's life, on both backends: a run that ends closes its
open alerts with a reason and late points cannot re-fire them; a database that goes away during
an evaluation round is one warning (not a traceback per run) and the round's leases are given
back."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.models import Alert, AlertEval
from curvecast.service.schemas import MetricBatch, RunCreate, RunUpdate
from curvecast.service.store import metrics as metric_store
from curvecast.service.store import runs as run_store
from curvecast.service.worker.alerts import evaluate_alerts
from curvecast.service.worker.loop import _TaskThread

SETTINGS = Settings(database_url="sqlite://")


def _new_run(factory: sessionmaker[Session], project: str) -> uuid.UUID:
    run_id = uuid.uuid4()
    with session_scope(factory) as s:
        run_store.create_or_get_run(
            s,
            run_id=run_id,
            run_in=RunCreate(project=project, config={"total_steps": 1000}),
            allowed_project=None,
        )
    return run_id


def _log(factory: sessionmaker[Session], run_id: uuid.UUID, steps: range, loss: float) -> None:
    batch = MetricBatch(steps=list(steps), values={"loss": [loss] * len(steps)})
    with session_scope(factory) as s:
        metric_store.ingest_batch(s, run_id=run_id, batch=batch, allowed_project=None)


def _evaluate_all(factory: sessionmaker[Session]) -> None:
    while evaluate_alerts(factory, SETTINGS):
        pass


def _alerts(factory: sessionmaker[Session], run_id: uuid.UUID) -> list[tuple[str, str, str]]:
    with session_scope(factory) as s:
        rows = s.execute(
            select(Alert.rule, Alert.state, Alert.description)
            .where(Alert.run_id == run_id)
            .order_by(Alert.id)
        ).all()
    return [(r[0], r[1], r[2]) for r in rows]


@pytest.mark.parametrize("status", ["finished", "failed"])
def test_a_run_that_ends_resolves_its_alerts_and_late_points_fire_nothing(
    factory: sessionmaker[Session], project: str, status: str
) -> None:
    run_id = _new_run(factory, project)
    _log(factory, run_id, range(0, 20), 2.0)
    _log(factory, run_id, range(20, 30), math.nan)
    _evaluate_all(factory)
    assert [(r, st) for r, st, _ in _alerts(factory, run_id)] == [("non_finite", "firing")]

    with session_scope(factory) as s:
        run_store.update_run(
            s, run_id=run_id, run_in=RunUpdate(status=status), allowed_project=None
        )
    _evaluate_all(factory)
    [(rule, state, description)] = _alerts(factory, run_id)
    assert (rule, state) == ("non_finite", "resolved")
    assert f"Resolved: run ended ({status}) while the condition still held." in description

    # Points that arrive after the end (a late retry) are judged, and nothing stays open.
    _log(factory, run_id, range(30, 40), math.nan)
    _evaluate_all(factory)
    assert {st for _, st, _ in _alerts(factory, run_id)} == {"resolved"}


def test_points_sent_just_before_the_end_are_judged_first(
    factory: sessionmaker[Session], project: str
) -> None:
    """A client flushes its last batch and finishes at once: the worker sees the run ended
    with points it has not judged. The alert they call for is recorded (and closed)."""
    run_id = _new_run(factory, project)
    _log(factory, run_id, range(0, 20), 2.0)
    _evaluate_all(factory)
    _log(factory, run_id, range(20, 30), math.nan)
    with session_scope(factory) as s:
        run_store.update_run(
            s, run_id=run_id, run_in=RunUpdate(status="failed"), allowed_project=None
        )
    _evaluate_all(factory)
    [(rule, state, description)] = _alerts(factory, run_id)
    assert (rule, state) == ("non_finite", "resolved")
    assert "NaN or infinite" in description
    assert "Resolved: run ended (failed) while the condition still held." in description


class _Outage:
    """Hands out sessions of a real working database or of a real unreachable one (a closed
    port), in a scripted order: the database going away between two steps of a round."""

    def __init__(self, working: sessionmaker[Session], script: list[bool]) -> None:
        self.working = working
        self.dead = make_sessionmaker(
            make_engine(Settings(database_url="postgresql://curvecast@127.0.0.1:9/none"))
        )
        self.script = script

    def __call__(self, **kwargs: Any) -> Session:
        up = self.script.pop(0) if self.script else False
        return (self.working if up else self.dead)(**kwargs)


@pytest.fixture
def three_runs_with_news(factory: sessionmaker[Session], project: str) -> Iterator[list[uuid.UUID]]:
    _evaluate_all(factory)  # nothing of other tests left to claim
    runs = [_new_run(factory, project) for _ in range(3)]
    for run_id in runs:
        _log(factory, run_id, range(0, 10), 2.0)
    yield runs
    _evaluate_all(factory)


def test_an_outage_mid_round_is_one_error_and_gives_the_leases_back(
    factory: sessionmaker[Session],
    three_runs_with_news: list[uuid.UUID],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Claim works, the first run's evaluation finds the database gone, the release works.
    outage = _Outage(factory, [True, False, True])
    with caplog.at_level(logging.WARNING), pytest.raises(OperationalError):
        evaluate_alerts(outage, SETTINGS)  # type: ignore[arg-type]
    assert not [r for r in caplog.records if r.exc_info], "no traceback per run"
    with session_scope(factory) as s:
        leases = (
            s.execute(
                select(AlertEval.lease_until).where(AlertEval.run_id.in_(three_runs_with_news))
            )
            .scalars()
            .all()
        )
    assert leases == [None, None, None]


def test_the_worker_logs_an_outage_once_and_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = {"n": 0}

    def task(_factory: sessionmaker[Session], _settings: Settings) -> int:
        calls["n"] += 1
        if calls["n"] <= 5:
            raise OperationalError("SELECT 1", {}, Exception("connection refused"))
        return 1

    import threading

    thread = _TaskThread(
        task, make_sessionmaker(make_engine(SETTINGS)), SETTINGS, threading.Event()
    )
    with caplog.at_level(logging.WARNING):
        results = [thread._round() for _ in range(7)]
    assert results == [0, 0, 0, 0, 0, 1, 1]
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "database unavailable" in m]) == 1
    assert len([m for m in messages if "database back" in m]) == 1


def test_a_lost_run_keeps_its_alerts_and_its_silence_raises_stalled(tmp_path: Any) -> None:
    """``lost`` is not an end (the client may come back): the service marking a run lost closes
    none of its alerts, and the run's silence goes on being watched, so on-call hears of a run
    that died without a word; its next point makes it running and resolves the stall."""
    import httpx

    from curvecast.service.migrate import upgrade
    from tests.support import thread_server, wait_for

    url = f"sqlite:///{tmp_path / 'lost.db'}"
    upgrade(url)
    settings = Settings(database_url=url, worker_interval_s=0.05, stalled_after_s=1.5,
                        client_gone_after_s=0.3, alert_eval_min_interval_s=0)
    with thread_server(settings) as server:
        run_id = str(uuid.uuid4())
        base = f"{server}/api/v1/runs/{run_id}"
        httpx.put(base, json={"project": "lost", "config": {"total_steps": 1000}})
        steps = list(range(30))
        httpx.post(f"{base}/metrics", json={
            "steps": steps, "values": {"loss": [2.0] * 20 + ["NaN"] * 10}}).raise_for_status()

        def alerts() -> dict[str, str]:
            body = httpx.get(f"{server}/api/v1/alerts", params={"run_id": run_id}).json()
            return {a["rule"]: a["state"] for a in body["alerts"]}

        wait_for(lambda: httpx.get(base).json()["status"] == "lost", 30, "the run lost")
        wait_for(lambda: alerts().get("stalled") == "firing", 30, "stalled firing")
        assert httpx.get(base).json()["status"] == "lost"
        assert alerts()["non_finite"] == "firing"
        httpx.post(f"{base}/metrics", json={"steps": [30], "values": {"loss": [2.0]}})
        assert httpx.get(base).json()["status"] == "running"
        wait_for(lambda: alerts().get("stalled") == "resolved", 30, "stalled resolved")
