"""Alerts: evaluation leases per run, the alert rows and their history, rule overrides, and
the outbox rows written in the same transaction as an alert's state change.

Only this module and ``service.store.webhooks`` talk SQL about alerts; they return schemas or
plain dataclasses, never ORM rows.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Select, delete, exists, literal, literal_column, or_, select, update
from sqlalchemy.orm import Session

from curvecast.service.alerting.engine import Transition
from curvecast.service.alerting.rules import RULES, Series, rule_config, validate_override
from curvecast.service.alerting.schemas import AlertList, AlertOut, RuleList, RuleOut
from curvecast.service.alerting.webhook import AlertView, build_payload, encode_body
from curvecast.service.errors import InvalidInput, NotFound, RunNotFound
from curvecast.service.models import (
    Alert,
    AlertDelivery,
    AlertEval,
    AlertRuleOverride,
    FitRecord,
    MetricPoint,
    Project,
    Run,
    Webhook,
)
from curvecast.service.models import (
    Series as SeriesRow,
)
from curvecast.service.store._common import as_utc, is_postgres, write_connection
from curvecast.service.store.projects import ensure_project

OPEN_STATES = ("pending", "firing")


# ---------------------------------------------------------------------------------------------
# Evaluation jobs (worker side)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalJob:
    """A run leased for alert evaluation."""

    run_id: uuid.UUID
    token: uuid.UUID
    project_id: int
    project: str
    run_name: str
    config: dict[str, Any]
    status: str
    last_step: int | None
    n_points: int
    last_ingest_at: datetime | None
    evaluated_step: int | None
    state: dict[str, Any]


def _ensure_eval_rows(session: Session) -> None:
    """Give every run an ``alert_eval`` row (runs are created elsewhere; this table is ours)."""
    missing: Select[uuid.UUID, int, Any] = select(Run.id, literal(0), literal_column("'{}'")).where(
        ~exists().where(AlertEval.run_id == Run.id)
    )
    stmt = (
        (_pg_insert if is_postgres(session) else _sqlite_insert)(AlertEval)
        .from_select(["run_id", "n_points", "state"], missing)
        .on_conflict_do_nothing()
    )
    session.execute(stmt)


def _pg_insert(table: Any) -> Any:
    from sqlalchemy.dialects.postgresql import insert

    return insert(table)


def _sqlite_insert(table: Any) -> Any:
    from sqlalchemy.dialects.sqlite import insert

    return insert(table)


def claim_eval_jobs(
    session: Session, *, now: datetime, lease: timedelta, limit: int
) -> list[EvalJob]:
    """Lease up to ``limit`` runs that have new points, or whose periodic check (the stalled
    rule) is due.

    ``FOR UPDATE SKIP LOCKED`` (PostgreSQL) lets concurrent workers pass over each other's
    candidates; the lease token then keeps the run theirs while they evaluate outside the
    transaction, and expires on its own if a worker dies. On SQLite the write transaction
    serialises claims.
    """
    write_connection(session)
    _ensure_eval_rows(session)
    stmt = (
        select(
            AlertEval.run_id,
            Run.project_id,
            Project.name,
            Run.name,
            Run.config,
            Run.status,
            Run.last_step,
            Run.n_points,
            Run.last_ingest_at,
            AlertEval.evaluated_step,
            AlertEval.state,
        )
        .join(Run, Run.id == AlertEval.run_id)
        .join(Project, Project.id == Run.project_id)
        .where(
            or_(AlertEval.lease_until.is_(None), AlertEval.lease_until < now),
            or_(Run.n_points > AlertEval.n_points, AlertEval.next_check_at <= now),
        )
        .order_by(AlertEval.evaluated_at.asc().nulls_first())
        .limit(limit)
        .with_for_update(of=AlertEval, skip_locked=True)
    )
    jobs = []
    for r in session.execute(stmt).all():
        token = uuid.uuid4()
        jobs.append(
            EvalJob(
                run_id=r[0],
                token=token,
                project_id=r[1],
                project=r[2],
                run_name=r[3],
                config=dict(r[4]),
                status=r[5],
                last_step=r[6],
                n_points=int(r[7]),
                last_ingest_at=as_utc(r[8]) if r[8] else None,
                evaluated_step=r[9],
                state=dict(r[10] or {}),
            )
        )
        session.execute(
            update(AlertEval)
            .where(AlertEval.run_id == r[0])
            .values(lease_until=now + lease, lease_token=token),
            execution_options={"synchronize_session": False},
        )
    return jobs


def run_series_ids(session: Session, *, run_id: uuid.UUID) -> dict[str, int]:
    """Every metric key of a run and its series id."""
    rows = session.execute(
        select(SeriesRow.key, SeriesRow.id).where(SeriesRow.run_id == run_id)
    ).all()
    return {str(k): int(i) for k, i in rows}


def read_points(session: Session, *, series_id: int, lo: int, hi: int) -> Series:
    """Points of one series with ``lo <= step <= hi`` (NULL values, i.e. NaN, included)."""
    rows = session.execute(
        select(MetricPoint.step, MetricPoint.value)
        .where(MetricPoint.series_id == series_id, MetricPoint.step >= lo, MetricPoint.step <= hi)
        .order_by(MetricPoint.step)
    ).all()
    steps = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    values = np.fromiter(
        (math.nan if r[1] is None else r[1] for r in rows), dtype=np.float64, count=len(rows)
    )
    return Series(steps, values)


def latest_fit(session: Session, *, run_id: uuid.UUID) -> tuple[dict[str, Any], str] | None:
    """The newest stored forecast fit of a run and the series it was fitted on."""
    row = session.execute(
        select(FitRecord.fit, FitRecord.key)
        .where(FitRecord.run_id == run_id)
        .order_by(FitRecord.id.desc())
        .limit(1)
    ).first()
    return (dict(row[0]), str(row[1])) if row else None


def rule_overrides(session: Session, *, project_id: int) -> dict[str, dict[str, Any]]:
    """A project's rule overrides (validated when stored)."""
    rows = session.execute(
        select(AlertRuleOverride.rule, AlertRuleOverride.config).where(
            AlertRuleOverride.project_id == project_id
        )
    ).all()
    return {str(r): dict(c) for r, c in rows if r in RULES}


