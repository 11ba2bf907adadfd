"""Alerts: evaluation leases per run, the alert rows and their history, rule overrides, and
the outbox rows written in the same transaction as an alert's state change.

Only this module and ``service.store.webhooks`` talk SQL about alerts; they return schemas or
the plain records of :mod:`curvecast.service.schemas.alerts`, never ORM rows. What an
evaluation writes is decided before the store is called, by pure code the worker runs; this
module writes what it is given.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import (
    DateTime,
    Integer,
    Select,
    and_,
    bindparam,
    case,
    delete,
    exists,
    literal,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, defer

from curvecast.service.errors import InvalidInput, NotFound, RunNotFound
from curvecast.service.models import (
    Alert,
    AlertDelivery,
    AlertEval,
    AlertRuleOverride,
    Project,
    Run,
)
from curvecast.service.schemas.alerts import AlertList, AlertOut, AlertRow, AlertWrite, EvalJob
from curvecast.service.store._common import (
    as_utc,
    is_postgres,
    run_created_at,
    run_series,
    series_points_many,
    write_connection,
)
from curvecast.service.store._leases import claim_leases
from curvecast.service.store.forecasts import StoredFit, newest_default_fits
from curvecast.service.store.projects import ensure_project

OPEN_STATES = ("pending", "firing")
#: How far ahead a silence may end. A bound, because an unbounded ``until`` (year 9999 at
#: UTC-14) was stored by PostgreSQL as year 10000, which no later read could load.
MAX_SILENCE = timedelta(days=366)
#: Stored silences are read clamped to this range, so that a value no client can load (one
#: written before ``until`` was bounded, or by hand) cannot break every read of the alerts.
_SILENCE_FLOOR = datetime(1970, 1, 1, tzinfo=UTC)
_SILENCE_CEILING = datetime(9000, 1, 1, tzinfo=UTC)


def _silenced_until() -> Any:
    """``alerts.silenced_until`` clamped in SQL (the driver never sees an unloadable value)."""
    bound = DateTime(timezone=True)
    return case(
        (Alert.silenced_until > literal(_SILENCE_CEILING, bound), literal(_SILENCE_CEILING, bound)),
        (Alert.silenced_until < literal(_SILENCE_FLOOR, bound), literal(_SILENCE_FLOOR, bound)),
        else_=Alert.silenced_until,
    ).label("silenced_until_safe")


# ---------------------------------------------------------------------------------------------
# Evaluation jobs (worker side)
# ---------------------------------------------------------------------------------------------

# The statements an alert round sends for every run, built once (as a refit's are: see
# ``store.forecasts``); their values are bound parameters.

#: A project's rule overrides.
_RULE_OVERRIDES = select(AlertRuleOverride.rule, AlertRuleOverride.config).where(
    AlertRuleOverride.project_id == bindparam("project_id"))
#: An evaluation recorded, if the lease named by ``token`` is still held.
_FINISH_EVALUATION = (
    update(AlertEval)
    .where(AlertEval.run_id == bindparam("b_run_id"),
           AlertEval.lease_token == bindparam("b_token"))
    .values(
        state=bindparam("b_state"),
        evaluated_step=bindparam("b_evaluated_step"),
        n_points=bindparam("b_n_points"),
        evaluated_at=bindparam("b_now"),
        next_check_at=bindparam("b_next_check_at"),
        lease_until=None,
        lease_token=None,
    )
)
#: A run's pending and firing alerts.
_OPEN_ALERTS = (
    select(Alert, _silenced_until())
    .options(defer(Alert.silenced_until))
    .where(Alert.run_id == bindparam("run_id"), Alert.state.in_(OPEN_STATES))
    .order_by(Alert.id)
)


def _ensure_eval_rows(session: Session) -> None:
    """Give every run an ``alert_eval`` row (runs are created elsewhere; this table is ours).

    A run being deleted meanwhile (``store.retention``) is skipped, not waited for: on
    PostgreSQL the row lock (``FOR KEY SHARE SKIP LOCKED``) passes over a run whose deletion is
    in flight and drops one deleted after this statement's snapshot, where a plain
    ``INSERT ... SELECT`` would insert a row for a run that is gone and fail its foreign key.
    SQLite has one writer at a time, so there the race cannot happen (the clause is omitted).
    """
    missing: Select[uuid.UUID, int, Any] = (
        select(Run.id, literal(0), literal_column("'{}'"))
        .where(~exists().where(AlertEval.run_id == Run.id))
        .with_for_update(key_share=True, skip_locked=True, of=Run)
    )
    stmt = (
        _dialect_insert(session)(AlertEval)
        .from_select(["run_id", "n_points", "state"], missing)
        .on_conflict_do_nothing()
    )
    session.execute(stmt)


def _dialect_insert(session: Session) -> Any:
    """The session's dialect's INSERT (both have ``ON CONFLICT`` clauses; core's has none)."""
    return postgresql.insert if is_postgres(session) else sqlite.insert


def claim_eval_jobs(
    session: Session, *, now: datetime, lease: timedelta, limit: int,
    min_interval: timedelta = timedelta(0),
) -> list[EvalJob]:
    """Lease up to ``limit`` runs that have new points (and were last evaluated at least
    ``min_interval`` ago), whose periodic check (the stalled rule) is due, or that ended since
    their last evaluation. The lease token keeps the run this worker's while it evaluates
    outside the transaction (see :func:`claim_leases`)."""
    write_connection(session)
    _ensure_eval_rows(session)
    candidates = (
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
            or_(
                and_(
                    Run.n_points > AlertEval.n_points,
                    or_(AlertEval.evaluated_at.is_(None),
                        AlertEval.evaluated_at <= now - min_interval),
                ),
                AlertEval.next_check_at <= now,
                # A run that ended since it was last evaluated: its open alerts close.
                Run.ended_at > AlertEval.evaluated_at,
            )
        )
        .order_by(AlertEval.evaluated_at.asc().nulls_first())
    )
    claim = claim_leases(
        session,
        candidates,
        key=AlertEval.run_id,
        lease_until=AlertEval.lease_until,
        lease_token=AlertEval.lease_token,
        now=now,
        lease=lease,
        limit=limit,
    )
    return [
        EvalJob(
            run_id=r[0],
            token=claim.token,
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
        for r in claim.rows
    ]


def run_series_ids(session: Session, *, run_id: uuid.UUID) -> dict[str, int]:
    """Every metric key of a run and its series id."""
    return dict(run_series(session, run_id))


def read_points_many(
    session: Session, *, ranges: Mapping[int, tuple[int, int]]
) -> dict[int, tuple[NDArray[np.int64], NDArray[np.float64]]]:
    """Steps and values of each series ``sid`` of ``ranges`` with ``lo <= step <= hi``, by step
    (NULL values, i.e. NaN, included as NaN); a series with no such points may be left out."""
    return series_points_many(session, ranges=ranges)


def latest_fit(session: Session, *, run_id: uuid.UUID) -> StoredFit | None:
    """The newest stored forecast fit of a run (parsed, with the series it was fitted on)."""
    return newest_default_fits(session, [run_id]).get(run_id)


def rule_overrides(session: Session, *, project_id: int) -> dict[str, dict[str, Any]]:
    """A project's rule overrides by rule name, as stored (validated when they were put)."""
    rows = session.execute(_RULE_OVERRIDES, {"project_id": project_id}).all()
    return {str(r): dict(c) for r, c in rows}


def release_eval_job(session: Session, *, job: EvalJob) -> None:
    """Give a lease back without recording progress (the evaluation failed)."""
    write_connection(session)
    session.execute(
        update(AlertEval)
        .where(AlertEval.run_id == job.run_id, AlertEval.lease_token == job.token)
        .values(lease_until=None, lease_token=None),
        execution_options={"synchronize_session": False},
    )


def finish_evaluation(
    session: Session,
    *,
    job: EvalJob,
    state: Mapping[str, Any],
    evaluated_step: int | None,
    n_points: int,
    next_check_at: datetime | None,
    now: datetime,
) -> bool:
    """Move the run's evaluation state on and give its lease back. Starts the transaction that
    also writes the evaluation's alerts (:func:`write_alerts`), so both land or neither does.

    Returns:
        False if the lease was lost (another worker took the run over); nothing is written.
    """
    write_connection(session)
    moved = session.execute(
        _FINISH_EVALUATION,
        {"b_run_id": job.run_id, "b_token": job.token, "b_state": dict(state),
         "b_evaluated_step": evaluated_step, "b_n_points": n_points, "b_now": now,
         "b_next_check_at": next_check_at},
        execution_options={"synchronize_session": False},
    )
    return bool(moved.rowcount == 1)  # type: ignore[attr-defined]


_ACKNOWLEDGED_RULES = (
    select(Alert.rule)
    .where(Alert.run_id == bindparam("run_id"), Alert.state.in_(OPEN_STATES),
           Alert.acknowledged_at.is_not(None))
)


def acknowledged_rules(session: Session, *, run_id: uuid.UUID) -> frozenset[str]:
    """The rules whose open alert of a run someone acknowledged (the rules' context: a
    ``non_finite`` alert resolves only once acknowledged)."""
    return frozenset(str(r) for r in session.scalars(_ACKNOWLEDGED_RULES, {"run_id": run_id}))


def open_alerts(session: Session, *, run_id: uuid.UUID) -> list[AlertRow]:
    """A run's pending and firing alerts (at most one per rule)."""
    alerts = session.execute(_OPEN_ALERTS, {"run_id": run_id}).all()
    return [
        AlertRow(
            id=a.id,
            rule=a.rule,
            state=a.state,
            severity=a.severity,
            summary=a.summary,
            description=a.description,
            key=a.key,
            labels=dict(a.labels or {}),
            since_step=a.since_step,
            step=a.step,
            value=a.value,
            started_at=as_utc(a.started_at),
            fired_at=as_utc(a.fired_at) if a.fired_at else None,
            fired_step=a.fired_step,
            resolved_at=as_utc(a.resolved_at) if a.resolved_at else None,
            silenced_until=as_utc(until) if until else None,
            updated_at=as_utc(a.updated_at),
        )
        for a, until in alerts
    ]


def write_alerts(
    session: Session, *, job: EvalJob, writes: Sequence[AlertWrite], now: datetime
) -> None:
    """Carry out an evaluation's alert writes, in order, and queue their notifications in the
    outbox (in this transaction: a notification is never lost, nor sent for a change that was
    rolled back)."""
    write_connection(session)
    # Each queued notification gets its own creation time, one microsecond apart, in the order
    # the round made them: the outbox sends an alert's notifications to a webhook in that order
    # (store.webhooks.claim_deliveries), a firing before the resolution that follows it.
    queued = 0
    for w in writes:
        row = w.row
        if w.delete:
            session.execute(delete(Alert).where(Alert.id == row.id))
            continue
        changes = {
            "state": row.state,
            "severity": row.severity,
            "summary": row.summary,
            "description": row.description,
            "step": row.step,
            "value": row.value,
            "fired_at": row.fired_at,
            "fired_step": row.fired_step,
            "resolved_at": row.resolved_at,
            "updated_at": row.updated_at,
        }
        if row.id is None:
            alert = Alert(
                run_id=job.run_id,
                project_id=job.project_id,
                rule=row.rule,
                key=row.key,
                labels=row.labels,
                since_step=row.since_step,
                started_at=row.started_at,
                **changes,
            )
            session.add(alert)
            session.flush()  # now, not later: the next write may open this rule's next alert
            alert_id = alert.id
        else:
            session.execute(
                update(Alert).where(Alert.id == row.id).values(**changes),
                execution_options={"synchronize_session": False},
            )
            alert_id = row.id
        for n in w.notifications:
            session.add(
                AlertDelivery(
                    id=n.delivery_id,
                    webhook_id=n.webhook_id,
                    alert_id=alert_id,
                    event=n.event,
                    body=n.body,
                    status="pending",
                    attempts=0,
                    next_attempt_at=now,
                    created_at=now + timedelta(microseconds=queued),
                )
            )
            queued += 1
    session.flush()


# ---------------------------------------------------------------------------------------------
# Reads and actions (API side)
# ---------------------------------------------------------------------------------------------


def _out(alert: Alert, project: str, silenced_until: datetime | None) -> AlertOut:
    """The API's view of an alert; ``silenced_until`` comes from :func:`_silenced_until` (the
    row's own attribute is deferred: loading it unclamped is what the clamp avoids)."""
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
        silenced_until=as_utc(silenced_until) if silenced_until else None,
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
    name = allowed_project or project
    stmt = _list_alerts_statement(name is not None, run_id is not None, state is not None)
    rows = session.execute(
        stmt, {"project": name, "run_id": run_id, "state": state, "limit": limit}).all()
    return AlertList(alerts=[_out(a, p, until) for a, p, until in rows])


# A run page's poll lists its alerts every 2 s: the statements are built once per shape
# (building them cost more CPU than running them; see ``store.forecasts``).

@cache
def _list_alerts_statement(by_project: bool, by_run: bool, by_state: bool) -> Select[Any]:
    """Alerts with their project's name, newest first. Parameters: ``project``, ``run_id``,
    ``state`` (each where its filter is on) and ``limit``."""
    stmt = (
        select(Alert, Project.name, _silenced_until())
        .options(defer(Alert.silenced_until))
        .join(Project, Project.id == Alert.project_id)
    )
    if by_project:
        stmt = stmt.where(Project.name == bindparam("project"))
    if by_run:
        stmt = stmt.where(Alert.run_id == bindparam("run_id"))
    if by_state:
        stmt = stmt.where(Alert.state == bindparam("state"))
    return stmt.order_by(Alert.id.desc()).limit(bindparam("limit", type_=Integer))


def run_alerts(
    session: Session,
    *,
    run_id: uuid.UUID,
    state: str | None,
    limit: int,
    allowed_project: str | None,
) -> AlertList:
    """A run's alerts; RunNotFound if the run is not visible."""
    if run_created_at(session, run_id, allowed_project) is None:
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
) -> tuple[Alert, str, datetime | None]:
    stmt = (
        select(Alert, Project.name, _silenced_until())
        .options(defer(Alert.silenced_until))
        .join(Project, Project.id == Alert.project_id)
        .where(Alert.id == alert_id)
    )
    if allowed_project is not None:
        stmt = stmt.where(Project.name == allowed_project)
    row = session.execute(stmt).first()
    if row is None:
        raise NotFound(f"alert {alert_id} not found")
    return row[0], row[1], row[2]


