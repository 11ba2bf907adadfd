"""What an evaluation writes, decided without a database: alert rows created, closed or
dropped, and a notification per enabled webhook unless the alert is silenced."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
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


def test_an_alert_keeps_the_step_and_value_its_description_describes() -> None:
    """An off_curve alert fired with the loss 1.05 above the interval ("... by 1.05"); later
    rounds showed the latest excess, -0.865, beside that description, and REST's step moved on
    from the page's. Step and value stay those of the firing observation."""
    fired = Transition("off_curve", Event("firing", 426, 1.05, 400), "warning",
                       "eval_loss is above its forecast interval",
                       "The smoothed eval_loss has stayed above the upper end of the 99% forecast "
                       "interval by 1.05 for a sustained stretch", "eval_loss")
    (write,) = plan_alert_writes(JOB, [fired], [], HOOKS, state={}, now=NOW,
                                 public_url="http://cc")
    row = write.row
    assert (row.step, row.fired_step, row.since_step, row.value) == (426, 426, 400, 1.05)
    assert "by 1.05" in row.description
    body = json.loads(write.notifications[0].body)
    annotations = body["alerts"][0]["annotations"]
    assert (annotations["step"], annotations["value"]) == ("426", "1.05")
    # Later rounds: the rule's statistic moved (in its dead band), nothing happened.
    stored = replace(row, id=5)
    later = {"off_curve": {"lifecycle": {"state": "firing", "step": 496, "value": -0.865}}}
    assert plan_alert_writes(JOB, [], [stored], HOOKS, state=later, now=NOW,
                             public_url="http://cc") == []
    # Resolving adds the time and the reason; the step and value stay.
    resolved = Transition("off_curve", Event("resolved", 501, -1.2, 400), "warning", "s", "d",
                          "eval_loss", reason="run ended (finished) while the condition held")
    (closed,) = plan_alert_writes(JOB, [resolved], [stored], HOOKS, state={}, now=NOW,
                                  public_url="http://cc")
    assert (closed.row.state, closed.row.step, closed.row.value) == ("resolved", 426, 1.05)
    assert closed.row.description.endswith("Resolved: run ended (finished) while the "
                                           "condition held.")
