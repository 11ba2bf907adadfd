"""Dashboard pages: the runs list, a run, a comparison, and the data their charts draw.

Routes stay thin. Page data comes from the service's own REST API, called in-process (no
network, same auth, same shapes any client sees); :mod:`curvecast.dashboards.views` turns the
answers
into Plotly figures; templates in ``dashboards/templates`` render with autoescaping. The runs
list is the exception: it reads a whole page of runs with one store call
(``service.store.dashboard``) instead of several REST calls per run.

Auth (``CURVECAST_AUTH_ENABLED=true``): open any page once with ``?token=<read token>``; the
token is checked, stored in an HttpOnly cookie (``SameSite=Lax``, ``Secure`` over HTTPS) and
the browser is redirected to the same URL without it. Every later page and chart-data request
authenticates with the cookie (or an ``Authorization`` header). The pages' JavaScript reaches
the REST API through ``/dashboards/api/v1/...``, which forwards GET requests in-process with the
cookie's token as a bearer token, so scripts in the page never see the token.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import uuid
from functools import cache
from pathlib import Path
from typing import Annotated, Any, cast
from urllib.parse import urlencode

import plotly
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from curvecast.dashboards import html, views
from curvecast.dashboards.data import EVAL_KEYS, TRAIN_KEY, ForecastData
from curvecast.dashboards.data import horizon as run_horizon
from curvecast.service.api.forecast import forecast_out
from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.errors import InvalidInput, ServiceError, Unauthenticated
from curvecast.service.forecast import Fit
from curvecast.service.schemas import MAX_STEP, PROJECT_FILTER_PATTERN, Principal, RunStatus
from curvecast.service.store import dashboard as dashboard_store
from curvecast.service.store import tokens

router = APIRouter(tags=["dashboards"], include_in_schema=False)

COOKIE = "curvecast_token"
API = "/api/v1"
#: Poll interval of the live pages.
POLL_MS = 2000
#: Runs on one compare page at most.
MAX_COMPARE = 8
_YEAR = "public, max-age=31536000, immutable"
# plotly.js compiles shader code with new Function (WebGL traces): 'unsafe-eval' is needed;
# inline scripts stay forbidden, which is what stops injected markup from running.
_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; worker-src 'self' "
    "blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
_PAGE_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_PROXY_PATH = re.compile(r"^[A-Za-z0-9_.\-/]{1,300}$")


# --- in-process REST calls ------------------------------------------------------------------


class RestError(Exception):
    """A REST answer that was not 2xx (status and the standard error body)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("message", ""))
        self.status = status
        self.error_code = str(body.get("error_code", "internal_error"))
        self.message = str(body.get("message", ""))


