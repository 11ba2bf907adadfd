"""The background worker: one daemon thread per service process that does the work ingest
must never wait for (refitting forecasts; evaluating alerts and sending webhooks later).

Every task is safe to run in several processes at once against one database: each claims its
work with leases and row locks (see ``service.store.forecasts.claim_fit_jobs``). The thread never
dies: a failing task is logged and retried on the next tick.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.forecast import Fit, FitParams, fit_curve
from curvecast.service.store import forecasts
from curvecast.service.store._common import utcnow

log = logging.getLogger(__name__)

#: A task does one round of work and returns how many items it handled (0 = nothing to do).
Task = Callable[[sessionmaker[Session], Settings], int]


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
        previous = Fit.from_dict(fit_input.previous_fit) if fit_input.previous_fit else None
        warm: FitParams | None = previous.params if previous is not None else None
        fit = fit_curve(fit_input.steps, fit_input.values, config=job.config, warm_start=warm)
        with session_scope(factory) as session:
            forecasts.save_fit(session, job=job, key=fit_input.key, fit=fit.to_dict(), now=utcnow())
    return len(jobs)


class Worker:
    """Runs ``tasks`` in a loop on a daemon thread; :meth:`notify` wakes it early."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        settings: Settings,
        tasks: Sequence[Task] = (refit_due_runs,),
    ) -> None:
        self._factory = factory
        self._settings = settings
        self._tasks = tuple(tasks)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="curvecast-worker", daemon=True)
        self._last_db_warning = 0.0

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def notify(self) -> None:
        """New data arrived: run a round soon instead of at the next interval."""
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the thread to finish its round and wait for it."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            handled = 0
            for task in self._tasks:
                handled += self._run_task(task)
            if handled == 0:
                self._wake.wait(self._settings.worker_interval_s)
                self._wake.clear()

    def _run_task(self, task: Task) -> int:
        try:
            return task(self._factory, self._settings)
        except OperationalError as exc:
            # The database is away: say so at most once a minute, keep trying.
            if time.monotonic() - self._last_db_warning > 60:
                self._last_db_warning = time.monotonic()
                log.warning("worker: database unavailable: %s", str(exc).splitlines()[0])
        except Exception:
            log.exception("worker task %s failed; retrying next round", task.__name__)
        return 0
