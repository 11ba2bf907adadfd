"""Forecast bookkeeping: which runs are due for a refit (leased so that several service
processes never fit the same run at once), the series a fit reads, and the fit history.

A stored fit is parsed into a :class:`~curvecast.service.forecast.fit.Fit` here, once, and
handed out as such: nothing past the store sees the JSON.
"""

from __future__ import annotations

import functools
import math
import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Select, bindparam, event, func, literal, or_, select, text, update
from sqlalchemy.orm import Session

from curvecast.contract import (
    ENDED_RUN_STATUSES,
    TRAIN_LOSS_KEY,
    RunConfig,
    fit_candidates,
    fit_key,
    fit_ready,
    lr_key,
)
from curvecast.service.errors import InvalidInput, NotFound, RunNotFound
from curvecast.service.forecast.binning import DEFAULT_MAX_BINS
from curvecast.service.forecast.curve import DIVERGED_MIN_POINTS, FloatArray, ends_diverged
from curvecast.service.forecast.fit import Fit
from curvecast.service.forecast.reached import (
    REACHED_MAX_POINTS,
    REACHED_WINDOW,
    ReachedReader,
    smoothed_reached,
)
from curvecast.service.models import (
    FitRecord,
    MetricPoint,
    MetricRollup,
    Project,
    Run,
    RunWork,
    Series,
)
from curvecast.service.store._common import (
    as_utc,
    is_postgres,
    keep_run,
    no_such_series,
    run_series,
    series_points,
    write_connection,
)
from curvecast.service.store._held_points import held_points
from curvecast.service.store._leases import claim_leases
from curvecast.service.store.rollups import ROLLUP_WIDTHS, read_block_means

#: Series spanning more steps than this are read as rollup block means (at least
#: ``MIN_FIT_BLOCKS`` of them, at most 8x that: the levels are 8x apart), so a refit reads
#: hundreds to a few thousand rows however long the run. The fit bins its input to
#: ``DEFAULT_MAX_BINS`` (400) anyway: reading more blocks than that only costs time (1,000
#: blocks read 7,800 rows of a 10^6-step series, ~35 ms; 400 read 980).
RAW_READ_LIMIT = 20_000
MIN_FIT_BLOCKS = DEFAULT_MAX_BINS
#: The logged learning rate only has to show whether it left its peak: a coarse read will do.
LR_RAW_READ_LIMIT = 2_000
LR_MIN_BLOCKS = 100

# The statements a refit sends for every run, built once: building a SELECT and computing its
# cache key cost more CPU than SQLite's execution of it (about 0.13 ms of the 0.2 a statement
# took when built per call; a refit sent nine), and the worker refits every growing run every
# few seconds. Their values are bound parameters.

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
#: The newest fit of each run's default series, for the runs in ``run_ids``.
_NEWEST_DEFAULT_FITS = select(
    FitRecord.id, FitRecord.run_id, FitRecord.key, FitRecord.created_at,
    FitRecord.steps_per_second,
).where(FitRecord.id.in_(
    select(func.max(FitRecord.id))
    .where(FitRecord.run_id.in_(bindparam("run_ids", expanding=True)),
           FitRecord.is_default.is_(True))
    .group_by(FitRecord.run_id)
    .scalar_subquery()
))


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


@dataclass(frozen=True)
class StoredFit:
    """A fit from the history: which series it fitted, the fit, when it was made, and the run's
    step rate then (for target ETAs, so a target query reads nothing but the fit)."""

    id: int
    run_id: uuid.UUID
    key: str
    fit: Fit
    created_at: datetime
    steps_per_second: float | None = None


