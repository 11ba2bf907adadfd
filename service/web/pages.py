"""The HTML pages: the runs list (and its table's rows, refreshed in place), a run, a
comparison.

Each page is rendered on the server with what it shows first; its charts arrive as chart data
(:mod:`.charts`) and its script keeps them live through the REST API. An error (no token, a
run of another project, a malformed run list) answers as a page that says what went wrong.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, cast, get_args
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response
from markupsafe import Markup
from pydantic import BeforeValidator
from sqlalchemy.orm import Session

from curvecast.contract import KEY_MAX_LENGTH, LEVEL_EXTENDING_STATUSES, MAX_STEP, is_valid_key
from curvecast.dashboards import figures, palette, views
from curvecast.dashboards.figures.static_svg import static_svg
from curvecast.service.deps import SessionDep, SettingsDep
from curvecast.service.errors import InvalidInput, ServiceError
from curvecast.service.schemas import PROJECT_FILTER_PATTERN, Principal, RunOut, RunStatus
from curvecast.service.web import compare_chances, reads
from curvecast.service.web.login import page_principal, token_login
from curvecast.service.web.responses import PAGE_HEADERS, PageRoute, error_page, fragment, page

router = APIRouter(route_class=PageRoute)

#: Where the pages' scripts reach the REST API: directly, or with auth on through the proxy
#: that adds the login cookie's token (:mod:`.proxy`).
_API = "/api/v1"
_API_VIA_COOKIE = "/dashboards/api/v1"
#: Poll interval of the live pages.
POLL_MS = 2000
_STATUSES: list[str] = list(get_args(RunStatus))

#: A run status, or "" for any (what the filter form sends). One Literal (nested Literals
#: flatten), so that a bad value's message lists the statuses (a pattern's message quoted the
#: regular expression), and the statuses are RunStatus's, not a copy of them.
StatusFilter = Annotated[Literal[RunStatus, ""] | None, Query()]
ProjectFilter = Annotated[str | None, Query(pattern=PROJECT_FILTER_PATTERN)]
PageToken = Annotated[str | None, Query(max_length=500)]


def serve_page(request: Request, settings: SettingsDep,
               render: Callable[[Principal], Response]) -> Response:
    """A page: the ``?token=`` login when asked, else ``render`` for the caller, with any
    error (no token, no such run, bad input) as an error page."""
    if (login := token_login(request, settings)) is not None:
        return login
    try:
        return render(page_principal(request, settings))
    except ServiceError as exc:
        return error_page(settings, exc)


def page_config(settings: SettingsDep, page_id: str, **extra: Any) -> dict[str, Any]:
    """What a page's script needs to know (JSON in the page, ``cc-config``)."""
    # "auth": the page shows its "Sign out" form (base.html).
    return {"page": page_id, "api": _API_VIA_COOKIE if settings.auth_enabled else _API,
            "auth": settings.auth_enabled,
            "data": "/dashboards/api", "poll_ms": POLL_MS, **extra}


def compare_href(run_ids: Sequence[str], horizon: int | None = None,
                 key: str | None = None) -> str:
    """The compare page's address for ``run_ids``: ``/compare?runs=ID1,ID2[&horizon=N][&key=K]``.

    The one format every link to the page uses (the runs list's "Compare selected" and the
    compare page's picker build the same in ``dashboards.js``: ``cc.compareHref``).
    """
    href = "/compare?runs=" + ",".join(quote(i, safe="") for i in run_ids)
    return (href + (f"&horizon={horizon}" if horizon else "")
            + (f"&key={quote(key, safe='')}" if key else ""))


def _rows(session: SessionDep, principal: Principal, project: str | None, status: str | None,
          page_token: str | None) -> tuple[list[dict[str, Any]], str | None]:
    # The filter form sends "" for "all projects" and "any status".
    run_status = cast("RunStatus | None", status or None)  # the pattern admits only these
    return reads.runs_rows(session, principal, project or None, run_status, page_token or None)


@router.get("/", response_class=HTMLResponse)
def runs_page(request: Request, settings: SettingsDep, session: SessionDep,
              project: ProjectFilter = None, status: StatusFilter = None,
              page_token: PageToken = None) -> Response:
    """The runs list: status, progress, last loss, forecast, f*, firing alerts, trend."""

    def render(principal: Principal) -> Response:
        rows, next_token = _rows(session, principal, project, status, page_token)
        return page("runs.html", title="Runs", rows=rows, project=project or "",
                    status=status or "", next_token=next_token, statuses=_STATUSES,
                    config=page_config(settings, "runs", project=project, status=status))

    return serve_page(request, settings, render)


@router.get("/dashboards/api/runs-table", response_class=HTMLResponse)
def runs_table(request: Request, settings: SettingsDep, session: SessionDep,
               project: ProjectFilter = None, status: StatusFilter = None,
               page_token: PageToken = None) -> Response:
    """The runs list's table rows alone (the page refreshes them in place)."""
    try:
        principal = page_principal(request, settings)
        rows, _next = _rows(session, principal, project, status, page_token)
    except ServiceError as exc:
        return Response(exc.message, status_code=exc.status_code, headers=PAGE_HEADERS)
    return fragment("_runs_rows.html", rows=rows)


#: A page's "Series" list: "" is its default entry (the run's, or the runs', default series).
SeriesChoice = Annotated[str, Query(max_length=KEY_MAX_LENGTH,
                                    description="The loss series to forecast (empty: the "
                                    "page's default)")]


def _check_key(key: str) -> None:
    """A "Series" choice is "" (the default) or a metric name (the API's ``?key=`` pattern)."""
    if key and not is_valid_key(key):
        raise InvalidInput(f"key: {key[:40]!r} is not a metric name; choose a series from "
                           "the list, or leave it at the default")