def release_eval_job(session: Session, *, job: EvalJob) -> None:
    """Give a lease back without recording progress (the evaluation failed)."""
    write_connection(session)
    session.execute(
        update(AlertEval)
        .where(AlertEval.run_id == job.run_id, AlertEval.lease_token == job.token)
        .values(lease_until=None, lease_token=None),
        execution_options={"synchronize_session": False},
    )


def apply_evaluation(
    session: Session,
    *,
    job: EvalJob,
    transitions: Sequence[Transition],
    state: Mapping[str, Any],
    evaluated_step: int | None,
    n_points: int,
    next_check_at: datetime | None,
    now: datetime,
    public_url: str,
) -> bool:
    """Record one evaluation: alert rows change, outbox rows are written for every firing or
    resolved transition (one per enabled webhook of the project), and the run's evaluation
    state moves on -- all in this one transaction, so a notification is never lost nor sent
    for a change that was rolled back.

    Returns:
        False if the lease was lost (another worker took the run over); nothing is written.
    """
    write_connection(session)
    moved = session.execute(
        update(AlertEval)
        .where(AlertEval.run_id == job.run_id, AlertEval.lease_token == job.token)
        .values(
            state=dict(state),
            evaluated_step=evaluated_step,
            n_points=n_points,
            evaluated_at=now,
            next_check_at=next_check_at,
            lease_until=None,
            lease_token=None,
        ),
        execution_options={"synchronize_session": False},
    )
    if moved.rowcount != 1:  # type: ignore[attr-defined]
        return False
    webhooks: list[tuple[int, str]] | None = None
    for t in transitions:
        alert = _open_alert(session, job.run_id, t.rule)
        ev = t.event
        value = ev.value if math.isfinite(ev.value) else None
        if ev.kind == "cancelled":
            if alert is not None and alert.state == "pending":
                session.delete(alert)
                session.flush()
            continue
        if ev.kind in ("pending", "firing") and alert is None:
            alert = Alert(
                run_id=job.run_id,
                project_id=job.project_id,
                rule=t.rule,
                state="pending",
                severity=t.severity,
                summary=t.summary,
                description=t.description,
                key=t.key,
                labels=_labels(job, t),
                since_step=ev.since_step,
                step=ev.step,
                value=value,
                started_at=now,
                updated_at=now,
            )
            session.add(alert)
            session.flush()
        if alert is None:
            continue  # resolved with nothing open (a rule disabled while inactive)
        alert.step, alert.value, alert.updated_at = ev.step, value, now
        if ev.kind == "firing":
            alert.state, alert.fired_at, alert.fired_step = "firing", now, ev.step
            alert.summary, alert.description, alert.severity = t.summary, t.description, t.severity
        elif ev.kind == "resolved":
            was_firing = alert.state == "firing"
            alert.state, alert.resolved_at = "resolved", now
            if not was_firing:
                continue
        else:
            continue
        session.flush()
        if alert.silenced_until is not None and as_utc(alert.silenced_until) > now:
            continue
        if webhooks is None:
            webhooks = _enabled_webhooks(session, job.project_id)
        for webhook_id, name in webhooks:
            _enqueue(session, alert, job, webhook_id, name, now, public_url)
    _refresh_open(session, job.run_id, state, now)
    return True