class Rest:
    """GET requests to this service's REST API, in-process, with the caller's token."""

    def __init__(self, request: Request, token: str | None) -> None:
        self._app = request.app
        self._scope = request.scope
        self._token = token

    async def raw(self, path: str, params: dict[str, Any] | None = None
                  ) -> tuple[int, str, bytes]:
        """Status, content type and body of ``GET path?params``."""
        query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
        headers = [(b"host", b"curvecast.internal"), (b"accept", b"application/json")]
        if self._token:
            headers.append((b"authorization", f"Bearer {self._token}".encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": self._scope.get("scheme", "http"),
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": query.encode(),
            "headers": headers,
            "client": self._scope.get("client"),
            "server": self._scope.get("server"),
            "state": dict(self._scope.get("state") or {}),
            "extensions": {},
        }
        done = asyncio.Event()
        answered = False
        status, content_type, chunks = 500, "", []

        async def receive() -> dict[str, Any]:
            nonlocal answered
            if not answered:
                answered = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, content_type
            if message["type"] == "http.response.start":
                status = int(message["status"])
                for name, value in message.get("headers", []):
                    if name.lower() == b"content-type":
                        content_type = value.decode("latin-1")
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    done.set()

        try:
            await self._app(scope, receive, send)
        finally:
            done.set()
        return status, content_type, b"".join(chunks)

    async def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """The JSON answer of ``GET path``; raises :class:`RestError` unless 2xx."""
        status, _type, body = await self.raw(path, params)
        data = json.loads(body) if body else None
        if not 200 <= status < 300:
            raise RestError(status, data if isinstance(data, dict) else {})
        return data

    async def get_or_none(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """Like :meth:`get`, but a 404 answers None (e.g. no such optional API)."""
        try:
            return await self.get(path, params)
        except RestError as exc:
            if exc.status == 404:
                return None
            raise


def _alerts_api(request: Request) -> tuple[bool, bool]:
    """Whether the service has a run's alerts (``GET /api/v1/runs/{id}/alerts``) and the
    alerts listing (``GET /api/v1/alerts``): read from the app's OpenAPI paths (built once),
    so the pages work with or without the alerting module."""
    paths = request.app.openapi().get("paths", {})
    run_alerts = any(re.fullmatch(r"/api/v1/runs/\{\w+\}/alerts", p) and "get" in ops
                     for p, ops in paths.items())
    listing = "get" in paths.get("/api/v1/alerts", {})
    return run_alerts, listing


# --- auth ----------------------------------------------------------------------------------------


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.cookies.get(COOKIE) or None


def _principal(request: Request, token: str | None) -> Principal:
    """The caller (cookie or header token); everyone is an admin when auth is off."""
    if not _settings(request).auth_enabled:
        return Principal(project=None, scope="admin")
    if not token:
        raise Unauthenticated("this page needs a read token")
    with session_scope(request.app.state.sessionmaker) as session:
        return tokens.authenticate(session, token=token)


def _error_page(request: Request, status: int, message: str) -> HTMLResponse:
    auth = _settings(request).auth_enabled
    body = html.render("error.html", title=f"{status}", status=status, message=message,
                       auth=auth and status in (401, 403), config={"page": "error"})
    return HTMLResponse(body, status_code=status, headers=_PAGE_HEADERS)


def _token_login(request: Request) -> Response | None:
    """``?token=...``: check it, keep it in an HttpOnly cookie, redirect without it."""
    token = request.query_params.get("token")
    if token is None or not _settings(request).auth_enabled:
        return None
    try:
        _principal(request, token)
    except ServiceError as exc:
        return _error_page(request, exc.status_code, exc.message)
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
    response = RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})
    secure = request.url.scheme == "https" or _settings(request).public_url.startswith("https")
    response.set_cookie(COOKIE, token, httponly=True, samesite="lax", secure=secure, path="/")
    return response


def _page_config(request: Request, page: str, **extra: Any) -> dict[str, Any]:
    auth = _settings(request).auth_enabled
    run_alerts, all_alerts = _alerts_api(request)
    return {
        "page": page,
        # With auth on, the page's scripts reach the API through the cookie-forwarding proxy.
        "api": "/dashboards/api/v1" if auth else API,
        "data": "/dashboards/api",
        "poll_ms": POLL_MS,
        "alerts_api": run_alerts,
        "alerts_list_api": all_alerts,
        **extra,
    }


def _html(template: str, **context: Any) -> HTMLResponse:
    return HTMLResponse(html.render(template, plotly_url=_plotly_url(), **context),
                        headers=_PAGE_HEADERS)


# --- pages ---------------------------------------------------------------------------------------

#: A run status, or "" for any (what the filter form sends).
StatusFilter = Annotated[
    str | None, Query(pattern=r"^(|running|finished|failed|crashed)$")
]


@router.get("/", response_class=HTMLResponse)
async def runs_page(
    request: Request,
    project: Annotated[str | None, Query(pattern=PROJECT_FILTER_PATTERN)] = None,
    status: StatusFilter = None,
    page_token: Annotated[str | None, Query(max_length=500)] = None,
) -> Response:
    """The runs list: status, progress, last loss, forecast, f*, firing alerts, trend."""
    if (login := _token_login(request)) is not None:
        return login
    try:
        rows, next_token = await _runs_rows(request, project, status, page_token)
    except ServiceError as exc:
        return _error_page(request, exc.status_code, exc.message)
    config = _page_config(request, "runs", project=project, status=status)
    return _html("runs.html", title="Runs", rows=rows, project=project or "",
                 status=status or "", next_token=next_token, config=config,
                 statuses=["running", "finished", "failed", "crashed"])


@router.get("/dashboards/api/runs-table", response_class=HTMLResponse)
async def runs_table(
    request: Request,
    project: Annotated[str | None, Query(pattern=PROJECT_FILTER_PATTERN)] = None,
    status: StatusFilter = None,
    page_token: Annotated[str | None, Query(max_length=500)] = None,
) -> Response:
    """The runs list's table body alone (the page refreshes it in place)."""
    try:
        rows, _next = await _runs_rows(request, project, status, page_token)
    except ServiceError as exc:
        return Response(exc.message, status_code=exc.status_code, headers=_PAGE_HEADERS)
    return HTMLResponse(html.render("_runs_rows.html", rows=rows), headers=_PAGE_HEADERS)


