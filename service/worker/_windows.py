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

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from curvecast.service.bounded_cache import BoundedLRU

__all__ = ["MAX_POINTS", "ManyReader", "Points", "SeriesWindows"]

#: Points kept in all (two float64 columns: ~32 MB).
MAX_POINTS = 2_000_000

Points = tuple[NDArray[np.int64], NDArray[np.float64]]
#: ``read({series_id: (lo, hi)})``: each series' points in its range, by step (a series with
#: none may be left out).
ManyReader = Callable[[dict[int, tuple[int, int]]], dict[int, Points]]


@dataclass
class _Window:
    lo: int  # the points held are every stored point with lo <= step <= hi (as read then)
    hi: int
    steps: NDArray[np.int64]
    values: NDArray[np.float64]


class SeriesWindows:
    """Recent points per (run, series), read incrementally. Thread-safe."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self._windows: BoundedLRU[tuple[uuid.UUID, int], _Window] = BoundedLRU(
            max_points, weight=lambda window: int(window.steps.size))

    @property
    def held_points(self) -> int:
        """Points held in all."""
        return self._windows.total_weight

    def points_many(self, run_id: uuid.UUID, los: Mapping[int, int], hi: int, read: ManyReader,
                    *, fresh: bool = False) -> dict[int, Points]:
        """The points of each series ``sid`` of ``los`` with ``los[sid] <= step <= hi``.

        Reads from the database only the steps after what the previous call for a series
        returned; its whole range when there is none, when ``fresh``, or when the range starts
        earlier or ends earlier than before (a rule looking further back, a run that started
        over). Every series' read goes to one ``read`` call (one statement on PostgreSQL).
        """
        held: dict[int, _Window | None] = {sid: self._windows.take((run_id, sid)) for sid in los}
        ranges: dict[int, tuple[int, int]] = {}
        for sid, lo in los.items():
            window = held[sid]
            if fresh or window is None or window.lo > lo or window.hi > hi:
                held[sid] = None
                ranges[sid] = (lo, hi)
            elif hi > window.hi:
                ranges[sid] = (window.hi + 1, hi)
        fetched = read(ranges) if ranges else {}
        out: dict[int, Points] = {}
        for sid, lo in los.items():
            new_steps, new_values = fetched.get(sid) or _empty()
            window = held[sid]
            if window is None:
                steps, values = new_steps, new_values
            else:
                keep = window.steps >= lo
                steps = np.concatenate((window.steps[keep], new_steps))
                values = np.concatenate((window.values[keep], new_values))
            out[sid] = steps, values
        self._windows.put_many(((run_id, sid), _Window(lo, hi, *out[sid]))
                               for sid, lo in los.items())
        return out


def _empty() -> Points:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