def _labels(job: EvalJob, t: Transition) -> dict[str, str]:
    labels = {
        "rule": t.rule,
        "severity": t.severity,
        "project": job.project,
        "run_id": str(job.run_id),
        "run_name": job.run_name,
    }
    if t.key:
        labels["key"] = t.key
    return labels


def _open_alert(session: Session, run_id: uuid.UUID, rule: str) -> Alert | None:
    return session.scalar(
        select(Alert).where(
            Alert.run_id == run_id, Alert.rule == rule, Alert.state.in_(OPEN_STATES)
        )
    )


def _refresh_open(
    session: Session, run_id: uuid.UUID, state: Mapping[str, Any], now: datetime
) -> None:
    """Show the latest statistic on open alerts (the lifecycle state carries it)."""
    for alert in session.scalars(
        select(Alert).where(Alert.run_id == run_id, Alert.state.in_(OPEN_STATES))
    ):
        life = (state.get(alert.rule) or {}).get("lifecycle") or {}
        step, value = life.get("step"), life.get("value")
        if step is not None and step != alert.step:
            alert.step, alert.value, alert.updated_at = int(step), value, now


def _enabled_webhooks(session: Session, project_id: int) -> list[tuple[int, str]]:
    rows = session.execute(
        select(Webhook.id, Webhook.name)
        .where(Webhook.project_id == project_id, Webhook.enabled.is_(True))
        .order_by(Webhook.id)
    ).all()
    return [(int(i), str(n)) for i, n in rows]


def _enqueue(
    session: Session,
    alert: Alert,
    job: EvalJob,
    webhook_id: int,
    receiver: str,
    now: datetime,
    public_url: str,
) -> None:
    delivery_id = uuid.uuid4()
    view = AlertView(
        alert_id=alert.id,
        run_id=str(job.run_id),
        run_name=job.run_name,
        project=job.project,
        rule=alert.rule,
        severity=alert.severity,
        status=alert.state,
        summary=alert.summary,
        description=alert.description,
        started_at=as_utc(alert.started_at),
        ended_at=as_utc(alert.resolved_at) if alert.resolved_at else None,
        step=alert.step,
        value=alert.value,
    )
    payload = build_payload(
        view, public_url=public_url, receiver=receiver, delivery_id=str(delivery_id)
    )
    session.add(
        AlertDelivery(
            id=delivery_id,
            webhook_id=webhook_id,
            alert_id=alert.id,
            event=alert.state,
            body=encode_body(payload).decode(),
            status="pending",
            attempts=0,
            next_attempt_at=now,
            created_at=now,
        )
    )


