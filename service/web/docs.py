"""The API's interactive documentation, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), served
entirely from this service.

FastAPI's own pages load both from a CDN and start Swagger UI with an inline script, so offline
they are blank. Here their files come from the installed ``fastapi-offline`` package through
:mod:`.static`, Swagger UI is started by a script file, and the pages carry a CSP that allows
nothing but this origin.
"""

from __future__ import annotations

import base64
import hashlib
import re
from html import escape

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse

from curvecast.service.web.static import asset_url

router = APIRouter()

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"


def _csp(script_src: str) -> str:
    # Both viewers style their elements inline and draw icons as data: images; ReDoc's search
    # runs in a worker made from a blob. Nothing may come from another host.
    return (
        f"default-src 'self'; script-src {script_src}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' "
        "blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
    )


def _headers(csp: str) -> dict[str, str]:
    return {"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


_HEADERS = _headers(_csp("'self'"))
_REDIRECT_PAGE = get_swagger_ui_oauth2_redirect_html().body
# FastAPI's OAuth2 redirect page is one inline script: allow exactly that script by its hash.
_REDIRECT_SCRIPTS = re.findall(rb"<script>(.*?)</script>", _REDIRECT_PAGE, re.S)
_REDIRECT_HEADERS = _headers(_csp(" ".join(
    f"'sha256-{base64.b64encode(hashlib.sha256(s).digest()).decode()}'"
    for s in _REDIRECT_SCRIPTS) or "'none'"))


def _page(request: Request, title: str, body: str, stylesheet: str | None = None) -> str:
    link = f'<link rel="stylesheet" href="{escape(stylesheet)}">\n' if stylesheet else ""
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        # No favicon request (the browser would otherwise ask for /favicon.ico).
        '<link rel="icon" href="data:,">\n<style>body { margin: 0; padding: 0; }</style>\n'
        f"<title>{escape(request.app.title)} · {escape(title)}</title>\n{link}</head>\n"
        f"<body>\n{body}\n</body>\n</html>\n"
    )


def _root(request: Request) -> str:
    """The path prefix the app is mounted under (behind a proxy), as FastAPI's pages use it."""
    return str(request.scope.get("root_path", ""))


@router.get(DOCS_URL, include_in_schema=False)
def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI on this service's OpenAPI schema."""
    root = _root(request)
    body = (
        f'<div id="swagger-ui" data-openapi-url="{escape(root + str(request.app.openapi_url))}" '
        f'data-oauth2-redirect-url="{escape(root + OAUTH2_REDIRECT_URL)}"></div>\n'
        f'<script src="{escape(root + asset_url("swagger-ui-bundle.js"))}"></script>\n'
        f'<script src="{escape(root + asset_url("swagger-init.js"))}"></script>'
    )
    return HTMLResponse(_page(request, "Swagger UI", body,
                              stylesheet=root + asset_url("swagger-ui.css")), headers=_HEADERS)


@router.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
def swagger_ui_redirect() -> HTMLResponse:
    """Swagger UI's OAuth2 redirect page (FastAPI's)."""
    return HTMLResponse(_REDIRECT_PAGE, headers=_REDIRECT_HEADERS)


@router.get(REDOC_URL, include_in_schema=False)
def redoc(request: Request) -> HTMLResponse:
    """ReDoc on this service's OpenAPI schema."""
    root = _root(request)
    body = (
        "<noscript>ReDoc needs JavaScript; the schema itself is at "
        f'<a href="{escape(root + str(request.app.openapi_url))}">openapi.json</a>.</noscript>\n'
        f'<redoc spec-url="{escape(root + str(request.app.openapi_url))}"></redoc>\n'
        f'<script src="{escape(root + asset_url("redoc.standalone.js"))}"></script>'
    )
    return HTMLResponse(_page(request, "ReDoc", body), headers=_HEADERS)
