"""Prometheus metrics of the service, at ``GET /metrics`` on its own port (prometheus-client).

What is measured (docs/deployment.md lists every name for dashboards and alerts):

* requests: a latency histogram per method, route template and status
  (:class:`RequestMetrics`, the outermost middleware but one);
* ingest: batches, points stored and points already stored, and the batches a client replayed
  from its spool (marked by the contract's :data:`~curvecast.contract.REPLAY_HEADER`);
* the worker: each refit's duration and lag (from the run's newest points to its stored fit),
  each alert round's duration and each judged run's lag, webhook delivery outcomes;
* the database pool: connections open and checked out (:func:`instrument_pool`);
* the process: prometheus-client's own CPU, memory and file-descriptor collectors.

**Several processes.** ``curvecast serve --workers N`` (N > 1) answers requests from N
processes and runs the worker in another: each scrape reaches one of them. There the command
sets ``PROMETHEUS_MULTIPROC_DIR`` (a fresh directory, removed when it stops; one set by the
operator is used as it is) before its processes start, every process writes its values to
files there (prometheus-client's multiprocess mode) and ``/metrics`` adds them all up, so any
process answers for the whole server. A single process keeps its values in memory. Replicas
(several containers) are separate scrape targets, one per replica, as Prometheus expects; a
``curvecast worker`` container serves no HTTP, its values are not exposed.

``/metrics`` is open when auth is off (the service then listens on loopback only) and needs a
token (any scope, of any project: the numbers are the whole server's, no run data) when it is
on. Like the health probes it answers under any ``Host``: Prometheus scrapes by address.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as _multiprocess
from sqlalchemy import Engine, event
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from curvecast.service.deps import ReadPrincipal

__all__ = ["METRICS_PATH", "RequestMetrics", "instrument_pool", "mark_process_dead",
           "multiprocess_enabled", "router"]

METRICS_PATH = "/metrics"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

#: Request latency buckets (seconds): an ingest batch takes milliseconds, a page up to seconds.
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Worker durations and lags (seconds): a refit takes milliseconds, a lag is seconds.
_WORK = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

REQUEST_SECONDS = Histogram(
    "curvecast_http_request_duration_seconds",
    "Time to answer a request, by method, route template and status (its _count: requests).",
    ["method", "route", "status"], buckets=_LATENCY)
INGEST_BATCHES = Counter("curvecast_ingest_batches_total",
                         "Metric batches stored (POST .../metrics answered 200).")
INGEST_POINTS = Counter("curvecast_ingest_points_total", "New points stored by ingest.")
INGEST_DUPLICATES = Counter("curvecast_ingest_duplicate_points_total",
                            "Points sent again that were already stored (kept as they were).")
SPOOL_REPLAYS = Counter("curvecast_spool_replay_batches_total",
                        "Batches a client replayed from its spool (it could not send them "
                        "when logged) or uploaded with `curvecast sync`.")
SPOOL_REPLAY_POINTS = Counter("curvecast_spool_replay_points_total",
                              "New points stored from replayed batches.")
REFIT_SECONDS = Histogram("curvecast_refit_duration_seconds",
                          "Time to refit one run (read, fit every loss series, store).",
                          buckets=_WORK)
REFIT_LAG = Histogram("curvecast_refit_lag_seconds",
                      "From a run's newest points arriving to its refit being stored.",
                      buckets=_WORK)
ALERT_ROUND_SECONDS = Histogram("curvecast_alert_round_duration_seconds",
                                "Time of one alert round that judged runs (claim, evaluate, "
                                "write).", buckets=_WORK)
ALERT_LAG = Histogram("curvecast_alert_lag_seconds",
                      "From a run's newest points arriving to the alert rules having judged "
                      "them.", buckets=_WORK)
WEBHOOK_DELIVERIES = Counter("curvecast_webhook_deliveries_total",
                             "Webhook delivery attempts by outcome: delivered, retry (failed, "
                             "tried again later), failed (gave up).", ["outcome"])
DB_CONNECTIONS = Gauge("curvecast_db_connections",
                       "Database connections held by the pool, by state: open (all of them) "
                       "and checked_out (in use by a request or the worker).", ["state"],
                       multiprocess_mode="livesum")


def multiprocess_enabled() -> bool:
    """Whether this process writes its values to ``PROMETHEUS_MULTIPROC_DIR``."""
    return bool(os.environ.get(MULTIPROC_ENV))


def mark_process_dead() -> None:
    """Drop this process's live gauges from the shared directory (at shutdown)."""
    if multiprocess_enabled():
        _multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


def observe_elapsed(histogram: Histogram) -> Callable[[], None]:
    """Start a timer; calling the result observes the seconds since into ``histogram``."""
    start = time.perf_counter()
    return lambda: histogram.observe(time.perf_counter() - start)


# --- the endpoint ----------------------------------------------------------------------------

router = APIRouter()


def exposition() -> bytes:
    """The text Prometheus scrapes: every process's values in multiprocess mode, else this
    process's (with its CPU, memory and file-descriptor collectors)."""
    if multiprocess_enabled():
        registry = CollectorRegistry()
        _multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
    return generate_latest(REGISTRY)


@router.get(METRICS_PATH, include_in_schema=False)
def metrics(_principal: ReadPrincipal) -> Response:
    """Prometheus metrics (text format 0.0.4). With auth on, any valid token."""
    return Response(exposition(), media_type=CONTENT_TYPE_LATEST)


# --- requests --------------------------------------------------------------------------------


class RequestMetrics:
    """Times every HTTP request and counts it by method, route template (``/api/v1/runs/
    {run_id}/metrics``; ``other`` for a path no route matched, so that scanners cannot make
    new series) and status. The labelled child of each combination is kept, so a request
    costs one dictionary lookup and one observation."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._children: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "other"
            label = (str(scope["method"]), route, status)
            child = self._children.get(label)
            if child is None:
                child = self._children[label] = REQUEST_SECONDS.labels(
                    label[0], route, str(status))
            child.observe(time.perf_counter() - start)


# --- the database pool -----------------------------------------------------------------------


def instrument_pool(engine: Engine) -> None:
    """Count the engine's pooled connections (open, checked out) as they change."""
    opened = DB_CONNECTIONS.labels("open")
    checked_out = DB_CONNECTIONS.labels("checked_out")

    @event.listens_for(engine, "connect")
    def _connect(*_args: Any) -> None:
        opened.inc()

    @event.listens_for(engine, "close")
    def _close(*_args: Any) -> None:
        opened.dec()

    @event.listens_for(engine, "close_detached")
    def _close_detached(*_args: Any) -> None:
        opened.dec()

    @event.listens_for(engine, "checkout")
    def _checkout(*_args: Any) -> None:
        checked_out.inc()

    @event.listens_for(engine, "checkin")
    def _checkin(*_args: Any) -> None:
        checked_out.dec()
