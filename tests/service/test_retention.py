"""Deleting runs, on both backends: ``DELETE /api/v1/runs/{id}`` (admin) removes every row of
the run from every table and nothing of any other run; a deletion cut off half way is finished
by asking again; the retention setting makes the worker delete runs that ended long ago."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.migrate import upgrade
from curvecast.service.schemas import MetricBatch, RunCreate, RunUpdate
from curvecast.service.store import metrics as metric_store
from curvecast.service.store import retention
from curvecast.service.store import runs as run_store
from curvecast.service.store._common import utcnow
from curvecast.service.worker.alerts import evaluate_alerts
from curvecast.service.worker.refit import refit_due_runs
from curvecast.service.worker.retention import delete_expired_runs
from tests._servers import thread_server
from tests.support import create_token

#: Every table holding rows of a run, and how to count one run's rows in it.
COUNTS = {
    "runs": "SELECT count(*) FROM runs WHERE id = :run",
    "series": "SELECT count(*) FROM series WHERE run_id = :run",
    "metric_points": "SELECT count(*) FROM metric_points WHERE series_id IN "
    "(SELECT id FROM series WHERE run_id = :run)",
    "metric_rollups": "SELECT count(*) FROM metric_rollups WHERE series_id IN "
    "(SELECT id FROM series WHERE run_id = :run)",
    "fits": "SELECT count(*) FROM fits WHERE run_id = :run",
    "run_work": "SELECT count(*) FROM run_work WHERE run_id = :run",
    "alerts": "SELECT count(*) FROM alerts WHERE run_id = :run",
    "alert_eval": "SELECT count(*) FROM alert_eval WHERE run_id = :run",
    "alert_deliveries": "SELECT count(*) FROM alert_deliveries WHERE alert_id IN "
    "(SELECT id FROM alerts WHERE run_id = :run)",
    "alert_delivery_attempts": "SELECT count(*) FROM alert_delivery_attempts WHERE delivery_id "
    "IN (SELECT d.id FROM alert_deliveries d JOIN alerts a ON a.id = d.alert_id "
    "WHERE a.run_id = :run)",
}
SETTINGS_KW = {"worker_enabled": False}


@pytest.fixture(scope="module")
def factory(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(Settings(database_url=database_url))
    yield make_sessionmaker(engine)
    engine.dispose()


def _key(factory: sessionmaker[Session], run_id: uuid.UUID) -> object:
    return run_id.hex if factory.kw["bind"].dialect.name == "sqlite" else run_id


def counts(factory: sessionmaker[Session], run_id: uuid.UUID) -> dict[str, int]:
    with session_scope(factory) as s:
        return {t: int(s.execute(text(q), {"run": _key(factory, run_id)}).scalar_one())
                for t, q in COUNTS.items()}


def full_run(factory: sessionmaker[Session], project: str, steps: int = 3000) -> uuid.UUID:
    """A run with rows in every table: points and rollups, fits, a firing alert, a delivery
    with an attempt recorded."""
    run_id = uuid.uuid4()
    with session_scope(factory) as s:
        run_store.create_or_get_run(
            s, run_id=run_id, run_in=RunCreate(project=project, config={"total_steps": steps}),
            allowed_project=None,
        )
    for lo in range(0, steps, 1000):
        st = list(range(lo, lo + 1000))
        loss = [3.0 / math.sqrt(1 + s) + 1 if s < steps - 10 else math.nan for s in st]
        batch = MetricBatch(steps=st, values={"loss": loss, "opt/grad_l1": [1.0] * len(st)})
        with session_scope(factory) as s:
            metric_store.ingest_batch(s, run_id=run_id, batch=batch, allowed_project=None)
    settings = Settings(database_url="sqlite://", refit_min_interval_s=0)
    while refit_due_runs(factory, settings):
        pass
    while evaluate_alerts(factory, settings):
        pass
    with session_scope(factory) as s:  # a delivery and its attempt, as the outbox keeps them
        key = _key(factory, run_id)
        alert_id = s.execute(text("SELECT id FROM alerts WHERE run_id = :r"), {"r": key}).scalar()
        project_id = s.execute(text("SELECT project_id FROM runs WHERE id = :r"),
                               {"r": key}).scalar()
        s.execute(text("INSERT INTO webhooks (project_id, name, url, enabled, created_at) "
                       "VALUES (:p, 'w', 'https://x.example/h', :t, :now)"),
                  {"p": project_id, "t": True, "now": utcnow()})
        hook = s.execute(text("SELECT max(id) FROM webhooks")).scalar()
        delivery = uuid.uuid4()
        dkey = delivery.hex if factory.kw["bind"].dialect.name == "sqlite" else delivery
        s.execute(text("INSERT INTO alert_deliveries (id, webhook_id, alert_id, event, body, "
                       "status, attempts, next_attempt_at, created_at) VALUES (:d, :w, :a, "
                       "'firing', '{}', 'failed', 1, :now, :now)"),
                  {"d": dkey, "w": hook, "a": alert_id, "now": utcnow()})
        s.execute(text("INSERT INTO alert_delivery_attempts (delivery_id, attempt, at, "
                       "status_code) VALUES (:d, 1, :now, 500)"), {"d": dkey, "now": utcnow()})
    return run_id


def test_the_store_removes_every_row_of_the_run_and_only_its_rows(
    factory: sessionmaker[Session], project: str
) -> None:
    doomed, kept = full_run(factory, project), full_run(factory, project)
    before = counts(factory, doomed)
    assert all(n > 0 for n in before.values()), before
    kept_before = counts(factory, kept)
    batches: list[int] = []
    deleted = retention.delete_run(factory, doomed, batch=500,
                                   on_batch=lambda d: batches.append(d.total))
    assert counts(factory, doomed) == dict.fromkeys(COUNTS, 0)
    assert counts(factory, kept) == kept_before
    assert deleted.rows["metric_points"] == before["metric_points"]
    assert len(batches) > before["metric_points"] // 500  # many short transactions


def test_an_interrupted_deletion_is_finished_by_asking_again(
    factory: sessionmaker[Session], project: str
) -> None:
    run_id = full_run(factory, project)

    class Stop(Exception):
        pass

    def crash_after_three(d: retention.Deleted) -> None:
        if d.rows.get("metric_points", 0) >= 1500:
            raise Stop

    with pytest.raises(Stop):
        retention.delete_run(factory, run_id, batch=500, on_batch=crash_after_three)
    half = counts(factory, run_id)
    assert half["runs"] == 1 and 0 < half["metric_points"]
    retention.delete_run(factory, run_id)
    assert counts(factory, run_id) == dict.fromkeys(COUNTS, 0)


def test_delete_route_scopes_and_projects(database_url: str, factory: sessionmaker[Session],
                                          project: str) -> None:
    run_id = full_run(factory, project, steps=1000)
    admin = create_token(database_url, project, "admin")
    ingest = create_token(database_url, project, "ingest")
    other_admin = create_token(database_url, project + "-other", "admin")
    settings = Settings(database_url=database_url, auth_enabled=True, **SETTINGS_KW)
    with thread_server(settings) as url:
        path = f"{url}/api/v1/runs/{run_id}"

        def delete(token: str) -> httpx.Response:
            return httpx.delete(path, headers={"Authorization": f"Bearer {token}"}, timeout=60)

        assert delete(ingest).status_code == 403
        assert delete(other_admin).status_code == 404
        assert counts(factory, run_id)["metric_points"] == 2000  # untouched so far
        assert delete(admin).status_code == 204
        assert counts(factory, run_id) == dict.fromkeys(COUNTS, 0)
        assert delete(admin).status_code == 404
        late = httpx.post(f"{path}/metrics", json={"steps": [5000], "values": {"loss": [1.0]}},
                          headers={"Authorization": f"Bearer {ingest}"})
        assert late.status_code == 404 and late.json()["error_code"] == "run_not_found"


def test_retention_deletes_only_runs_that_ended_long_enough_ago(
    factory: sessionmaker[Session], project: str
) -> None:
    old_finished, running = full_run(factory, project, 1000), full_run(factory, project, 1000)
    recent = full_run(factory, project, 1000)
    for run_id in (old_finished, recent):
        with session_scope(factory) as s:
            run_store.update_run(s, run_id=run_id, run_in=RunUpdate(status="finished"),
                                 allowed_project=None)
    settings = Settings(database_url="sqlite://", retention_days=30)
    assert delete_expired_runs(factory, settings, now=utcnow() + timedelta(days=10)) == 0
    # 31 days on, only the runs that ended are old enough; a running run is never expired.
    later = utcnow() + timedelta(days=31)
    with session_scope(factory) as s:
        s.execute(text("UPDATE runs SET ended_at = :t WHERE id = :r"),
                  {"t": utcnow() + timedelta(days=5), "r": _key(factory, recent)})
    while delete_expired_runs(factory, settings, now=later):
        pass
    assert counts(factory, old_finished)["runs"] == 0
    assert counts(factory, recent)["runs"] == 1 and counts(factory, running)["runs"] == 1
    assert delete_expired_runs(factory, Settings(database_url="sqlite://"), now=later) == 0


def test_alert_rounds_pass_over_a_run_whose_deletion_is_in_flight(fresh_pg_url: str,
                                                                  project: str) -> None:
    """The race CI once hit: the worker gives every run an ``alert_eval`` row while a deletion
    has already removed the run's row there and is now deleting the run itself. The worker must
    neither wait for the deletion nor insert a row for a run that is going (a foreign-key error
    once the deletion commits). A database of its own: no other test's sessions hold locks."""
    from curvecast.service.store import alerts as alert_store

    upgrade(fresh_pg_url)
    engine = make_engine(Settings(database_url=fresh_pg_url))
    factory = make_sessionmaker(engine)
    try:
        run_id = full_run(factory, project, steps=1000)
        with session_scope(factory) as s:
            s.execute(text("DELETE FROM alert_eval WHERE run_id = :r"), {"r": run_id})
        with engine.connect() as deleting:  # the deletion's last step, not committed yet
            tx = deleting.begin()
            deleting.execute(text("SET LOCAL lock_timeout = '5s'"))
            deleting.execute(text("DELETE FROM runs WHERE id = :r"), {"r": run_id})
            with session_scope(factory) as s:
                # Waiting on the deletion's row lock would fail here, not hang the test.
                s.execute(text("SET LOCAL lock_timeout = '5s'"))
                alert_store.claim_eval_jobs(s, now=utcnow(), lease=timedelta(seconds=30),
                                            limit=10)
            tx.commit()
        with session_scope(factory) as s:
            alert_store.claim_eval_jobs(s, now=utcnow(), lease=timedelta(seconds=30), limit=10)
        assert counts(factory, run_id) == dict.fromkeys(COUNTS, 0)
    finally:
        engine.dispose()
