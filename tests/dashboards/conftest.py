"""Fixtures for the dashboard tests: real servers (optionally with a stand-in alerts API),
synthetic ScheduleFree+ runs, and helpers to wait for the worker's fits."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI

from curvecast.service.app import create_app
from curvecast.service.config import Settings
from tests._servers import serve_app
from tests.dashboards import _synthetic as syn

TOTAL = 20_000


@contextmanager
def app_server(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` (with its test stand-ins) on a free loopback port in a background thread."""
    with serve_app(app) as url:
        yield url


class FakeAlerts:
    """A stand-in for the alerts API (built in another issue), same paths and shapes."""

    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []

    def add(self, run_id: uuid.UUID, project: str, **fields: Any) -> dict[str, Any]:
        alert = {"id": len(self.alerts) + 1, "run_id": str(run_id), "project": project,
                 "rule": "grad_norm_drift", "state": "firing", "severity": "warning",
                 "summary": "gradient L1 norm rose 3x over its post-burn-in baseline",
                 "started_at": "2026-01-01T00:00:00Z", "fired_at": "2026-01-01T00:01:00Z",
                 "resolved_at": None, "acknowledged_at": None, "silenced_until": None,
                 "step": 1000, "value": 3.0, "since_step": None, "fired_step": None,
                 "key": "sfplus/grad_l1", "labels": {}, "description": "", **fields}
        self.alerts.append(alert)
        return alert

    def router(self) -> APIRouter:
        router = APIRouter()

        @router.get("/api/v1/runs/{run_id}/alerts")
        def run_alerts(run_id: uuid.UUID) -> dict[str, Any]:
            return {"alerts": [a for a in self.alerts if a["run_id"] == str(run_id)]}

        @router.get("/api/v1/alerts")
        def all_alerts(state: str | None = None, project: str | None = None,
                       limit: int = 100) -> dict[str, Any]:
            found = [a for a in self.alerts if (state is None or a["state"] == state)
                     and (project is None or a["project"] == project)]
            return {"alerts": found[:limit]}

        return router


def live_settings(database_url: str, **overrides: Any) -> Settings:
    """A service that refits quickly (tests wait on fits, not on time)."""
    return Settings(database_url=database_url, worker_interval_s=0.1, refit_max_age_s=0.5,
                    **overrides)


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, every: float = 0.05) -> Any:
    """Poll a condition with a deadline (synchronisation on state, not on time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError("condition not met in time")


def wait_for_fit(client: httpx.Client, run_id: uuid.UUID, upto: int | None = None
                 ) -> dict[str, Any]:
    """Wait until the worker stored a fit (with data up to ``upto``, when given)."""

    def fitted() -> dict[str, Any] | None:
        body = client.get(f"/api/v1/runs/{run_id}/forecast").json()
        if body["status"] == "pending":
            return None
        if upto is not None and (body["fitted_upto_step"] or 0) < upto:
            return None
        return dict(body)

    return dict(wait_for(fitted))


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


def new_app(settings: Settings, alerts: FakeAlerts | None = None, *,
            without_alerts: bool = False) -> FastAPI:
    """The real app; with ``alerts``, its alerts reads answered by the stand-in (so a test
    decides which alerts exist); with ``without_alerts``, a service that has no alerts API."""
    app = create_app(settings)
    if alerts is not None or without_alerts:
        from curvecast.service.api import alerts as alerts_api

        app.router.routes = [r for r in app.router.routes
                             if getattr(r, "original_router", None) is not alerts_api.router]
    if alerts is not None:
        app.include_router(alerts.router())
    return app
