"""The hook's :class:`HTTPTransport` (``http.client``, one keep-alive connection per thread)
against a real loopback server that answers with scripted bytes: keep-alive, the three ways a
body is framed, interim answers, a connection the server dropped while idle, timeouts, bounded
bodies, answers that are not HTTP, and HTTPS with the system's certificate store."""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from curvecast.client import HTTPTransport, TransportError, _transport
from tests.support import wait_for

#: What the server does with one request: given the request head (and body), the raw bytes
#: to answer and whether to close the connection afterwards.
Script = Callable[[bytes, bytes], tuple[bytes, bool]]


class RawServer:
    """A loopback server that reads requests (head + Content-Length body) and answers each
    with the bytes its script returns. Records every request, counts connections and those
    still open."""

    def __init__(self, script: Script, tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.tls = tls
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self.open_connections = 0
        self._count = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except (OSError, ssl.SSLError):
                    conn.close()
                    continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with self._count:
            self.open_connections += 1
        try:
            self._answer(conn)
        finally:
            with self._count:
                self.open_connections -= 1

    def _answer(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                self.requests.append((head, body))
                answer, close = self.script(head, body)
                conn.sendall(answer)
                if close:
                    return

    def close(self) -> None:
        self._sock.close()


@contextmanager
def raw_server(script: Script, tls: ssl.SSLContext | None = None) -> Iterator[RawServer]:
    server = RawServer(script, tls)
    try:
        yield server
    finally:
        server.close()


def answer(body: bytes = b"{}", *, extra: bytes = b"", close: bool = False) -> Script:
    return lambda head, req: (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s"
                              % (len(body), extra, body), close)


def test_requests_share_one_connection_and_carry_head_and_body() -> None:
    with raw_server(answer(b'{"ok":true}', extra=b"X-Thing: a\r\nX-Thing: b\r\n")) as srv:
        transport = HTTPTransport(srv.url + "/prefix")
        for i in range(3):
            resp = transport.request("POST", f"/p/{i}", body=b"x" * (70_000 + i),
                                     headers={"Authorization": "Bearer t"})
            assert (resp.status, resp.body, resp.json()) == (200, b'{"ok":true}', {"ok": True})
            assert resp.headers["x-thing"] == "b"  # a repeated field keeps its last value
        transport.close()
    assert srv.connections == 1
    head, body = srv.requests[2]
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /prefix/p/2 HTTP/1.1"
    assert b"Authorization: Bearer t" in lines and b"Content-Length: 70002" in lines
    assert body == b"x" * 70_002
    assert any(line.startswith(b"Host: 127.0.0.1:") for line in lines)


def test_each_thread_has_its_own_connection_and_close_ends_them_all() -> None:
    with raw_server(answer()) as srv:
        transport = HTTPTransport(srv.url)
        assert transport.request("GET", "/").status == 200
        other = threading.Thread(target=transport.request, args=("GET", "/"))
        other.start()
        other.join(10)
        assert srv.connections == 2
        transport.close()  # from this thread: the other thread's connection is closed too
        wait_for(lambda: srv.open_connections == 0, 10, "the server's side closed")
        assert transport.request("GET", "/").status == 200  # usable again: a new connection
    assert srv.connections == 3


def test_chunked_body_with_extensions_and_trailers() -> None:
    chunked = (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=1\r\nhello\r\n1A\r\n" + b"z" * 26 + b"\r\n0\r\nX-Trailer: t\r\n\r\n")
    with raw_server(lambda h, b: (chunked, False)) as srv:
        transport = HTTPTransport(srv.url)
        for _ in range(2):  # the framing left the connection clean for the next answer
            resp = transport.request("GET", "/")
            assert (resp.status, resp.body) == (201, b"hello" + b"z" * 26)
    assert srv.connections == 1


def test_body_to_the_end_of_the_connection_and_connection_close() -> None:
    scripts = iter([
        (b"HTTP/1.0 200 OK\r\n\r\nall of it", True),  # no length: the body ends with the socket
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", True),
        (b"HTTP/1.1 204 No Content\r\n\r\n", False),  # no body, even without a length
        (b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlast", False),
    ])
    with raw_server(lambda h, b: next(scripts)) as srv:
        transport = HTTPTransport(srv.url)
        assert transport.request("GET", "/").body == b"all of it"
        assert transport.request("GET", "/").body == b"ok"
        assert transport.request("DELETE", "/").status == 204
        assert transport.request("GET", "/").body == b"last"
    assert srv.connections == 3  # new connections after the two that had to close


def test_100_continue_is_skipped_and_other_interim_answers_are_refused() -> None:
    final = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal"
    scripts = iter([
        (b"HTTP/1.1 100 Continue\r\n\r\n" + final, False),
        # http.client would hand this back as the answer, the real one left unread on the
        # connection for the next request to read: refused, and the connection closed.
        (b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + final, False),
        (final, False),
    ])
    with raw_server(lambda h, b: next(scripts)) as srv:
        transport = HTTPTransport(srv.url)
        resp = transport.request("PUT", "/", body=b"{}")
        assert (resp.status, resp.body) == (200, b"final")
        with pytest.raises(TransportError, match="interim answer .103 Early Hints."):
            transport.request("PUT", "/", body=b"{}")
        assert transport.request("PUT", "/", body=b"{}").body == b"final"
    assert srv.connections == 2


def test_a_dropped_idle_connection_is_retried_once_on_a_fresh_one() -> None:
    ok = answer()(b"", b"")[0]
    # The server closes the connection after its second answer, without saying so.
    with raw_server(lambda h, b: (ok, len(srv.requests) == 2)) as srv:
        transport = HTTPTransport(srv.url)
        assert transport.request("GET", "/").status == 200
        assert transport.request("GET", "/").status == 200  # on the same connection
        wait_for(lambda: srv.open_connections == 0, 10, "the server's side closed")
        # That connection is gone: this request retries on a fresh one, unseen by the caller.
        assert transport.request("POST", "/", body=b"{}").status == 200
    assert srv.connections == 2
    assert len(srv.requests) == 3


def test_a_connection_that_never_answers_is_a_transport_error() -> None:
    with raw_server(lambda h, b: (b"", True)) as srv:  # reads the request, closes silently
        with pytest.raises(TransportError, match="closed connection without response"):
            HTTPTransport(srv.url).request("GET", "/")
    assert srv.connections == 1  # a fresh connection failing is not retried


@pytest.mark.parametrize("raw", [
    b"SPDY/3 200 OK\r\n\r\n",
    b"garbage",
    b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"X-Long: " + b"x" * 70_000 + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
])
def test_answers_that_are_not_http_are_transport_errors(raw: bytes) -> None:
    with raw_server(lambda h, b: (raw, True)) as srv:
        transport = HTTPTransport(srv.url)
        with pytest.raises(TransportError):
            transport.request("GET", "/")
        # The broken connection was dropped: the next request opens a new one.
        srv.script = answer()
        assert transport.request("GET", "/").status == 200
    assert srv.connections == 2


def test_a_body_over_the_bound_is_a_transport_error(monkeypatch: pytest.MonkeyPatch) -> None:
    huge = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (_transport.MAX_BODY + 1)
    with raw_server(lambda h, b: (huge, True)) as srv:  # refused by its length, unread
        with pytest.raises(TransportError, match="over"):
            HTTPTransport(srv.url).request("GET", "/")
    monkeypatch.setattr(_transport, "MAX_BODY", 100_000)
    chunk = b"10000\r\n" + b"y" * 0x10000 + b"\r\n"
    for raw in (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 2 + b"0\r\n\r\n",
                b"HTTP/1.0 200 OK\r\n\r\n" + b"y" * 100_001):
        with raw_server(lambda h, b, raw=raw: (raw, True)) as srv:
            with pytest.raises(TransportError, match="a body over 100000 bytes"):
                HTTPTransport(srv.url).request("GET", "/")


def test_a_header_that_would_break_the_framing_is_refused() -> None:
    with raw_server(answer()) as srv:
        transport = HTTPTransport(srv.url)
        with pytest.raises(ValueError, match="[Ii]nvalid header"):
            transport.request("GET", "/", headers={"Authorization": "Bearer x\r\nX-Evil: 1"})
        assert transport.request("GET", "/", headers={"Authorization": "Bearer x"}).status == 200
    assert len(srv.requests) == 1  # the refused request never reached the server
    assert b"X-Evil" not in srv.requests[0][0]


def test_a_server_that_does_not_answer_in_time_is_a_transport_error() -> None:
    stall = threading.Event()

    def slow(head: bytes, body: bytes) -> tuple[bytes, bool]:
        stall.wait(10)
        return b"", True

    with raw_server(slow) as srv:
        with pytest.raises(TransportError, match="timed out"):
            HTTPTransport(srv.url).request("GET", "/", timeout=0.2)
        stall.set()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (and its key), signed by itself."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "curvecast test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_https_checks_the_certificate_and_keeps_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = _self_signed(tmp_path)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    with raw_server(answer(b"secret"), tls=server_tls) as srv:
        url = srv.url.replace("http://", "https://")
        # The system's store does not know the certificate.
        with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
            HTTPTransport(url).request("GET", "/")
        # SSL_CERT_FILE points the system's store at it (as for a company's own CA) ...
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        transport = HTTPTransport(url)
        for _ in range(2):
            assert transport.request("POST", "/", body=b"{}").body == b"secret"
        # ... and the host name is still checked: the certificate names 127.0.0.1 only.
        with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
            HTTPTransport(url.replace("127.0.0.1", "localhost")).request("GET", "/")
    assert srv.connections == 3  # the refused handshakes, and one kept connection
