"""Worker task: mark ``lost`` the runs whose client is gone.

A trainer killed by SIGKILL, the OOM killer or a lost node never reports a final status, so its
run would stay ``running`` forever, and be compared and forecast as if it were training. A live
client is never silent for long: it sends points, and while it has nothing to send, a heartbeat
(an empty ``PATCH``) every minute. A ``running`` run whose client sent no points and made no
request for ``client_gone_after_s`` (default 4 minutes: four missed heartbeats) is marked
``lost`` (the contract's ``LOST_RUN_STATUS``) with a reason that says so; checked every minute
at most, a silent run leaves ``running`` within 5 minutes of its last contact. If its client
comes back (points, a heartbeat, any request), the run is ``running`` again
(``store/runs.revive_values``). The ``stalled`` alert still fires for a lost run that stays
silent for ``stalled_after_s``: on-call hears of a run that died without a word.

The check is one conditional ``UPDATE`` (after a read that usually finds nothing), so any
number of service processes may run it at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.store import runs as run_store
from curvecast.service.store._common import utcnow

#: The longest pause between two checks (shorter when the threshold is short, e.g. in tests).
MAX_CHECK_INTERVAL_S = 60.0


def mark_silent_runs(
    factory: sessionmaker[Session], settings: Settings, *, now: datetime | None = None
) -> int:
    """One check: mark ``lost`` every running run whose client is gone (see the module).

    Args:
        factory: session factory.
        settings: ``client_gone_after_s``.
        now: the current time (tests pass a later one instead of waiting).

    Returns:
        How many runs were marked.
    """
    at = now or utcnow()
    gone = settings.client_gone_after_s
    # Two transactions: a read that usually finds nothing, then (rarely) the write.
    with session_scope(factory) as session:
        if not run_store.silent_runs_exist(session, now=at, client_gone_after_s=gone):
            return 0
    with session_scope(factory) as session:
        return run_store.mark_silent_runs_lost(session, now=at, client_gone_after_s=gone)


class LivenessTask:
    """The worker's task: :func:`mark_silent_runs`, at most every ``min(60 s, threshold / 4)``
    (the worker polls it every ``worker_interval_s``; this check has no reason to run that often).

    The first check waits one such interval after start: a service that was down could not
    hear its clients, which retry at least every 30 s (and send a heartbeat once they get
    through), so they get the time to reconnect before anyone is judged.

    Args:
        clock: monotonic clock deciding when the next check is due.
    """

    __name__ = "mark_silent_runs"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._next: float | None = None

    def __call__(self, factory: sessionmaker[Session], settings: Settings) -> int:
        now = self._clock()
        every = min(MAX_CHECK_INTERVAL_S, settings.client_gone_after_s / 4)
        if self._next is None:
            self._next = now + every
        if now < self._next:
            return 0
        self._next = now + every
        # Marking is not "work found": the worker loop must not spin on it.
        mark_silent_runs(factory, settings)
        return 0
