"""Worker task: refit the forecast of every run whose data grew enough since its last fit."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.forecast.solver import fit_curve
from curvecast.service.store import forecasts
from curvecast.service.store._common import utcnow


def refit_due_runs(factory: sessionmaker[Session], settings: Settings) -> int:
    """Refit every run whose data grew enough since its last fit (a few per round)."""
    now = utcnow()
    with session_scope(factory) as session:
        jobs = forecasts.claim_fit_jobs(
            session,
            now=now,
            growth=settings.refit_growth,
            max_age=timedelta(seconds=settings.refit_max_age_s),
            lease=timedelta(seconds=settings.refit_lease_s),
            min_points=4,
            limit=4,
        )
    for job in jobs:
        with session_scope(factory) as session:
            fit_input = forecasts.read_fit_input(session, job=job)
        if fit_input is None:  # no loss-like series yet
            with session_scope(factory) as session:
                forecasts.finish_fit_job(session, job=job, now=utcnow())
            continue
        previous = fit_input.previous_fit
        fit = fit_curve(
            fit_input.steps,
            fit_input.values,
            config=job.config,
            warm_start=previous.params if previous is not None else None,
        )
        with session_scope(factory) as session:
            forecasts.save_fit(session, job=job, key=fit_input.key, fit=fit, now=utcnow())
    return len(jobs)
