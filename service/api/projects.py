"""Projects: which exist, and how many runs each has in each status.

A script's first question before it asks for a project's ranking or rules; the projects page
shows the same counts (:func:`curvecast.service.store.dashboard.project_summaries`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from curvecast.contract import PROJECT_PATTERN
from curvecast.service.deps import ReadPrincipal, SessionDep
from curvecast.service.routing import OneHopRoute
from curvecast.service.schemas import ProjectList, ProjectOut
from curvecast.service.store import projects as project_store

router = APIRouter(prefix="/api/v1/projects", tags=["projects"], route_class=OneHopRoute)


@router.get("", response_model=ProjectList, summary="List projects, by name")
def list_projects(session: SessionDep, principal: ReadPrincipal) -> ProjectList:
    """Every project the token may see (a project token: its own), each with its runs counted
    by status, when a run last changed and its firing alerts."""
    return ProjectList(projects=project_store.project_overviews(
        session, allowed_project=principal.project))


@router.get("/{project}", response_model=ProjectOut, summary="One project's runs by status")
def get_project(project: Annotated[str, Path(pattern=PROJECT_PATTERN)], session: SessionDep,
                principal: ReadPrincipal) -> ProjectOut:
    """One project, as the list shows it; 404 when it does not exist or is another's."""
    return project_store.project_overviews(session, allowed_project=principal.project,
                                           name=project)[0]