@dataclass(frozen=True)
class RunForecastContext:
    """What answering for a run needs besides its fits: its config, last logged step, and
    whether it has ended (no "current pace" ETA then)."""

    config: RunConfig
    last_step: int | None
    finished: bool = False


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
    # The previous fit's id and time only: its parsed JSON is usually in _parsed_fits already
    # (this process stored it, or read it for a request or an alert round).
    previous = session.execute(_PREVIOUS_FIT, {"run_id": job.run_id, "key": key}).first()
    previous_fit = (
        None if previous is None
        else _parsed_fits.get_many(
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
        # waiting for the WAL flush took the store's p95 from 6.3 to 4.1-4.8 ms at 10^6 points
        # (bench/service/forecast_latency.py).
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
        _parsed_fits.remember_on_commit(session, records)


def finish_fit_job(session: Session, *, job: FitJob, now: datetime) -> None:
    """Record that the run was handled at ``job.run_n_points`` and release its lease."""
    write_connection(session)
    session.execute(
        _FINISH_FIT_JOB, {"b_run_id": job.run_id, "b_n": job.run_n_points, "b_at": now},
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
        steps_per_second=record.steps_per_second,
    )


def _context(run: Run) -> RunForecastContext:
    return RunForecastContext(config=RunConfig.read(run.config), last_step=run.last_step,
                              finished=run.status in ENDED_RUN_STATUSES)


def _fit_filter(session: Session, run_id: uuid.UUID, key: str | None) -> Any:
    """Rows of the run's default series, or of ``key`` (which must exist in the run)."""
    if key is None:
        return FitRecord.is_default.is_(True)
    exists = session.scalar(
        select(Series.id).where(Series.run_id == run_id, Series.key == key).limit(1)
    )
    if exists is None:
        raise NotFound(_no_such_series(session, run_id, key))
    return FitRecord.key == key


def _no_such_series(session: Session, run_id: uuid.UUID, key: str) -> str:
    present = [k for k, _ in run_series(session, run_id)]
    return (no_such_series(run_id, [key], present)
            + " (forecasts are of loss series; leave key out for the default)")


def loss_reached(session: Session, run_id: uuid.UUID, key: str, step: int,
                 last_step: int | None) -> float | None:
    """The loss ``key`` had at ``step`` once the run got there (``reached.loss_reached``'s rule,
    read from the database): the series smoothed over the last ``REACHED_WINDOW`` of the steps
    up to ``step`` (:func:`~curvecast.service.forecast.reached.smoothed_reached`), provided the
    series has a point at or after ``step``. None before that, or where its point at or before
    ``step`` is NaN or infinite.

    Forecast answers give it beside the forecast for a step the run is past. The run's
    ``last_step`` (already read) decides whether to look at all: the horizon asked about is
    usually ahead of the run, and those answers cost no statement more. Past it, one statement
    reads the window's points (at most ``REACHED_MAX_POINTS``, by the series' step index).
    """
    if last_step is None or last_step < step:
        return None
    sid = select(Series.id).where(Series.run_id == run_id, Series.key == key).scalar_subquery()
    points = MetricPoint.__table__.c
    newest = select(func.max(points.step)).where(points.series_id == sid, points.step <= step)
    after = select(points.step).where(points.series_id == sid, points.step >= step).exists()
    # Steps are whole numbers: "above step * (1 - window)" is "above its floor", an integer
    # bound the step index can use on PostgreSQL.
    start = math.floor(step * (1.0 - REACHED_WINDOW))
    rows = session.execute(
        select(points.step, points.value, after)
        .where(points.series_id == sid, points.step <= step,
               or_(points.step > start, points.step == newest.scalar_subquery()))
        .order_by(points.step.desc()).limit(REACHED_MAX_POINTS)
    ).all()
    if not rows or not rows[0][2]:
        return None
    # A non-finite value may be stored as NULL (a backend without NaN): NaN here.
    return smoothed_reached(
        [(float(s), math.nan if v is None else float(v)) for s, v, _ in rows], step)


def reached_reader(session: Session, run_id: uuid.UUID, last_step: int | None
                   ) -> ReachedReader:
    """:func:`loss_reached` for one run, as the answer builders take it (``(key, step)``: they
    resolve the horizon, and a history reads each series its rows fitted; no key, no series)."""

    def read(key: str | None, step: int) -> float | None:
        return None if key is None else loss_reached(session, run_id, key, step, last_step)

    return read


def latest_fit(
    session: Session, *, run_id: uuid.UUID, allowed_project: str | None, key: str | None = None
) -> tuple[StoredFit | None, RunForecastContext]:
    """The newest fit of a run's default series, or of ``key`` (or None), with the run's
    config, last step and whether it has ended.

    One statement reads the run, its newest fit's id and (with ``key``) whether the series
    exists; the fit's JSON is read and parsed only the first time this process sees that fit
    (:class:`_ParsedFits`). Forecast queries are the service's most frequent reads: this keeps
    them to one round trip and no JSON work.

    Raises:
        RunNotFound: no such run (visible to the caller).
        NotFound: the run has no series ``key``.
        InvalidInput: ``key`` is a series no fit is made of (not a loss series, not the
            config's ``fit_key``), and it has none.
    """
    params: dict[str, Any] = {"run_id": run_id, "key": key, "project": allowed_project}
    row = session.execute(
        _latest_fit_statement(key is not None, allowed_project is not None), params
    ).one_or_none()
    if row is None:
        raise RunNotFound(f"run {run_id} not found")
    config, last_step, status, fit_id, fit_key_, created_at, rate, key_series = row
    if key is not None and key_series is None:
        raise NotFound(_no_such_series(session, run_id, key))
    context = RunForecastContext(config=RunConfig.read(config), last_step=last_step,
                                 finished=status in ENDED_RUN_STATUSES)
    if fit_id is None:
        candidates = fit_candidates(context.config)
        if key is not None and key not in candidates:
            # A series the run logs but the worker never fits: "pending" would wait forever.
            raise InvalidInput(
                f"run {run_id}'s series {key!r} is not forecast: the worker fits the loss "
                f"series ({', '.join(candidates)}); to forecast {key!r}, name it as the run "
                "config's fit_key")
        return None, context
    created = as_utc(created_at)
    stored = StoredFit(id=fit_id, run_id=run_id, key=fit_key_,
                       fit=_parsed_fits.get(session, fit_id, run_id, created),
                       created_at=created, steps_per_second=rate)
    return stored, context


@functools.cache
def _latest_fit_statement(by_key: bool, by_project: bool) -> Select[Any]:
    """The statement :func:`latest_fit` runs, built once per shape (with or without ``key``
    and a project): building an aliased, correlated select cost more CPU than running it.
    Core columns, not ORM attributes, for the same reason. Parameters: ``run_id``, ``key``,
    ``project``."""
    runs, fits = Run.__table__.c, FitRecord.__table__.c
    newer = FitRecord.__table__.alias("newer").c
    newest_id = (
        select(newer.id)
        .where(newer.run_id == runs.id,
               newer.key == bindparam("key") if by_key else newer.is_default.is_(True))
        .order_by(newer.id.desc())
        .limit(1)
        .correlate(Run.__table__)
        .scalar_subquery()
    )
    series = Series.__table__.c
    series_id = (
        select(series.id).where(series.run_id == runs.id, series.key == bindparam("key"))
        .limit(1).correlate(Run.__table__).scalar_subquery()
    )
    stmt = (
        select(runs.config, runs.last_step, runs.status, fits.id, fits.key, fits.created_at,
               fits.steps_per_second, series_id if by_key else literal(None))
        .select_from(Run.__table__.outerjoin(FitRecord.__table__, fits.id == newest_id))
        .where(runs.id == bindparam("run_id"))
    )
    if by_project:
        projects = Project.__table__
        stmt = stmt.join(projects, projects.c.id == runs.project_id).where(
            projects.c.name == bindparam("project"))
    return stmt


class _ParsedFits:
    """Fits parsed from their JSON, kept per database by (fit id, run id, creation time).

    A fit row is written once and never updated, so its parsed :class:`Fit` can be reused for
    as long as the process lives. The run id and creation time in the key guard against SQLite
    reusing the id of a deleted newest row. Bounded (least recently used goes first) and
    thread-safe: requests run in a thread pool.
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._by_engine: weakref.WeakKeyDictionary[Any, OrderedDict[Any, Fit]] = (
            weakref.WeakKeyDictionary())

    def get(self, session: Session, fit_id: int, run_id: uuid.UUID, created: datetime) -> Fit:
        """The parsed fit of row ``fit_id``, read from the database only on first use."""
        fit = self.get_many(session, [(fit_id, run_id, created)]).get(fit_id)
        if fit is None:  # the run was deleted between the two reads
            raise RunNotFound(f"run {run_id} not found")
        return fit

    def remember_on_commit(self, session: Session, records: list[FitRecord]) -> None:
        """Keep the parsed fits of ``records`` (flushed, so with their ids) once ``session``
        commits; nothing is kept if it rolls back. Parsed from the stored JSON, so a cached fit
        is exactly what a read of the row would give."""
        engine = session.get_bind()
        parsed = [((r.id, r.run_id, as_utc(r.created_at)), Fit.from_dict(r.fit))
                  for r in records]

        event.listen(session, "after_commit", lambda _s: self._keep(engine, parsed), once=True)

    def _keep(self, engine: Any, parsed: list[tuple[Any, Fit]]) -> None:
        """Add ``(key, fit)`` pairs to ``engine``'s fits, dropping the least recently used."""
        with self._lock:
            fits = self._by_engine.setdefault(engine, OrderedDict())
            fits.update(parsed)
            while len(fits) > self._size:
                fits.popitem(last=False)

    def get_many(self, session: Session, idents: list[tuple[int, uuid.UUID, datetime]]
                 ) -> dict[int, Fit]:
        """The parsed fits of rows ``(fit id, run id, created_at)``, by fit id; the ones not
        seen before are read in one statement. A row deleted meanwhile is left out."""
        engine = session.get_bind()
        found: dict[int, Fit] = {}
        with self._lock:
            fits = self._by_engine.setdefault(engine, OrderedDict())
            for ident in idents:
                fit = fits.get(ident)
                if fit is not None:
                    fits.move_to_end(ident)
                    found[ident[0]] = fit
        missing = {ident[0]: ident for ident in idents if ident[0] not in found}
        if not missing:
            return found
        rows = session.execute(
            select(FitRecord.id, FitRecord.fit).where(FitRecord.id.in_(missing))).all()
        parsed = {fit_id: Fit.from_dict(data) for fit_id, data in rows}
        self._keep(engine, [(missing[fit_id], fit) for fit_id, fit in parsed.items()])
        return found | parsed


_parsed_fits = _ParsedFits()


def newest_default_fits(session: Session, run_ids: list[uuid.UUID]) -> dict[uuid.UUID, StoredFit]:
    """The newest fit of each run's default series (runs without one are left out), in one
    statement through the (run_id, id) index; for the runs list and the alert worker, which
    check visibility themselves."""
    if not run_ids:
        return {}
    rows = session.execute(_NEWEST_DEFAULT_FITS, {"run_ids": list(run_ids)}).all()
    created = {row.id: as_utc(row.created_at) for row in rows}
    fits = _parsed_fits.get_many(session, [(r.id, r.run_id, created[r.id]) for r in rows])
    return {
        row.run_id: StoredFit(id=row.id, run_id=row.run_id, key=row.key, fit=fits[row.id],
                              created_at=created[row.id], steps_per_second=row.steps_per_second)
        for row in rows if row.id in fits
    }


def fit_history(
    session: Session, *, run_id: uuid.UUID, allowed_project: str | None, limit: int,
    key: str | None = None,
) -> tuple[list[StoredFit], RunForecastContext]:
    """Fits of a run's default series (or of ``key``), oldest first (at most ``limit``, the
    newest ones), with the run's context. Raises as :func:`latest_fit`."""
    run = _visible_run(session, run_id, allowed_project)
    records = session.scalars(
        select(FitRecord)
        .where(FitRecord.run_id == run_id, _fit_filter(session, run_id, key))
        .order_by(FitRecord.id.desc())
        .limit(limit)
    ).all()
    return [stored_fit(r) for r in reversed(records)], _context(run)


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
