"""Refit bookkeeping, the worker's side of forecasts: which runs are due for a refit (leased
so that several service processes never fit the same run at once), the series a refit reads,
and storing the fits it makes.

A stored fit's JSON is parsed into a :class:`~curvecast.service.forecast.fit.Fit` once per
process (:mod:`._parsed_fits`): a refit compares its new fit with the previous one without the
JSON. The reads that answer forecast requests are :mod:`.forecasts`'.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from sqlalchemy import bindparam, func, or_, select, text, update
from sqlalchemy.orm import Session

from curvecast.contract import (
    TRAIN_LOSS_KEY,
    RunConfig,
    fit_candidates,
    fit_key,
    fit_ready,
    lr_key,
)
from curvecast.service.forecast.binning import DEFAULT_MAX_BINS
from curvecast.service.forecast.curve import DIVERGED_MIN_POINTS, FloatArray, ends_diverged
from curvecast.service.forecast.fit import Fit
from curvecast.service.models import (
    FitRecord,
    MetricPoint,
    MetricRollup,
    Run,
    RunWork,
    Series,
)
from curvecast.service.store._common import (
    as_utc,
    is_postgres,
    keep_run,
    series_points,
    write_connection,
)
from curvecast.service.store._held_points import held_points
from curvecast.service.store._leases import claim_leases
from curvecast.service.store._parsed_fits import parsed_fits
from curvecast.service.store.rollups import ROLLUP_WIDTHS, read_block_means

__all__ = [
    "LR_MIN_BLOCKS",
    "LR_RAW_READ_LIMIT",
    "MIN_FIT_BLOCKS",
    "RAW_READ_LIMIT",
    "FitInput",
    "FitJob",
    "claim_fit_jobs",
    "finish_fit_job",
    "read_fit_inputs",
    "recent_step_rate",
    "save_fits",
]

#: Series spanning more steps than this are read as rollup block means (at least
#: ``MIN_FIT_BLOCKS`` of them, at most 8x that: the levels are 8x apart), so a refit reads
#: hundreds to a few thousand rows however long the run. The fit bins its input to
#: ``DEFAULT_MAX_BINS`` anyway: reading more blocks than that only costs time.
RAW_READ_LIMIT = 20_000
MIN_FIT_BLOCKS = DEFAULT_MAX_BINS
#: The logged learning rate only has to show whether it left its peak: a coarse read will do.
LR_RAW_READ_LIMIT = 2_000
LR_MIN_BLOCKS = 100

# The statements a refit sends for every run, built once: building a SELECT and computing its
# cache key cost more CPU than SQLite's execution of it, and the worker refits every growing
# run every few seconds. Their values are bound parameters.

#: Every series of a run, with the run's creation time.
_RUN_SERIES = (
    select(Series.key, Series.id, Run.created_at)
    .join(Run, Run.id == Series.run_id)
    .where(Series.run_id == bindparam("run_id"))
)
#: Point counts of a run's series named in ``keys``, from the coarsest rollup level (one small
#: row per 524,288 steps).
_SERIES_COUNTS = (
    select(Series.key, func.sum(MetricRollup.n))
    .join(MetricRollup, MetricRollup.series_id == Series.id)
    .where(
        Series.run_id == bindparam("run_id"),
        Series.key.in_(bindparam("keys", expanding=True)),
        MetricRollup.level == len(ROLLUP_WIDTHS) - 1,
    )
    .group_by(Series.key)
)
#: The id and time of the newest fit of one series of a run.
_PREVIOUS_FIT = (
    select(FitRecord.id, FitRecord.created_at)
    .where(FitRecord.run_id == bindparam("run_id"), FitRecord.key == bindparam("key"))
    .order_by(FitRecord.id.desc())
    .limit(1)
)
#: A series' latest values (NULL: a NaN), to tell a run that diverged.
_LATEST_VALUES = (
    select(MetricPoint.value)
    .where(MetricPoint.series_id == bindparam("sid"))
    .order_by(MetricPoint.step.desc())
    .limit(DIVERGED_MIN_POINTS)
)
#: A refit's bookkeeping: the run was handled at ``n`` points; its lease is given back.
_FINISH_FIT_JOB = (
    update(RunWork)
    .where(RunWork.run_id == bindparam("b_run_id"))
    .values(fit_n_points=bindparam("b_n"), fit_at=bindparam("b_at"), fit_lease_until=None)
)
#: The newest 200 points of a series, newest first (steps and wall times).
_NEWEST_WALL_TIMES = (
    select(MetricPoint.step, MetricPoint.wall_time)
    .where(MetricPoint.series_id == bindparam("sid"))
    .order_by(MetricPoint.step.desc())
    .limit(200)
)


@dataclass(frozen=True)
class FitJob:
    """A run leased for refitting."""

    run_id: uuid.UUID
    run_n_points: int
    config: RunConfig
    #: When the run's newest points arrived (the refit's lag is measured from it).
    last_ingest_at: datetime | None = None


@dataclass(frozen=True)
class FitInput:
    """What a refit of one series needs: its points and its previous fit (a refit whose status,
    points and range equal it is not stored again).

    ``is_default``: the series is the run's default (the contract's ``fit_key``);
    ``steps_per_second``: the run's recent step rate (stored with the fit, for target ETAs);
    ``lr``: the learning rate the optimizer logged, ``(steps, values)``, if any (a decaying
    one makes the fit ``off_model``); ``ends_non_finite``: the series' latest
    ``DIVERGED_MIN_POINTS`` points are NaN or infinite (the fit is then ``diverged``: the points
    read for it are the finite ones).
    """

    key: str
    steps: FloatArray
    values: FloatArray
    previous_fit: Fit | None
    is_default: bool = True
    steps_per_second: float | None = None
    lr: tuple[FloatArray, FloatArray] | None = None
    ends_non_finite: bool = False  #: its latest points are NaN or infinite (not in ``values``)


def claim_fit_jobs(
    session: Session,
    *,
    now: datetime,
    growth: float,
    max_age: timedelta,
    lease: timedelta,
    min_points: int,
    limit: int,
    min_interval: timedelta = timedelta(0),
) -> list[FitJob]:
    """Lease up to ``limit`` runs that need a refit: at least ``growth`` more points than at the
    last fit, or any new points and a fit older than ``max_age`` or a run that has ended (its
    last fit is the one its pages show from then on: it should hold every point, not wait for
    ``max_age``); never within ``min_interval`` of the last fit (see
    :func:`~curvecast.service.store._leases.claim_leases` for how the lease works)."""
    candidates = (
        select(RunWork.run_id, Run.n_points, Run.config, Run.last_ingest_at)
        .join(Run, Run.id == RunWork.run_id)
        .where(
            Run.n_points >= min_points,
            Run.n_points > RunWork.fit_n_points,
            or_(
                RunWork.fit_at.is_(None),
                Run.n_points >= RunWork.fit_n_points * (1.0 + growth),
                RunWork.fit_at < now - max_age,
                Run.ended_at.is_not(None),
            ),
            or_(RunWork.fit_at.is_(None), RunWork.fit_at <= now - min_interval),
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
        FitJob(run_id=r[0], run_n_points=r[1], config=RunConfig.read(r[2]),
               last_ingest_at=as_utc(r[3]) if r[3] is not None else None)
        for r in claim.rows
    ]


def read_fit_inputs(session: Session, *, job: FitJob) -> list[FitInput]:
    """The loss series to fit, the default one (the contract's ``fit_key``) first.

    Every loss-like series with enough points is fitted (an evaluation loss and the training
    loss, typically), so ``?key=`` answers for each; raw points, or bucket means for very long
    series. Empty when the run has no loss-like series yet.
    """
    # With the run's creation time: the raw points held of its series (held_points) belong to
    # this incarnation of the run, not to a deleted one of the same id (SQLite may even give
    # the new series the old ids).
    rows = session.execute(_RUN_SERIES, {"run_id": job.run_id}).all()
    series_ids = {str(k): int(i) for k, i, _ in rows}
    run = (job.run_id, rows[0][2] if rows else None)
    wanted = fit_candidates(job.config)
    counts = {
        str(k): int(n)
        for k, n in session.execute(_SERIES_COUNTS, {"run_id": job.run_id, "keys": list(wanted)})
    }
    default = fit_key(counts, job.config)
    if default is None:
        return []
    # The other series the contract would accept: the ones fit_key picks among.
    ready = fit_ready(counts)
    others = [k for k in wanted if k != default and k in ready]
    # The training loss is logged every step with its wall time: the best clock; the fitted
    # series (an evaluation loss) is the fallback.
    rate = None
    for key in dict.fromkeys((TRAIN_LOSS_KEY, default)):
        if key in series_ids:
            rate = recent_step_rate(session, series_id=series_ids[key])
            if rate is not None:
                break
    lr_series = lr_key(series_ids)
    lr = (None if lr_series is None else
          _read_points(session, series_ids[lr_series], LR_RAW_READ_LIMIT, LR_MIN_BLOCKS))
    inputs = [
        _read_one(session, job, run, key, series_ids[key], is_default=key == default, rate=rate,
                  lr=lr)
        for key in (default, *others)
    ]
    return [one for one in inputs if one is not None]


def _bounds(session: Session, sid: int) -> tuple[int, int] | None:
    """A series' first and last step (None without points); one statement, which PostgreSQL
    and SQLite answer from the primary key's index."""
    lo, hi = session.execute(
        select(func.min(MetricPoint.step), func.max(MetricPoint.step))
        .where(MetricPoint.series_id == sid)
    ).one()
    return None if lo is None or hi is None else (int(lo), int(hi))


def _read_points(session: Session, sid: int, raw_limit: int, min_blocks: int, *,
                 held: Hashable | None = None) -> tuple[FloatArray, FloatArray] | None:
    """A series' points: raw when it spans at most ``raw_limit`` steps, else rollup block means
    (at least ``min_blocks`` of them), so the read costs the same however long the run.
    ``None`` when the series has no points.

    With ``held`` (the run's id and creation time: see ``_held_points``) the raw points stay
    held in this process, so the next read asks only for the steps after them.
    """
    raw = held_points.update(session, held, sid)[0] if held is not None else None
    if raw is None or raw[0][-1] - raw[0][0] + 1 > raw_limit:
        bounds = _bounds(session, sid)
        if bounds is None:
            return None
        lo, hi = bounds
        if hi - lo + 1 > raw_limit:
            means = read_block_means(session, sid, lo, hi, min_blocks)
            if means is not None:  # too long to read raw: nothing is held
                return means
        raw = series_points(session, series_id=sid)
        if not raw[0].size:
            return None
    if held is not None:
        held_points.keep(session, held, sid, raw)
    steps, values = raw
    logged = ~np.isnan(values)  # a NaN was logged as such (stored NULL): not a point to fit
    return steps[logged].astype(np.float64), values[logged]


def _read_one(session: Session, job: FitJob, run: Hashable, key: str, sid: int, *,
              is_default: bool, rate: float | None, lr: tuple[FloatArray, FloatArray] | None
              ) -> FitInput | None:
    points = _read_points(session, sid, RAW_READ_LIMIT, MIN_FIT_BLOCKS, held=run)
    if points is None:
        return None
    steps, values = points
    # The previous fit's id and time only: its parsed JSON is usually in parsed_fits already
    # (this process stored it, or read it for a request or an alert round).
    previous = session.execute(_PREVIOUS_FIT, {"run_id": job.run_id, "key": key}).first()
    previous_fit = (
        None if previous is None
        else parsed_fits.get_many(
            session, [(previous.id, job.run_id, as_utc(previous.created_at))]
        ).get(previous.id)
    )
    latest = session.execute(_LATEST_VALUES, {"sid": sid}).scalars().all()
    return FitInput(
        key=key,
        steps=steps,
        values=values,
        previous_fit=previous_fit,
        is_default=is_default,
        steps_per_second=rate,
        lr=lr,
        ends_non_finite=ends_diverged(latest),
    )


def save_fits(
    session: Session,
    *,
    job: FitJob,
    fits: list[tuple[FitInput, Fit]],
    now: datetime,
) -> None:
    """Store each new fit in the history (as ``fit.to_dict()``) and release the run's lease.

    A fit that says nothing new (the same status, points and last step as the previous fit of
    its series: the run grew in other series) is not stored, so the history has one row per
    fit. Nothing is stored for a run deleted since its points were read.
    """
    write_connection(session)
    if not keep_run(session, job.run_id):
        return
    if is_postgres(session):
        # A fit is derived data: if a crash loses the last few hundred ms of these commits,
        # the fit row and the run's bookkeeping are lost together and the run is refitted. Not
        # waiting for the WAL flush shortens the store's part of a refit (BENCHMARKS.md,
        # "Forecast query latency and refit time, postgres").
        session.execute(text("SET LOCAL synchronous_commit TO OFF"))
    records = []
    for fit_input, fit in fits:
        upto = fit.fitted_upto_step
        previous = fit_input.previous_fit
        if (previous is not None and previous.status == fit.status
                and previous.n_points == fit.n_points
                and previous.fitted_upto_step == fit.fitted_upto_step):
            continue
        record = FitRecord(
            run_id=job.run_id,
            key=fit_input.key,
            status=str(fit.status),
            n_points=fit.n_points,
            run_n_points=job.run_n_points,
            fitted_upto_step=None if upto is None else int(upto),
            fit=fit.to_dict(),
            created_at=now,
            is_default=fit_input.is_default,
            steps_per_second=fit_input.steps_per_second,
        )
        session.add(record)
        records.append(record)
    finish_fit_job(session, job=job, now=now)
    if records:
        # The ids, then the parsed fits into the cache once the transaction commits: this
        # process's alert round and the next refit read them without the JSON.
        session.flush()
        parsed_fits.remember_on_commit(session, records)


def finish_fit_job(session: Session, *, job: FitJob, now: datetime) -> None:
    """Record that the run was handled at ``job.run_n_points`` and release its lease."""
    write_connection(session)
    session.execute(
        _FINISH_FIT_JOB, {"b_run_id": job.run_id, "b_n": job.run_n_points, "b_at": now},
        execution_options={"synchronize_session": False},
    )


def recent_step_rate(session: Session, *, series_id: int) -> float | None:
    """Steps per second over the last (up to) 200 points of a series, from their wall times.

    The newest 200 points whatever their wall time (a range scan of the series' primary key),
    then those that carry one: filtering on ``wall_time`` in SQL would scan the whole series of a
    run that logs none.
    """
    rows = [
        (step, wall)
        for step, wall in session.execute(_NEWEST_WALL_TIMES, {"sid": series_id}).all()
        if wall is not None
    ]
    if len(rows) < 2:
        return None
    (last_step, last_wall), (first_step, first_wall) = rows[0], rows[-1]
    if last_wall <= first_wall:
        return None
    return float(last_step - first_step) / float(last_wall - first_wall)
