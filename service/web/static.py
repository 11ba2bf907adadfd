"""Static files: plotly.js from the installed ``plotly`` package (never a CDN, so the service
works offline) and our own small CSS and JavaScript, each with its caching headers."""

from __future__ import annotations

import gzip
from functools import cache
from pathlib import Path

import plotly
from fastapi import APIRouter, Request
from fastapi.responses import Response

from curvecast.dashboards import html
from curvecast.service.errors import error_response

router = APIRouter()

#: Versioned URLs never change content: cache them for a year.
_YEAR = "public, max-age=31536000, immutable"
_JAVASCRIPT = "text/javascript; charset=utf-8"


@cache
def _plotly_js() -> tuple[bytes, bytes, str]:
    """plotly.min.js from the installed plotly package: raw, gzipped, and an ETag."""
    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    raw = path.read_bytes()
    return raw, gzip.compress(raw, compresslevel=4, mtime=0), f'"plotly-{plotly.__version__}"'


def plotly_url() -> str:
    """The versioned URL of plotly.js (the pages' templates load it from here)."""
    return f"/static/plotly.min.js?v={plotly.__version__}"


@router.get("/static/plotly.min.js")
def plotly_js(request: Request) -> Response:
    """plotly.js, cached for a year (the URL carries the package version), gzipped when the
    browser accepts it (4.8 MB raw)."""
    raw, packed, etag = _plotly_js()
    headers = {"Cache-Control": _YEAR, "ETag": etag, "Vary": "Accept-Encoding"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    if "gzip" in request.headers.get("accept-encoding", ""):
        headers["Content-Encoding"] = "gzip"
        return Response(packed, media_type=_JAVASCRIPT, headers=headers)
    return Response(raw, media_type=_JAVASCRIPT, headers=headers)


@router.get("/static/{name}")
def static_file(name: str, v: str | None = None) -> Response:
    """One of our files in ``dashboards/static`` (no build step); anything else is 404.

    Cached for a year when asked for by its versioned URL (``?v=<content hash>``), else
    revalidated on every use.
    """
    media_type = html.STATIC_FILES.get(name)
    if media_type is None:
        return error_response("not_found", f"no static file {name}")
    body = (html.STATIC_DIR / name).read_bytes()
    cache_control = _YEAR if v == html.static_version(name) else "no-cache"
    return Response(body, media_type=media_type, headers={"Cache-Control": cache_control,
                                                         "X-Content-Type-Options": "nosniff"})
