"""The answers every page route gives: HTML with the pages' security headers, error pages, and
chart data as uncached JSON; and :class:`PageRoute`, which gives a page's unreadable query an
error page too."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response
from fastapi.routing import APIRoute

from curvecast.dashboards import html
from curvecast.service.config import Settings
from curvecast.service.errors import InvalidInput, NotFound, ServiceError, validation_message
from curvecast.service.web.static import plotly_url

# No inline scripts and no eval (plotly.js's basic bundle has no WebGL traces, whose shaders
# needed it): what stops injected markup from running.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; worker-src 'self' "
    "blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
#: Headers of every HTML answer (pages, error pages, the runs table's rows).
PAGE_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on the
    # pages' own form POSTs (sign out, switch token), which the edge cannot tell from another
    # site's. Other sites still get no Referer.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def page(template: str, **context: Any) -> HTMLResponse:
    """A full page: ``template`` rendered with ``context`` (and plotly.js's URL)."""
    return HTMLResponse(html.render(template, plotly_url=plotly_url(), **context),
                        headers=PAGE_HEADERS)


def fragment(template: str, **context: Any) -> HTMLResponse:
    """Part of a page (the runs table's rows), for a script to swap in."""
    return HTMLResponse(html.render(template, **context), headers=PAGE_HEADERS)


def error_page(settings: Settings, error: ServiceError) -> HTMLResponse:
    """An error as a page; a 401 or 403 with auth on says how to open the page with a token."""
    status = error.status_code
    body = html.render("error.html", title=str(status), status=status, message=error.message,
                       auth=settings.auth_enabled and status in (401, 403),
                       config={"page": "error"})
    return HTMLResponse(body, status_code=status, headers=PAGE_HEADERS)


#: Paths that scripts and API clients read (JSON, static files): an error there answers as
#: the REST API's do, in JSON. Every other path is a page a person opens.
_MACHINE_PREFIXES = ("/api/", "/dashboards/api/", "/static/")
_MACHINE_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json"})


def is_page_path(path: str) -> bool:
    """Whether ``path`` is (or would be) a page a person opens, not an API or file path."""
    return path not in _MACHINE_PATHS and not path.startswith(_MACHINE_PREFIXES)


def not_found_page(settings: Settings, path: str) -> HTMLResponse:
    """The one 404 page: no page at ``path`` (shown for every unknown page address)."""
    shown = path if len(path) <= 120 else path[:119] + "…"
    return error_page(settings, NotFound(f"There is no page at {shown}."))


def page_not_found(request: Request) -> Response | None:
    """The HTML 404 page for an unknown page address opened in a browser (GET or HEAD); None
    for API and file paths, which keep the REST API's JSON 404."""
    if request.method not in ("GET", "HEAD") or not is_page_path(request.url.path):
        return None
    return not_found_page(request.app.state.settings, request.url.path)


def chart_json(body: str) -> Response:
    """Chart data (already JSON): never cached, it changes with every new point."""
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})


class PageRoute(APIRoute):
    """The route of a page a person opens (not ``/dashboards/api/...``, which scripts read):
    a query FastAPI cannot read (``/compare?horizon=abc``, ``/?status=bogus``) is answered
    with the error page and the same message the API would give, as every other error of a
    page is, rather than with the API's JSON error body."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.path.startswith("/dashboards/api/"):
            return handler

        async def page_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                errors = list(exc.errors())
                settings = request.app.state.settings
                if any(e.get("loc", ("",))[0] == "path" for e in errors):
                    # /runs/nope: an address no page has, answered as every unknown page is.
                    return not_found_page(settings, request.url.path)
                _code, message = validation_message(errors)
                return error_page(settings, InvalidInput(message))

        return page_handler
