"""Forecast reads: the stored fits a forecast answer is built from (the newest, or the
history), with the run's context, and the loss a run reached at a step.

A stored fit is parsed into a :class:`~curvecast.service.forecast.fit.Fit` here, once per
process (:mod:`._parsed_fits`), and handed out as such: nothing past the store sees the JSON.
The worker's side (leases, refit inputs, storing fits) is :mod:`.refits`'.
"""

from __future__ import annotations

import functools
import math
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, bindparam, func, literal, or_, select
from sqlalchemy.orm import Session

from curvecast.contract import (
    ENDED_RUN_STATUSES,
    RunConfig,
    fit_candidates,
)
from curvecast.service.errors import InvalidInput, NotFound, RunNotFound
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
    Project,
    Run,
    Series,
)
from curvecast.service.store._common import (
    as_utc,
    no_such_series,
    run_series,
)
from curvecast.service.store._parsed_fits import parsed_fits

__all__ = [
    "RunForecastContext",
    "StoredFit",
    "fit_history",
    "latest_fit",
    "loss_reached",
    "newest_default_fits",
    "reached_reader",
    "stored_fit",
]

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
    (:class:`~._parsed_fits.ParsedFits`). Forecast queries are the service's most frequent
    reads: this keeps them to one round trip and no JSON work.

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
                       fit=parsed_fits.get(session, fit_id, run_id, created),
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


def newest_default_fits(session: Session, run_ids: list[uuid.UUID]) -> dict[uuid.UUID, StoredFit]:
    """The newest fit of each run's default series (runs without one are left out), in one
    statement through the (run_id, id) index; for the runs list and the alert worker, which
    check visibility themselves."""
    if not run_ids:
        return {}
    rows = session.execute(_NEWEST_DEFAULT_FITS, {"run_ids": list(run_ids)}).all()
    created = {row.id: as_utc(row.created_at) for row in rows}
    fits = parsed_fits.get_many(session, [(r.id, r.run_id, created[r.id]) for r in rows])
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
