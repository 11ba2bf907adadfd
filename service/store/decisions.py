"""What the decision answers read: a project's runs with their latest fits, one run with its.

Returns :class:`~curvecast.service.forecast.chances.RunInput` values, whose ``loss_at`` and
``final`` read the loss a run had at a step (its series' last, for ``final``) through this
request's session (:func:`forecasts.loss_reached`): only for the runs the answer asks about,
and only at a step the run got to.
"""

from __future__ import annotations

import math
import uuid
from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from curvecast.contract import RunConfig, fit_candidates
from curvecast.service.errors import NotFound
from curvecast.service.forecast.chances import RunInput
from curvecast.service.models import FitRecord, MetricPoint, Project, Run, Series
from curvecast.service.store import forecasts, projects
from curvecast.service.store import runs as run_store
from curvecast.service.store.forecasts import StoredFit

__all__ = [
    "MAX_RANKED_RUNS", "best_finished", "project_runs", "run_input", "seconds_per_step",
]

#: A ranking compares a project's newest runs, at most this many.
MAX_RANKED_RUNS: Final = 1000


def _reader(session: Session, run_id: uuid.UUID, key: str | None, last_step: int | None
            ) -> Any:
    def read(step: int) -> float | None:
        if key is None:
            return None
        return forecasts.loss_reached(session, run_id, key, step, last_step)

    return read


def _final(session: Session, run_id: uuid.UUID, key: str | None) -> Any:
    def final() -> tuple[int, float | None] | None:
        if key is None:
            return None
        sid = select(Series.id).where(Series.run_id == run_id, Series.key == key
                                      ).scalar_subquery()
        last = session.scalar(select(func.max(MetricPoint.step))
                              .where(MetricPoint.series_id == sid))
        if last is None:
            return None
        return int(last), forecasts.loss_reached(session, run_id, key, int(last), int(last))

    return final


def _missing(config: RunConfig, key: str | None, has_series: bool, has_fit: bool) -> str:
    """Why a run will have no fit of the series ``key`` ("" when it has one, or may yet)."""
    if key is None or has_fit:
        return ""
    if not has_series:
        return f"the run has no series {key!r}"
    if key not in fit_candidates(config):
        return (f"the run's series {key!r} is not forecast (name it as the run config's "
                "fit_key to forecast it)")
    return ""


def _as_input(session: Session, *, run_id: uuid.UUID, name: str, status: str,
              config: RunConfig, last_step: int | None, stored: StoredFit | None,
              key: str | None, has_series: bool) -> RunInput:
    series = stored.key if stored is not None else key
    return RunInput(
        run_id=run_id, name=name, status=status, fit=stored.fit if stored else None,
        key=series, total_steps=config.total_steps, last_step=last_step,
        loss_at=_reader(session, run_id, series, last_step),
        final=_final(session, run_id, series),
        missing=_missing(config, key, has_series, stored is not None),
    )


def _fits_of_key(session: Session, run_ids: list[uuid.UUID], key: str
                 ) -> dict[uuid.UUID, StoredFit]:
    """The newest fit of series ``key`` of each of ``run_ids`` (runs without one left out)."""
    newest = (select(func.max(FitRecord.id))
              .where(FitRecord.run_id.in_(run_ids), FitRecord.key == key)
              .group_by(FitRecord.run_id))
    records = session.scalars(select(FitRecord).where(FitRecord.id.in_(newest))).all()
    return {r.run_id: forecasts.stored_fit(r) for r in records}


def project_runs(session: Session, *, project: str, allowed_project: str | None,
                 key: str | None = None) -> list[RunInput]:
    """The project's newest runs (at most :data:`MAX_RANKED_RUNS`), each with its newest fit
    of its default series (or of ``key``).

    Raises:
        NotFound: no such project, or not the caller's; a ``key`` none of its runs logs.
    """
    projects.check_visible(session, name=project, allowed_project=allowed_project)
    rows = session.execute(
        select(Run.id, Run.name, Run.status, Run.config, Run.last_step)
        .join(Project, Project.id == Run.project_id)
        .where(Project.name == project)
        .order_by(Run.created_at.desc(), Run.id)
        .limit(MAX_RANKED_RUNS)
    ).all()
    ids = [row.id for row in rows]
    if key is None:
        fits = forecasts.newest_default_fits(session, ids)
        with_series = set(ids)
    else:
        fits = _fits_of_key(session, ids, key) if ids else {}
        with_series = set(session.scalars(
            select(Series.run_id).where(Series.run_id.in_(ids), Series.key == key))) \
            if ids else set()
        if ids and not with_series:
            # As a run's forecast of a series it does not log: a 404 that says what there is.
            logged = session.scalars(select(Series.key).where(Series.run_id.in_(ids))
                                     .distinct().order_by(Series.key)).all()
            raise NotFound(f"no run of project {project!r} logs a series {key!r}; the keys "
                           f"they log: {', '.join(logged) or 'none yet'}")
    return [
        _as_input(session, run_id=row.id, name=row.name, status=row.status,
                  config=RunConfig.read(row.config), last_step=row.last_step,
                  stored=fits.get(row.id), key=key, has_series=row.id in with_series)
        for row in rows
    ]


def run_input(session: Session, *, run_id: uuid.UUID, allowed_project: str | None,
              key: str | None = None) -> RunInput:
    """One run with its newest fit of its default series (or of ``key``).

    Raises as :func:`forecasts.latest_fit`: RunNotFound, NotFound (no series ``key``),
    InvalidInput (``key`` is a series no fit is made of).
    """
    stored, context = forecasts.latest_fit(session, run_id=run_id,
                                           allowed_project=allowed_project, key=key)
    run = run_store.get_run(session, run_id=run_id, allowed_project=allowed_project)
    return _as_input(session, run_id=run_id, name=run.name, status=run.status,
                     config=context.config, last_step=context.last_step, stored=stored,
                     key=key, has_series=True)


def best_finished(session: Session, *, project_id: int, key: str, exclude: uuid.UUID
                  ) -> tuple[float, str] | None:
    """The lowest final loss of series ``key`` among the project's finished runs other than
    ``exclude`` (its newest :data:`MAX_RANKED_RUNS`), with that run's name; None when none has
    a finite one. A run's final loss is what the ranking compares finished runs on (the
    smoothed loss at its series' last step)."""
    rows = session.execute(
        select(Run.id, Run.name)
        .where(Run.project_id == project_id, Run.status == "finished", Run.id != exclude)
        .order_by(Run.created_at.desc(), Run.id)
        .limit(MAX_RANKED_RUNS)
    ).all()
    best: tuple[float, str] | None = None
    for row in rows:
        end = _final(session, row.id, key)()
        if end is None or end[1] is None or not math.isfinite(end[1]):
            continue
        if best is None or end[1] < best[0]:
            best = (end[1], row.name)
    return best


def seconds_per_step(session: Session, *, run_id: uuid.UUID) -> float | None:
    """The run's wall seconds per step so far (created to its last ingest, over its last
    step), or None when that is not known yet."""
    row = session.execute(select(Run.created_at, Run.last_ingest_at, Run.last_step)
                          .where(Run.id == run_id)).one_or_none()
    if row is None or row.last_ingest_at is None or not row.last_step:
        return None
    created, last = row.created_at, row.last_ingest_at
    if (created.tzinfo is None) != (last.tzinfo is None):  # SQLite reads naive datetimes
        created, last = created.replace(tzinfo=None), last.replace(tzinfo=None)
    elapsed = (last - created).total_seconds()
    return elapsed / row.last_step if elapsed > 0 else None
