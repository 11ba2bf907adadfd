"""The alert store on both backends: one open alert per (run, rule), leases that keep workers
apart and expire, and an evaluation that lost its lease writes nothing."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from sqlalchemy import insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.alerting.engine import Transition
from curvecast.service.alerting.lifecycle import Event
from curvecast.service.db import session_scope
from curvecast.service.models import Alert, AlertDelivery, Run, Webhook
from curvecast.service.schemas import RunCreate
from curvecast.service.schemas.alerts import EvalJob
from curvecast.service.store import alerts as alert_store
from curvecast.service.store import runs as run_store
from curvecast.service.store import webhooks as webhook_store
from curvecast.service.store._common import utcnow
from curvecast.service.worker.alerts import apply_evaluation


def _run(factory: sessionmaker[Session], project: str) -> uuid.UUID:
    run_id = uuid.uuid4()
    with session_scope(factory) as s:
        run_store.create_or_get_run(s, run_id=run_id, run_in=RunCreate(project=project),
                                    allowed_project=None)
    with session_scope(factory) as s:  # pretend points arrived
        s.execute(update(Run).where(Run.id == run_id).values(n_points=10, last_step=9,
                                                            last_ingest_at=utcnow()))
    return run_id


def _claim(factory: sessionmaker[Session], run_id: uuid.UUID) -> EvalJob | None:
    with session_scope(factory) as s:
        jobs = alert_store.claim_eval_jobs(s, now=utcnow(), lease=timedelta(seconds=60),
                                           limit=1000)
    return next((j for j in jobs if j.run_id == run_id), None)


def test_a_run_with_new_points_waits_out_the_minimum_interval(
    factory: sessionmaker[Session], project: str
) -> None:
    run_id = _run(factory, project)
    job = _claim(factory, run_id)
    assert job is not None
    evaluated = utcnow()
    with session_scope(factory) as s:
        assert apply_evaluation(
            s, job=job, transitions=[], state={}, evaluated_step=9, n_points=10,
            next_check_at=None, now=evaluated, public_url="http://x")
    with session_scope(factory) as s:  # more points arrive right away
        s.execute(update(Run).where(Run.id == run_id).values(n_points=20, last_step=19))

    def claim(at: datetime) -> list[uuid.UUID]:
        with session_scope(factory) as s:
            jobs = alert_store.claim_eval_jobs(s, now=at, lease=timedelta(seconds=60),
                                               limit=1000, min_interval=timedelta(seconds=5))
            for j in jobs:
                alert_store.release_eval_job(s, job=j)
        return [j.run_id for j in jobs]

    assert run_id not in claim(evaluated + timedelta(seconds=4))
    assert run_id in claim(evaluated + timedelta(seconds=5))


def _firing(rule: str = "non_finite") -> Transition:
    return Transition(rule, Event("firing", 5, 1.0, 5), "critical", "s", "d", "loss")


def test_one_open_alert_per_run_and_rule(factory: sessionmaker[Session], project: str) -> None:
    run_id = _run(factory, project)
    job = _claim(factory, run_id)
    assert job is not None
    with session_scope(factory) as s:
        assert apply_evaluation(
            s, job=job, transitions=[_firing()], state={}, evaluated_step=9, n_points=10,
            next_check_at=None, now=utcnow(), public_url="http://x")
    with pytest.raises(IntegrityError), session_scope(factory) as s:
        s.execute(insert(Alert).values(
            run_id=run_id, project_id=job.project_id, rule="non_finite", state="pending",
            severity="critical", summary="", description="", labels={}, started_at=utcnow(),
            updated_at=utcnow()))
    with session_scope(factory) as s:  # resolved ones are history: any number
        for _ in range(2):
            s.execute(insert(Alert).values(
                run_id=run_id, project_id=job.project_id, rule="non_finite", state="resolved",
                severity="critical", summary="", description="", labels={},
                started_at=utcnow(), updated_at=utcnow()))


def test_claimed_runs_are_leased_and_a_lost_lease_writes_nothing(
    factory: sessionmaker[Session], project: str
) -> None:
    run_id = _run(factory, project)
    job = _claim(factory, run_id)
    assert job is not None
    assert _claim(factory, run_id) is None  # leased: nobody else gets it
    with session_scope(factory) as s:
        alert_store.release_eval_job(s, job=job)
    second = _claim(factory, run_id)  # released: claimable again, with a new token
    assert second is not None and second.token != job.token
    with session_scope(factory) as s:
        ok = apply_evaluation(
            s, job=job, transitions=[_firing()], state={}, evaluated_step=9, n_points=10,
            next_check_at=None, now=utcnow(), public_url="http://x")
    assert ok is False
    with session_scope(factory) as s:
        assert s.scalars(select(Alert).where(Alert.run_id == run_id)).all() == []


def _fire_with_webhook(factory: sessionmaker[Session], project: str,
                       transitions: list[Transition] | None = None) -> int:
    """A webhook of ``project``, then an evaluation of a new run of it with ``transitions``
    (default: an alert fires), so outbox rows are written for the webhook; returns its id."""
    from curvecast.service.schemas.alerts import WebhookIn

    with session_scope(factory) as s:
        hook = webhook_store.create_webhook(
            s, project=project, webhook_in=WebhookIn(url="http://127.0.0.1:9/h"),
            shown_url="http://127.0.0.1:9/h", sealed_url=None, stored_secret=None, now=utcnow(),
            allowed_project=None)
    run_id = _run(factory, project)
    job = _claim(factory, run_id)
    assert job is not None
    with session_scope(factory) as s:
        assert apply_evaluation(
            s, job=job, transitions=transitions or [_firing()], state={}, evaluated_step=9,
            n_points=10, next_check_at=None, now=utcnow(), public_url="http://x")
    return hook.id


def test_outbox_rows_are_written_with_the_alert_and_leased_for_sending(
    factory: sessionmaker[Session], project: str
) -> None:
    hook_id = _fire_with_webhook(factory, project)
    with session_scope(factory) as s:
        rows = s.scalars(select(AlertDelivery).where(AlertDelivery.webhook_id == hook_id)).all()
        assert [r.event for r in rows] == ["firing"] and rows[0].status == "pending"
    now = utcnow()
    with session_scope(factory) as s:
        first = webhook_store.claim_deliveries(s, now=now, lease=timedelta(seconds=30),
                                               limit=100)
    assert hook_id in {_webhook_of(factory, d.id) for d in first}
    with session_scope(factory) as s:
        again = webhook_store.claim_deliveries(s, now=now, lease=timedelta(seconds=30),
                                               limit=100)
    assert {d.id for d in again}.isdisjoint({d.id for d in first})
    with session_scope(factory) as s:  # the lease expires: another sender may take it
        later = webhook_store.claim_deliveries(s, now=now + timedelta(seconds=31),
                                               lease=timedelta(seconds=30), limit=100)
    assert {d.id for d in first} <= {d.id for d in later}


def _webhook_of(factory: sessionmaker[Session], delivery_id: uuid.UUID) -> int:
    with session_scope(factory) as s:
        return int(s.scalar(select(AlertDelivery.webhook_id)
                            .where(AlertDelivery.id == delivery_id)))  # type: ignore[arg-type]


def test_deleting_a_webhook_drops_its_deliveries(factory: sessionmaker[Session],
                                                 project: str) -> None:
    hook_id = _fire_with_webhook(factory, project)
    with session_scope(factory) as s:
        webhook_store.delete_webhook(s, project=project, webhook_id=hook_id, allowed_project=None)
    with session_scope(factory) as s:
        assert s.scalars(select(Webhook).where(Webhook.id == hook_id)).all() == []
        assert s.scalars(select(AlertDelivery)
                         .where(AlertDelivery.webhook_id == hook_id)).all() == []


def test_an_alerts_notifications_leave_in_order_even_from_one_round(
    factory: sessionmaker[Session], project: str
) -> None:
    """One evaluation round fires and resolves an alert (a run evaluated after a burst of
    points): the webhook gets the firing first; the resolution waits until it is delivered."""
    resolved = Transition("non_finite", Event("resolved", 8, 0.0, 5), "critical", "s", "d",
                          "loss")
    hook_id = _fire_with_webhook(factory, project, [_firing(), resolved])

    def claim_mine(now: datetime) -> list[str]:
        with session_scope(factory) as s:
            jobs = webhook_store.claim_deliveries(s, now=now, lease=timedelta(seconds=30),
                                                  limit=100)
            mine = {d.id: d for d in jobs if _webhook_of(factory, d.id) == hook_id}
            events = {r.id: r.event for r in s.scalars(
                select(AlertDelivery).where(AlertDelivery.id.in_(list(mine))))}
        for delivery in mine.values():
            with session_scope(factory) as s:
                webhook_store.record_attempt(
                    s, job=delivery, at=now, status_code=200, error=None, duration_ms=1.0,
                    delivered=True, next_attempt_at=None)
        return [events[d] for d in mine]

    now = utcnow()
    assert claim_mine(now) == ["firing"]  # the resolution waited for it
    assert claim_mine(now + timedelta(seconds=1)) == ["resolved"]


def test_points_of_several_series_are_read_in_one_go_each_in_its_own_range(
    factory: sessionmaker[Session], project: str
) -> None:
    """The alert round's read (one statement on PostgreSQL, binary columns): every series in
    its own step range, by step, NaN kept as NaN, a series with nothing in range empty, and the
    same answer as reading the series one by one."""
    import math

    import numpy as np

    from curvecast.service.models import Series as SeriesRow
    from curvecast.service.schemas import MetricBatch
    from curvecast.service.store import metrics as metric_store
    from curvecast.service.store._common import series_points

    run_id = _run(factory, project)
    later, earlier = list(range(10, 20)), list(range(0, 10))  # stored out of step order
    for steps in (later, earlier):
        values = {"loss": [2.0 + s / 10 if s != 13 else math.nan for s in steps],
                  "opt/eta": [0.1 * s if s % 2 == 0 else None for s in steps]}
        with session_scope(factory) as s:
            metric_store.ingest_batch(s, run_id=run_id, allowed_project=None,
                                      batch=MetricBatch(steps=steps, values=values))
    with session_scope(factory) as s:
        rows = s.execute(select(SeriesRow.key, SeriesRow.id).where(SeriesRow.run_id == run_id))
        ids = {str(k): int(i) for k, i in rows}
        if s.get_bind().dialect.name == "postgresql":  # rows in the order they were stored
            for setting in ("enable_indexscan", "enable_indexonlyscan", "enable_bitmapscan"):
                s.execute(text(f"SET LOCAL {setting} = off"))
        ranges = {ids["loss"]: (5, 15), ids["opt/eta"]: (3, 8), 10**9: (0, 5)}
        many = alert_store.read_points_many(s, ranges=ranges)
        one_by_one = {sid: series_points(s, series_id=sid, lo=lo, hi=hi)
                      for sid, (lo, hi) in ranges.items()}
    steps, values = many[ids["loss"]]
    assert steps.tolist() == list(range(5, 16))
    expected = [2.0 + t / 10 if t != 13 else math.nan for t in range(5, 16)]
    np.testing.assert_array_equal(values, expected)
    assert many[ids["opt/eta"]][0].tolist() == [4, 6, 8]
    assert many[ids["opt/eta"]][1].tolist() == [0.4, 0.6000000000000001, 0.8]
    assert 10**9 not in many or many[10**9][0].size == 0
    for sid, (got_steps, got_values) in many.items():
        np.testing.assert_array_equal(got_steps, one_by_one[sid][0])
        np.testing.assert_array_equal(got_values, one_by_one[sid][1])
    assert one_by_one[10**9][0].size == 0
