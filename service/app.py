"""The FastAPI application factory."""

from __future__ import annotations

import gc
import json
import logging
import re
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from curvecast.service import __version__, prometheus, web
from curvecast.service.api import alerts, decisions, forecast, health, metrics, projects, runs
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker
from curvecast.service.edge import EdgeGuard
from curvecast.service.errors import ERROR_CODE_TO_HTTP_STATUS, ERROR_RESPONSES, install_handlers
from curvecast.service.migrate import check_schema, upgrade
from curvecast.service.web import docs, static
from curvecast.service.web.responses import page_not_found
from curvecast.service.worker import (
    LivenessTask,
    RetentionTask,
    Worker,
    deliver_webhooks,
    evaluate_alerts,
    refit_due_runs,
)

log = logging.getLogger(__name__)


class RedactSecrets(logging.Filter):
    """Hide bearer tokens in log records: the dashboards' one-time ``?token=`` login, and any
    token-shaped string (``cc_<prefix>_<secret>``, kept as ``cc_<prefix>_***``), so access logs
    (``curvecast serve --access-log``) never hold a usable secret."""

    _QUERY = re.compile(r"((?:^|[?&])token=)[^&\s\"]*", re.IGNORECASE)
    _TOKEN = re.compile(r"(cc_[0-9a-f]{12}_)[A-Za-z0-9_-]{43}")

    def redact(self, text: str) -> str:
        return self._TOKEN.sub(r"\1***", self._QUERY.sub(r"\1***", text))

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self.redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.msg, str) and not record.args:
            record.msg = self.redact(record.msg)
        return True


_REDACT = RedactSecrets()


def install_log_redaction() -> None:
    """Attach :class:`RedactSecrets` to uvicorn's loggers (once per process)."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if _REDACT not in logger.filters:
            logger.addFilter(_REDACT)


class BodySizeLimit:
    """Reject bodies over ``max_bytes`` with 413 before they are parsed.

    Checks Content-Length up front and also counts streamed (chunked) bodies, so a client
    cannot bypass the limit by omitting the header.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._drain(receive, int(declared))
            await self._reject(send)
            return
        received = 0
        response_started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Drain first, then raise an HTTPException: FastAPI turns any other error
                    # raised while it reads the body into "400 error parsing the body".
                    if message.get("more_body", False):
                        await self._drain(receive, None)
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:  # raised outside the exception handlers' reach (already drained)
            if not response_started:
                await self._reject(send)

    async def _drain(self, receive: Receive, declared: int | None) -> None:
        """Read and discard the rest of a moderately oversized body before answering.

        A server that answers and closes while the client is still sending makes the client
        see a connection reset instead of the 413 and its message. Bodies far over the limit
        are not read: the connection is closed on them.
        """
        if declared is not None and declared > 8 * self.max_bytes:
            return
        budget = 8 * self.max_bytes
        while budget > 0:
            message = await receive()
            if message["type"] != "http.request":
                return
            budget -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    async def _reject(self, send: Send) -> None:
        body = json.dumps(
            {"error_code": "payload_too_large", "message": _too_large_message(self.max_bytes)}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": ERROR_CODE_TO_HTTP_STATUS["payload_too_large"],
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _too_large_message(max_bytes: int) -> str:
    return f"request body is larger than {max_bytes} bytes; send smaller batches"


class _TooLarge(StarletteHTTPException):
    """A streamed body went over the limit (handled by the 413 of the one error table)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, _too_large_message(max_bytes), headers={"Connection": "close"})


def prepare_database(settings: Settings) -> None:
    """Bring the embedded SQLite database up to date, or check a server database's schema.

    Raises:
        SchemaOutOfDate: a server database (PostgreSQL) needs ``curvecast migrate``.
    """
    if settings.is_sqlite and settings.auto_migrate_sqlite:
        upgrade(settings.database_url)
        return
    engine = make_engine(settings)
    try:
        check_schema(engine)
    except OperationalError as exc:
        # Unreachable now: start anyway, answer 503 until it is back (/readyz says so).
        log.warning("database unreachable at start-up: %s", str(exc).splitlines()[0])
    finally:
        engine.dispose()


def freeze_startup_heap() -> None:
    """Exclude the objects made by imports and startup from the garbage collector's scans.

    The service imports plotly, scipy, SQLAlchemy and pydantic: about 150,000 long-lived objects
    that every full collection walks, with the GIL held, for tens of milliseconds. Those pauses
    arrive every few thousand requests and set the p99 of every endpoint (BENCHMARKS.md,
    "Garbage-collector pauses in the service"). ``gc.freeze`` moves them to a permanent generation;
    objects made later are collected as usual.
    """
    gc.collect()
    gc.freeze()


def make_worker(sessions: sessionmaker[Session], settings: Settings) -> Worker:
    """The background worker with every task: what each service process runs unless
    ``CURVECAST_WORKER_ENABLED=false``, and what ``curvecast worker`` runs alone."""
    return Worker(
        sessions,
        settings,
        tasks=(
            refit_due_runs, evaluate_alerts, deliver_webhooks, LivenessTask(), RetentionTask(),
        ),
        # Ingest wakes what acts on new points; an alert round that did work wakes the
        # webhook deliveries it may have queued. The rest poll every worker_interval_s.
        on_new_data=(refit_due_runs, evaluate_alerts),
        follow_ups={evaluate_alerts: (deliver_webhooks,)},
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the application. ``settings`` default to the environment (``CURVECAST_*``)."""
    settings = settings or Settings()
    engine = make_engine(settings)

    prometheus.instrument_pool(engine)
    sessions = make_sessionmaker(engine)
    worker = make_worker(sessions, settings) if settings.worker_enabled else None

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        prepare_database(settings)
        freeze_startup_heap()
        # Read and gzip the static files (plotly.js: 1.2 MB) now, not in the first browser's
        # request; in a thread, so readiness does not wait for it.
        threading.Thread(target=static.warm, name="static-warm", daemon=True).start()
        if worker is not None:
            worker.start()
        yield
        if worker is not None:
            worker.stop()
        engine.dispose()
        prometheus.mark_process_dead()

    app = FastAPI(
        title="curvecast",
        version=__version__,
        summary="Watch and forecast neural-network training runs.",
        lifespan=lifespan,
        # /docs and /redoc are served from installed files (web/docs.py): FastAPI's own pages
        # load Swagger UI and ReDoc from a CDN and are blank offline.
        docs_url=None,
        redoc_url=None,
    )
    install_log_redaction()
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = sessions
    app.state.notify_ingest = (lambda _run_id: worker.notify()) if worker else _no_worker
    install_handlers(app, settings.retry_after_s, page_not_found=page_not_found)
    for module in (health, runs, metrics, forecast, decisions, alerts, projects):
        # API routes document the standard error answers (health probes have their own).
        app.include_router(module.router, responses=None if module is health else ERROR_RESPONSES)
    app.include_router(web.router)
    app.include_router(docs.router)
    app.include_router(prometheus.router)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    # Host, cross-site and token checks answer before a body is read.
    app.add_middleware(EdgeGuard, settings=settings)
    # Outermost (added last): every request is timed and counted, refused ones included.
    app.add_middleware(prometheus.RequestMetrics)
    return app


def _no_worker(_run_id: uuid.UUID) -> None:
    """Ingest notification sink when the worker is disabled."""