# ---------------------------------------------------------------------------------------------
# Reads and actions (API side)
# ---------------------------------------------------------------------------------------------


def _out(alert: Alert, project: str) -> AlertOut:
    return AlertOut(
        id=alert.id,
        run_id=alert.run_id,
        project=project,
        rule=alert.rule,
        state=alert.state,  # type: ignore[arg-type]
        severity=alert.severity,
        summary=alert.summary,
        description=alert.description,
        started_at=as_utc(alert.started_at),
        fired_at=as_utc(alert.fired_at) if alert.fired_at else None,
        resolved_at=as_utc(alert.resolved_at) if alert.resolved_at else None,
        acknowledged_at=as_utc(alert.acknowledged_at) if alert.acknowledged_at else None,
        silenced_until=as_utc(alert.silenced_until) if alert.silenced_until else None,
        step=alert.step,
        value=alert.value,
        since_step=alert.since_step,
        fired_step=alert.fired_step,
        key=alert.key,
        labels={str(k): str(v) for k, v in (alert.labels or {}).items()},
    )


def list_alerts(
    session: Session,
    *,
    project: str | None,
    run_id: uuid.UUID | None,
    state: str | None,
    limit: int,
    allowed_project: str | None,
) -> AlertList:
    """Alerts newest first, filtered; other projects' alerts are invisible."""
    if allowed_project is not None and project not in (None, allowed_project):
        return AlertList(alerts=[])
    stmt = select(Alert, Project.name).join(Project, Project.id == Alert.project_id)
    name = allowed_project or project
    if name is not None:
        stmt = stmt.where(Project.name == name)
    if run_id is not None:
        stmt = stmt.where(Alert.run_id == run_id)
    if state is not None:
        stmt = stmt.where(Alert.state == state)
    rows = session.execute(stmt.order_by(Alert.id.desc()).limit(limit)).all()
    return AlertList(alerts=[_out(a, p) for a, p in rows])


def run_alerts(
    session: Session,
    *,
    run_id: uuid.UUID,
    state: str | None,
    limit: int,
    allowed_project: str | None,
) -> AlertList:
    """A run's alerts; RunNotFound if the run is not visible."""
    stmt = select(Run.id).join(Project).where(Run.id == run_id)
    if allowed_project is not None:
        stmt = stmt.where(Project.name == allowed_project)
    if session.scalar(stmt) is None:
        raise RunNotFound(f"run {run_id} not found")
    return list_alerts(
        session,
        project=None,
        run_id=run_id,
        state=state,
        limit=limit,
        allowed_project=allowed_project,
    )


def _visible_alert(
    session: Session, alert_id: int, allowed_project: str | None
) -> tuple[Alert, str]:
    stmt = (
        select(Alert, Project.name)
        .join(Project, Project.id == Alert.project_id)
        .where(Alert.id == alert_id)
    )
    if allowed_project is not None:
        stmt = stmt.where(Project.name == allowed_project)
    row = session.execute(stmt).first()
    if row is None:
        raise NotFound(f"alert {alert_id} not found")
    return row[0], row[1]


def acknowledge(
    session: Session, *, alert_id: int, now: datetime, allowed_project: str | None
) -> AlertOut:
    """Mark an alert as seen (idempotent: the first acknowledgement's time is kept)."""
    write_connection(session)
    alert, project = _visible_alert(session, alert_id, allowed_project)
    if alert.acknowledged_at is None:
        alert.acknowledged_at = now
        alert.updated_at = now
        session.flush()
    return _out(alert, project)


