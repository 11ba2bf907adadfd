"""What an evaluation writes, decided without a database: alert rows created, closed or
dropped, and a notification per enabled webhook unless the alert is silenced."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from curvecast.service.alerting.decisions import plan_alert_writes
from curvecast.service.alerting.engine import Transition
from curvecast.service.alerting.lifecycle import Event, EventKind
from curvecast.service.schemas.alerts import AlertRow, AlertState, EvalJob, WebhookTarget

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
JOB = EvalJob(
    run_id=uuid.UUID(int=7), token=uuid.UUID(int=8), project_id=1, project="lm", run_name="charlm",
    config={}, status="running", last_step=100, n_points=100, last_ingest_at=NOW,
    evaluated_step=50, state={},
)
HOOKS = [WebhookTarget(1, "ops"), WebhookTarget(2, "chat")]


def _t(kind: EventKind, step: int) -> Transition:
    return Transition("non_finite", Event(kind, step, 1.0, 60), "critical", f"{kind} at {step}",
                      "d", "loss")


def _open(state: AlertState = "pending", silenced_until: datetime | None = None) -> AlertRow:
    return AlertRow(
        id=5, rule="non_finite", state=state, severity="critical", summary="s",
        description="d", key="loss", labels={}, since_step=60, step=60, value=1.0,
        started_at=NOW - timedelta(hours=1), fired_at=None, fired_step=None, resolved_at=None,
        silenced_until=silenced_until, updated_at=NOW - timedelta(hours=1),
    )


def test_firing_and_resolving_in_one_round_notify_every_webhook_twice() -> None:
    (write,) = plan_alert_writes(JOB, [_t("firing", 60), _t("resolved", 90)], [], HOOKS,
                                 state={}, now=NOW, public_url="http://cc")
    assert write.row.id is None and write.row.state == "resolved" and not write.delete
    assert write.row.fired_step == 60 and write.row.since_step == 60
    assert [(n.webhook_id, n.event) for n in write.notifications] == [
        (1, "firing"), (2, "firing"), (1, "resolved"), (2, "resolved")]
    first = write.notifications[0]
    body = json.loads(first.body)
    assert body["receiver"] == "ops" and body["deliveryId"] == str(first.delivery_id)
    assert len({n.delivery_id for n in write.notifications}) == 4


def test_a_silenced_alert_changes_without_notifying() -> None:
    silenced = _open(silenced_until=NOW + timedelta(days=1))
    (write,) = plan_alert_writes(JOB, [_t("firing", 70)], [silenced], HOOKS, state={}, now=NOW,
                                 public_url="http://cc")
    assert write.row.id == 5 and write.row.state == "firing" and write.notifications == ()


def test_a_cancelled_pending_alert_is_deleted_and_a_new_one_comes_after_it() -> None:
    writes = plan_alert_writes(JOB, [_t("cancelled", 70), _t("pending", 80)], [_open()], HOOKS,
                               state={}, now=NOW, public_url="http://cc")
    assert [(w.row.id, w.delete, w.row.state) for w in writes] == [(5, True, "pending"),
                                                                   (None, False, "pending")]
    assert plan_alert_writes(JOB, [_t("pending", 80), _t("cancelled", 81)], [], HOOKS,
                             state={}, now=NOW, public_url="http://cc") == []


def test_an_open_alert_shows_the_latest_statistic_and_an_unchanged_one_is_not_written() -> None:
    state = {"non_finite": {"lifecycle": {"step": 99, "value": 3.0}}}
    (write,) = plan_alert_writes(JOB, [], [_open()], [], state=state, now=NOW,
                                 public_url="http://cc")
    assert (write.row.step, write.row.value, write.row.updated_at) == (99, 3.0, NOW)
    unchanged = {"non_finite": {"lifecycle": {"step": 60, "value": 1.0}}}
    assert plan_alert_writes(JOB, [], [_open()], [], state=unchanged, now=NOW,
                             public_url="http://cc") == []
