"""The raw points of series this process reads whole again and again, kept between reads so
that the next read asks the database only for the steps logged since.

Two readers share it. A refit fits a series' raw points while it spans at most
``refits.RAW_READ_LIMIT`` steps; read whole every round, that read grew with the run: a run
logging many steps a second had its whole history read every few seconds to add a few hundred
points. And on SQLite a downsampled read whose buckets are narrower than a rollup block (a chart
or a script asking 2,000 buckets of a run of a few thousand steps) reads the raw points, which
SQLite hands over one row at a time.

What it checks: the points held plus the new ones must be as many as the series' rollups count,
counted *after* the new points were read (points are only added while a run exists, so a count
taken later can only be larger: a point stored late, with a step the cache already covers, or
one stored between the two reads, makes the numbers differ). Anything else reads the series
whole, so a reader sees exactly what a fresh read would. Points are held under the run's id
*and creation time*: a run deleted and created again under the same id (whose series SQLite may
give the old ids) starts afresh even where the counts happen to agree. Memory is bounded
(:data:`MAX_POINTS` in all, least recently used series dropped first), per database engine,
thread-safe.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import text
from sqlalchemy.orm import Session

from curvecast.service.bounded_cache import BoundedLRU, PerEngine
from curvecast.service.store._common import series_points
from curvecast.service.store.rollups import ROLLUP_WIDTHS

__all__ = ["HOLD_LIMIT", "MAX_POINTS", "HeldPoints", "held_points", "stored_count"]

#: Points held in all, per engine (two 8-byte columns: ~32 MB).
MAX_POINTS = 2_000_000
#: The longest series a downsampled read holds (a refit holds what it reads raw:
#: ``refits.RAW_READ_LIMIT`` steps).
HOLD_LIMIT = 20_000

Points = tuple[NDArray[np.int64], NDArray[np.float64]]

#: A series' point count: one small row per 524,288 steps at the coarsest rollup level.
_COUNT_SQL = text(
    "SELECT sum(n) FROM metric_rollups WHERE series_id = :sid AND level = :level"
)


class HeldPoints:
    """Every point of a series (NaN where a NaN was logged), by step, read incrementally."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self._caches: PerEngine[BoundedLRU[tuple[Hashable, int], Points]] = PerEngine(
            lambda: BoundedLRU(max_points, weight=lambda points: int(points[0].size)))
        #: Reads answered from what was held plus the new steps / read whole (diagnostics).
        self.hits = 0
        self.misses = 0

    def update(self, session: Session, run: Hashable, sid: int
               ) -> tuple[Points | None, int | None]:
        """The points held of series ``sid`` of ``run`` (what tells the run apart from a
        deleted one of the same id: its id and creation time) and the steps stored after them,
        or None when nothing is held or the count disagrees (read the series whole, then
        :meth:`keep` it). What was held is released either way: :meth:`keep` what is used.

        Returns:
            The points (or None), and the series' count where this read it (None where
            nothing was held): a caller that needs the count after a miss need not ask again.
        """
        held = self._caches.of(session).take((run, sid))
        if held is None or not held[0].size:
            self.misses += 1
            return None, None
        new_steps, new_values = series_points(session, series_id=sid, lo=int(held[0][-1]) + 1)
        count = stored_count(session, sid)
        if held[0].size + new_steps.size != count:
            self.misses += 1
            return None, count
        self.hits += 1
        return (np.concatenate((held[0], new_steps)), np.concatenate((held[1], new_values))), count

    def keep(self, session: Session, run: Hashable, sid: int, points: Points) -> None:
        """Hold ``points`` (every point of the series, NaN included, by step) for the next
        :meth:`update`, dropping the least recently used series beyond the bound."""
        self._caches.of(session).put((run, sid), points)


def stored_count(session: Session, sid: int) -> int:
    """How many points series ``sid`` has, from its rollups (kept in the points' transaction)."""
    n = session.execute(_COUNT_SQL, {"sid": sid, "level": len(ROLLUP_WIDTHS) - 1}).scalar()
    return int(n or 0)


#: The process's held points (refits and SQLite's raw-bucket reads share them).
held_points = HeldPoints()