async def _runs_rows(request: Request, project: str | None, status: str | None,
                     page_token: str | None) -> tuple[list[dict[str, Any]], str | None]:
    token = _token(request)
    # The filter form sends "" for "all projects" and "any status".
    project = project or None
    run_status = cast("RunStatus | None", status or None)  # the pattern admits only these
    page_token = page_token or None
    principal = await run_in_threadpool(_principal, request, token)

    def read() -> tuple[list[dashboard_store.RunSummary], str | None]:
        with session_scope(request.app.state.sessionmaker) as session:
            return dashboard_store.run_summaries(
                session, project=project, status=run_status, limit=200,
                page_token=page_token,
                allowed_project=principal.project,
            )

    summaries, next_token = await run_in_threadpool(read)
    firing: dict[str, int] | None = None
    if _alerts_api(request)[1]:
        answer = await Rest(request, token).get_or_none(
            f"{API}/alerts", {"state": "firing", "project": project, "limit": 1000})
        firing = {}
        for alert in (answer or {}).get("alerts", []):
            firing[str(alert.get("run_id"))] = firing.get(str(alert.get("run_id")), 0) + 1
    items = []
    for s in summaries:
        forecast = None
        if s.latest_fit is not None:
            horizon, _planned = run_horizon(s.run.config, s.run.last_step)
            forecast = forecast_out(Fit.from_dict(s.latest_fit.fit), horizon=horizon,
                                    confidence=0.9).model_dump(mode="json")
        items.append({
            "run": s.run.model_dump(mode="json"),
            "last_loss": s.last_loss,
            "spark_steps": s.spark_steps,
            "spark_values": s.spark_values,
            "forecast": forecast,
            "firing": None if firing is None else firing.get(str(s.run.id), 0),
        })
    return views.runs_rows(items), next_token


@router.get("/runs/{run_id}", response_class=HTMLResponse)
async def run_page(request: Request, run_id: uuid.UUID) -> Response:
    """One run: loss and forecast, optimizer telemetry, alerts, forecast evolution, live."""
    if (login := _token_login(request)) is not None:
        return login
    token = _token(request)
    try:
        await run_in_threadpool(_principal, request, token)
        run = await Rest(request, token).get(f"{API}/runs/{run_id}")
    except ServiceError as exc:
        return _error_page(request, exc.status_code, exc.message)
    except RestError as exc:
        return _error_page(request, exc.status, exc.message)
    config_rows = [(k, v if isinstance(v, str) else json.dumps(v))
                   for k, v in sorted((run.get("config") or {}).items())]
    page_config = _page_config(request, "run", run_id=str(run_id), run_status=run.get("status"),
                               charts=list(views.RUN_CHARTS))
    return _html("run.html", title=run.get("name") or str(run_id), run=run,
                 config_rows=config_rows, config=page_config,
                 first_data=f"/dashboards/api/runs/{run_id}/figures")


@router.get("/compare", response_class=HTMLResponse)
async def compare_page(
    request: Request,
    runs: Annotated[str, Query(max_length=2000, description="Comma-separated run ids")] = "",
    horizon: Annotated[int | None, Query(ge=1, le=MAX_STEP)] = None,
) -> Response:
    """Several runs overlaid with their forecasts to a common horizon, and which will be best."""
    if (login := _token_login(request)) is not None:
        return login
    token = _token(request)
    try:
        await run_in_threadpool(_principal, request, token)
        ids = _parse_run_ids(runs)
        rest = Rest(request, token)
        found = await asyncio.gather(*(rest.get(f"{API}/runs/{i}") for i in ids))
    except ServiceError as exc:
        return _error_page(request, exc.status_code, exc.message)
    except RestError as exc:
        return _error_page(request, exc.status, exc.message)
    page_config = _page_config(request, "compare", run_ids=[str(i) for i in ids],
                               horizon=horizon)
    first = "/dashboards/api/compare?" + urlencode(
        {"runs": ",".join(str(i) for i in ids), **({"horizon": horizon} if horizon else {})})
    return _html("compare.html", title="Compare runs", runs=found, horizon=horizon or "",
                 run_ids=",".join(str(i) for i in ids), config=page_config, first_data=first)


