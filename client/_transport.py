"""Transports: how request bytes reach the service.

A transport turns ``(method, path, body, headers)`` into a :class:`Response` or raises
:class:`TransportError` when no HTTP answer came back (connection refused or reset, DNS failure,
timeout). It knows nothing about the API: status codes, retries and spooling are decided above it,
so tests can swap in an in-memory transport and exercise that logic without sockets or sleeps.

:class:`HTTPTransport` is the standard implementation: one persistent keep-alive connection per
calling thread (:mod:`curvecast.client._http`, standard library sockets), with ``TCP_NODELAY``
set and each request written in one ``send``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from curvecast.client._http import Connection, ProtocolError, ServerClosed

__all__ = ["HTTPTransport", "Response", "Transport", "TransportError"]


@dataclass(frozen=True)
class Response:
    """An HTTP answer.

    Attributes:
        status: the HTTP status code.
        headers: response headers, names in lower case.
        body: the raw response body.
    """

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        """The body parsed as JSON (raises ``ValueError`` if it is not JSON)."""
        return json.loads(self.body)


class TransportError(Exception):
    """No HTTP answer: the connection was refused, reset or timed out."""


@runtime_checkable
class Transport(Protocol):
    """What :class:`~curvecast.client.Monitor` needs from the network. Must be safe to call
    from several threads at once (the monitor's sender thread and the caller of
    ``Monitor.alerts()``)."""

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> Response:
        """Send one request to ``path`` (e.g. ``/api/v1/runs/ID``) and return the answer.

        Raises:
            TransportError: when no HTTP answer was received.
        """
        ...

    def close(self) -> None:
        """Release connections. The transport may be used again afterwards."""
        ...


# Errors that mean "the server closed an idle keep-alive connection": worth one immediate retry
# on a fresh connection. A timeout is not among them (retrying would double the wait).
_STALE_CONNECTION_ERRORS = (
    ServerClosed,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
)


class HTTPTransport:
    """HTTP/1.1 with one keep-alive connection per thread.

    Args:
        url: base URL of the service, e.g. ``http://127.0.0.1:8000`` (a path prefix is kept).

    Raises:
        ValueError: if ``url`` is not an ``http://`` or ``https://`` URL with a host.
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must look like http://host:port, got {url!r}")
        try:
            port = parts.port
        except ValueError as exc:  # urllib's message does not name the URL
            raise ValueError(f"url {url!r}: {exc}") from None
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port
        self._prefix = parts.path.rstrip("/")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[Connection] = set()

    #: ``TCP_NODELAY`` on new connections (a benchmark turns it off to show what it avoids).
    nodelay = True

    def _new_connection(self) -> Connection:
        conn = Connection(self._host, self._port, https=self._https, nodelay=self.nodelay)
        with self._lock:
            self._open.add(conn)
        self._local.conn = conn
        return conn

    def _drop(self, conn: Connection) -> None:
        conn.close()
        with self._lock:
            self._open.discard(conn)
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> Response:
        """Send one request; see :meth:`Transport.request`."""
        conn: Connection | None = getattr(self._local, "conn", None)
        reused = conn is not None and conn.sock is not None
        if conn is None:
            conn = self._new_connection()
        elif not reused:
            # Closed by close() from another thread: its next request reconnects; track it again.
            with self._lock:
                self._open.add(conn)
        try:
            return self._send(conn, method, path, body, headers, timeout)
        except _STALE_CONNECTION_ERRORS as exc:
            self._drop(conn)
            if not reused:
                raise TransportError(f"{method} {self.url}{path}: {exc!r}") from exc
        except (OSError, ProtocolError) as exc:
            self._drop(conn)
            raise TransportError(f"{method} {self.url}{path}: {exc!r}") from exc
        # The reused connection had gone stale: one retry on a fresh one (requests are idempotent).
        conn = self._new_connection()
        try:
            return self._send(conn, method, path, body, headers, timeout)
        except (OSError, ProtocolError) as exc:
            self._drop(conn)
            raise TransportError(f"{method} {self.url}{path}: {exc!r}") from exc

    def _send(
        self,
        conn: Connection,
        method: str,
        path: str,
        body: bytes | None,
        headers: Mapping[str, str] | None,
        timeout: float,
    ) -> Response:
        answer = conn.request(method, self._prefix + path, body, headers or {}, timeout)
        if answer.will_close:
            self._drop(conn)
        return Response(answer.status, answer.headers, answer.body)

    def close(self) -> None:
        """Close every open connection (of all threads)."""
        with self._lock:
            conns, self._open = self._open, set()
        for conn in conns:
            conn.close()

    def __repr__(self) -> str:
        return f"HTTPTransport({self.url!r})"
