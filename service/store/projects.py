"""Projects are created on first use (by a run or a token) and looked up by name."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from curvecast.service.models import Project
from curvecast.service.store._common import insert_ignore, utcnow


def ensure_project(session: Session, *, name: str) -> int:
    """Return the id of project ``name``, creating it if needed (safe under concurrency)."""
    existing = session.scalar(select(Project.id).where(Project.name == name))
    if existing is not None:
        return existing
    session.execute(insert_ignore(session, Project.__table__, name=name, created_at=utcnow()))  # type: ignore[arg-type]
    project_id = session.scalar(select(Project.id).where(Project.name == name))
    assert project_id is not None
    return project_id


def project_id(session: Session, *, name: str) -> int | None:
    """The id of project ``name``, or None."""
    return session.scalar(select(Project.id).where(Project.name == name))


def list_projects(session: Session) -> list[str]:
    """All project names, sorted."""
    return list(session.scalars(select(Project.name).order_by(Project.name)))
