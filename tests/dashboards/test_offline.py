"""Offline: every page of the service works with no network but the service's own origin, no
page or static file references another host, and static files are served compressed with
long-lived caching.

The browser tests drive Debian's Chromium (as ``test_browser.py`` does) with every request to
another origin aborted and recorded; under ``CI=true`` they must run.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from curvecast.service.web import static
from tests.conftest import IN_CI
from tests.dashboards.conftest import app_server, live_settings, make_run, new_app

CHROMIUM = os.environ.get("CURVECAST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]

#: A reference to another host: an absolute URL, or a protocol-relative one in a string, an
#: attribute or CSS ``url(``. (``/^image\//i.test`` in minified code is not one.)
URL = re.compile(
    rb"""(?:\b(?:https?|wss?|ftp):|(?<=["'`(=]))//([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)""")

# Why an outside host may appear in a third-party file we serve. None of these is requested by
# any page of ours: test_pages_work_with_the_network_cut_to_the_service loads every page with
# the network restricted to the service's origin and asserts that no request was attempted.
_NAMESPACE = "a namespace or schema identifier, compared as a string, never fetched"
_PROSE = "a link in an error message, a comment or a license header: text, never loaded"
_LINK = "the href of a link the user may click (not loaded by the page)"
ALLOWED: dict[str, dict[str, str]] = {
    "plotly-basic.min.js": {
        "www.w3.org": _NAMESPACE + " (SVG, XLink, XHTML)",
        "github.com": _PROSE, "getify.mit-license.org": _PROSE, "syntheti.cc": _PROSE,
        "plotly.com": _LINK + ": the modebar's logo (dashboards.js sets displaylogo: false)",
        "cdn.plot.ly": "the default topojsonURL of geo traces, which our figures never draw",
        "cloud.plotly.com": "plotlyServerURL, used only by the Chart Studio button (off)",
    },
    "swagger-ui-bundle.js": {
        "www.w3.org": _NAMESPACE, "json-schema.org": _NAMESPACE,
        "spec.openapis.org": _NAMESPACE + " (the OpenAPI 3.1 dialect)",
        "swagger.io": "the base URI external $refs would resolve against (our schema has none)",
        "validator.swagger.io": "the default validator badge, off: swagger-init.js sets "
                                "validatorUrl: null",
        "example.com": "sample values Swagger UI shows for uri-formatted fields",
        "vladimirgorej.com": "a base for new URL() that checks whether a string is a URL",
        "spdx.org": _LINK + " (an API's license, from its schema; ours names none)",
        "twitter.com": _LINK + " (the Markdown renderer's @mention/#hashtag linkifier)",
        "www.facebook.com": _LINK + " (linkifier)", "instagram.com": _LINK + " (linkifier)",
        "soundcloud.com": _LINK + " (linkifier)", "www.tiktok.com": _LINK + " (linkifier)",
        "github.com": _PROSE, "datatracker.ietf.org": _PROSE, "www.rfc-editor.org": _PROSE,
        "reactjs.org": _PROSE, "redux.js.org": _PROSE, "fb.me": _PROSE,
    },
    "swagger-ui.css": {"www.w3.org": _NAMESPACE + " (inside data: SVG icons)"},
    "redoc.standalone.js": {
        "www.w3.org": _NAMESPACE, "json-schema.org": _NAMESPACE,
        "raw.githubusercontent.com": _NAMESPACE + " (ajv's $data meta-schema id)",
        "redocly.com": _LINK + " ('API docs by Redocly'; its CDN logo is removed in static.py)",
        "example.com": "sample values ReDoc shows for uri-formatted fields",
        "github.com": _PROSE, "stackoverflow.com": _PROSE, "reactjs.org": _PROSE,
        "marked.js.org": _PROSE, "git.io": _PROSE, "fb.me": _PROSE,
    },
}


def outside_hosts(body: bytes, own: str) -> set[str]:
    """The hosts ``body`` refers to, other than ``own`` (the server's host)."""
    return {m.group(1).decode().lower() for m in URL.finditer(body)} - {own}


# --- what the server sends -------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(sqlite_url: str) -> Iterator[tuple[str, uuid.UUID]]:
    """A live service with one fitted run."""
    with app_server(new_app(live_settings(sqlite_url))) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        yield url, make_run(client, f"p-{uuid.uuid4().hex[:10]}", steps=2000)


def pages_of(run_id: uuid.UUID, project: str) -> list[str]:
    """Every HTML page the service serves (and its schema), for one run. The runs list is
    filtered to the run's project: other tests' runs in the shared database carry hostile
    names (escaped text, but text that names other hosts)."""
    return [f"/?project={project}", f"/runs/{run_id}", f"/compare?runs={run_id}",
            f"/runs/{uuid.uuid4()}", "/compare?runs=nope", "/docs", "/redoc",
            "/docs/oauth2-redirect", "/openapi.json"]


def test_no_page_or_static_file_references_another_host(served: tuple[str, uuid.UUID]) -> None:
    url, run_id = served
    own = urlsplit(url).hostname or ""
    referenced: set[str] = set()
    with httpx.Client(base_url=url, timeout=60) as client:
        project = client.get(f"/api/v1/runs/{run_id}").json()["project"]
        for path in pages_of(run_id, project):
            body = client.get(path).content
            assert outside_hosts(body, own) == set(), path
            referenced |= {m.decode() for m in re.findall(rb'(?:src|href)="/static/([^"?]+)',
                                                          body)}
        names = set(static.assets())
        # The pages load only files the static route serves, and those are all scanned below.
        assert referenced and referenced <= names, referenced - names
        assert set(ALLOWED) <= names, set(ALLOWED) - names  # no allowance for a file not served
        for name in sorted(names):
            resp = client.get(f"/static/{name}")
            assert resp.status_code == 200, name
            found = outside_hosts(resp.content, own)
            allowed = ALLOWED.get(name, {})
            assert found <= set(allowed), f"{name} refers to {sorted(found - set(allowed))}"
        # ReDoc's sidebar logo came from Redocly's CDN: the served copy no longer asks for it.
        assert b"cdn.redoc.ly" not in client.get("/static/redoc.standalone.js").content


def test_static_files_are_gzipped_and_cached_for_a_year(served: tuple[str, uuid.UUID]) -> None:
    url, _ = served
    with httpx.Client(base_url=url, timeout=60) as client:
        for name in static.assets():
            versioned = static.asset_url(name)
            plain = client.get(versioned, headers={"accept-encoding": "identity"})
            assert plain.status_code == 200 and "content-encoding" not in plain.headers, name
            assert plain.headers["cache-control"] == "public, max-age=31536000, immutable"
            assert plain.headers["vary"] == "Accept-Encoding"
            packed = client.get(versioned, headers={"accept-encoding": "br, gzip;q=0.8"})
            assert packed.headers["content-encoding"] == "gzip", name
            assert gzip.decompress(_raw(url, versioned)) == plain.content, name
            assert int(packed.headers["content-length"]) < len(plain.content), name
            assert packed.headers["etag"] != plain.headers["etag"], name  # two representations
            for etag in (plain.headers["etag"], packed.headers["etag"]):
                again = client.get(versioned, headers={"if-none-match": etag})
                assert again.status_code == 304 and not again.content, name
            refused = client.get(versioned, headers={"accept-encoding": "gzip;q=0"})
            assert "content-encoding" not in refused.headers, name
        # Only the versioned URL is immutable.
        for name in ("dashboards.css", "swagger-ui-bundle.js"):
            for query in ("", "?v=stale"):
                assert client.get(f"/static/{name}{query}").headers["cache-control"] == \
                    "no-cache"
        plotly_js = client.get(static.plotly_url(), headers={"accept-encoding": "gzip"})
        assert int(plotly_js.headers["content-length"]) < 500_000  # 1.2 MB raw
        # The pages ask for the versioned URLs.
        docs = client.get("/docs").text + client.get("/redoc").text
        for name in ("swagger-ui-bundle.js", "swagger-ui.css", "swagger-init.js",
                     "redoc.standalone.js"):
            assert f'"{static.asset_url(name)}"' in docs, name


def _raw(url: str, path: str) -> bytes:
    """The body exactly as sent (gzipped), not decoded by the client."""
    with httpx.stream("GET", url + path, headers={"accept-encoding": "gzip"}) as resp:
        return b"".join(resp.iter_raw())


def test_docs_pages_allow_only_their_own_origin(served: tuple[str, uuid.UUID]) -> None:
    url, _ = served
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        resp = httpx.get(url + path)
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
        csp = resp.headers["content-security-policy"]
        directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
        assert directives["default-src"] == "'self'" and "unsafe-eval" not in csp, path
        assert "http" not in csp and "*" not in csp, path
        if path != "/docs/oauth2-redirect":  # FastAPI's one inline script, allowed by hash
            assert directives["script-src"] == "'self'", path
        else:
            assert directives["script-src"].startswith("'sha256-"), csp


# --- in a real browser -----------------------------------------------------------------------


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"the browser tests must run under CI=true but {reason}; .ci/run installs "
                    "Debian's chromium and the dev extra playwright", pytrace=False)
    pytest.skip(reason)


@dataclass
class Offline:
    """A fresh Chromium whose network reaches only the service: any request to another origin
    is aborted and recorded, as are console errors, page errors and CSP violations."""

    context: Any
    outside: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def open(self, url: str) -> Any:
        page = self.context.new_page()
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.goto(url)
        return page


@pytest.fixture(scope="module")
def offline(served: tuple[str, uuid.UUID], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Offline]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed")
    if not Path(CHROMIUM).exists():
        _unavailable(f"Chromium is not installed at {CHROMIUM}")
    origin = urlsplit(served[0])[:2]
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-offline")), executable_path=CHROMIUM,
            headless=True, args=FLAGS, viewport={"width": 1280, "height": 800})
        context.set_default_timeout(30_000)
        state = Offline(context)

        def route(r: Any) -> None:
            if urlsplit(r.request.url)[:2] == origin:
                r.continue_()
            else:
                state.outside.append(r.request.url)
                r.abort()

        context.route("**/*", route)
        # A request the CSP blocks never reaches the route: count those as attempts too.
        context.add_init_script(
            "document.addEventListener('securitypolicyviolation', e => console.error("
            "'CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI));")
        yield state
        context.close()


