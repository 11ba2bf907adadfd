"""Forecast bookkeeping: which runs are due for a refit (leased so that several service
processes never fit the same run at once), the series a fit reads, and the fit history."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from curvecast.service.errors import RunNotFound
from curvecast.service.models import (
    FitRecord,
    MetricPoint,
    MetricRollup,
    Project,
    Run,
    RunWork,
    Series,
)
from curvecast.service.store._common import as_utc, write_connection
from curvecast.service.store.rollups import ROLLUP_WIDTHS, read_block_means

#: Series a forecast fits, in order of preference, unless the run's config names ``fit_key``.
#: Evaluation loss (measured at the averaged iterate x) is smoother than per-step training loss.
FIT_KEY_CANDIDATES = ("eval_loss", "val_loss", "eval/loss", "val/loss", "validation/loss", "loss")
#: Series spanning more steps than this are read as rollup block means (at least
#: ``MIN_FIT_BLOCKS`` of them), so a refit reads thousands of rows however long the run.
RAW_READ_LIMIT = 20_000
MIN_FIT_BLOCKS = 1_000


@dataclass(frozen=True)
class FitJob:
    """A run leased for refitting."""

    run_id: uuid.UUID
    run_n_points: int
    config: dict[str, Any]


@dataclass(frozen=True)
class FitInput:
    """What a refit needs: the chosen series and the previous fit of it (for a warm start)."""

    key: str
    steps: np.ndarray
    values: np.ndarray
    previous_fit: dict[str, Any] | None


@dataclass(frozen=True)
class StoredFit:
    """A fit from the history."""

    id: int
    run_id: uuid.UUID
    key: str
    status: str
    n_points: int
    fitted_upto_step: int | None
    fit: dict[str, Any]
    created_at: datetime


def claim_fit_jobs(
    session: Session,
    *,
    now: datetime,
    growth: float,
    max_age: timedelta,
    lease: timedelta,
    min_points: int,
    limit: int,
) -> list[FitJob]:
    """Lease up to ``limit`` runs that need a refit: at least ``growth`` more points than at the
    last fit, or any new points and a fit older than ``max_age``.

    ``FOR UPDATE SKIP LOCKED`` (PostgreSQL) lets concurrent workers pass over each other's
    candidates; the lease then keeps the run theirs while they fit outside the transaction, and
    expires on its own if a worker dies. On SQLite the write transaction serialises claims.
    """
    write_connection(session)
    stmt = (
        select(RunWork.run_id, Run.n_points, Run.config)
        .join(Run, Run.id == RunWork.run_id)
        .where(
            Run.n_points >= min_points,
            Run.n_points > RunWork.fit_n_points,
            or_(RunWork.fit_lease_until.is_(None), RunWork.fit_lease_until < now),
            or_(
                RunWork.fit_at.is_(None),
                Run.n_points >= RunWork.fit_n_points * (1.0 + growth),
                RunWork.fit_at < now - max_age,
            ),
        )
        .order_by(RunWork.fit_at.asc().nulls_first())
        .limit(limit)
        .with_for_update(of=RunWork, skip_locked=True)
    )
    jobs = [
        FitJob(run_id=r[0], run_n_points=r[1], config=dict(r[2])) for r in session.execute(stmt)
    ]
    if jobs:
        session.execute(
            update(RunWork)
            .where(RunWork.run_id.in_([j.run_id for j in jobs]))
            .values(fit_lease_until=now + lease),
            execution_options={"synchronize_session": False},
        )
    return jobs


#: An evaluation series is preferred once it has this many points; before, the training loss.
MIN_EVAL_POINTS = 8


def choose_fit_key(counts: dict[str, int], config: dict[str, Any]) -> str | None:
    """The series to fit: the config's ``fit_key`` if present, else the first candidate with
    enough points (the training loss ``loss`` needs no minimum: it is the fallback)."""
    wanted = config.get("fit_key")
    if isinstance(wanted, str) and wanted in counts:
        return wanted
    for key in FIT_KEY_CANDIDATES:
        if key in counts and (key == "loss" or counts[key] >= MIN_EVAL_POINTS):
            return key
    return next((k for k in FIT_KEY_CANDIDATES if k in counts), None)


def read_fit_input(session: Session, *, job: FitJob) -> FitInput | None:
    """The series to fit (raw, or bucket means for very long series) and the previous fit."""
    rows = session.execute(select(Series.key, Series.id).where(Series.run_id == job.run_id)).all()
    series_ids = {str(k): int(i) for k, i in rows}
    # Point counts from the coarsest rollup level: one small row per 524,288 steps.
    counts = {
        str(k): int(n)
        for k, n in session.execute(
            select(Series.key, func.sum(MetricRollup.n))
            .join(MetricRollup, MetricRollup.series_id == Series.id)
            .where(
                Series.run_id == job.run_id,
                Series.key.in_([*FIT_KEY_CANDIDATES, str(job.config.get("fit_key", ""))]),
                MetricRollup.level == len(ROLLUP_WIDTHS) - 1,
            )
            .group_by(Series.key)
        )
    }
    key = choose_fit_key(counts, job.config)
    if key is None:
        return None
    sid = series_ids[key]
    lo = session.scalar(
        select(MetricPoint.step)
        .where(MetricPoint.series_id == sid)
        .order_by(MetricPoint.step)
        .limit(1)
    )
    hi = session.scalar(
        select(MetricPoint.step)
        .where(MetricPoint.series_id == sid)
        .order_by(MetricPoint.step.desc())
        .limit(1)
    )
    if lo is None or hi is None:
        return None
    means = (
        read_block_means(session, sid, int(lo), int(hi), MIN_FIT_BLOCKS)
        if hi - lo + 1 > RAW_READ_LIMIT
        else None
    )
    if means is not None:
        steps, values = means
    else:
        points = session.execute(
            select(MetricPoint.step, MetricPoint.value)
            .where(MetricPoint.series_id == sid, MetricPoint.value.is_not(None))
            .order_by(MetricPoint.step)
        ).all()
        data = np.array(points, dtype=np.float64).reshape(-1, 2)
        steps, values = data[:, 0], data[:, 1]
    previous = session.scalar(
        select(FitRecord.fit)
        .where(FitRecord.run_id == job.run_id, FitRecord.key == key)
        .order_by(FitRecord.id.desc())
        .limit(1)
    )
    return FitInput(key=key, steps=steps, values=values, previous_fit=previous)


def save_fit(
    session: Session,
    *,
    job: FitJob,
    key: str,
    fit: dict[str, Any],
    now: datetime,
) -> None:
    """Store a fit in the history and release the run's lease."""
    write_connection(session)
    upto = fit.get("fitted_upto_step")
    session.add(
        FitRecord(
            run_id=job.run_id,
            key=key,
            status=str(fit["status"]),
            n_points=int(fit.get("n_points") or 0),
            run_n_points=job.run_n_points,
            fitted_upto_step=None if upto is None else int(upto),
            a=fit.get("a"),
            b=fit.get("b"),
            c=fit.get("c"),
            fit=fit,
            created_at=now,
        )
    )
    finish_fit_job(session, job=job, now=now)


