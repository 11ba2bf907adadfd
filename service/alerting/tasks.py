"""Worker tasks: evaluate alert rules on runs with new data, and deliver webhooks from the
outbox. Both have the worker's task signature (``service.worker.Task``) and are safe to run in
every service process at once: work is claimed with ``FOR UPDATE SKIP LOCKED`` and a lease.

Evaluation never runs in a request: ingest only wakes the worker (``Worker.notify``).
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

from curvecast.service.alerting.engine import evaluate_round
from curvecast.service.alerting.rules import (
    RULES,
    EvalContext,
    RuleConfig,
    Series,
    first_present,
    rule_config,
)
from curvecast.service.alerting.webhook import signature_headers
from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.store import alerts as alert_store
from curvecast.service.store import webhooks as webhook_store
from curvecast.service.store._common import utcnow

log = logging.getLogger(__name__)

#: Runs evaluated per round (each in its own short transactions).
EVAL_BATCH = 8
#: A run that is far behind (a bulk upload, a long outage) is judged on its last this many
#: steps only: rules look at recent behaviour, and one round must stay short.
MAX_CATCHUP_STEPS = 50_000
#: Deliveries sent per round, and how many at once.
DELIVERY_BATCH = 16
SEND_THREADS = 4


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


def evaluate_alerts(factory: sessionmaker[Session], settings: Settings) -> int:
    """Evaluate every run with new points (a few per round); returns how many were handled."""
    now = utcnow()
    with session_scope(factory) as session:
        jobs = alert_store.claim_eval_jobs(
            session, now=now, lease=timedelta(seconds=settings.alert_eval_lease_s),
            limit=EVAL_BATCH,
        )
    for job in jobs:
        try:
            evaluate_job(factory, settings, job)
        except Exception:
            # The lease is not released: it expires, which spaces out retries of a run whose
            # evaluation keeps failing instead of spinning on it.
            log.exception("alert evaluation of run %s failed", job.run_id)
    return len(jobs)


def _configs(overrides: dict[str, dict[str, Any]]) -> dict[str, RuleConfig]:
    out = {}
    for name in RULES:
        try:
            out[name] = rule_config(name, overrides.get(name))
        except ValueError as exc:  # stored before a rule changed: defaults, and say so
            log.warning("ignoring stored override of rule %s: %s", name, exc)
            out[name] = rule_config(name)
    return out


def evaluate_job(
    factory: sessionmaker[Session], settings: Settings, job: alert_store.EvalJob,
    *, now: datetime | None = None,
) -> bool:
    """Read what the rules need, evaluate them (pure), write the outcome. Returns whether the
    outcome was recorded (False: the lease was lost to another worker)."""
    now = now or utcnow()
    last_step = job.last_step if job.last_step is not None else -1
    after = job.evaluated_step if job.evaluated_step is not None else -1
    after = max(after, last_step - MAX_CATCHUP_STEPS)
    new_data = last_step > after or job.evaluated_step is None
    silent = (now - job.last_ingest_at).total_seconds() if job.last_ingest_at else None
    with session_scope(factory) as session:
        configs = _configs(alert_store.rule_overrides(session, project_id=job.project_id))
        fit = alert_store.latest_fit(session, run_id=job.run_id) if new_data else None
        ctx = EvalContext(
            config=job.config, last_step=last_step, after_step=after, status=job.status,
            seconds_since_ingest=silent, stalled_after_s=settings.stalled_after_s,
            fit=fit[0] if fit else None, fit_key=fit[1] if fit else None,
        )
        rules = tuple(RULES) if new_data else ("stalled",)
        series = _read_series(session, job, ctx, configs, rules) if new_data else {}
    state, transitions = evaluate_round(series, ctx, configs, job.state, rules=rules)
    with session_scope(factory) as session:
        recorded = alert_store.apply_evaluation(
            session, job=job, transitions=transitions, state=state,
            evaluated_step=last_step if new_data else job.evaluated_step,
            n_points=job.n_points, next_check_at=_next_check(job, configs, state, settings, now),
            now=now, public_url=settings.public_url,
        )
    if not recorded:
        log.info("alert evaluation of run %s: lease lost; another worker has it", job.run_id)
    return recorded


def _read_series(
    session: Session, job: alert_store.EvalJob, ctx: EvalContext,
    configs: dict[str, RuleConfig], rules: tuple[str, ...],
) -> dict[str, Series]:
    """The points each enabled rule needs: its keys, from its lookback to the last step."""
    ids = alert_store.run_series_ids(session, run_id=job.run_id)
    need: dict[str, int] = {}
    for name in rules:
        cfg = configs[name]
        if not cfg.enabled:
            continue
        spec = RULES[name]
        memory = (job.state.get(name) or {}).get("memory") or {}
        lo = spec.lookback(ctx, cfg, memory)
        keys: list[str] = []
        for candidates in spec.inputs(cfg):
            key = first_present(ids, candidates)
            if key is not None:
                keys.append(key)
        if name == "off_curve" and ctx.fit_key in ids:
            keys.append(str(ctx.fit_key))
        for key in keys:
            need[key] = min(need.get(key, lo), lo)
    return {
        key: alert_store.read_points(session, series_id=ids[key], lo=lo, hi=ctx.last_step)
        for key, lo in need.items()
    }


def _next_check(
    job: alert_store.EvalJob, configs: dict[str, RuleConfig], state: dict[str, Any],
    settings: Settings, now: datetime,
) -> datetime | None:
    """When to look at the run again without new data: when it would count as stalled, and
    periodically while a stalled alert is open (so that a run marked finished resolves it)."""
    cfg = configs["stalled"]
    if not cfg.enabled:
        return None
    after_s = cfg.params.get("after_s") or settings.stalled_after_s
    period = timedelta(seconds=max(float(after_s), 30.0))
    open_stall = ((state.get("stalled") or {}).get("lifecycle") or {}).get("state") in (
        "pending", "firing")
    if open_stall:
        return now + period
    if job.status != "running" or job.last_ingest_at is None:
        return None
    due = job.last_ingest_at + timedelta(seconds=float(after_s))
    # A hair past the limit, so the check sees the run as silent for longer than after_s.
    return max(due, now) + timedelta(seconds=0.5)


# ---------------------------------------------------------------------------------------------
# Delivery
# ---------------------------------------------------------------------------------------------


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


__all__ = [
    "SendResult",
    "backoff_s",
    "deliver_round",
    "deliver_webhooks",
    "evaluate_alerts",
    "evaluate_job",
    "send_http",
]
