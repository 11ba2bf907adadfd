"""Fixtures for the dashboard tests: real servers (optionally with alerts a test chose),
synthetic ScheduleFree+ runs, and helpers to wait for the worker's fits."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
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
from curvecast.service.testing import synthetic as syn
from curvecast.service.testing import wait_for
from tests._servers import serve_app

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
