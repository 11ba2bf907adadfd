"""Fixtures for the dashboard tests: real servers (optionally with alerts a test chose),
synthetic ScheduleFree+ runs, helpers to wait for the worker's fits, and a real headless
Chromium (Debian's, driven by playwright-python) with a tab that records console errors."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.app import create_app
from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.models import Alert, Run
from curvecast.service.store._common import write_connection
from tests._servers import serve_app
from tests.conftest import IN_CI
from tests.support import synthetic as syn
from tests.support import wait_for

TOTAL = 20_000


@contextmanager
def app_server(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` (with its test stand-ins) on a free loopback port in a background thread."""
    with serve_app(app) as url:
        yield url


class FakeAlerts:
    """Alerts written straight into the database, as if the worker had raised them, so a test
    decides which alerts exist; the real alerts API and the pages read them as any other."""

    def __init__(self) -> None:
        self._sessions: sessionmaker[Session] | None = None

    def bind(self, app: FastAPI) -> None:
        """Write into ``app``'s database."""
        self._sessions = app.state.sessionmaker

    def add(self, run_id: uuid.UUID, project: str, **fields: Any) -> None:
        """Store an alert of ``run_id`` (``project`` names its project, for the reader)."""
        assert self._sessions is not None, "new_app(settings, alerts) binds the stand-in"
        del project  # the run's own project is used
        alert: dict[str, Any] = {
            "rule": "grad_norm_drift", "state": "firing", "severity": "warning",
            "summary": "gradient L1 norm rose 3x over its post-burn-in baseline",
            "started_at": datetime(2026, 1, 1, tzinfo=UTC),
            "fired_at": datetime(2026, 1, 1, 0, 1, tzinfo=UTC), "step": 1000, "value": 3.0,
            "since_step": None, "fired_step": None, "key": "opt/grad_l1", "labels": {},
            "description": "", **fields}
        for name in ("started_at", "fired_at", "resolved_at"):  # the API's ISO strings too
            if isinstance(alert.get(name), str):
                alert[name] = datetime.fromisoformat(alert[name])
        with session_scope(self._sessions) as session:
            write_connection(session)
            project_id = session.scalar(select(Run.project_id).where(Run.id == run_id))
            session.add(Alert(run_id=run_id, project_id=project_id,
                              updated_at=alert["started_at"], **alert))


def live_settings(database_url: str, **overrides: Any) -> Settings:
    """A service that refits quickly (tests wait on fits, not on time)."""
    return Settings(database_url=database_url, worker_interval_s=0.1, refit_max_age_s=0.5,
                    **overrides)


def wait_for_fit(client: httpx.Client, run_id: uuid.UUID, upto: int | None = None,
                 key: str | None = None) -> dict[str, Any]:
    """Wait until the worker stored a fit (with data up to ``upto``, when given; of ``key``,
    when given, else of the run's default series)."""

    def fitted() -> dict[str, Any] | None:
        params = {"key": key} if key is not None else {}
        body = client.get(f"/api/v1/runs/{run_id}/forecast", params=params).json()
        if body["status"] == "pending":
            return None
        if upto is not None and (body["fitted_upto_step"] or 0) < upto:
            return None
        return dict(body)

    return dict(wait_for(fitted, timeout=60, what="a stored fit"))


def make_run(client: httpx.Client, project: str, *, name: str = "synthetic", steps: int = 4000,
             total: int = TOTAL, eval_every: int | None = 500, fit: bool = True,
             **kwargs: Any) -> uuid.UUID:
    """Create a run, stream ``steps`` steps of a synthetic ScheduleFree+ run, wait for a fit."""
    run_id = uuid.uuid4()
    syn.create_run(client, run_id, project, name=name, total_steps=total)
    syn.stream(client, run_id, 0, steps, total_steps=total, eval_every=eval_every, **kwargs)
    if fit:
        wait_for_fit(client, run_id)
    return run_id


@pytest.fixture
def client_for() -> Iterator[Callable[[str], httpx.Client]]:
    """``client_for(url)``: an httpx client for a server, closed after the test."""
    clients: list[httpx.Client] = []

    def make(url: str) -> httpx.Client:
        client = httpx.Client(base_url=url, timeout=60)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def new_app(settings: Settings, alerts: FakeAlerts | None = None) -> FastAPI:
    """The real app; with ``alerts``, the stand-in writes its alerts into this app's
    database."""
    app = create_app(settings)
    if alerts is not None:
        alerts.bind(app)
    return app


# --- the browser ---------------------------------------------------------------------------

CHROMIUM = os.environ.get("CURVECAST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
#: Headless Chromium's flags for these tests (the user-data directory is a fresh temporary one).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"the browser tests must run under CI=true but {reason}; .ci/run installs "
                    "Debian's chromium (apt-get install chromium) and the dev extra playwright",
                    pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium (persistent context on a fresh profile) for the module."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed")
    if not Path(CHROMIUM).exists():
        _unavailable(f"Chromium is not installed at {CHROMIUM}")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        # bypass_csp: Playwright polls a string predicate (wait_for_function) with eval, which
        # the pages' CSP forbids. test_offline loads every page under its CSP instead.
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1280, "height": 800}, bypass_csp=True,
        )
        context.set_default_timeout(30_000)
        yield context
        context.close()


@dataclass
class Tab:
    """A page with everything it logged: console errors, uncaught exceptions, dialogs."""

    page: Any
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def no_errors(self) -> None:
        assert not self.errors, f"console errors: {self.errors}"
        assert not self.dialogs, f"dialogs opened (script ran): {self.dialogs}"

    def wait_for_charts(self, charts: tuple[str, ...]) -> None:
        selector = ", ".join(f"#chart-{c}[data-rendered]" for c in charts)
        self.page.wait_for_function(
            f"document.querySelectorAll({selector!r}).length === {len(charts)}")

    def ask(self, form: str, value: str, until: str) -> str:
        """Type ``value`` into the run page's "ask the forecast" box ``form`` ("step" or
        "loss"), submit, and return the answer once it contains ``until``."""
        self.page.fill(f"#ask-{form}-input", value)
        self.page.click(f"#ask-{form} button")
        self.page.wait_for_function(f"""() => document.getElementById('ask-{form}-answer')
            .textContent.includes({until!r})""")
        return str(self.page.locator(f"#ask-{form}-answer").inner_text())

    def traces(self, chart: str) -> list[dict[str, Any]]:
        """What Plotly is drawing: each trace's meta, type and x-range, read from the DOM."""
        return list(self.page.evaluate(
            """chart => document.getElementById('chart-' + chart).data.map(t => ({
                meta: t.meta || {}, type: t.type, name: t.name,
                n: t.x ? t.x.length : 0,
                x0: t.x && t.x.length ? t.x[0] : null,
                x1: t.x && t.x.length ? t.x[t.x.length - 1] : null}))""", chart))


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    page = browser.new_page()
    tab = Tab(page)

    def on_console(msg: Any) -> None:
        if msg.type == "error":
            tab.errors.append(msg.text)

    def on_dialog(dialog: Any) -> None:
        tab.dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("console", on_console)
    page.on("pageerror", lambda exc: tab.errors.append(f"uncaught: {exc}"))
    page.on("dialog", on_dialog)
    yield tab
    page.close()


@pytest.fixture
def validate_figures() -> Iterator[None]:
    """Validate every figure in full (the service skips plotly's validation for speed)."""
    from curvecast.dashboards.figures import base as figure_base
    figure_base.VALIDATE = True
    yield
    figure_base.VALIDATE = False
