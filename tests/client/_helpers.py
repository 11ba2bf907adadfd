"""Helpers for the client tests: reading what the server stored (``wait_for`` it), a stalled
listener, a uvicorn server on a chosen port, and transports that record or fake."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpx

from curvecast.client import HTTPTransport, Response, TransportError
from curvecast.service.config import Settings
from tests.support import thread_server, wait_for


def series(url: str, run_id: str) -> dict[str, dict[str, Any]]:
    """Every stored series of a run, by key ({} if the run does not exist yet)."""
    try:
        resp = httpx.get(f"{url}/api/v1/runs/{run_id}/metrics", timeout=10)
    except httpx.TransportError:
        return {}
    if resp.status_code == 404:
        return {}
    resp.raise_for_status()
    return {s["key"]: s for s in resp.json()["series"]}


def point_counts(url: str, run_id: str) -> dict[str, int]:
    """Stored points per key."""
    return {k: s["total_points"] for k, s in series(url, run_id).items()}


def wait_for_points(url: str, run_id: str, expected: Mapping[str, int], timeout: float = 30.0):
    """Wait until the stored point counts equal ``expected`` exactly; returns the series."""
    wait_for(lambda: point_counts(url, run_id) == dict(expected), timeout,
             f"points {dict(expected)} stored")
    return series(url, run_id)


def get_run(url: str, run_id: str) -> dict[str, Any]:
    resp = httpx.get(f"{url}/api/v1/runs/{run_id}", timeout=10)
    resp.raise_for_status()
    return resp.json()


@contextmanager
def stalled_listener() -> Iterator[int]:
    """A port that accepts TCP connections and never answers (a hung server)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
                held.append(conn)  # read nothing, answer nothing
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(sock.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        sock.close()


@contextmanager
def thread_server_on(settings: Settings, port: int) -> Iterator[str]:
    """``tests._servers.thread_server`` on a given port (to bring a 'down' URL up)."""
    with thread_server(settings, port) as url:
        yield url


class RecordingTransport(HTTPTransport):
    """The real HTTP transport, remembering (monotonic time, method, path, status or None)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.log: list[tuple[float, str, str, int | None]] = []

    def request(self, method: str, path: str, **kwargs: Any) -> Response:
        try:
            resp = super().request(method, path, **kwargs)
        except TransportError:
            self.log.append((time.monotonic(), method, path, None))
            raise
        self.log.append((time.monotonic(), method, path, resp.status))
        return resp


Handler = Callable[[str, str, bytes | None], Response | Exception]


class FakeTransport:
    """In-memory transport: ``handler(method, path, body)`` returns a Response or an exception
    to raise. Records every request."""

    def __init__(self, handler: Handler | None = None) -> None:
        self.handler = handler or accept_all
        self.requests: list[tuple[str, str, bytes | None]] = []
        self.lock = threading.Lock()

    def request(self, method: str, path: str, *, body: bytes | None = None,
                headers: Mapping[str, str] | None = None, timeout: float = 10.0) -> Response:
        with self.lock:
            self.requests.append((method, path, body))
        result = self.handler(method, path, body)
        if isinstance(result, Exception):
            raise result
        return result

    def close(self) -> None:
        pass

    def paths(self, method: str | None = None) -> list[str]:
        return [p for m, p, _ in self.requests if method is None or m == method]


def accept_all(method: str, path: str, body: bytes | None) -> Response:
    """A fake service that stores nothing and says yes to everything."""
    if method == "POST":
        return Response(200, {}, b'{"accepted": 1, "duplicates": 0}')
    if method == "GET":
        return Response(404, {}, b'{"error_code": "not_found", "message": "no route"}')
    return Response(201 if method == "PUT" else 200, {}, b"{}")


class FakeClock:
    """A monotonic clock that moves only when told."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
