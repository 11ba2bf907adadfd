"""The FastAPI application factory."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.exc import OperationalError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import __version__
from service.api import forecast, health, metrics, pages, runs
from service.config import Settings
from service.db import make_engine, make_sessionmaker
from service.errors import ERROR_CODE_TO_HTTP_STATUS, install_handlers
from service.migrate import check_schema, upgrade
from service.worker import Worker

log = logging.getLogger(__name__)


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
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not response_started:
                await self._drain(receive, None)
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
        body = (
            b'{"error_code":"payload_too_large","message":"request body is larger than '
            + str(self.max_bytes).encode()
            + b' bytes; send smaller batches"}'
        )
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


class _TooLarge(Exception):
    pass


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


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the application. ``settings`` default to the environment (``CURVECAST_*``)."""
    settings = settings or Settings()
    engine = make_engine(settings)

    sessions = make_sessionmaker(engine)
    worker = Worker(sessions, settings) if settings.worker_enabled else None

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        prepare_database(settings)
        if worker is not None:
            worker.start()
        yield
        if worker is not None:
            worker.stop()
        engine.dispose()

    app = FastAPI(
        title="curvecast",
        version=__version__,
        summary="Watch and forecast neural-network training runs.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = sessions
    app.state.notify_ingest = (lambda _run_id: worker.notify()) if worker else _no_worker
    install_handlers(app, settings.retry_after_s)
    for module in (health, runs, metrics, forecast, pages):
        app.include_router(module.router)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    return app


def _no_worker(_run_id: uuid.UUID) -> None:
    """Ingest notification sink when the worker is disabled."""
