"""Forecast bookkeeping: which runs are due for a refit (leased so that several service
processes never fit the same run at once), the series a fit reads, and the fit history.

A stored fit is parsed into a :class:`~curvecast.service.forecast.fit.Fit` here, once, and
handed out as such: nothing past the store sees the JSON.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from curvecast.contract import RunConfig, fit_candidates, fit_key
from curvecast.service.errors import RunNotFound
from curvecast.service.forecast.fit import Fit, FloatArray
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
from curvecast.service.store._leases import claim_leases
from curvecast.service.store.rollups import ROLLUP_WIDTHS, read_block_means

#: Series spanning more steps than this are read as rollup block means (at least
#: ``MIN_FIT_BLOCKS`` of them), so a refit reads thousands of rows however long the run.
RAW_READ_LIMIT = 20_000
MIN_FIT_BLOCKS = 1_000


@dataclass(frozen=True)
class FitJob:
    """A run leased for refitting."""

    run_id: uuid.UUID
    run_n_points: int
    config: RunConfig


@dataclass(frozen=True)
class FitInput:
    """What a refit needs: the chosen series and the previous fit of it (for a warm start)."""

    key: str
    steps: FloatArray
    values: FloatArray
    previous_fit: Fit | None


@dataclass(frozen=True)
class StoredFit:
    """A fit from the history: which series it fitted, the fit, and when it was made."""

    id: int
    run_id: uuid.UUID
    key: str
    fit: Fit
    created_at: datetime


@dataclass(frozen=True)
class RunForecastContext:
    """What answering for a run needs besides its fits: its config and last logged step."""

    config: RunConfig
    last_step: int | None


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
    last fit, or any new points and a fit older than ``max_age`` (see
    :func:`~curvecast.service.store._leases.claim_leases` for how the lease works)."""
    candidates = (
        select(RunWork.run_id, Run.n_points, Run.config)
        .join(Run, Run.id == RunWork.run_id)
        .where(
            Run.n_points >= min_points,
            Run.n_points > RunWork.fit_n_points,
            or_(
                RunWork.fit_at.is_(None),
                Run.n_points >= RunWork.fit_n_points * (1.0 + growth),
                RunWork.fit_at < now - max_age,
            ),
        )
        .order_by(RunWork.fit_at.asc().nulls_first())
    )
    claim = claim_leases(
        session,
        candidates,
        key=RunWork.run_id,
        lease_until=RunWork.fit_lease_until,
        now=now,
        lease=lease,
        limit=limit,
    )
    return [
        FitJob(run_id=r[0], run_n_points=r[1], config=RunConfig.read(r[2])) for r in claim.rows
    ]


def read_fit_input(session: Session, *, job: FitJob) -> FitInput | None:
    """The series to fit (raw, or bucket means for very long series) and the previous fit."""
    rows = session.execute(select(Series.key, Series.id).where(Series.run_id == job.run_id)).all()
    series_ids = {str(k): int(i) for k, i in rows}
    wanted = fit_candidates(job.config)
    # Point counts from the coarsest rollup level: one small row per 524,288 steps.
    counts = {
        str(k): int(n)
        for k, n in session.execute(
            select(Series.key, func.sum(MetricRollup.n))
            .join(MetricRollup, MetricRollup.series_id == Series.id)
            .where(
                Series.run_id == job.run_id,
                Series.key.in_(wanted),
                MetricRollup.level == len(ROLLUP_WIDTHS) - 1,
            )
            .group_by(Series.key)
        )
    }
    key = fit_key(counts, job.config)
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
    return FitInput(
        key=key,
        steps=steps,
        values=values,
        previous_fit=Fit.from_dict(previous) if previous is not None else None,
    )


def save_fit(
    session: Session,
    *,
    job: FitJob,
    key: str,
    fit: Fit,
    now: datetime,
) -> None:
    """Store a fit in the history (as ``fit.to_dict()``) and release the run's lease."""
    write_connection(session)
    upto = fit.fitted_upto_step
    session.add(
        FitRecord(
            run_id=job.run_id,
            key=key,
            status=fit.status,
            n_points=fit.n_points,
            run_n_points=job.run_n_points,
            fitted_upto_step=None if upto is None else int(upto),
            fit=fit.to_dict(),
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


def stored_fit(record: FitRecord) -> StoredFit:
    """A fit row as the rest of curvecast sees it: its JSON parsed, once, into a ``Fit``."""
    return StoredFit(
        id=record.id,
        run_id=record.run_id,
        key=record.key,
        fit=Fit.from_dict(record.fit),
        created_at=as_utc(record.created_at),
    )


def _context(run: Run) -> RunForecastContext:
    return RunForecastContext(config=RunConfig.read(run.config), last_step=run.last_step)


def latest_fit(
    session: Session, *, run_id: uuid.UUID, allowed_project: str | None
) -> tuple[StoredFit | None, RunForecastContext]:
    """The newest fit of a run (or None), with the run's config and last step."""
    run = _visible_run(session, run_id, allowed_project)
    record = session.scalar(
        select(FitRecord).where(FitRecord.run_id == run_id).order_by(FitRecord.id.desc()).limit(1)
    )
    return (stored_fit(record) if record else None), _context(run)


def fit_history(
    session: Session, *, run_id: uuid.UUID, allowed_project: str | None, limit: int
) -> tuple[list[StoredFit], RunForecastContext]:
    """Fits of a run, oldest first (at most ``limit``, the newest ones), with the run's config
    and last step."""
    run = _visible_run(session, run_id, allowed_project)
    records = session.scalars(
        select(FitRecord)
        .where(FitRecord.run_id == run_id)
        .order_by(FitRecord.id.desc())
        .limit(limit)
    ).all()
    return [stored_fit(r) for r in reversed(records)], _context(run)


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