def _parse_run_ids(text: str) -> list[uuid.UUID]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise InvalidInput("runs: give the run ids to compare, e.g. /compare?runs=ID1,ID2")
    if len(parts) > MAX_COMPARE:
        raise InvalidInput(f"runs: at most {MAX_COMPARE} runs per comparison")
    ids = []
    for index, part in enumerate(parts):
        try:
            ids.append(uuid.UUID(part))
        except ValueError:
            raise InvalidInput(f"runs[{index}]: {part[:40]!r} is not a run id") from None
    return list(dict.fromkeys(ids))


# --- chart data ----------------------------------------------------------------------------------


def _json(body: str | bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json",
                    headers={"Cache-Control": "no-store"})


def _rest_error(exc: RestError) -> Response:
    return _json(json.dumps({"error_code": exc.error_code, "message": exc.message}), exc.status)


def _x_range(
    start: int | None, end: int | None
) -> tuple[list[float] | None, int | None, int | None]:
    if start is None and end is None:
        return None, None, None
    lo = max(0, start or 0)
    hi = end if end is not None else MAX_STEP
    if hi < lo:
        lo, hi = hi, lo
    return [float(lo), float(hi)], lo, hi


async def _band(rest: Rest, path: str, fit: ForecastData | None, end: int | None,
                n: int = views.BAND_SAMPLES) -> list[Any]:
    """The forecast interval at a few steps up to ``end`` (the band), asked of the REST API."""
    if fit is None:
        return []
    steps = views.band_steps(fit.fitted_upto_step, end, n)
    answers = await asyncio.gather(*(rest.get(path, {"horizon": s}) for s in steps))
    return [a.get("prediction") for a in answers]


@router.get("/dashboards/api/runs/{run_id}/figures")
async def run_figures(
    request: Request,
    run_id: uuid.UUID,
    charts: Annotated[str | None, Query(description="Comma-separated chart ids")] = None,
    start: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    end: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
) -> Response:
    """The run page's figures (all, or ``charts``), optionally for the step range
    [start, end] after a zoom, with headline numbers and the live-update cursor."""
    wanted = [c for c in (charts or "").split(",") if c] or list(views.RUN_CHARTS)
    unknown = [c for c in wanted if c not in views.RUN_CHARTS]
    if unknown:
        return _json(json.dumps({"error_code": "invalid_request", "message":
                                 f"charts: unknown {unknown[0]!r}; choose from "
                                 f"{', '.join(views.RUN_CHARTS)}"}), 422)
    x_range, lo, hi = _x_range(start, end)
    rest = Rest(request, _token(request))
    base = f"{API}/runs/{run_id}"
    loss_keys = views.chart_keys("loss") if "loss" in wanted else []
    telemetry = [k for c in wanted if c != "loss" for k in views.chart_keys(c)]
    run_alerts, _ = _alerts_api(request)

    # Everything is asked at once; only the forecast waits for the run (its horizon) and the
    # band for the forecast (its last fitted step). The metrics reads are the long pole.
    async def metrics(keys: list[str], max_points: int) -> list[Any]:
        if not keys:
            return []
        answer = await rest.get(f"{base}/metrics", {
            "keys": ",".join(keys), "start": lo, "end": hi, "max_points": max_points})
        return list(answer["series"])

    async def horizon() -> int | None:
        run = await run_task
        return run_horizon(run.get("config") or {}, run.get("last_step"))[0]

    async def forecast_and_band() -> tuple[Any, list[Any]]:
        if "loss" not in wanted:
            return None, []
        end = await horizon()
        forecast = await rest.get(f"{base}/forecast", {"horizon": end})
        band = await _band(rest, f"{base}/forecast", ForecastData.from_api(forecast), end)
        return forecast, band

    async def history() -> Any:
        if "evolution" not in wanted:
            return None
        return await rest.get(f"{base}/forecast/history", {"horizon": await horizon(),
                                                             "limit": 200})

    run_task = asyncio.ensure_future(rest.get(base))
    try:
        run, loss_series, telemetry_series, (forecast, band), fit_history, alerts = (
            await asyncio.gather(
                run_task,
                metrics(loss_keys, views.MAX_POINTS["loss"]),
                metrics(telemetry, views.DEFAULT_MAX_POINTS),
                forecast_and_band(),
                history(),
                rest.get_or_none(f"{base}/alerts") if run_alerts else _none(),
            )
        )
    except RestError as exc:
        return _rest_error(exc)
    page = views.RunPage(
        run=run, metrics=loss_series + telemetry_series, forecast=forecast, band=band,
        history=fit_history, alerts=(alerts or {}).get("alerts", []),
        alerts_available=run_alerts,
    )
    body = await run_in_threadpool(views.run_payload, page, wanted, x_range)
    return _json(body)


