"""Projects are created on first use (by a run or a token) and looked up by name."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from curvecast.service.errors import NotFound
from curvecast.service.models import Project
from curvecast.service.schemas import ProjectOut
from curvecast.service.store._common import insert_ignore, utcnow
from curvecast.service.store.dashboard import project_summaries


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


def check_visible(session: Session, *, name: str, allowed_project: str | None) -> None:
    """NotFound unless project ``name`` exists and the caller (a project token: its own
    project) may see it; another's project reads as missing (no existence leak)."""
    if allowed_project not in (None, name) or project_id(session, name=name) is None:
        raise NotFound(f"project {name!r} not found")


def project_overviews(session: Session, *, allowed_project: str | None,
                      name: str | None = None) -> list[ProjectOut]:
    """Every project the caller may see (a project token: its own), or only ``name`` (NotFound
    when it does not exist or is not the caller's), with its runs counted by status."""
    if name is not None:
        check_visible(session, name=name, allowed_project=allowed_project)
    return [ProjectOut(name=p.name, runs=p.runs, runs_by_status=p.runs_by_status,
                       last_update=p.last_update, firing_alerts=p.firing_alerts)
            for p in project_summaries(session, allowed_project=allowed_project, name=name)]
