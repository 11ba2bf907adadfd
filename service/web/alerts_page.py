"""The alerts page: every alert the caller may see, across runs (firing, then pending, then
resolved), with acknowledge and silence.

The list is the REST API's (``GET /api/v1/alerts``, read through the store); acknowledging and
silencing are the REST API's actions (``POST /api/v1/alerts/{id}/ack`` and ``.../silence``),
offered as plain same-origin form POSTs that need what those need: an ingest token (the login
cookie's) or auth off. Each answers by going back to the page it came from.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from curvecast.dashboards.lists import ALERT_STATES, SILENCE_HOURS
from curvecast.service.deps import SessionDep, SettingsDep
from curvecast.service.errors import ServiceError
from curvecast.service.schemas import Principal
from curvecast.service.store import alerts as alert_store
from curvecast.service.store._common import utcnow
from curvecast.service.web import reads
from curvecast.service.web.login import local_path, page_actor, page_principal
from curvecast.service.web.pages import ProjectFilter, page_config, serve_page
from curvecast.service.web.responses import PAGE_HEADERS, PageRoute, error_page, fragment, page

router = APIRouter(route_class=PageRoute)

#: An alert state, or "" for every state (what the filter form sends).
StateFilter = Annotated[Literal["firing", "pending", "resolved", ""] | None, Query()]
#: Alert ids as the REST API bounds them.
AlertId = Annotated[int, Path(ge=1, le=2**31 - 1)]
#: Where an action goes back to: a path of this site (anything else goes to /alerts).
NextPage = Annotated[str, Query(max_length=2000)]


def _view(session: SessionDep, principal: Principal, project: str | None, state: str | None
          ) -> dict[str, object]:
    rows, counts = reads.alerts_rows(session, principal, project or None, state or None)
    return {"rows": rows, "counts": counts, "can_act": principal.can("ingest"),
            "silence_hours": SILENCE_HOURS}


@router.get("/alerts", response_class=HTMLResponse)
def alerts_page(request: Request, settings: SettingsDep, session: SessionDep,
                project: ProjectFilter = None, state: StateFilter = None) -> Response:
    """Alerts across runs: state, run, rule, severity, step, summary, when it started; ack and
    silence for those still open."""

    def render(principal: Principal) -> Response:
        back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return page("alerts.html", title="Alerts", project=project or "", state=state or "",
                    states=ALERT_STATES, back=back,
                    config=page_config(settings, "alerts", project=project, state=state),
                    **_view(session, principal, project, state))

    return serve_page(request, settings, render)


@router.get("/dashboards/api/alerts-table", response_class=HTMLResponse)
def alerts_table(request: Request, settings: SettingsDep, session: SessionDep,
                 project: ProjectFilter = None, state: StateFilter = None,
                 back: NextPage = "/alerts") -> Response:
    """The alerts page's table rows alone (the page refreshes them in place)."""
    try:
        principal = page_principal(request, settings)
        view = _view(session, principal, project, state)
    except ServiceError as exc:
        return Response(exc.message, status_code=exc.status_code, headers=PAGE_HEADERS)
    return fragment("_alerts_rows.html", back=local_path(back), state=state or "", **view)


def _back(next_page: str) -> RedirectResponse:
    """Back to the page the action came from (a path of this site only)."""
    target = local_path(next_page)
    return RedirectResponse(target if target != "/" else "/alerts", status_code=303,
                            headers={"Cache-Control": "no-store"})


@router.post("/alerts/{alert_id}/ack", response_class=HTMLResponse)
def acknowledge(request: Request, alert_id: AlertId, settings: SettingsDep,
                session: SessionDep, next: NextPage = "/alerts") -> Response:  # noqa: A002
    """Acknowledge an alert (as ``POST /api/v1/alerts/{id}/ack``), then back to the page."""
    try:
        principal = page_actor(request, settings)
        alert_store.acknowledge(session, alert_id=alert_id, now=utcnow(),
                                allowed_project=principal.project)
    except ServiceError as exc:
        return error_page(settings, exc)
    return _back(next)


@router.post("/alerts/{alert_id}/silence", response_class=HTMLResponse)
def silence(request: Request, alert_id: AlertId, settings: SettingsDep, session: SessionDep,
            hours: Annotated[int | None, Query(ge=1, le=24 * 366)] = None,
            next: NextPage = "/alerts") -> Response:  # noqa: A002
    """Silence an alert's notifications for ``hours`` (none: lift the silence), as ``POST
    /api/v1/alerts/{id}/silence``, then back to the page."""
    try:
        principal = page_actor(request, settings)
        now = utcnow()
        alert_store.silence(session, alert_id=alert_id,
                            until=now + timedelta(hours=hours) if hours else None, now=now,
                            allowed_project=principal.project)
    except ServiceError as exc:
        return error_page(settings, exc)
    return _back(next)