@pytest.mark.browser
def test_pages_work_with_the_network_cut_to_the_service(
        served: tuple[str, uuid.UUID], offline: Offline, artifacts_dir: Path) -> None:
    url, run_id = served
    paths = httpx.get(f"{url}/openapi.json").json()["paths"]
    operations = [(method.upper(), path) for path, item in paths.items() for method in item]
    assert len(operations) > 20

    docs = offline.open(f"{url}/docs")
    # A locator wait, not wait_for_function: the docs pages' CSP forbids eval, which
    # Playwright's polling of a string predicate needs.
    docs.locator(".opblock").nth(len(operations) - 1).wait_for(state="attached")
    assert docs.locator(".opblock").count() == len(operations)
    listed = docs.eval_on_selector_all(
        ".opblock", "els => els.map(e => [e.querySelector('.opblock-summary-method').textContent,"
        " e.querySelector('.opblock-summary-path').dataset.path])")
    assert sorted(map(tuple, listed)) == sorted(operations)
    # Swagger UI calls the service itself (same origin) from "Try it out".
    health = docs.locator(".opblock", has=docs.locator("[data-path='/healthz']"))
    health.locator(".opblock-summary").click()
    health.get_by_role("button", name="Try it out").click()
    health.get_by_role("button", name="Execute").click()
    status = health.locator(".live-responses-table tr.response .response-col_status").first
    assert status.inner_text().strip() == "200"
    status.scroll_into_view_if_needed()
    docs.screenshot(path=str(artifacts_dir / "offline-docs.png"))

    redoc = offline.open(f"{url}/redoc")
    redoc_ops = redoc.locator("[id^='operation/']")
    redoc_ops.nth(len(operations) - 1).wait_for(state="attached")
    assert redoc_ops.count() == len(operations)
    titles = redoc.eval_on_selector_all("[id^='operation/'] h2",
                                        "els => els.map(e => e.textContent.trim())")
    summaries = {op["summary"] for item in paths.values() for op in item.values()}
    assert summaries <= set(titles), summaries - set(titles)
    redoc.screenshot(path=str(artifacts_dir / "offline-redoc.png"))

    # The dashboards too: plotly.js and every script come from the service, and run under the
    # pages' CSP (no eval; locator waits, which need none): a violation is a console error.
    run = offline.open(f"{url}/runs/{run_id}")
    run.locator("#chart-loss[data-rendered] .main-svg").first.wait_for(state="attached")
    compare = offline.open(f"{url}/compare?runs={run_id}")
    compare.locator("[data-rendered] .main-svg").first.wait_for(state="attached")
    assert "script-src 'self';" in httpx.get(f"{url}/runs/{run_id}").headers[
        "content-security-policy"]
    offline.open(f"{url}/").locator(f"a[href='/runs/{run_id}']").first.wait_for()

    assert offline.outside == [], offline.outside
    assert offline.errors == [], offline.errors