def finish_fit_job(session: Session, *, job: FitJob, now: datetime) -> None:
    """Record that the run was handled at ``job.run_n_points`` and release its lease."""
    write_connection(session)
    session.execute(
        update(RunWork)
        .where(RunWork.run_id == job.run_id)
        .values(fit_n_points=job.run_n_points, fit_at=now, fit_lease_until=None),
        execution_options={"synchronize_session": False},
    )


def _visible_run(session: Session, run_id: uuid.UUID, allowed_project: str | None) -> Run:
    stmt = select(Run).where(Run.id == run_id)
    if allowed_project is not None:
        stmt = stmt.join(Project).where(Project.name == allowed_project)
    run = session.scalar(stmt)
    if run is None:
        raise RunNotFound(f"run {run_id} not found")
    return run


def _stored(record: FitRecord) -> StoredFit:
    return StoredFit(
        id=record.id,
        run_id=record.run_id,
        key=record.key,
        status=record.status,
        n_points=record.n_points,
        fitted_upto_step=record.fitted_upto_step,
        fit=dict(record.fit),
        created_at=as_utc(record.created_at),
    )


def latest_fit(
    session: Session, *, run_id: uuid.UUID, allowed_project: str | None
) -> tuple[StoredFit | None, dict[str, Any], int | None]:
    """The newest fit of a run (or None), the run's config and its last step."""
    run = _visible_run(session, run_id, allowed_project)
    record = session.scalar(
        select(FitRecord).where(FitRecord.run_id == run_id).order_by(FitRecord.id.desc()).limit(1)
    )
    return (_stored(record) if record else None), dict(run.config), run.last_step


def fit_history(
    session: Session, *, run_id: uuid.UUID, allowed_project: str | None, limit: int
) -> tuple[list[StoredFit], dict[str, Any]]:
    """Fits of a run, oldest first (at most ``limit``, the newest ones)."""
    run = _visible_run(session, run_id, allowed_project)
    records = session.scalars(
        select(FitRecord)
        .where(FitRecord.run_id == run_id)
        .order_by(FitRecord.id.desc())
        .limit(limit)
    ).all()
    return [_stored(r) for r in reversed(records)], dict(run.config)


def recent_step_rate(session: Session, *, run_id: uuid.UUID, key: str) -> float | None:
    """Steps per second over the last (up to) 200 points of ``key`` that carry a wall time."""
    rows = session.execute(
        select(MetricPoint.step, MetricPoint.wall_time)
        .join(Series, Series.id == MetricPoint.series_id)
        .where(Series.run_id == run_id, Series.key == key, MetricPoint.wall_time.is_not(None))
        .order_by(MetricPoint.step.desc())
        .limit(200)
    ).all()
    if len(rows) < 2:
        return None
    (last_step, last_wall), (first_step, first_wall) = rows[0], rows[-1]
    if last_wall is None or first_wall is None or last_wall <= first_wall:
        return None
    return float(last_step - first_step) / float(last_wall - first_wall)
