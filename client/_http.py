"""One HTTP/1.1 keep-alive connection, as small as the hook needs it.

:class:`~curvecast.client.HTTPTransport` used ``http.client``. On the machines this project is
measured on, ``http.client`` spent about 0.4 ms of Python per request: ``putheader`` checks and
joins the head line by line, and the answer's headers go through the ``email`` package's parser.
At one batch a second that was two thirds of the sender thread's CPU (``bench.client_overhead``).
The hook needs little of it: it talks to one service, over one connection per thread, in short
requests. So a request here is its head and body in one ``sendall`` (one write, so Nagle's
algorithm has nothing to hold back), and the answer is read as RFC 9112 frames it: a status
line and header fields up to an empty line, then a body delimited by ``Transfer-Encoding:
chunked``, by ``Content-Length``, or by the end of the connection. Interim (1xx) answers are
skipped. What is not HTTP/1.x raises :class:`ProtocolError`.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

#: The most bytes an answer's head (status line and header fields) may take.
MAX_HEAD = 64 << 10
#: The most bytes of a body delimited by the end of the connection (no length given).
MAX_UNFRAMED_BODY = 64 << 20
_RECV = 64 << 10
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.x this client can read."""


class ServerClosed(ConnectionError):
    """The connection ended before the first byte of the answer: what a server does to an idle
    keep-alive connection it dropped (worth one retry on a fresh connection)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A read answer: status, header fields (names in lower case; a repeated field keeps its
    last value), body, and whether the connection cannot be used again."""

    status: int
    headers: dict[str, str]
    body: bytes
    will_close: bool


_TLS: ssl.SSLContext | None = None


def _tls_context() -> ssl.SSLContext:
    # One context per process: creating it loads the system's CA certificates.
    global _TLS
    if _TLS is None:
        context = ssl.create_default_context()
        context.set_alpn_protocols(["http/1.1"])
        _TLS = context
    return _TLS


class Connection:
    """A keep-alive connection to ``host:port``; not thread-safe (one per thread).

    Args:
        host: host name or address.
        port: TCP port (None: 80, or 443 with ``https``).
        https: wrap the socket in TLS (the system's certificate store, host name checked).
        nodelay: set ``TCP_NODELAY`` (off only to show what it avoids, in a benchmark).
    """

    def __init__(self, host: str, port: int | None, *, https: bool, nodelay: bool = True) -> None:
        self.host = host
        self.port = port if port is not None else (443 if https else 80)
        self.https = https
        self.nodelay = nodelay
        name = f"[{host}]" if ":" in host else host  # an IPv6 address, as in a URL
        self._host_field = name if port is None else f"{name}:{port}"
        self.sock: socket.socket | None = None
        self._buf = bytearray()

    def connect(self, timeout: float) -> None:
        """Open the socket (closing any open one)."""
        self.close()
        sock = socket.create_connection((self.host, self.port), timeout)
        try:
            if self.nodelay:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.https:
                sock = _tls_context().wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def close(self) -> None:
        """Close the socket; the next request opens a new one."""
        sock, self.sock = self.sock, None
        self._buf.clear()
        if sock is not None:
            sock.close()

    def request(
        self,
        method: str,
        target: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
    ) -> Answer:
        """Send one request and read its answer.

        Raises:
            OSError: the connection failed or timed out (:class:`ServerClosed`: it ended before
                the answer began).
            ProtocolError: the answer is not HTTP/1.x.
            ValueError: a header name or value that would break the request's framing.
        """
        head = [f"{method} {target} HTTP/1.1", f"Host: {self._host_field}",
                "Accept-Encoding: identity"]
        for name, value in headers.items():
            if "\r" in name or "\n" in name or ":" in name or "\r" in value or "\n" in value:
                raise ValueError(f"invalid HTTP header {name!r}: {value!r}")
            head.append(f"{name}: {value}")
        if body is not None or method in _BODY_METHODS:
            head.append(f"Content-Length: {len(body) if body else 0}")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")
        if self.sock is None or self._buf:  # never opened, or left mid-answer: start afresh
            self.connect(timeout)
        assert self.sock is not None
        self.sock.settimeout(timeout)
        self.sock.sendall(data)
        return self._read_answer(method)

    # -- reading ---------------------------------------------------------------------------

    def _recv(self) -> bytes:
        assert self.sock is not None
        return self.sock.recv(_RECV)

    def _read_answer(self, method: str) -> Answer:
        status, version, headers = self._read_head(first=True)
        while 100 <= status < 200:  # 100 Continue and other interim answers: no body
            status, version, headers = self._read_head(first=False)
        connection = headers.get("connection", "").lower()
        will_close = "close" in connection or (
            version == "HTTP/1.0" and "keep-alive" not in connection
        )
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = self._read_chunked()
        elif "content-length" in headers:
            text = headers["content-length"]
            if not text.isdigit():
                raise ProtocolError(f"bad Content-Length {text!r}")
            body = self._read_exact(int(text))
        else:
            body = self._read_to_close()
            will_close = True
        return Answer(status, headers, body, will_close)

    def _read_head(self, *, first: bool) -> tuple[int, str, dict[str, str]]:
        head = self._read_until(b"\r\n\r\n", "the answer's head", closed_is_stale=first)
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name[0] in " \t":  # obsolete line folding: refused
                raise ProtocolError(f"malformed header line {line[:80]!r}")
            headers[name.lower()] = value.strip(" \t")
        return int(code), version, headers

    def _read_exact(self, n: int) -> bytes:
        buf = self._buf
        while len(buf) < n:
            chunk = self._recv()
            if not chunk:
                raise ProtocolError("the connection ended inside the answer's body")
            buf += chunk
        out = bytes(buf[:n])
        del buf[:n]
        return out

    def _read_until(self, delimiter: bytes, what: str, *, closed_is_stale: bool = False
                    ) -> bytes:
        """The bytes before ``delimiter``, taken from the buffer with it; ``what`` names them
        in errors. With ``closed_is_stale``, a connection that ends before any byte arrived
        raises :class:`ServerClosed`."""
        buf = self._buf
        while (end := buf.find(delimiter)) < 0:
            if len(buf) > MAX_HEAD:
                raise ProtocolError(f"{what} is over {MAX_HEAD} bytes")
            chunk = self._recv()
            if not chunk:
                if closed_is_stale and not buf:
                    raise ServerClosed("the server closed the connection before answering")
                raise ProtocolError(f"the connection ended inside {what}")
            buf += chunk
        out = bytes(buf[:end])
        del buf[: end + len(delimiter)]
        return out

    def _read_line(self) -> bytes:
        return self._read_until(b"\r\n", "a chunked body's line")

    def _read_chunked(self) -> bytes:
        parts = []
        while True:
            size_text = self._read_line().split(b";", 1)[0].strip(b" \t")
            if not size_text or size_text.strip(b"0123456789abcdefABCDEF"):
                raise ProtocolError(f"bad chunk size {size_text[:20]!r}")
            size = int(size_text, 16)
            if size == 0:
                break
            parts.append(self._read_exact(size))
            if self._read_exact(2) != b"\r\n":
                raise ProtocolError("a chunk does not end with CRLF")
        while self._read_line():  # trailer fields, up to the empty line
            pass
        return b"".join(parts)

    def _read_to_close(self) -> bytes:
        buf = self._buf
        while chunk := self._recv():
            buf += chunk
            if len(buf) > MAX_UNFRAMED_BODY:
                raise ProtocolError(f"an unframed body over {MAX_UNFRAMED_BODY} bytes")
        out = bytes(buf)
        buf.clear()
        return out
