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

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings

log = logging.getLogger(__name__)

#: A task does one round of work and returns how many items it handled (0 = nothing to do).
Task = Callable[[sessionmaker[Session], Settings], int]


class Worker:
    """Runs ``tasks`` in a loop on a daemon thread; :meth:`notify` wakes it early."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        settings: Settings,
        tasks: Sequence[Task],
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
