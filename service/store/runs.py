"""Runs: create-or-get, update, read, list with keyset pagination."""

from __future__ import annotations

import base64
import binascii
import uuid
from datetime import datetime

from sqlalchemy import Select, and_, or_, select
from sqlalchemy.orm import Session

from curvecast.contract import FINAL_RUN_STATUSES
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
        created_at=as_utc(run.created_at),
        updated_at=as_utc(run.updated_at),
        ended_at=as_utc(run.ended_at) if run.ended_at else None,
        last_step=run.last_step,
        n_points=run.n_points,
    )


def _visible(stmt: Select[Run, str], project: str | None) -> Select[Run, str]:
    return stmt if project is None else stmt.where(Project.name == project)


def _load(session: Session, run_id: uuid.UUID, project: str | None) -> tuple[Run, str]:
    stmt = _visible(select(Run, Project.name).join(Project).where(Run.id == run_id), project)
    row = session.execute(stmt).first()
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
    return _to_out(run, project), created


def get_run(session: Session, *, run_id: uuid.UUID, allowed_project: str | None) -> RunOut:
    """Return one run, or raise RunNotFound (also for runs of other projects)."""
    run, project = _load(session, run_id, allowed_project)
    return _to_out(run, project)


def update_run(
    session: Session, *, run_id: uuid.UUID, run_in: RunUpdate, allowed_project: str | None
) -> RunOut:
    """Apply a status/name change and merge config keys."""
    write_connection(session)
    run, project = _load(session, run_id, allowed_project)
    now = utcnow()
    if run_in.name is not None:
        run.name = run_in.name
    if run_in.config is not None:
        run.config = {**run.config, **run_in.config.model_dump(exclude_none=True)}
    if run_in.status is not None and run_in.status != run.status:
        run.status = run_in.status
        run.ended_at = now if run_in.status in FINAL_RUN_STATUSES else None
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
