"""The alert worker's memory of each series' recent points, so a round reads only what is new.

Every alert round judges a run's new steps against windows of the steps before them (a rule's
lookback: its smoothing window and reference stretch, hundreds to thousands of steps). Read from
the database each round, that lookback was most of a round's cost, and it does not shrink when
rounds come often: a run logging 100 steps a second had its last ~3,000 steps of each watched
series read every second to judge 100 new ones. :class:`SeriesWindows` keeps what the last round
read of each series and asks the database only for the steps after it.

What it trusts: points arrive in step order (the client hook sends them so; a point stored later
with a step the cache already covers is not seen by the rules' reference windows -- the new
points themselves are always read). Several worker processes may take turns on a run: each reads
whatever came since *its* last read. A run evaluated afresh (a new evaluation state, as after a
deletion) is read whole. Memory is bounded (:data:`MAX_POINTS` in all, least recently used
series dropped first).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["MAX_POINTS", "SeriesWindows"]

#: Points kept in all (two float64 columns: ~32 MB).
MAX_POINTS = 2_000_000

Points = tuple[NDArray[np.int64], NDArray[np.float64]]
#: ``read(lo, hi)``: the series' points with ``lo <= step <= hi``, by step.
Reader = Callable[[int, int], Points]


@dataclass
class _Window:
    lo: int  # the points held are every stored point with lo <= step <= hi (as read then)
    hi: int
    steps: NDArray[np.int64]
    values: NDArray[np.float64]


class SeriesWindows:
    """Recent points per (run, series), read incrementally. Thread-safe."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self._max_points = max_points
        self._windows: OrderedDict[tuple[uuid.UUID, int], _Window] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def points(self, run_id: uuid.UUID, series_id: int, lo: int, hi: int, read: Reader, *,
               fresh: bool = False) -> Points:
        """The points of the series with ``lo <= step <= hi``.

        Reads from the database (``read``) only the steps after what the previous call for this
        series returned; the whole range when there is none, when ``fresh``, or when the range
        starts earlier or ends earlier than before (a rule looking further back, a run that
        started over).
        """
        key = (run_id, series_id)
        with self._lock:
            held = self._windows.pop(key, None)
            if held is not None:
                self._held -= held.steps.size
        if fresh or held is None or held.lo > lo or held.hi > hi:
            steps, values = read(lo, hi)
        else:
            new_steps, new_values = read(held.hi + 1, hi) if hi > held.hi else _empty()
            keep = held.steps >= lo
            steps = np.concatenate((held.steps[keep], new_steps))
            values = np.concatenate((held.values[keep], new_values))
        with self._lock:
            self._windows[key] = _Window(lo, hi, steps, values)
            self._held += steps.size
            while self._held > self._max_points and len(self._windows) > 1:
                _, dropped = self._windows.popitem(last=False)
                self._held -= dropped.steps.size
        return steps, values


def _empty() -> Points:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
