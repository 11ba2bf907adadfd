"""Worker task: deliver webhooks from the outbox. Safe to run in every service process at once:
deliveries are claimed with ``FOR UPDATE SKIP LOCKED`` and a lease, and each outcome is recorded
in its own transaction.
"""

from __future__ import annotations

import logging
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.alerting.webhook import signature_headers
from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.store import webhooks as webhook_store
from curvecast.service.store._common import utcnow

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


_OPENER = urllib.request.build_opener(_NoRedirect)


def send_http(url: str, body: bytes, headers: dict[str, str], timeout: float) -> SendResult:
    """POST ``body`` to ``url`` with the standard library (the service needs no HTTP client)."""
    started = time.monotonic()
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            response.read(65_536)
            code = int(response.status)
        return SendResult(code, None if 200 <= code < 300 else f"HTTP {code}",
                          (time.monotonic() - started) * 1000)
    except urllib.error.HTTPError as exc:
        return SendResult(int(exc.code), f"HTTP {exc.code} {exc.reason}",
                          (time.monotonic() - started) * 1000)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return SendResult(None, f"{type(exc).__name__}: {reason}",
                          (time.monotonic() - started) * 1000)


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
    send: Sender = send_http,
    clock: Callable[[], datetime] = utcnow,
    wall: Callable[[], float] = time.time,
    rng: Callable[[], float] = random.random,
) -> int:
    """One round of delivery, with injectable transport, clocks and randomness (for tests).

    Leases are taken in one short transaction; the HTTP requests run outside any transaction
    (in a few threads, each with ``webhook_timeout_s``); each outcome is recorded in its own
    transaction. A process killed mid-round leaves leased deliveries pending: the lease expires
    and another round (in any process) sends them again with the same delivery id.
    """
    now = clock()
    lease = timedelta(seconds=2 * settings.webhook_timeout_s + 30)
    with session_scope(factory) as session:
        jobs = webhook_store.claim_deliveries(session, now=now, lease=lease,
                                              limit=DELIVERY_BATCH)
    if not jobs:
        return 0

    def attempt(job: webhook_store.DeliveryJob) -> SendResult:
        headers = signature_headers(job.secret, str(job.id), int(wall()), job.body)
        try:
            return send(job.url, job.body, headers, settings.webhook_timeout_s)
        except Exception as exc:  # a transport bug must not lose the outcome
            return SendResult(None, f"{type(exc).__name__}: {exc}", 0.0)

    if len(jobs) == 1:
        results = [attempt(jobs[0])]
    else:
        with ThreadPoolExecutor(max_workers=min(SEND_THREADS, len(jobs))) as pool:
            results = list(pool.map(attempt, jobs))
    for job, result in zip(jobs, results, strict=True):
        at = clock()
        next_at: datetime | None = None
        if not result.ok:
            next_at = at + timedelta(seconds=backoff_s(job.attempts + 1, settings, rng))
            if (next_at - job.created_at).total_seconds() > settings.webhook_give_up_after_s:
                next_at = None
                log.warning("webhook delivery %s failed for good after %d attempts: %s",
                            job.id, job.attempts + 1, result.error)
        with session_scope(factory) as session:
            webhook_store.record_attempt(
                session, job=job, at=at, status_code=result.status_code, error=result.error,
                duration_ms=result.duration_ms, delivered=result.ok, next_attempt_at=next_at,
            )
    return len(jobs)