async def _none() -> None:
    return None


@router.get("/dashboards/api/compare")
async def compare_figures(
    request: Request,
    runs: Annotated[str, Query(max_length=2000)],
    horizon: Annotated[int | None, Query(ge=1, le=MAX_STEP)] = None,
    start: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    end: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
) -> Response:
    """The compare page's figures: losses and forecasts overlaid, and the ranking."""
    rest = Rest(request, _token(request))
    x_range, lo, hi = _x_range(start, end)
    try:
        ids = _parse_run_ids(runs)
        found = await asyncio.gather(*(rest.get(f"{API}/runs/{i}") for i in ids))
        common = views.common_horizon(found, horizon)

        async def one(run: dict[str, Any]) -> views.CompareRun:
            base = f"{API}/runs/{run['id']}"
            metrics, forecast = await asyncio.gather(
                rest.get(f"{base}/metrics", {"keys": ",".join([TRAIN_KEY, *EVAL_KEYS]),
                                              "start": lo, "end": hi,
                                              "max_points": views.MAX_POINTS["compare"]}),
                rest.get(f"{base}/forecast", {"horizon": common}),
            )
            fit = ForecastData.from_api(forecast)
            band = await _band(rest, f"{base}/forecast", fit, common, n=6)
            return views.CompareRun(run=run, metrics=metrics["series"], forecast=forecast,
                                    band=band, at_horizon=forecast.get("prediction"))

        items = await asyncio.gather(*(one(r) for r in found))
    except RestError as exc:
        return _rest_error(exc)
    except ServiceError as exc:
        return _json(json.dumps({"error_code": exc.error_code, "message": exc.message}),
                     exc.status_code)
    body = await run_in_threadpool(views.compare_payload, items, common, x_range)
    return _json(body)


@router.get("/dashboards/api/v1/{path:path}")
async def rest_proxy(request: Request, path: str) -> Response:
    """GET ``/api/v1/{path}`` in-process with the cookie's token as a bearer token, so the
    pages' scripts call the REST API without ever holding the token. Read-only (GET)."""
    if not _PROXY_PATH.fullmatch(path) or ".." in path.split("/"):
        return _json(json.dumps({"error_code": "not_found", "message": "no such API path"}),
                     404)
    params = dict(request.query_params.multi_items())
    status, content_type, body = await Rest(request, _token(request)).raw(f"{API}/{path}", params)
    return Response(body, status_code=status, media_type=content_type or "application/json",
                    headers={"Cache-Control": "no-store"})


@router.get("/logout", response_class=HTMLResponse)
def logout() -> Response:
    """Forget the token cookie."""
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


# --- static files --------------------------------------------------------------------------------


@cache
def _plotly_js() -> tuple[bytes, bytes, str]:
    """plotly.min.js from the installed plotly package: raw, gzipped, and an ETag."""
    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    raw = path.read_bytes()
    return raw, gzip.compress(raw, compresslevel=4, mtime=0), f'"plotly-{plotly.__version__}"'


def _plotly_url() -> str:
    return f"/static/plotly.min.js?v={plotly.__version__}"


@router.get("/static/plotly.min.js")
def plotly_js(request: Request) -> Response:
    """plotly.js from the installed plotly Python package (never a CDN), cached for a year
    (the URL carries the package version), gzipped when the browser accepts it."""
    raw, packed, etag = _plotly_js()
    headers = {"Cache-Control": _YEAR, "ETag": etag, "Vary": "Accept-Encoding"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    if "gzip" in request.headers.get("accept-encoding", ""):
        headers["Content-Encoding"] = "gzip"
        return Response(packed, media_type="text/javascript; charset=utf-8", headers=headers)
    return Response(raw, media_type="text/javascript; charset=utf-8", headers=headers)


@router.get("/static/{name}")
def static_file(name: str, v: str | None = None) -> Response:
    """Our own small CSS and JavaScript (no build step)."""
    media_type = html.STATIC_FILES.get(name)
    if media_type is None:
        return _json(json.dumps({"error_code": "not_found", "message": f"no static file {name}"}),
                     404)
    body = (html.STATIC_DIR / name).read_bytes()
    cache_control = _YEAR if v == html.static_version(name) else "no-cache"
    return Response(body, media_type=media_type, headers={"Cache-Control": cache_control,
                                                         "X-Content-Type-Options": "nosniff"})

