"""Worker task: apply the retention setting (``CURVECAST_RETENTION_DAYS``).

Runs that ended (``finished``, ``failed``, ``crashed``, ``lost``) more than the configured
number of days ago are deleted with everything of theirs, in the same small batches as ``DELETE
/api/v1/runs/{id}`` (:func:`curvecast.service.store.retention.delete_run`). Without the setting
nothing is ever deleted. Deleting is idempotent, so several service processes may run this at
once (at worst they share the batches of one run), and a deletion cut off by a restart is
finished on the next round: the half-deleted run still matches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.store import retention
from curvecast.service.store._common import utcnow

log = logging.getLogger(__name__)

#: Runs deleted per round (a round ends between runs, so the thread stops promptly).
RUNS_PER_ROUND = 4
#: How often expired runs are looked for.
CHECK_INTERVAL_S = 300.0


def delete_expired_runs(
    factory: sessionmaker[Session], settings: Settings, *, now: datetime | None = None
) -> int:
    """One round: delete up to :data:`RUNS_PER_ROUND` expired runs. Returns how many."""
    if settings.retention_days is None:
        return 0
    with session_scope(factory) as session:
        expired = retention.expired_runs(
            session, now=now or utcnow(), older_than=timedelta(days=settings.retention_days),
            limit=RUNS_PER_ROUND,
        )
    for run_id in expired:
        deleted = retention.delete_run(factory, run_id)
        log.info("retention: deleted run %s (%d rows)", run_id, deleted.total)
    return len(expired)


class RetentionTask:
    """The worker's task: :func:`delete_expired_runs` every :data:`CHECK_INTERVAL_S`, and
    round after round while it finds runs to delete.

    Args:
        clock: monotonic clock deciding when the next check is due.
    """

    __name__ = "delete_expired_runs"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._next = 0.0

    def __call__(self, factory: sessionmaker[Session], settings: Settings) -> int:
        if settings.retention_days is None or self._clock() < self._next:
            return 0
        done = delete_expired_runs(factory, settings)
        if done == 0:
            self._next = self._clock() + CHECK_INTERVAL_S
        return done
