"""Worker task: evaluate alert rules on runs with new data. It has the worker's task signature
(``curvecast.service.worker.Task``) and is safe to run in every service process at once: work is
claimed with ``FOR UPDATE SKIP LOCKED`` and a lease.

Evaluation never runs in a request: ingest only wakes the worker (``Worker.notify``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from curvecast.contract import FINAL_RUN_STATUSES, ForecastStatus
from curvecast.service import prometheus
from curvecast.service.alerting.decisions import plan_alert_writes
from curvecast.service.alerting.engine import Transition, evaluate_round
from curvecast.service.alerting.rules import (
    RULES,
    EvalContext,
    RuleConfig,
    Series,
    first_present,
    rule_config,
)
from curvecast.service.alerting.rules.stalled import SILENCE_WATCHED
from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.schemas.alerts import EvalJob
from curvecast.service.store import alerts as alert_store
from curvecast.service.store import decisions as decision_store
from curvecast.service.store import webhooks as webhook_store
from curvecast.service.store._common import utcnow
from curvecast.service.store.forecasts import StoredFit
from curvecast.service.worker._windows import Points, SeriesWindows

log = logging.getLogger(__name__)

#: Runs evaluated per round (each in its own short transactions).
EVAL_BATCH = 8
#: A run that is far behind (a bulk upload, a long outage) is judged on its last this many
#: steps only: rules look at recent behaviour, and one round must stay short.
MAX_CATCHUP_STEPS = 50_000
#: What this process's rounds read of each series, so the next round reads only what is new.
WINDOWS = SeriesWindows()


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


def evaluate_alerts(factory: sessionmaker[Session], settings: Settings) -> int:
    """Evaluate every run with new points (a few per round); returns how many were handled."""
    now = utcnow()
    done = prometheus.observe_elapsed(prometheus.ALERT_ROUND_SECONDS)
    with session_scope(factory) as session:
        jobs = alert_store.claim_eval_jobs(
            session, now=now, lease=timedelta(seconds=settings.alert_eval_lease_s),
            limit=EVAL_BATCH, min_interval=_min_interval(settings),
        )
    for i, job in enumerate(jobs):
        try:
            evaluate_job(factory, settings, job)
        except OperationalError:
            # The database went away: every run of the round would fail the same way. Give
            # the leases back (if it answers) so the runs are evaluated as soon as it returns,
            # and let the worker loop say so once per outage instead of a traceback per run.
            _release(factory, jobs[i:])
            raise
        except Exception:
            # The lease is not released: it expires, which spaces out retries of a run whose
            # evaluation keeps failing instead of spinning on it.
            log.exception("alert evaluation of run %s failed", job.run_id)
            continue
        judged_new = (job.last_step if job.last_step is not None else -1) > (
            job.evaluated_step if job.evaluated_step is not None else -1)
        if judged_new and job.last_ingest_at is not None:
            # How long after the newest of the points judged arrived.
            lag = (utcnow() - job.last_ingest_at).total_seconds()
            prometheus.ALERT_LAG.observe(max(0.0, lag))
    if jobs:
        done()
    return len(jobs)


def _min_interval(settings: Settings) -> timedelta:
    """How long a run with new points may wait for its next round: the configured throttle,
    but never so long that a run which resumed sending and went quiet again within it is
    judged on its second silence only (a quarter of the stalled limit)."""
    return timedelta(seconds=min(settings.alert_eval_min_interval_s,
                                 settings.stalled_after_s / 4))


def _release(factory: sessionmaker[Session], jobs: Sequence[EvalJob]) -> None:
    """Best effort: give back the leases of ``jobs`` (nothing happens if the database is away;
    the leases then expire)."""
    try:
        with session_scope(factory) as session:
            for job in jobs:
                alert_store.release_eval_job(session, job=job)
    except OperationalError:
        pass


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
    factory: sessionmaker[Session], settings: Settings, job: EvalJob,
    *, now: datetime | None = None,
) -> bool:
    """Read what the rules need, evaluate them (pure), write the outcome. Returns whether the
    outcome was recorded (False: the lease was lost to another worker)."""
    now = now or utcnow()
    last_step = job.last_step if job.last_step is not None else -1
    after = job.evaluated_step if job.evaluated_step is not None else -1
    after = max(after, last_step - MAX_CATCHUP_STEPS)
    # A run that ended has its last points judged, then its open alerts close
    # (evaluate_round); claim_eval_jobs brings it here once more when it ends.
    ended = job.status in FINAL_RUN_STATUSES
    new_data = last_step > after or job.evaluated_step is None
    silent = (now - job.last_ingest_at).total_seconds() if job.last_ingest_at else None
    with session_scope(factory) as session:
        configs = _configs(alert_store.rule_overrides(session, project_id=job.project_id))
        fit = alert_store.latest_fit(session, run_id=job.run_id) if new_data else None
        # Asked only while a rule that waits on it is firing (a statement saved per round).
        acked = (alert_store.acknowledged_rules(session, run_id=job.run_id)
                 if _firing(job.state, "non_finite") else frozenset())
        best, pace = _competition(session, job, configs, fit) if new_data else (None, None)
        ctx = EvalContext(
            config=job.config, last_step=last_step, after_step=after, status=job.status,
            seconds_since_ingest=silent, stalled_after_s=settings.stalled_after_s,
            fit=fit.fit if fit else None, fit_key=fit.key if fit else None, acknowledged=acked,
            project_best=best, seconds_per_step=pace,
        )
        rules = tuple(RULES) if new_data else ("stalled",) if not ended else ()
        series = _read_series(session, job, ctx, configs, rules) if new_data else {}
    state, transitions = evaluate_round(series, ctx, configs, job.state, rules=rules)
    with session_scope(factory) as session:
        recorded = apply_evaluation(
            session, job=job, transitions=transitions, state=state,
            evaluated_step=last_step if new_data else job.evaluated_step,
            n_points=job.n_points, next_check_at=_next_check(job, configs, state, settings, now),
            now=now, public_url=settings.public_url,
        )
    if not recorded:
        log.info("alert evaluation of run %s: lease lost; another worker has it", job.run_id)
    return recorded


def _competition(session: Session, job: EvalJob, configs: dict[str, RuleConfig],
                 fit: StoredFit | None) -> tuple[tuple[float, str] | None, float | None]:
    """What the opt-in ``not_competitive`` rule needs besides the fit: the project's best
    finished loss on the fitted series (unless a target replaces it) and the run's pace. Read
    only while the rule is enabled and could judge (a running run with an ``ok`` fit)."""
    cfg = configs["not_competitive"]
    if (not cfg.enabled or job.status != "running" or fit is None
            or fit.fit.status != ForecastStatus.OK):
        return None, None
    best = None
    if cfg.params.get("target_loss") is None:
        best = decision_store.best_finished(session, project_id=job.project_id, key=fit.key,
                                            exclude=job.run_id)
    return best, decision_store.seconds_per_step(session, run_id=job.run_id)


def _firing(state: Mapping[str, Any], rule: str) -> bool:
    """Whether ``rule``'s alert is firing in a run's evaluation state."""
    return ((state.get(rule) or {}).get("lifecycle") or {}).get("state") == "firing"


def apply_evaluation(
    session: Session,
    *,
    job: EvalJob,
    transitions: Sequence[Transition],
    state: Mapping[str, Any],
    evaluated_step: int | None,
    n_points: int,
    next_check_at: datetime | None,
    now: datetime,
    public_url: str,
) -> bool:
    """Record one evaluation in one transaction: the run's evaluation state moves on, and the
    alert rows and outbox rows the transitions call for are written (decided by
    :func:`~curvecast.service.alerting.decisions.plan_alert_writes`).

    Returns:
        False if the lease was lost (another worker took the run over); nothing is written.
    """
    if not alert_store.finish_evaluation(
        session, job=job, state=state, evaluated_step=evaluated_step, n_points=n_points,
        next_check_at=next_check_at, now=now,
    ):
        return False
    current = alert_store.open_alerts(session, run_id=job.run_id)
    # Webhooks matter only when something changed (a round without transitions is the norm).
    hooks = (
        webhook_store.enabled_webhooks(session, project_id=job.project_id) if transitions else []
    )
    writes = plan_alert_writes(
        job, transitions, current, hooks, state=state, now=now, public_url=public_url
    )
    alert_store.write_alerts(session, job=job, writes=writes, now=now)
    return True


def _read_series(
    session: Session, job: EvalJob, ctx: EvalContext,
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
    fresh = job.evaluated_step is None  # a new evaluation state: read everything again

    def read(ranges: dict[int, tuple[int, int]]) -> dict[int, Points]:
        return alert_store.read_points_many(session, ranges=ranges)

    points = WINDOWS.points_many(job.run_id, {ids[key]: lo for key, lo in need.items()},
                                 ctx.last_step, read, fresh=fresh)
    return {key: Series(*points[ids[key]]) for key in need}


def _next_check(
    job: EvalJob, configs: dict[str, RuleConfig], state: dict[str, Any],
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
    if job.status not in SILENCE_WATCHED or job.last_ingest_at is None:
        return None
    due = job.last_ingest_at + timedelta(seconds=float(after_s))
    # A hair past the limit, so the check sees the run as silent for longer than after_s.
    return max(due, now) + timedelta(seconds=0.5)
