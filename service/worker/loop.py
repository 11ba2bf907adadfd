"""The background worker: the work ingest must never wait for (refitting forecasts, evaluating
alerts, sending webhooks), one daemon thread per task in every service process.

Each task runs on its own thread with its own wake-up, so one task's failure or slowness (a
webhook receiver that takes its full timeout, a refit of a huge run, a database call that
hangs) never delays the others: alerts are evaluated while a delivery waits on a slow
receiver. Every task is safe to run in several processes at once against one database: each
claims its work with leases and row locks (``curvecast.service.store._leases``). The threads
never die: a failing round is logged and retried after the interval.
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
#: A database outage is logged at most this often per task (it is retried every interval).
DB_WARNING_EVERY_S = 60.0


class _TaskThread:
    """One task in a loop on its own daemon thread: a round right after a round that found
    work (there may be more), else after the interval or a wake-up."""

    def __init__(
        self,
        task: Task,
        factory: sessionmaker[Session],
        settings: Settings,
        stopping: threading.Event,
    ) -> None:
        self.task = task
        self.wake = threading.Event()
        self.thread = threading.Thread(
            target=self._loop, name=f"curvecast-worker-{task.__name__}", daemon=True
        )
        self._factory = factory
        self._settings = settings
        self._stopping = stopping
        self._last_db_warning = -DB_WARNING_EVERY_S

    def _loop(self) -> None:
        while not self._stopping.is_set():
            # Cleared before the round, so a wake-up that arrives during it is not lost.
            self.wake.clear()
            if self._round() == 0:
                self.wake.wait(self._settings.worker_interval_s)

    def _round(self) -> int:
        try:
            return self.task(self._factory, self._settings)
        except OperationalError as exc:
            # The database is away: say so now and then, keep trying.
            if time.monotonic() - self._last_db_warning >= DB_WARNING_EVERY_S:
                self._last_db_warning = time.monotonic()
                log.warning(
                    "worker task %s: database unavailable: %s",
                    self.task.__name__,
                    str(exc).splitlines()[0],
                )
        except Exception:
            log.exception("worker task %s failed; retrying next round", self.task.__name__)
        return 0


class Worker:
    """Runs each of ``tasks`` on its own daemon thread; :meth:`notify` wakes them all early."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        settings: Settings,
        tasks: Sequence[Task],
    ) -> None:
        self._stopping = threading.Event()
        self._threads = [_TaskThread(t, factory, settings, self._stopping) for t in tasks]

    def start(self) -> None:
        """Start every task's thread."""
        for t in self._threads:
            t.thread.start()

    def notify(self) -> None:
        """New data arrived: every task runs a round soon instead of at the next interval."""
        for t in self._threads:
            t.wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask every thread to finish its round, and wait for them (``timeout`` in all)."""
        self._stopping.set()
        self.notify()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t.thread.is_alive():
                t.thread.join(max(0.0, deadline - time.monotonic()))
