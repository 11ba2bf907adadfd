"""Transports: how request bytes reach the service.

A transport turns ``(method, path, body, headers)`` into a :class:`Response` or raises
:class:`TransportError` when no HTTP answer came back (connection refused or reset, DNS failure,
timeout, an answer that is not HTTP/1.x). It knows nothing about the API: status codes, retries
and spooling are decided above it, so tests can swap in an in-memory transport and exercise that
logic without sockets or sleeps.

:class:`HTTPTransport` is the standard implementation: the standard library's ``http.client``,
one keep-alive connection per calling thread. ``http.client`` sets ``TCP_NODELAY`` on its
sockets itself, which matters: it writes a request's head and its body in two sends, and without
it Nagle's algorithm holds the body back until the server acknowledges the head (a delayed ACK:
tens of milliseconds a request). HTTPS checks the server's certificate and host name against the
system's certificate store (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` point it elsewhere).
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

__all__ = ["HTTPTransport", "Response", "Transport", "TransportError"]

#: The most bytes of an answer's body (``http.client`` bounds its head: 64 KiB a line, 100
#: header fields). The service's answers are small JSON; anything larger is not the service.
MAX_BODY = 64 << 20
_READ = 64 << 10


@dataclass(frozen=True)
class Response:
    """An HTTP answer.

    Attributes:
        status: the HTTP status code.
        headers: response headers, names in lower case (a repeated field keeps its last value).
        body: the raw response body.
    """

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        """The body parsed as JSON (raises ``ValueError`` if it is not JSON)."""
        return json.loads(self.body)


class TransportError(Exception):
    """No HTTP answer: the connection was refused, reset or timed out, or the answer was not
    HTTP/1.x this client can read."""


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


class UnreadableAnswer(http.client.HTTPException):
    """An answer ``http.client`` reads but this client refuses (see :func:`_read_answer`)."""


# Errors that mean "the server closed an idle keep-alive connection": worth one immediate retry
# on a fresh connection. A timeout is not among them (retrying would double the wait).
_STALE_CONNECTION_ERRORS = (
    http.client.RemoteDisconnected,  # closed before the answer's first byte
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
)


class HTTPTransport:
    """HTTP/1.1 over ``http.client``, one keep-alive connection per thread.

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
        self._open: set[http.client.HTTPConnection] = set()
        self._tls: ssl.SSLContext | None = None

    def _new_connection(self) -> http.client.HTTPConnection:
        """A connection object for the calling thread (it opens its socket on first use)."""
        if not self._https:
            return http.client.HTTPConnection(self._host, self._port)
        if self._tls is None:  # loads the system's CA certificates: once per transport
            context = ssl.create_default_context()
            context.set_alpn_protocols(["http/1.1"])
            self._tls = context
        return http.client.HTTPSConnection(self._host, self._port, context=self._tls)

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._new_connection()
        if conn.sock is None:  # about to open (again): close() of any thread must see it
            with self._lock:
                self._open.add(conn)
        return conn

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> Response:
        """Send one request; see :meth:`Transport.request`.

        Raises:
            TransportError: no HTTP answer.
            ValueError: a header name or value that would break the request's framing.
        """
        conn = self._connection()
        reused = conn.sock is not None
        try:
            return self._send(conn, method, path, body, headers, timeout)
        except _STALE_CONNECTION_ERRORS as exc:
            if not reused:
                raise TransportError(f"{method} {self.url}{path}: {exc!r}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise TransportError(f"{method} {self.url}{path}: {exc!r}") from exc
        # The reused connection had gone stale: one retry on a fresh one (requests are idempotent).
        conn = self._connection()
        try:
            return self._send(conn, method, path, body, headers, timeout)
        except (OSError, http.client.HTTPException) as exc:
            raise TransportError(f"{method} {self.url}{path}: {exc!r}") from exc

    def _send(
        self,
        conn: http.client.HTTPConnection,
        method: str,
        path: str,
        body: bytes | None,
        headers: Mapping[str, str] | None,
        timeout: float,
    ) -> Response:
        """One request and its answer on ``conn``; on any error ``conn`` is closed, so that the
        thread's next request opens a fresh socket."""
        try:
            conn.timeout = timeout  # for connecting
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            conn.request(method, self._prefix + path, body=body, headers=headers or {})
            try:
                return _read_answer(conn.getresponse())
            except ValueError as exc:  # http.client's reading, e.g. of a negative chunk size
                raise UnreadableAnswer(f"a malformed answer: {exc}") from exc
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        """Close every open connection (of all threads)."""
        with self._lock:
            conns, self._open = self._open, set()
        for conn in conns:
            conn.close()

    def __repr__(self) -> str:
        return f"HTTPTransport({self.url!r})"


def _read_answer(answer: http.client.HTTPResponse) -> Response:
    """The whole answer, its body at most :data:`MAX_BODY` bytes.

    ``http.client`` reads past a ``100 Continue`` itself but hands other interim (1xx) answers
    back as if final, with the real answer still unread on the connection: refused here (the
    caller closes the connection), as is a body over the bound.
    """
    if answer.status < 200:
        raise UnreadableAnswer(f"an interim answer ({answer.status} {answer.reason}) "
                                "this client does not read")
    if answer.length is not None:  # Content-Length (0 for HEAD, 204, 304)
        if answer.length > MAX_BODY:
            raise UnreadableAnswer(f"a body of {answer.length} bytes, over {MAX_BODY}")
        body = answer.read()  # IncompleteRead if the connection ends early
    else:  # chunked, or up to the connection's end
        parts: list[bytes] = []
        size = 0
        while chunk := answer.read(_READ):
            size += len(chunk)
            if size > MAX_BODY:
                raise UnreadableAnswer(f"a body over {MAX_BODY} bytes")
            parts.append(chunk)
        body = b"".join(parts)
    return Response(answer.status, {k.lower(): v for k, v in answer.getheaders()}, body)