def _series_options(session: Session, runs: Sequence[RunOut], key: str
                    ) -> list[dict[str, str]]:
    """The entries of a page's "Series" list: the loss series the runs log (with how many of
    them log each, where not all do), and ``key`` however it came."""
    options = [{"key": name, "label": name if n == len(runs) else
                f"{name} ({n} of {len(runs)} runs)"}
               for name, n in reads.loss_series(session, runs)]
    if key and key not in {o["key"] for o in options}:
        options.append({"key": key, "label": f"{key} (no run logs it)"})
    return options


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: uuid.UUID, settings: SettingsDep,
             session: SessionDep, key: SeriesChoice = "") -> Response:
    """One run: headline numbers, loss and forecast (of ``key``, else of the run's default
    series), optimizer telemetry, alerts, forecast evolution, live."""

    def render(principal: Principal) -> Response:
        run = reads.get_run(session, principal, run_id)
        _check_key(key)
        series = _series_options(session, [run], key)
        config_rows = [(k, v if isinstance(v, str) else json.dumps(v))
                       for k, v in sorted(run.config.items())]
        config = page_config(settings, "run", run_id=str(run_id), run_status=run.status,
                             charts=list(views.RUN_CHARTS), key=key or None,
                             level_extending=list(LEVEL_EXTENDING_STATUSES))
        # The loss chart drawn by the server too: it shows at first paint, before plotly.js
        # (megabytes of JavaScript on a first visit) has loaded and drawn the real one.
        fits = reads.run_fits(session, principal, run, key or None)
        loss = views.run_figures(reads.run_page(session, principal, run, ["loss"], (None, None),
                                                key or None, fits), ["loss"])["loss"]
        first = f"/dashboards/api/runs/{run_id}/figures" + (
            "?" + urlencode({"key": key}) if key else "")
        # The list's default entry names the series it stands for (the default switches from
        # the training loss to the eval loss once that has enough points): the newest fit's
        # when the page shows the default series, else that series' own newest fit's.
        default = None
        if len(series) > 1:
            default = (reads.default_fit_key(session, principal, run) if key
                       else fits.latest.key if fits.latest is not None else None)
        return page("run.html", title=run.name or str(run_id), run=run.model_dump(mode="json"),
                    config_rows=config_rows, config=config, series=series, key=key,
                    default_key=default,
                    compare_href=compare_href([str(run_id)], key=key or None),
                    first_data=first, loss_preview=Markup(static_svg(loss)))

    return serve_page(request, settings, render)


#: The compare form's horizon: its field left empty ("planned end") submits ``horizon=``.
FormHorizon = Annotated[
    int | None, BeforeValidator(lambda v: None if v == "" else v),
    Query(description="Step to forecast to (default: the furthest step every run can be "
          "compared at)"),
]


def _check_horizon(horizon: int | None) -> None:
    """The bounds the form's horizon has once a blank one is None (checked here: the query's
    own ``ge`` would also be applied to None)."""
    if horizon is not None and not 1 <= horizon <= MAX_STEP:
        raise InvalidInput(f"horizon: a step from 1 to 2**62, got {horizon}")


@router.get("/compare", response_class=HTMLResponse)
def compare_page(
    request: Request,
    settings: SettingsDep,
    session: SessionDep,
    runs: Annotated[str, Query(max_length=2000, description="Comma-separated run ids")] = "",
    horizon: FormHorizon = None,
    key: SeriesChoice = "",
) -> Response:
    """Several runs overlaid with their forecasts to a common horizon, which will be best, and
    a picker to add or drop runs."""

    def render(principal: Principal) -> Response:
        ids = reads.parse_run_ids(runs)
        _check_horizon(horizon)
        chosen_runs = [reads.get_run(session, principal, i) for i in ids]
        _check_key(key)
        series = _series_options(session, chosen_runs, key)
        found = [run.model_dump(mode="json") for run in chosen_runs]
        keys = [str(i) for i in ids]
        listed = ",".join(keys)
        first = "/dashboards/api/compare?" + urlencode(
            {"runs": listed, **({"horizon": horizon} if horizon else {}),
             **({"key": key} if key else {})})
        # The picker: each run in the chart's colour with a link that drops it (the last
        # one stays: a comparison needs a run), and runs of the first run's project first.
        # Two runs of one name carry their short ids, as in the chart and the verdict.
        shared = figures.shared_names(found)
        # Each run's chance of ending best where the page compares them (the leaderboard's).
        default = views.common_horizon(found)
        p_best = compare_chances.chances_best(session, principal, ids, horizon or default,
                                              key or None)
        chosen = [{**run, "name": figures.run_label(run, shared[index]),
                   "p_best": p_best.get(run["id"], (None, ""))[0],
                   "p_best_why": p_best.get(run["id"], (None, ""))[1],
                   "colour": palette.run_colour(index),
                   "remove": compare_href([k for k in keys if k != run["id"]], horizon, key)
                   if len(keys) > 1 else None}
                  for index, run in enumerate(found)]
        config = page_config(settings, "compare", run_ids=keys, horizon=horizon,
                             key=key or None, project=found[0]["project"],
                             max_runs=reads.MAX_COMPARE)
        # The horizon the page compares at when none is typed: ``default``.
        return page("compare.html", title="Compare runs", runs=chosen, horizon=horizon or "",
                    default_horizon=default,
                    run_ids=listed, config=config, first_data=first, series=series, key=key,
                    max_runs=reads.MAX_COMPARE)

    return serve_page(request, settings, render)