def acknowledge(
    session: Session, *, alert_id: int, now: datetime, allowed_project: str | None
) -> AlertOut:
    """Mark an alert as seen (idempotent: the first acknowledgement's time is kept)."""
    write_connection(session)
    alert, project, silenced_until = _visible_alert(session, alert_id, allowed_project)
    if alert.acknowledged_at is None:
        alert.acknowledged_at = now
        alert.updated_at = now
        session.flush()
    return _out(alert, project, silenced_until)


def silence(
    session: Session,
    *,
    alert_id: int,
    until: datetime | None,
    now: datetime,
    allowed_project: str | None,
) -> AlertOut:
    """Suppress this alert's notifications until ``until`` (``None`` lifts the silence).

    ``until`` must be in the future and at most :data:`MAX_SILENCE` ahead; it is stored in UTC
    (SQLite keeps no UTC offset: ``+05:00`` was stored as if it were ``Z``, five hours late).

    Raises:
        InvalidInput: ``until`` is naive, in the past, or too far ahead.
    """
    write_connection(session)
    alert, project, _ = _visible_alert(session, alert_id, allowed_project)
    if until is not None:
        if until.tzinfo is None:
            raise InvalidInput("until: must carry a timezone, e.g. 2026-11-22T08:00:00Z")
        if until <= now:
            raise InvalidInput("until: must be in the future (UTC)")
        if until > now + MAX_SILENCE:
            raise InvalidInput(
                f"until: must be at most {MAX_SILENCE.days} days ahead; silence again later, "
                "or disable the rule for the project"
            )
        until = until.astimezone(UTC)
    alert.silenced_until = until
    alert.updated_at = now
    session.flush()
    return _out(alert, project, until)


