"""HTML rendering: one Jinja2 environment with autoescaping on for every template, and the one
way data reaches the pages' JavaScript (JSON in ``<script type="application/json">``).

Never build HTML or JavaScript by string concatenation: templates escape every ``{{ value }}``,
and :func:`script_json` makes JSON safe inside a script element.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from curvecast.dashboards import fmt

PACKAGE_DIR = Path(__file__).resolve().parent
TEMPLATES_DIR = PACKAGE_DIR / "templates"
STATIC_DIR = PACKAGE_DIR / "static"
#: Files served under ``/static/`` (anything else is 404) and their media types.
_JAVASCRIPT = "text/javascript; charset=utf-8"
STATIC_FILES = {
    "dashboards.js": _JAVASCRIPT,  # shared by every page's script
    "run.js": _JAVASCRIPT,
    "compare.js": _JAVASCRIPT,
    "runs.js": _JAVASCRIPT,
    "alerts.js": _JAVASCRIPT,
    "dashboards.css": "text/css; charset=utf-8",
}

_SCRIPT_ESCAPES = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def script_json(value: Any) -> Markup:
    """JSON that is safe as the text of a ``<script type="application/json">`` element.

    ``<``, ``>`` and ``&`` are written as ``\\u003c``-style escapes, so no value (a run named
    ``</script><script>alert(1)</script>``) can close the element; ``JSON.parse`` reads them
    back unchanged. NaN and infinities are refused (JSON has none).
    """
    text = json.dumps(value, allow_nan=False, separators=(",", ":"), default=str)
    return Markup(text.translate(_SCRIPT_ESCAPES))


@cache
def static_version(name: str) -> str:
    """A content hash of a static file, for cache-busting URLs."""
    return hashlib.sha256((STATIC_DIR / name).read_bytes()).hexdigest()[:12]


def static_url(name: str) -> str:
    """The versioned URL of one of our static files (served with a year-long cache)."""
    return f"/static/{name}?v={static_version(name)}"


@cache
def environment() -> jinja2.Environment:
    """The templates' environment: autoescape on for everything, undefined names are errors."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        script_json=script_json,
        loss=fmt.loss,
        step=fmt.step,
        short_step=fmt.short_step,
        interval=fmt.interval,
        chance=fmt.chance,
        ago=fmt.ago,
    )
    env.globals.update(static=static_url)
    return env


def render(template: str, **context: Any) -> str:
    """Render ``template`` (a file in ``dashboards/templates``) with ``context``."""
    return environment().get_template(template).render(**context)
