"""Runs: create-or-get, update, read, list with keyset pagination, and liveness (marking runs
whose client is gone ``lost``, and reviving them when it comes back)."""

from __future__ import annotations

import base64
import binascii
import uuid
from datetime import datetime, timedelta
from functools import cache

from sqlalchemy import ColumnElement, Select, and_, bindparam, or_, select, update
from sqlalchemy.orm import Session

from curvecast.contract import FINAL_RUN_STATUSES, LOST_RUN_STATUS
from curvecast.service.errors import Conflict, Forbidden, InvalidInput, RunNotFound
from curvecast.service.models import Project, Run, RunWork
from curvecast.service.schemas import RunCreate, RunOut, RunPage, RunUpdate
from curvecast.service.store._common import as_utc, insert_ignore, utcnow, write_connection
from curvecast.service.store.projects import ensure_project


def _to_out(run: Run, project: str) -> RunOut:
    return RunOut(
        id=run.id,
        project=project,
        name=run.name,
        config=dict(run.config),
        status=run.status,  # type: ignore[arg-type]
        status_reason=run.status_reason,
        created_at=as_utc(run.created_at),
        updated_at=as_utc(run.updated_at),
        ended_at=as_utc(run.ended_at) if run.ended_at else None,
        last_step=run.last_step,
        n_points=run.n_points,
        last_seen_at=_last_seen(run),
        source=run.source,
    )


def _last_seen(run: Run) -> datetime | None:
    stamps = [as_utc(t) for t in (run.last_seen_at, run.last_ingest_at) if t is not None]
    return max(stamps) if stamps else None


def revive_values() -> str:
    """The ``SET`` assignments (SQL, both backends) that put a ``lost`` run (its client went
    silent) back to ``running``, and leave any other run as it is. Ingest applies them in its
    hand-written ``UPDATE runs``: a run that sends points again is alive. (Each assignment
    reads the row as it was, so all three see the old status.)"""
    lost = f"status = '{LOST_RUN_STATUS}'"
    return (
        f"status = CASE WHEN {lost} THEN 'running' ELSE status END, "
        f"status_reason = CASE WHEN {lost} THEN NULL ELSE status_reason END, "
        f"ended_at = CASE WHEN {lost} THEN NULL ELSE ended_at END"
    )


def _silent(now: datetime, client_gone_after_s: float) -> ColumnElement[bool]:
    gone = now - timedelta(seconds=client_gone_after_s)
    return and_(
        Run.status == "running",
        Run.created_at < gone,
        or_(Run.last_ingest_at.is_(None), Run.last_ingest_at < gone),
        or_(Run.last_seen_at.is_(None), Run.last_seen_at < gone),
    )


def silent_runs_exist(session: Session, *, now: datetime, client_gone_after_s: float) -> bool:
    """Whether :func:`mark_silent_runs_lost` would mark any run (a read: the usual answer
    is "no", and on SQLite a write transaction would queue behind ingest for nothing)."""
    stmt = select(Run.id).where(_silent(now, client_gone_after_s)).limit(1)
    return session.execute(stmt).first() is not None


