"""What an evaluation's transitions do to the alert rows and the outbox. Pure.

The engine says what happened to each rule (:class:`~curvecast.service.alerting.engine.
Transition`); this module decides what that means for storage, and the store writes exactly
that:

* a new pending or firing condition with no open alert creates one;
* a pending alert that is cancelled before it fires is deleted (it never notified anyone, so
  it is not history, as in Prometheus);
* a firing alert, and a firing alert that resolves, notify every enabled webhook of the
  project, unless the alert is silenced;
* an alert's ``step`` and ``value`` are those of the observation its summary and description
  describe: the first active one while it is pending, the one that made it fire once it fired.
  They do not change afterwards (a later statistic, e.g. an ``off_curve`` excess gone negative
  in the dead band, beside a description of the excess that fired it, contradicted it);
  resolving adds ``resolved_at`` and the reason.

The transitions of one round are applied in order to the run's open alerts, so a rule that
fires and resolves within one round leaves one resolved alert and two notifications.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from curvecast.service.alerting.engine import Transition
from curvecast.service.alerting.webhook import AlertView, build_payload, encode_body
from curvecast.service.schemas.alerts import (
    AlertRow,
    AlertWrite,
    EvalJob,
    Notification,
    WebhookTarget,
)

__all__ = ["plan_alert_writes"]


@dataclass
class _Alert:
    """An alert row while the round's transitions are applied to it."""

    original: AlertRow | None
    row: AlertRow
    deleted: bool = False
    notifications: list[Notification] = field(default_factory=list)

    def write(self) -> AlertWrite | None:
        """The write this alert needs, if any."""
        if self.original is None and self.deleted:
            return None  # created and cancelled in the same round: never stored
        if self.original == self.row and not self.deleted:
            return None
        return AlertWrite(self.row, self.deleted, tuple(self.notifications))


def plan_alert_writes(
    job: EvalJob,
    transitions: Sequence[Transition],
    open_alerts: Sequence[AlertRow],
    webhooks: Sequence[WebhookTarget],
    *,
    state: Mapping[str, Any],
    now: datetime,
    public_url: str,
    new_delivery_id: Callable[[], uuid.UUID] = uuid.uuid4,
) -> list[AlertWrite]:
    """The alert rows and outbox rows one evaluation of a run writes.

    Args:
        job: the evaluated run.
        transitions: the engine's transitions, in order.
        open_alerts: the run's pending and firing alerts before this evaluation.
        webhooks: the project's enabled webhooks (the caller may pass none when there are no
            transitions: nothing can notify).
        state: the engine's new state (unused: kept for the callers' one signature).
        now: the evaluation's time, stamped on what changes.
        public_url: the service's address, for the dashboard links in notifications.
        new_delivery_id: makes each notification's id (receivers de-duplicate on it).

    Returns:
        The writes, in the order the store must make them: an alert that closes comes
        before the one that replaces it (one open alert per run and rule).
    """
    alerts = [_Alert(row, row) for row in open_alerts]
    open_by_rule = {a.row.rule: a for a in alerts}
    for t in transitions:
        ev = t.event
        alert = open_by_rule.get(t.rule)
        if ev.kind == "cancelled":
            if alert is not None and alert.row.state == "pending":
                alert.deleted = True
                del open_by_rule[t.rule]
            continue
        if alert is None:
            if ev.kind == "resolved":
                continue  # nothing open (a rule disabled while inactive)
            alert = _Alert(None, _new_row(job, t, now))
            alerts.append(alert)
            open_by_rule[t.rule] = alert
        value = ev.value if math.isfinite(ev.value) else None
        row = replace(alert.row, updated_at=now)
        if row.step is None:  # a new alert: the observation it describes
            row = replace(row, step=ev.step, value=value)
        notify = False
        if ev.kind == "firing":
            # The summary and description describe this observation: step and value with them.
            row = replace(
                row, state="firing", fired_at=now, fired_step=ev.step, summary=t.summary,
                description=t.description, severity=t.severity, step=ev.step, value=value,
            )
            notify = True
        elif ev.kind == "resolved":
            del open_by_rule[t.rule]
            # A pending alert that resolves (its rule was disabled) never told anyone.
            notify = row.state == "firing"
            row = replace(row, state="resolved", resolved_at=now)
            if t.reason:
                # Say why it closed: its condition did not clear, the run ended.
                row = replace(row, description=f"{row.description}\n\nResolved: {t.reason}.")
        alert.row = row
        silenced = row.silenced_until is not None and row.silenced_until > now
        if notify and not silenced:
            alert.notifications += [
                _notification(job, row, hook, public_url, new_delivery_id()) for hook in webhooks
            ]
    return [w for w in (a.write() for a in alerts) if w is not None]


def _new_row(job: EvalJob, t: Transition, now: datetime) -> AlertRow:
    labels = {
        "rule": t.rule,
        "severity": t.severity,
        "project": job.project,
        "run_id": str(job.run_id),
        "run_name": job.run_name,
    }
    if t.key:
        labels["key"] = t.key
    return AlertRow(
        id=None, rule=t.rule, state="pending", severity=t.severity, summary=t.summary,
        description=t.description, key=t.key, labels=labels, since_step=t.event.since_step,
        step=None, value=None, started_at=now, fired_at=None, fired_step=None,
        resolved_at=None, silenced_until=None, updated_at=now,
    )


def _notification(
    job: EvalJob, row: AlertRow, hook: WebhookTarget, public_url: str, delivery_id: uuid.UUID
) -> Notification:
    view = AlertView(
        run_id=str(job.run_id),
        run_name=job.run_name,
        project=job.project,
        rule=row.rule,
        severity=row.severity,
        status=row.state,
        summary=row.summary,
        description=row.description,
        started_at=row.started_at,
        ended_at=row.resolved_at,
        step=row.step,
        value=row.value,
    )
    payload = build_payload(
        view, public_url=public_url, receiver=hook.name, delivery_id=str(delivery_id)
    )
    return Notification(delivery_id, hook.id, row.state, encode_body(payload).decode())
