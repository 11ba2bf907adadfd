"""Worker task: deliver webhooks from the outbox. Safe to run in every service process at once:
deliveries are claimed with ``FOR UPDATE SKIP LOCKED`` and a lease, and each outcome is recorded
in its own transaction.
"""

from __future__ import annotations

import http.client
import logging
import random
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from curvecast.service import prometheus
from curvecast.service.alerting.targets import TargetNotAllowed, pick_address
from curvecast.service.alerting.webhook import signature_headers
from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.secrets import SecretUnavailable, box_for
from curvecast.service.store import webhooks as webhook_store
from curvecast.service.store._common import utcnow
from curvecast.service.store.webhooks import DeliveryJob

log = logging.getLogger(__name__)

#: Deliveries sent per round, and how many at once.
DELIVERY_BATCH = 16
SEND_THREADS = 4


@dataclass(frozen=True)
class SendResult:
    """Outcome of one HTTP attempt."""

    status_code: int | None
    error: str | None
    duration_ms: float

    @property
    def ok(self) -> bool:
        """A 2xx answer acknowledges the delivery."""
        return self.status_code is not None and 200 <= self.status_code < 300


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A webhook answer of 3xx is a failure, not a hint to POST elsewhere."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Deadline:
    """One attempt's total deadline: when it passes, a timer shuts down the attempt's socket,
    which ends whatever read or write is blocked on it.

    A socket timeout alone bounds each read, not the attempt: a receiver sending one header
    byte every few seconds held the delivery thread for minutes. ``shutdown`` (not ``close``)
    is what wakes a thread blocked in ``recv`` on Linux; the owner still closes the socket.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._ends = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._timer.cancel()

    def remaining(self) -> float:
        """Seconds left (never below a millisecond: a socket timeout of 0 means non-blocking)."""
        return max(0.001, self._ends - time.monotonic())

    def watch(self, sock: socket.socket) -> None:
        """Shut ``sock`` down at the deadline (at once if it has passed)."""
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shutdown(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    try:
        # The plain socket's method, also for a TLS socket: shut the descriptor down
        # without a TLS close_notify exchange that could itself block.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


def _resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (a literal address resolves to itself)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _guarded(
    base: type[http.client.HTTPConnection], deadline: _Deadline, allow_private: bool
) -> Any:
    """``base`` (HTTP or HTTPS connection) that connects only to an address webhooks may reach
    (:mod:`curvecast.service.alerting.targets`), to exactly the address it checked (the name is
    resolved once; ``Host`` and TLS's server name stay the URL's), waits at most the time left,
    and whose socket the deadline shuts down. (The socket is watched once connected: a TLS
    handshake is bounded by the per-read timeout, the rest of the attempt by the deadline.)"""

    class Connection(base):  # type: ignore[valid-type,misc]
        def connect(self) -> None:
            given = getattr(self, "timeout", None)  # may be socket's "default" sentinel
            per_read = float(given) if isinstance(given, int | float) else deadline.seconds
            self.timeout = min(per_read, deadline.remaining())
            checked = pick_address(
                _resolve(self.host, self.port), host=self.host, allow_private=allow_private
            )

            def create_connection(
                address: tuple[str, int], timeout: Any = None, source: Any = None
            ) -> socket.socket:
                return socket.create_connection((checked, address[1]), timeout, source)

            self._create_connection = create_connection
            super().connect()
            deadline.watch(self.sock)

    return Connection


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline, allow_private: bool) -> None:
        super().__init__()
        self._deadline = deadline
        self._allow_private = allow_private

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = _guarded(http.client.HTTPConnection, self._deadline, self._allow_private)
        return self.do_open(connection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline, allow_private: bool) -> None:
        super().__init__()
        self._deadline = deadline
        self._allow_private = allow_private

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = _guarded(http.client.HTTPSConnection, self._deadline, self._allow_private)
        return self.do_open(connection, req)


def _failure(exc: BaseException) -> str:
    """What a failed attempt records: a class of failure, never the socket error's text. The
    delivery log is readable with a read token; errno texts ("connection refused" against a
    silent drop) would tell which ports of a host are open."""
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, TargetNotAllowed):
        return f"target not allowed: {reason}"
    if isinstance(reason, socket.gaierror):
        return "name did not resolve"
    if isinstance(reason, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(reason, ssl.SSLError):
        return "TLS handshake or certificate failed"
    if isinstance(exc, http.client.HTTPException):
        return "invalid HTTP answer"
    return "connection failed"


def _deadline_error(timeout: float) -> str:
    return f"no complete answer within the attempt's deadline of {timeout:g} s"


def send_http(
    url: str, body: bytes, headers: dict[str, str], timeout: float, *, allow_private: bool = False
) -> SendResult:
    """POST ``body`` to ``url`` with the standard library (the service needs no HTTP client).

    ``timeout`` is the attempt's total deadline (connect, send, status line and headers), not
    a per-read timeout. The answer's status acknowledges the delivery: its body is read only
    while time is left, and never decides the outcome. Only addresses webhooks may reach are
    connected to (``allow_private``: any); proxies from the environment are not used (the
    address checked must be the one connected to).
    """
    started = time.monotonic()

    def took() -> float:
        return (time.monotonic() - started) * 1000

    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with _Deadline(timeout) as deadline:
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}),
            _NoRedirect,
            _HTTPHandler(deadline, allow_private),
            _HTTPSHandler(deadline, allow_private),
        )
        try:
            with opener.open(request, timeout=timeout) as response:
                code = int(response.status)
                if deadline.expired:
                    # Cut short mid-headers: http.client takes the shutdown's end of stream
                    # for the end of the headers, so this "answer" was never complete.
                    return SendResult(None, _deadline_error(timeout), took())
                try:
                    response.read(65_536)
                except (OSError, http.client.HTTPException):
                    pass  # the status line already answered
            return SendResult(code, None if 200 <= code < 300 else f"HTTP {code}", took())
        except urllib.error.HTTPError as exc:
            return SendResult(int(exc.code), f"HTTP {exc.code} {exc.reason}", took())
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
            if deadline.expired:
                return SendResult(None, _deadline_error(timeout), took())
            return SendResult(None, _failure(exc), took())


Sender = Callable[[str, bytes, dict[str, str], float], SendResult]


def backoff_s(attempts: int, settings: Settings, rng: Callable[[], float] = random.random
              ) -> float:
    """Delay before the next attempt after ``attempts`` failures: exponential from
    ``webhook_backoff_base_s``, capped at ``webhook_backoff_max_s``, with jitter (a uniform
    factor in [0.5, 1]) so that receivers coming back are not hit by every sender at once."""
    delay = min(settings.webhook_backoff_max_s,
                settings.webhook_backoff_base_s * 2.0 ** max(0, attempts - 1))
    return delay * (0.5 + 0.5 * rng())


def deliver_webhooks(factory: sessionmaker[Session], settings: Settings) -> int:
    """Send due deliveries from the outbox; returns how many were attempted."""
    return deliver_round(factory, settings)


def deliver_round(
    factory: sessionmaker[Session],
    settings: Settings,
    *,
    send: Sender | None = None,
    clock: Callable[[], datetime] = utcnow,
    wall: Callable[[], float] = time.time,
    rng: Callable[[], float] = random.random,
) -> int:
    """One round of delivery, with injectable transport, clocks and randomness (for tests).

    Leases are taken in one short transaction; the HTTP requests run outside any transaction
    (in a few threads, each attempt with a total deadline of ``webhook_timeout_s``, so a
    receiver that trickles its answer holds a thread no longer than that); each outcome is
    recorded in its own transaction as soon as it is known, and a delivery whose webhook was
    deleted meanwhile is dropped without affecting the others. A process killed mid-round
    leaves leased deliveries pending: the lease expires and another round (in any process)
    sends them again with the same delivery id.
    """
    now = clock()
    lease = timedelta(seconds=2 * settings.webhook_timeout_s + 30)
    with session_scope(factory) as session:
        jobs = webhook_store.claim_deliveries(session, now=now, lease=lease,
                                              limit=DELIVERY_BATCH)
    if not jobs:
        return 0

    sender = send or partial(send_http, allow_private=settings.webhook_allow_private)
    box = box_for(settings)

    def attempt(job: DeliveryJob) -> SendResult:
        try:
            secret = box.open(job.secret) if job.secret else None
            url = box.open(job.sealed_url) if job.sealed_url else job.url
        except SecretUnavailable as exc:
            # Never send unsigned what the receiver expects signed: a failed attempt, retried
            # (the operator may fix the key) until the delivery gives up.
            return SendResult(None, exc.message, 0.0)
        headers = signature_headers(secret, str(job.id), int(wall()), job.body)
        try:
            return sender(url, job.body, headers, settings.webhook_timeout_s)
        except Exception as exc:  # a transport bug must not lose the outcome
            log.exception("webhook delivery %s: the transport failed", job.id)
            return SendResult(None, f"internal error ({type(exc).__name__})", 0.0)

    def record(job: DeliveryJob, result: SendResult) -> None:
        # Any failure here is logged and leaves this delivery to its lease's expiry; it must
        # not keep the round's other outcomes from being recorded (they would be sent again).
        try:
            _record(factory, settings, job, result, clock(), rng)
        except Exception:
            log.exception("webhook delivery %s: could not record the attempt", job.id)

    if len(jobs) == 1:
        record(jobs[0], attempt(jobs[0]))
    else:
        # Each outcome is recorded as soon as it is known, not after the round's slowest.
        with ThreadPoolExecutor(max_workers=min(SEND_THREADS, len(jobs))) as pool:
            futures = {pool.submit(attempt, job): job for job in jobs}
            for future in as_completed(futures):
                record(futures[future], future.result())
    return len(jobs)


def _record(
    factory: sessionmaker[Session],
    settings: Settings,
    job: DeliveryJob,
    result: SendResult,
    at: datetime,
    rng: Callable[[], float],
) -> None:
    """Record one attempt's outcome in its own transaction, with the next attempt's time."""
    next_at: datetime | None = None
    if not result.ok:
        next_at = at + timedelta(seconds=backoff_s(job.attempts + 1, settings, rng))
        if (next_at - job.created_at).total_seconds() > settings.webhook_give_up_after_s:
            next_at = None
            log.warning("webhook delivery %s failed for good after %d attempts: %s",
                        job.id, job.attempts + 1, result.error)
    with session_scope(factory) as session:
        recorded = webhook_store.record_attempt(
            session, job=job, at=at, status_code=result.status_code, error=result.error,
            duration_ms=result.duration_ms, delivered=result.ok, next_attempt_at=next_at,
        )
    outcome = "delivered" if result.ok else ("retry" if next_at is not None else "failed")
    prometheus.WEBHOOK_DELIVERIES.labels(outcome).inc()
    if not recorded:
        log.info("webhook delivery %s: its webhook was deleted during the attempt; dropped",
                 job.id)
