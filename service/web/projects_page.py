"""The projects page (every project the caller may see, with its runs by status and firing
alerts) and a project's own page (its runs, as the runs list shows them).

A project's page is where per-project views go: its runs table is one section of it, and its
leaderboard (the runs at a common step, with each one's chance of ending best: the answer of
``GET /api/v1/projects/{project}/ranking``) another, above it.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse, Response

from curvecast.contract import PROJECT_PATTERN
from curvecast.service.deps import SessionDep, SettingsDep
from curvecast.service.schemas import Principal
from curvecast.service.web import reads
from curvecast.service.web.pages import page_config, serve_page
from curvecast.service.web.responses import PageRoute, page

router = APIRouter(route_class=PageRoute)

ProjectName = Annotated[str, Path(pattern=PROJECT_PATTERN)]


@router.get("/projects", response_class=HTMLResponse)
def projects_page(request: Request, settings: SettingsDep, session: SessionDep) -> Response:
    """Every project the caller may see: its runs by status, firing alerts, last update."""

    def render(principal: Principal) -> Response:
        return page("projects.html", title="Projects",
                    projects=reads.project_rows(session, principal),
                    config=page_config(settings, "projects"))

    return serve_page(request, settings, render)


@router.get("/projects/{project}", response_class=HTMLResponse)
def project_page(request: Request, project: ProjectName, settings: SettingsDep,
                 session: SessionDep) -> Response:
    """One project: its leaderboard, and its runs (newest first), each as on the runs list,
    ticked to compare."""

    def render(principal: Principal) -> Response:
        summary = reads.project_rows(session, principal, project)[0]
        rows, next_token = reads.runs_rows(session, principal, project, None, None)
        ranking = reads.project_ranking(session, principal, project)
        return page("project.html", title=f"{project} · project", project=summary, rows=rows,
                    next_token=next_token, ranking=ranking,
                    config=page_config(settings, "project", nav="projects", project=project,
                                       rows_query="?" + urlencode({"project": project})))

    return serve_page(request, settings, render)
