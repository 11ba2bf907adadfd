"""Worker task: refit the forecasts of every run whose data grew enough since its last fit: its
default loss series (the contract's ``fit_key``) and its other loss series (for ``?key=``)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from curvecast.service import prometheus
from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.forecast.solver import fit_curve
from curvecast.service.store import refits
from curvecast.service.store._common import utcnow


def refit_due_runs(factory: sessionmaker[Session], settings: Settings) -> int:
    """Refit every run whose data grew enough since its last fit (a few per round)."""
    now = utcnow()
    with session_scope(factory) as session:
        jobs = refits.claim_fit_jobs(
            session,
            now=now,
            growth=settings.refit_growth,
            max_age=timedelta(seconds=settings.refit_max_age_s),
            min_interval=timedelta(seconds=settings.refit_min_interval_s),
            lease=timedelta(seconds=settings.refit_lease_s),
            min_points=4,
            limit=4,
        )
    for job in jobs:
        done = prometheus.observe_elapsed(prometheus.REFIT_SECONDS)
        with session_scope(factory) as session:
            inputs = refits.read_fit_inputs(session, job=job)
        fits = []
        for fit_input in inputs:  # the default series first, then the other loss series
            # A fit of the points alone, not warm-started from the previous fit: the answer
            # is then what `curvecast forecast` gives on the run's export and what the
            # backtests measure. A warm start kept the first fit's burn-in for good on a run
            # without c_warmup (a plateau, then the fall: no_asymptote where a fresh fit is
            # ok), and its intervals covered the final loss less often (BENCHMARKS.md,
            # "Warm-started refits against fits of the points alone").
            fits.append((fit_input, fit_curve(
                fit_input.steps,
                fit_input.values,
                config=job.config,
                lr=fit_input.lr,
                ends_non_finite=fit_input.ends_non_finite,
            )))
        with session_scope(factory) as session:
            refits.save_fits(session, job=job, fits=fits, now=utcnow())
        done()
        if job.last_ingest_at is not None:
            lag = (utcnow() - job.last_ingest_at).total_seconds()
            prometheus.REFIT_LAG.observe(max(0.0, lag))
    return len(jobs)
