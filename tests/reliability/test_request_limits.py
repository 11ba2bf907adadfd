"""What a connection may cost before its request reaches the app (``service/http_guard.py``),
on raw sockets against a real ``curvecast serve`` process: request heads over the size or line
limit are answered 431 before the app (and its auth) sees them, a head that trickles in is cut
off, open connections are capped (the longest waiting is closed first, busy ones are never),
and two ``Host`` headers are refused."""

from __future__ import annotations

import json
import select
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support import (
    ServerProcess,
    create_token,
    start_server_process,
    wait_for,
)

MIB = 1024 * 1024
#: The server's limits in these tests: few connections (quick to fill), and a head timeout
#: longer than any test here, so that what closes a connection is the limit under test.
MAX_CONNECTIONS = 24
HEADER_TIMEOUT_S = 60.0


def _serve(sqlite_url: str, log_dir: Path, header_timeout_s: float) -> ServerProcess:
    """``curvecast serve`` with auth on (the limits hold before authentication)."""
    return start_server_process(
        sqlite_url, log_dir,
        env={"CURVECAST_AUTH_ENABLED": "true", "CURVECAST_WORKER_ENABLED": "false",
             "CURVECAST_HEADER_TIMEOUT_S": str(header_timeout_s),
             "CURVECAST_MAX_CONNECTIONS": str(MAX_CONNECTIONS)},
    )


