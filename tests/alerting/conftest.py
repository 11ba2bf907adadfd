"""A real webhook receiver: an HTTP server on loopback in a thread that records every request
and answers with scripted status codes; and a migrated database per test module."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker
from curvecast.service.migrate import upgrade
from tests.conftest import create_pg_database, drop_pg_database


@dataclass
class Received:
    """One request the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


def _event(*, is_set: bool) -> threading.Event:
    event = threading.Event()
    if is_set:
        event.set()
    return event


@dataclass
class Receiver:
    """A loopback webhook receiver. ``statuses`` are answered in order (then 200). While
    ``gate`` is clear, each request is held unanswered (``holding`` says one arrived)."""

    url: str
    port: int
    server: ThreadingHTTPServer
    requests: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    gate: threading.Event = field(default_factory=lambda: _event(is_set=True))
    holding: threading.Event = field(default_factory=threading.Event)

    def payloads(self, path: str | None = None) -> list[Any]:
        with self.lock:
            return [r.json() for r in self.requests if path is None or r.path == path]

    def by_path(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.requests if r.path == path]


def start_receiver(port: int = 0) -> Receiver:
    """Start a receiver on 127.0.0.1 (``port`` 0: any free port)."""
    holder: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            rx = holder["rx"]
            with rx.lock:
                rx.requests.append(Received(self.path, dict(self.headers), body, time.time()))
                status = rx.statuses.pop(0) if rx.statuses else 200
            if not rx.gate.is_set():
                rx.holding.set()
                rx.gate.wait(60)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    real_port = int(server.server_address[1])
    rx = Receiver(url=f"http://127.0.0.1:{real_port}", port=real_port, server=server)
    holder["rx"] = rx
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return rx


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver for one test."""
    rx = start_receiver()
    yield rx
    rx.server.shutdown()
    rx.server.server_close()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[sessionmaker[Session]]:
    """A database of the test module's own, on each backend: store and delivery tests claim
    every due run or delivery, which must not lease what other modules' tests wait on."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('alerts') / 'alerts.db'}"
    else:
        url = create_pg_database()
    upgrade(url)
    engine = make_engine(Settings(database_url=url))
    yield make_sessionmaker(engine)
    engine.dispose()
    if request.param == "postgres":
        drop_pg_database(url)
