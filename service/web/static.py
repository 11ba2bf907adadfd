"""Static files, all from installed packages or this repository (never a CDN, so the service
works offline): plotly.js's basic bundle (vendored, ``dashboards/static/vendor``), Swagger UI's
and ReDoc's files from ``fastapi-offline``, and our own small CSS and JavaScript.

Each file is read and gzipped once per process (:func:`warm` runs at start-up, in a background
thread, so the first browser never waits for the compression) and kept in memory; it is sent
gzipped when the browser accepts it, with an ETag, ``Vary: Accept-Encoding``, and a year-long
``immutable`` cache on its versioned URL (:func:`asset_url`).
"""

from __future__ import annotations

import gzip
import hashlib
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Request
from fastapi.responses import Response

from curvecast.dashboards import html
from curvecast.service.errors import error_response

router = APIRouter()

#: Versioned URLs never change content: cache them for a year.
_YEAR = "public, max-age=31536000, immutable"
_JAVASCRIPT = "text/javascript; charset=utf-8"
_CSS = "text/css; charset=utf-8"
_OFFLINE_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
#: plotly.js's official partial bundle with the scatter, bar and pie traces (the pages draw only
#: scatter), a quarter of the full bundle's JavaScript: a fresh browser runs it sooner
#: (BENCHMARKS.md, "Dashboards on a 10^6-step run"). Vendored from npm: see the README beside it.
PLOTLY_JS = "plotly-basic.min.js"
_PLOTLY_PATH = html.STATIC_DIR / "vendor" / PLOTLY_JS
#: The bundle's own first lines name its version: ``plotly.js (basic - minified) v4.1.1``.
_PLOTLY_VERSION = re.compile(rb"plotly\.js \(basic - minified\) v(\d[\w.+-]*)")
#: Swagger UI's and ReDoc's files, as fastapi-offline ships them (copies of their npm builds).
_DOCS_FILES = {
    "swagger-ui-bundle.js": _JAVASCRIPT,
    "swagger-ui.css": _CSS,
    "redoc.standalone.js": _JAVASCRIPT,
}
#: ReDoc's sidebar footer shows Redocly's logo from their CDN, unconditionally. An empty ``src``
#: makes no request and fires the image's error handler, which hides it (the link stays).
_REDOC_LOGO = (b'src:"https://cdn.redoc.ly/redoc/logo-mini.svg"', b'src:""')
#: Starts Swagger UI (inline scripts are forbidden by the docs pages' CSP). The URLs come from
#: the page's element; ``validatorUrl: null`` stops Swagger UI from asking validator.swagger.io
#: for a badge.
_SWAGGER_INIT = b"""\
"use strict";
(function () {
  var el = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: el.dataset.openapiUrl,
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    validatorUrl: null,
    oauth2RedirectUrl: window.location.origin + el.dataset.oauth2RedirectUrl,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
})();
"""


@dataclass(frozen=True)
class Asset:
    """One static file as it is served."""

    raw: bytes
    #: ``raw`` gzipped, or None where that would not be smaller.
    packed: bytes | None
    media_type: str
    #: What ``?v=`` carries on the versioned URL: a package version or a content hash.
    version: str

    @property
    def etag(self) -> str:
        """The identity representation's strong validator."""
        return f'"{self.version}"'

    @property
    def gzip_etag(self) -> str:
        """The gzipped representation's (a different one: its bytes differ)."""
        return f'"{self.version}-gzip"'


def _asset(raw: bytes, media_type: str, version: str | None = None) -> Asset:
    # Level 6: about as small as level 9 on plotly.js, in about half the time.
    packed = gzip.compress(raw, compresslevel=6, mtime=0)
    return Asset(raw=raw, packed=packed if len(packed) < len(raw) else None,
                 media_type=media_type,
                 version=version or hashlib.sha256(raw).hexdigest()[:12])


def plotly_js_version(head: bytes | None = None) -> str:
    """The version of the vendored plotly.js bundle, read from its license header."""
    if head is None:
        with _PLOTLY_PATH.open("rb") as f:
            head = f.read(512)
    match = _PLOTLY_VERSION.search(head)
    if match is None:
        raise RuntimeError(f"{_PLOTLY_PATH} does not name its plotly.js version")
    return match.group(1).decode()


def _load() -> dict[str, Asset]:
    raw_plotly = _PLOTLY_PATH.read_bytes()
    assets = {PLOTLY_JS: _asset(raw_plotly, _JAVASCRIPT, plotly_js_version(raw_plotly[:512]))}
    for name, media_type in html.STATIC_FILES.items():
        assets[name] = _asset((html.STATIC_DIR / name).read_bytes(), media_type,
                              html.static_version(name))
    for name, media_type in _DOCS_FILES.items():
        raw = (_OFFLINE_DIR / name).read_bytes()
        if name == "redoc.standalone.js":
            raw = raw.replace(*_REDOC_LOGO)
        assets[name] = _asset(raw, media_type)
    assets["swagger-init.js"] = _asset(_SWAGGER_INIT, _JAVASCRIPT)
    return assets


_lock = threading.Lock()
_assets: dict[str, Asset] | None = None


def assets() -> dict[str, Asset]:
    """Every file served under ``/static/``, by name (read and compressed on first use)."""
    global _assets
    if _assets is None:
        with _lock:  # the start-up warm-up and a first request may race: compress once
            if _assets is None:
                _assets = _load()
    return _assets


def warm() -> None:
    """Read and compress every file now (called at start-up, off the event loop)."""
    assets()


def asset_url(name: str) -> str:
    """The versioned URL of a static file (cached for a year)."""
    return f"/static/{name}?v={assets()[name].version}"


def plotly_url() -> str:
    """The versioned URL of plotly.js (the pages' templates load it from here)."""
    return asset_url(PLOTLY_JS)


def _accepts_gzip(header: str) -> bool:
    """Whether an ``Accept-Encoding`` header accepts gzip: named (``gzip;q=0`` refuses it),
    else through ``*``."""
    quality: dict[str, float] = {}
    for part in header.lower().split(","):
        coding, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            if param.startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    q = 0.0
        quality.setdefault(coding, q)
    return quality.get("gzip", quality.get("*", 0.0)) > 0


def _serve(name: str, request: Request, cache_control: str | None) -> Response:
    asset = assets().get(name)
    if asset is None:
        return error_response("not_found", f"no static file {name}")
    v = request.query_params.get("v")
    headers = {"Cache-Control": cache_control or (_YEAR if v == asset.version else "no-cache"),
               "Vary": "Accept-Encoding", "X-Content-Type-Options": "nosniff"}
    packed = asset.packed if _accepts_gzip(request.headers.get("accept-encoding", "")) else None
    headers["ETag"] = asset.etag if packed is None else asset.gzip_etag
    # Either representation's validator revalidates: the content behind both is the same.
    if any(tag.strip().removeprefix("W/") in (asset.etag, asset.gzip_etag, "*")
           for tag in request.headers.get("if-none-match", "").split(",")):
        return Response(status_code=304, headers=headers)
    if packed is not None:
        headers["Content-Encoding"] = "gzip"
        return Response(packed, media_type=asset.media_type, headers=headers)
    return Response(asset.raw, media_type=asset.media_type, headers=headers)


@router.get("/static/{name}")
def static_file(name: str, request: Request) -> Response:
    """Any other static file; anything not listed is 404.

    Cached for a year when asked for by its versioned URL (``?v=<version>``), else
    revalidated on every use.
    """
    return _serve(name, request, None)