@pytest.fixture(scope="module")
def served(sqlite_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = _serve(sqlite_url, tmp_path_factory.mktemp("limits"), HEADER_TIMEOUT_S)
    yield server
    server.stop()


def _connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return sock


def _head(server: ServerProcess, path: str = "/healthz", method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n".encode()


def _answer(sock: socket.socket, timeout: float = 30) -> bytes:
    """Everything the server sends until it closes the connection (a reset after an answer
    counts as the close)."""
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def _responses(sock: socket.socket, n: int) -> list[bytes]:
    """``n`` whole responses (head and ``Content-Length`` body) read from a connection kept
    open; pipelined answers may arrive in one read, so the bytes after one response are the
    start of the next. Fails if the server closes before all ``n`` came."""
    sock.settimeout(30)
    data, out = b"", []

    def more() -> None:
        nonlocal data
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection after {len(out)} of {n} responses"
        data += chunk

    while len(out) < n:
        while b"\r\n\r\n" not in data:
            more()
        head = data[:data.index(b"\r\n\r\n")]
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        end = len(head) + 4 + length
        while len(data) < end:
            more()
        out.append(data[:end])
        data = data[end:]
    return out


def _status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


def _send_until_answered(sock: socket.socket, chunks: Iterator[bytes]) -> int:
    """Send ``chunks`` until the server answers (or closes); returns the bytes sent."""
    sent = 0
    for chunk in chunks:
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            break
        try:
            sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += len(chunk)
    return sent


def _huge_header(total: int, piece: int = 64 * 1024) -> Iterator[bytes]:
    yield b"X-Big: "
    for _ in range(total // piece):
        yield b"a" * piece


def test_a_large_header_is_refused_with_431(served: ServerProcess) -> None:
    # A 200 KB header sent at once: the complete head is measured.
    with _connect(served) as sock:
        sock.sendall(_head(served) + b"X-Big: " + b"a" * 200_000 + b"\r\n\r\n")
        answer = _answer(sock)
    assert _status(answer) == 431, answer[:300]
    assert b"headers_too_large" in answer and b"32768 bytes" in answer
    # Just under the limit is served.
    with _connect(served) as sock:
        sock.sendall(_head(served) + b"X-Big: " + b"a" * 30_000 + b"\r\nConnection: close\r\n\r\n")
        assert _status(_answer(sock)) == 200


def test_an_endless_header_is_cut_off_early(served: ServerProcess) -> None:
    """A 100 MiB header value streamed: answered 431 after a few hundred KB at most, long
    before it ends (it was read whole, ~96 s and +800 MB, then answered 200)."""
    with _connect(served) as sock:
        sent = _send_until_answered(sock, iter([_head(served), *_huge_header(100 * MIB)]))
        answer = _answer(sock)
    assert _status(answer) == 431, answer[:300]
    assert sent < 4 * MIB, f"{sent} bytes were sent before the answer"


@pytest.mark.parametrize("lines", [101, 20_000])
def test_too_many_header_lines_are_refused(served: ServerProcess, lines: int) -> None:
    fields = b"".join(b"X-%d: 1\r\n" % i for i in range(lines))
    with _connect(served) as sock:
        _send_until_answered(sock, iter([_head(served) + fields + b"\r\n"]))
        answer = _answer(sock)
    assert _status(answer) == 431, answer[:300]
    assert b"more than 100 header lines" in answer


def test_a_hundred_header_lines_are_served(served: ServerProcess) -> None:
    fields = b"".join(b"X-%d: 1\r\n" % i for i in range(98)) + b"Connection: close\r\n"
    with _connect(served) as sock:
        sock.sendall(_head(served) + fields + b"\r\n")  # Host + 99 = 100 lines
        assert _status(_answer(sock)) == 200


def test_bodies_and_pipelined_requests_do_not_count_as_heads(served: ServerProcess,
                                                             sqlite_url: str) -> None:
    """Large bodies, and requests pipelined behind them in the same reads, are served: only
    a head's own bytes count against the head limit."""
    project = f"p-{uuid.uuid4().hex[:8]}"
    token = create_token(sqlite_url, project, "ingest")
    run = f"/api/v1/runs/{uuid.uuid4()}"
    auth = {"authorization": f"Bearer {token}"}
    httpx.put(served.url + run, json={"project": project}, headers=auth).raise_for_status()
    requests = b""
    for lo in (0, 20_000):
        steps = list(range(lo, lo + 20_000))
        body = json.dumps({"steps": steps, "values": {"loss": [1.0] * len(steps)}}).encode()
        assert len(body) > 200_000
        requests += (_head(served, run + "/metrics", "POST")
                     + f"Authorization: Bearer {token}\r\n".encode()
                     + b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        requests += _head(served) + b"\r\n"
    with _connect(served) as sock:
        sock.sendall(requests)
        answers = _responses(sock, 4)
    assert [_status(a) for a in answers] == [200, 200, 200, 200], [a[:100] for a in answers]
    assert httpx.get(served.url + run, headers=auth).json()["n_points"] == 40_000


def test_limits_hold_before_authentication(served: ServerProcess) -> None:
    """A write without a token and a huge head: 431, not 401 (the head was never parsed into
    a request)."""
    path = f"/api/v1/runs/{uuid.uuid4()}/metrics"
    with _connect(served) as sock:
        sock.sendall(_head(served, path, "POST") + b"X-Big: " + b"a" * 100_000 + b"\r\n"
                     b"Content-Length: 2\r\n\r\n{}")
        assert _status(_answer(sock)) == 431


def test_a_trickling_head_is_closed(sqlite_url: str, tmp_path: Path) -> None:
    """One header line every 0.2 s (slowloris): the server closes the connection about
    ``header_timeout_s`` (here 1 s) after it opened, however long the client keeps sending."""
    impatient = _serve(sqlite_url, tmp_path, header_timeout_s=1.0)
    try:
        _trickle_and_idle(impatient)
        # A client that is not slow is served as before.
        assert httpx.get(f"{impatient.url}/healthz").status_code == 200
    finally:
        impatient.stop()


def _trickle_and_idle(served: ServerProcess) -> None:
    with _connect(served) as sock:
        sock.sendall(_head(served))
        closed = False
        deadline = time.monotonic() + 30
        while not closed and time.monotonic() < deadline:
            readable, _, _ = select.select([sock], [], [], 0.2)
            if readable:
                closed = _answer(sock, timeout=5) == b""
                break
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        assert closed, "the server kept a trickling request head open for 30 s"
    # A connection that sends nothing at all is closed too.
    with _connect(served) as sock:
        assert _answer(sock) == b""
    # And so is a kept-alive one whose next head trickles in after a response.
    with _connect(served) as sock:
        sock.sendall(_head(served) + b"\r\n")
        assert _responses(sock, 1)[0].startswith(b"HTTP/1.1 200")
        sock.sendall(_head(served))
        for _ in range(150):  # 30 s of trickling, unless the server closes first
            readable, _, _ = select.select([sock], [], [], 0.2)
            if readable:
                break
            sock.sendall(b"X-Slow: 1\r\n")
        assert _answer(sock) == b""


def _open_on_port(server: ServerProcess) -> int:
    """Established connections the server process holds on its port."""
    return sum(1 for c in psutil.Process(server.proc.pid).net_connections("tcp")
               if c.laddr and c.laddr.port == server.port and c.status == psutil.CONN_ESTABLISHED)


def test_connections_are_capped_and_the_longest_waiting_go_first(served: ServerProcess) -> None:
    """Three times the cap of connections that never finish a head: the server holds at most
    the cap, the oldest are the ones closed, and a client arriving last is served."""
    slow = []
    try:
        for _ in range(3 * MAX_CONNECTIONS):
            sock = _connect(served)
            sock.sendall(_head(served))  # a head begun, never finished
            slow.append(sock)
        wait_for(lambda: _open_on_port(served) <= MAX_CONNECTIONS, 10, "the connection cap")
        # A new client is served although the cap is reached (it evicts the longest waiting).
        resp = httpx.get(f"{served.url}/healthz", timeout=10)
        assert resp.status_code == 200
        # The first connections are the ones that were closed.
        first = slow[0]
        first.settimeout(5)
        assert _answer(first) == b""
    finally:
        for sock in slow:
            sock.close()


def test_busy_connections_are_not_evicted_and_one_more_is_answered_503(
    served: ServerProcess, sqlite_url: str,
) -> None:
    """Connections in the middle of a request (a body still to come) are never closed to make
    room: beyond the cap, the newcomer is told 503 with Retry-After."""
    token = create_token(sqlite_url, f"p-{uuid.uuid4().hex[:8]}", "ingest")
    path = f"/api/v1/runs/{uuid.uuid4()}/metrics"
    busy = []
    try:
        for _ in range(MAX_CONNECTIONS):
            sock = _connect(served)
            sock.sendall(_head(served, path, "POST")
                         + f"Authorization: Bearer {token}\r\n".encode()
                         + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n")
            busy.append(sock)
        wait_for(lambda: _open_on_port(served) >= MAX_CONNECTIONS, 10, "the busy connections")
        with _connect(served) as extra:
            answer = _answer(extra)
        assert _status(answer) == 503, answer[:300]
        assert b"retry-after: 5" in answer.lower()
        # The busy ones are still open: finishing a body still gets an answer (the run does
        # not exist: 404, or 400 for the body).
        busy[0].sendall(b" " * 98 + b"{}")
        assert _status(_answer(busy[0])) in (400, 404, 422)
    finally:
        for sock in busy:
            sock.close()


def test_two_host_headers_are_refused(served: ServerProcess) -> None:
    """``evil.example`` first, the allowed name last: the edge read the last, Starlette the
    first, and the request was served (a public page: 200)."""
    for hosts in ([b"evil.example", b"127.0.0.1"], [b"127.0.0.1", b"127.0.0.1"]):
        head = b"GET /openapi.json HTTP/1.1\r\n" + b"".join(b"Host: %s\r\n" % h for h in hosts)
        with _connect(served) as sock:
            sock.sendall(head + b"Connection: close\r\n\r\n")
            answer = _answer(sock)
        assert _status(answer) == 400, answer[:300]
        assert b"one Host header" in answer


def test_header_floods_do_not_grow_the_server(served: ServerProcess) -> None:
    """Four sockets streaming 100 MiB headers at once: the server answers each 431 and its
    RSS stays flat (it grew by ~200 MB per socket)."""
    process = psutil.Process(served.proc.pid)
    before = process.memory_info().rss
    socks = [_connect(served) for _ in range(4)]
    try:
        streams = [iter([_head(served), *_huge_header(100 * MIB)]) for _ in socks]
        live = list(range(len(socks)))
        while live:
            for i in list(live):
                readable, _, _ = select.select([socks[i]], [], [], 0)
                chunk = next(streams[i], None)
                if readable or chunk is None:
                    live.remove(i)
                    continue
                try:
                    socks[i].sendall(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    live.remove(i)
        assert all(_status(_answer(s)) == 431 for s in socks)
    finally:
        for s in socks:
            s.close()
    assert httpx.get(f"{served.url}/healthz").status_code == 200
    grown = process.memory_info().rss - before
    assert grown < 30 * MIB, f"server RSS grew by {grown / MIB:.0f} MiB"


def test_the_limits_are_settings(tmp_path: Path) -> None:
    """Each limit is a setting with the default the docs give."""
    from curvecast.service.config import Settings
    from curvecast.service.http_guard import HeadLimits

    limits = HeadLimits.from_settings(Settings(database_url=f"sqlite:///{tmp_path}/x.db"))
    assert (limits.max_bytes, limits.max_fields, limits.timeout_s, limits.max_connections) == (
        32 * 1024, 100, 10.0, 1000)