def mark_silent_runs_lost(session: Session, *, now: datetime, client_gone_after_s: float) -> int:
    """Mark ``lost`` every ``running`` run whose client sent no points and made no request
    for ``client_gone_after_s`` (a live client sends a heartbeat every minute while it has
    nothing else to say). One conditional ``UPDATE``: safe in any number of processes at once,
    and a point that arrives meanwhile wins (the row no longer matches).

    Returns:
        How many runs were marked.
    """
    reason = (
        f"nothing from its client for {_duration(client_gone_after_s)} (no points, no "
        "heartbeat); running again if the client is heard from"
    )
    write_connection(session)
    result = session.execute(
        update(Run)
        .where(_silent(now, client_gone_after_s))
        .values(status=LOST_RUN_STATUS, status_reason=reason[:200], ended_at=now,
                updated_at=now),
        execution_options={"synchronize_session": False},
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def _duration(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:g} s"


def _visible(stmt: Select[Run, str], project: str | None) -> Select[Run, str]:
    return stmt if project is None else stmt.where(Project.name == project)


@cache
def _load_statement(by_project: bool) -> Select[Run, str]:
    """A run and its project's name; built once per shape (a run page polls it every 2 s,
    and building the statement cost more CPU than running it). Parameters: ``run_id``,
    ``project``."""
    stmt = select(Run, Project.name).join(Project).where(Run.id == bindparam("run_id"))
    return stmt.where(Project.name == bindparam("project")) if by_project else stmt


def _load(session: Session, run_id: uuid.UUID, project: str | None) -> tuple[Run, str]:
    row = session.execute(_load_statement(project is not None),
                          {"run_id": run_id, "project": project}).first()
    if row is None:
        raise RunNotFound(f"run {run_id} not found")
    return row[0], row[1]


def create_or_get_run(
    session: Session, *, run_id: uuid.UUID, run_in: RunCreate, allowed_project: str | None
) -> tuple[RunOut, bool]:
    """Create run ``run_id`` or return it unchanged if it exists (idempotent ``PUT``).

    Returns:
        The run and whether this call created it.

    Raises:
        Conflict: the id exists in another project (or is not visible to the caller).
    """
    if allowed_project is not None and run_in.project != allowed_project:
        raise Forbidden(f"this token may only create runs in project {allowed_project!r}")
    write_connection(session)
    project_id = ensure_project(session, name=run_in.project)
    now = utcnow()
    config = run_in.config.model_dump(exclude_none=True)
    # Whatever follows, the client was heard from: an existing run records it below.
    result = session.execute(
        insert_ignore(
            session,
            Run.__table__,  # type: ignore[arg-type]
            id=run_id,
            project_id=project_id,
            name=run_in.name or str(run_id)[:8],
            config=config,
            status="running",
            created_at=now,
            updated_at=now,
            last_seen_at=now,
            n_points=0,
        ).returning(Run.id)
    )
    # RETURNING yields a row only when the insert happened (rowcount is unreliable here).
    created = result.first() is not None
    if created:
        session.execute(insert_ignore(session, RunWork.__table__, run_id=run_id, fit_n_points=0))  # type: ignore[arg-type]
    row = session.execute(select(Run, Project.name).join(Project).where(Run.id == run_id)).one()
    run, project = row[0], row[1]
    if project != run_in.project:
        raise Conflict(f"run {run_id} already exists in another project; choose a new run id")
    if not created:
        run.last_seen_at = now
        _revive(run)  # a client that starts again (a resumed run) is back
        session.flush()
    return _to_out(run, project), created


def _revive(run: Run) -> None:
    """A ``lost`` run whose client is heard from is ``running`` again (see revive_values)."""
    if run.status == LOST_RUN_STATUS:
        run.status, run.status_reason, run.ended_at = "running", None, None


def get_run(session: Session, *, run_id: uuid.UUID, allowed_project: str | None) -> RunOut:
    """Return one run, or raise RunNotFound (also for runs of other projects)."""
    run, project = _load(session, run_id, allowed_project)
    return _to_out(run, project)


def update_run(
    session: Session, *, run_id: uuid.UUID, run_in: RunUpdate, allowed_project: str | None
) -> RunOut:
    """Apply a status/name change and merge config keys; record that the client was seen.

    Any request revives a ``lost`` run (its client is back); an empty body is the client's
    heartbeat: it only records ``last_seen_at``.
    """
    if run_in.status_reason is not None and run_in.status is None:
        raise InvalidInput("status_reason: give it together with the status it explains")
    write_connection(session)
    run, project = _load(session, run_id, allowed_project)
    now = utcnow()
    run.last_seen_at = now
    _revive(run)
    if not run_in.model_fields_set:
        session.flush()
        return _to_out(run, project)
    if run_in.name is not None:
        run.name = run_in.name
    if run_in.config is not None:
        run.config = {**run.config, **run_in.config.model_dump(exclude_none=True)}
    if run_in.status is not None:
        if run_in.status != run.status:
            run.status = run_in.status
            run.ended_at = now if run_in.status in FINAL_RUN_STATUSES else None
        # A new status replaces the old reason (none given: none stored).
        run.status_reason = run_in.status_reason
    run.updated_at = now
    session.flush()
    return _to_out(run, project)


def _encode_cursor(created_at: datetime, run_id: uuid.UUID) -> str:
    raw = f"{as_utc(created_at).isoformat()}|{run_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(token: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        stamp, run_id = raw.split("|")
        return datetime.fromisoformat(stamp), uuid.UUID(run_id)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidInput("page_token: not a token returned by this API") from exc


def list_runs(
    session: Session,
    *,
    project: str | None,
    status: str | None,
    limit: int,
    page_token: str | None,
    allowed_project: str | None,
) -> RunPage:
    """Runs, newest first, ``limit`` per page (keyset pagination: stable under inserts)."""
    if allowed_project is not None and project not in (None, allowed_project):
        return RunPage(runs=[], next_page_token=None)
    stmt = _visible(select(Run, Project.name).join(Project), allowed_project or project)
    if status is not None:
        stmt = stmt.where(Run.status == status)
    if page_token:
        created_at, after_id = _decode_cursor(page_token)
        stmt = stmt.where(
            or_(
                Run.created_at < created_at,
                and_(Run.created_at == created_at, Run.id < after_id),
            )
        )
    rows = session.execute(
        stmt.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit + 1)
    ).all()
    runs = [_to_out(r[0], r[1]) for r in rows[:limit]]
    next_token = (
        _encode_cursor(rows[limit - 1][0].created_at, rows[limit - 1][0].id)
        if len(rows) > limit
        else None
    )
    return RunPage(runs=runs, next_page_token=next_token)