def silence(
    session: Session,
    *,
    alert_id: int,
    until: datetime | None,
    now: datetime,
    allowed_project: str | None,
) -> AlertOut:
    """Suppress this alert's notifications until ``until`` (``None`` lifts the silence)."""
    write_connection(session)
    alert, project = _visible_alert(session, alert_id, allowed_project)
    if until is not None and until <= now:
        raise InvalidInput("until: must be in the future (UTC)")
    alert.silenced_until = until
    alert.updated_at = now
    session.flush()
    return _out(alert, project)


# ---------------------------------------------------------------------------------------------
# Rule configuration
# ---------------------------------------------------------------------------------------------


def _check_project(project: str, allowed_project: str | None) -> None:
    if allowed_project is not None and project != allowed_project:
        raise NotFound(f"project {project!r} not found")


def _rule_out(rule: str, override: Mapping[str, Any] | None) -> RuleOut:
    spec = RULES[rule]
    cfg = rule_config(rule, override)
    return RuleOut(
        rule=rule,
        title=spec.title,
        description=spec.description,
        enabled=cfg.enabled,
        severity=cfg.severity,
        for_steps=cfg.for_steps,
        resolve_for_steps=cfg.resolve_for_steps,
        for_doc=spec.for_doc,
        params=dict(cfg.params),
        param_docs={k: p.doc for k, p in spec.params.items()},
        defaults=spec.default_config().to_dict(),
        overridden=bool(override),
    )


def list_rules(session: Session, *, project: str, allowed_project: str | None) -> RuleList:
    """Every rule's effective configuration for ``project``."""
    _check_project(project, allowed_project)
    pid = session.scalar(select(Project.id).where(Project.name == project))
    overrides = rule_overrides(session, project_id=pid) if pid is not None else {}
    return RuleList(project=project, rules=[_rule_out(r, overrides.get(r)) for r in RULES])


def get_rule(session: Session, *, project: str, rule: str, allowed_project: str | None) -> RuleOut:
    """One rule's effective configuration."""
    _check_project(project, allowed_project)
    if rule not in RULES:
        raise NotFound(f"no rule {rule!r}; rules are {', '.join(RULES)}")
    pid = session.scalar(select(Project.id).where(Project.name == project))
    overrides = rule_overrides(session, project_id=pid) if pid is not None else {}
    return _rule_out(rule, overrides.get(rule))


def put_rule(
    session: Session,
    *,
    project: str,
    rule: str,
    override: Mapping[str, Any],
    now: datetime,
    allowed_project: str | None,
) -> RuleOut:
    """Replace a project's override of ``rule`` (``{}`` returns to the defaults).

    Raises:
        NotFound: unknown rule (or another project's).
        InvalidInput: a threshold is unknown or out of range; the message names it.
    """
    _check_project(project, allowed_project)
    if rule not in RULES:
        raise NotFound(f"no rule {rule!r}; rules are {', '.join(RULES)}")
    try:
        clean = validate_override(rule, override)
    except ValueError as exc:
        raise InvalidInput(f"rule {rule}: {exc}") from None
    write_connection(session)
    pid = ensure_project(session, name=project)
    if not clean:
        session.execute(
            delete(AlertRuleOverride).where(
                AlertRuleOverride.project_id == pid, AlertRuleOverride.rule == rule
            )
        )
    else:
        # An upsert, so two admins writing at once cannot collide on the unique key.
        insert = _pg_insert if is_postgres(session) else _sqlite_insert
        stmt = insert(AlertRuleOverride).values(
            project_id=pid, rule=rule, config=clean, updated_at=now
        )
        session.execute(
            stmt.on_conflict_do_update(
                index_elements=["project_id", "rule"],
                set_={"config": stmt.excluded.config, "updated_at": stmt.excluded.updated_at},
            )
        )
    return _rule_out(rule, clean)
