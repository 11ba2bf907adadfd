"""The background worker: the work ingest must never wait for (refitting forecasts, evaluating
alerts, sending webhooks), one daemon thread per task in every service process.

Each task runs on its own thread with its own wake-up, so one task's failure or slowness (a
webhook receiver that takes its full timeout, a refit of a huge run, a database call that
hangs) never delays the others: alerts are evaluated while a delivery waits on a slow
receiver. Every task is safe to run in several processes at once against one database: each
claims its work with leases and row locks (``curvecast.service.store._leases``). The threads
never die: a failing round is logged and retried after the interval.

New data wakes only the tasks that act on it (refits, alert rounds), and not more often than
``worker_wake_gap_s``: under load every ingest request notifies, dozens of times a second per
process, and each early round is a claim transaction that mostly finds nothing due (runs are
refitted and judged at most every few seconds). Tasks that act on another task's output
(webhook deliveries after an alert round) are woken by that task's rounds, not by ingest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings

log = logging.getLogger(__name__)

#: A task does one round of work and returns how many items it handled (0 = nothing to do).
Task = Callable[[sessionmaker[Session], Settings], int]
#: During a long database outage a task repeats its warning this often (it retries every
#: interval; the first failure and the recovery are always logged).
DB_WARNING_EVERY_S = 600.0


class _TaskThread:
    """One task in a loop on its own daemon thread: a round right after a round that found
    work (there may be more), else after the interval or a wake-up, but no sooner than
    ``worker_wake_gap_s`` after the previous round started. ``follow_ups`` are woken after
    every round that did something."""

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
        self.follow_ups: list[_TaskThread] = []
        self._db_down_since: float | None = None
        self._last_db_warning = 0.0

    def _loop(self) -> None:
        gap = min(self._settings.worker_wake_gap_s, self._settings.worker_interval_s)
        while not self._stopping.is_set():
            # Cleared before the round, so a wake-up that arrives during it is not lost.
            self.wake.clear()
            started = time.monotonic()
            done = self._round()
            if done:
                _wake(self.follow_ups)
            if done == 0 and self.wake.wait(self._settings.worker_interval_s):
                # Woken early: at most one such round per gap (stop() cuts the wait short).
                self._stopping.wait(started + gap - time.monotonic())

    def _round(self) -> int:
        try:
            done = self.task(self._factory, self._settings)
        except OperationalError as exc:
            # The database is away: say so once (and again only during a long outage), keep
            # trying every interval.
            now = time.monotonic()
            if self._db_down_since is None or now - self._last_db_warning >= DB_WARNING_EVERY_S:
                self._db_down_since = self._db_down_since or now
                self._last_db_warning = now
                log.warning(
                    "worker task %s: database unavailable (retrying every %g s): %s",
                    self.task.__name__,
                    self._settings.worker_interval_s,
                    str(exc).splitlines()[0],
                )
            return 0
        except Exception:
            log.exception("worker task %s failed; retrying next round", self.task.__name__)
            return 0
        if self._db_down_since is not None:
            log.warning(
                "worker task %s: database back after %.0f s",
                self.task.__name__,
                time.monotonic() - self._db_down_since,
            )
            self._db_down_since = None
        return done


class Worker:
    """Runs each of ``tasks`` on its own daemon thread.

    Args:
        factory: sessions for the tasks.
        settings: the service's settings (intervals, the wake-up gap).
        tasks: every task, each on its own thread.
        on_new_data: the tasks :meth:`notify` wakes early (default: every task).
        follow_ups: for a task, the tasks to wake after each of its rounds that did work.
    """

    def __init__(
        self,
        factory: sessionmaker[Session],
        settings: Settings,
        tasks: Sequence[Task],
        *,
        on_new_data: Sequence[Task] | None = None,
        follow_ups: Mapping[Task, Sequence[Task]] | None = None,
    ) -> None:
        self._stopping = threading.Event()
        self._threads = [_TaskThread(t, factory, settings, self._stopping) for t in tasks]
        by_task = {t.task: t for t in self._threads}
        unknown = [t for t in (*(on_new_data or ()), *(follow_ups or {}),
                               *(f for fs in (follow_ups or {}).values() for f in fs))
                   if t not in by_task]
        if unknown:
            raise ValueError(f"not one of the worker's tasks: {unknown[0]!r}")
        self._on_new_data = ([by_task[t] for t in on_new_data] if on_new_data is not None
                             else list(self._threads))
        for task, woken in (follow_ups or {}).items():
            by_task[task].follow_ups = [by_task[t] for t in woken]

    def start(self) -> None:
        """Start every task's thread."""
        for t in self._threads:
            t.thread.start()

    def notify(self) -> None:
        """New data arrived: the tasks that act on it run a round soon instead of at the next
        interval."""
        _wake(self._on_new_data)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask every thread to finish its round, and wait for them (``timeout`` in all)."""
        self._stopping.set()
        _wake(self._threads)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t.thread.is_alive():
                t.thread.join(max(0.0, deadline - time.monotonic()))


def _wake(threads: Sequence[_TaskThread]) -> None:
    for t in threads:
        t.wake.set()