# ---------------------------------------------------------------------------------------------
# Rule configuration
# ---------------------------------------------------------------------------------------------


def _check_project(project: str, allowed_project: str | None) -> None:
    if allowed_project is not None and project != allowed_project:
        raise NotFound(f"project {project!r} not found")


def project_rule_overrides(
    session: Session, *, project: str, allowed_project: str | None
) -> dict[str, dict[str, Any]]:
    """A visible project's rule overrides by rule name (none for a project with no runs yet)."""
    _check_project(project, allowed_project)
    pid = session.scalar(select(Project.id).where(Project.name == project))
    return rule_overrides(session, project_id=pid) if pid is not None else {}


def put_rule_override(
    session: Session,
    *,
    project: str,
    rule: str,
    override: Mapping[str, Any],
    now: datetime,
    allowed_project: str | None,
) -> None:
    """Replace a project's override of ``rule`` with ``override`` (validated by the caller;
    ``{}`` deletes it: the rule returns to its defaults)."""
    _check_project(project, allowed_project)
    write_connection(session)
    pid = ensure_project(session, name=project)
    if not override:
        session.execute(
            delete(AlertRuleOverride).where(
                AlertRuleOverride.project_id == pid, AlertRuleOverride.rule == rule
            )
        )
        return
    # An upsert, so two admins writing at once cannot collide on the unique key.
    stmt = _dialect_insert(session)(AlertRuleOverride).values(
        project_id=pid, rule=rule, config=dict(override), updated_at=now
    )
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["project_id", "rule"],
            set_={"config": stmt.excluded.config, "updated_at": stmt.excluded.updated_at},
        )
    )
