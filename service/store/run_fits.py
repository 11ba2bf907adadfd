"""A run's fits for a caller who has read the run already (the run page, its chart data, its
live poll, the compare page): the newest fit of a series, or its recent history, read without
reading the run again.

:func:`~curvecast.service.store.forecasts.latest_fit` and
:func:`~curvecast.service.store.forecasts.fit_history` read the run's row with the fit (they
check that the caller may see it and return its forecast context); a page has that row in hand
as a :class:`~curvecast.service.schemas.RunOut`, so these read the ``fits`` table alone. They
answer what those do (the same fit, the same errors): where a series is missing or is not
forecast, the error is raised by ``latest_fit`` itself, so its message stays the one REST gives.
A newest fit is parsed through the store's cache (:mod:`._parsed_fits`), as ``latest_fit``'s
is: once per process, whichever of the two reads it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Select, bindparam, select
from sqlalchemy.orm import Session

from curvecast.contract import RunConfig, fit_candidates
from curvecast.service.models import FitRecord, Series
from curvecast.service.schemas import RunOut
from curvecast.service.store import forecasts as forecast_store
from curvecast.service.store._common import as_utc
from curvecast.service.store._parsed_fits import parsed_fits
from curvecast.service.store.forecasts import StoredFit, stored_fit


def newest_fit(session: Session, *, run: RunOut, allowed_project: str | None,
               key: str | None = None) -> StoredFit | None:
    """The newest fit of ``run``'s default series, or of ``key`` (None before its first fit):
    ``latest_fit``'s answer, in one statement that reads no run.

    Raises:
        NotFound: the run has no series ``key``.
        InvalidInput: ``key`` is a series no fit is made of, and it has none.
    """
    row = session.execute(_newest_statement(key is not None),
                          {"run_id": run.id, "key": key}).one_or_none()
    if key is not None and (row is None or row.series_id is None):
        _raise_as_latest_fit(session, run, allowed_project, key)  # no series ``key``
        return None
    if row is None or row.id is None:
        if key is not None and key not in fit_candidates(RunConfig.read(run.config)):
            _raise_as_latest_fit(session, run, allowed_project, key)  # not forecast
        return None
    created = as_utc(row.created_at)
    return StoredFit(id=row.id, run_id=run.id, key=row.key,
                     fit=parsed_fits.get(session, row.id, run.id, created),
                     created_at=created, steps_per_second=row.steps_per_second)


def recent_fits(session: Session, *, run: RunOut, allowed_project: str | None, limit: int,
                key: str | None = None) -> list[StoredFit]:
    """``fit_history``'s fits of ``run`` (its default series', or ``key``'s; oldest first, the
    newest ``limit``), read without the run.

    Raises:
        NotFound: the run has no series ``key``.
    """
    stmt = select(FitRecord).where(FitRecord.run_id == run.id)
    if key is None:
        stmt = stmt.where(FitRecord.is_default.is_(True))
    else:
        if session.scalar(select(Series.id).where(Series.run_id == run.id, Series.key == key)
                          .limit(1)) is None:
            _raise_as_latest_fit(session, run, allowed_project, key)
            return []
        stmt = stmt.where(FitRecord.key == key)
    records = session.scalars(stmt.order_by(FitRecord.id.desc()).limit(limit)).all()
    return [stored_fit(r) for r in reversed(records)]


def _raise_as_latest_fit(session: Session, run: RunOut, allowed_project: str | None,
                         key: str) -> None:
    """Raise the error ``latest_fit`` raises for ``key`` (read again: only on this error path,
    so that its message is REST's). Returns only if the run changed meanwhile."""
    forecast_store.latest_fit(session, run_id=run.id, allowed_project=allowed_project, key=key)


@cache
def _newest_statement(by_key: bool) -> Select[Any]:
    """The statement :func:`newest_fit` runs, built once per shape (as ``latest_fit``'s is).
    Parameters: ``run_id``, ``key``. By key, one row per series ``key`` of the run (none: the
    run has no such series) with its newest fit's columns (NULL: no fit yet)."""
    fits = FitRecord.__table__.c
    columns = (fits.id, fits.key, fits.created_at, fits.steps_per_second)
    if not by_key:
        return (select(*columns)
                .where(fits.run_id == bindparam("run_id"), fits.is_default.is_(True))
                .order_by(fits.id.desc()).limit(1))
    series = Series.__table__.c
    newer = FitRecord.__table__.alias("newer").c
    newest_id = (
        select(newer.id)
        .where(newer.run_id == series.run_id, newer.key == series.key)
        .order_by(newer.id.desc())
        .limit(1)
        .correlate(Series.__table__)
        .scalar_subquery()
    )
    return (
        select(series.id.label("series_id"), *columns)
        .select_from(Series.__table__.outerjoin(FitRecord.__table__, fits.id == newest_id))
        .where(series.run_id == bindparam("run_id"), series.key == bindparam("key"))
        .limit(1)
    )
