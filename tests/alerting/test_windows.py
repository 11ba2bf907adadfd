"""The alert worker's per-series memory: each round reads only the steps after the previous
round's, returns exactly what a full read would, and stays within its bound."""

from __future__ import annotations

import uuid

import numpy as np

from curvecast.service.worker._windows import SeriesWindows


class Store:
    """A series in memory that records every read asked of it."""

    def __init__(self, n: int) -> None:
        self.steps = np.arange(n, dtype=np.int64) * 2  # a point every other step
        self.values = np.sin(self.steps / 100.0)
        self.reads: list[tuple[int, int]] = []

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        self.reads.append((lo, hi))
        m = (self.steps >= lo) & (self.steps <= hi)
        return self.steps[m], self.values[m]


def points(windows: SeriesWindows, run: uuid.UUID, sid: int, lo: int, hi: int, store: Store,
           *, fresh: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """One series' window, its reads going to ``store``."""
    def read_many(ranges: dict[int, tuple[int, int]]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        return {key: store.read(*bounds) for key, bounds in ranges.items()}

    return windows.points_many(run, {sid: lo}, hi, read_many, fresh=fresh)[sid]


def test_rounds_read_only_what_is_new_and_see_what_a_full_read_sees() -> None:
    store, truth, windows, run = Store(10_000), Store(10_000), SeriesWindows(), uuid.uuid4()
    for lo, hi in ((0, 3000), (200, 3400), (1000, 3401), (1000, 3401), (3000, 9000)):
        steps, values = points(windows, run, 7, lo, hi, store)
        want_steps, want_values = truth.read(lo, hi)
        np.testing.assert_array_equal(steps, want_steps)
        np.testing.assert_array_equal(values, want_values)
    # The first round reads its range; later ones only the steps after the previous round's
    # (nothing at all when no step is new).
    assert store.reads == [(0, 3000), (3001, 3400), (3401, 3401), (3402, 9000)]


def test_fresh_state_an_earlier_start_or_a_shorter_run_read_everything_again() -> None:
    store, windows, run = Store(5_000), SeriesWindows(), uuid.uuid4()
    points(windows, run, 1, 500, 4000, store)
    points(windows, run, 1, 500, 4200, store, fresh=True)
    points(windows, run, 1, 100, 4300, store)  # a rule now looks further back
    points(windows, run, 1, 200, 3000, store)  # the run started over (fewer steps)
    assert store.reads == [(500, 4000), (500, 4200), (100, 4300), (200, 3000)]
    other = uuid.uuid4()  # another run's series with the same id is its own window
    points(windows, other, 1, 500, 4000, store)
    assert store.reads[-1] == (500, 4000)


def test_memory_stays_within_its_bound() -> None:
    store, windows = Store(2_000), SeriesWindows(max_points=3_000)
    runs = [uuid.uuid4() for _ in range(5)]
    for run in runs:
        points(windows, run, 1, 0, 3998, store)  # 2,000 points each
    assert windows.held_points <= 3_000
    before = len(store.reads)
    points(windows, runs[-1], 1, 0, 3998, store)  # the newest one is still held
    assert len(store.reads) == before
    points(windows, runs[0], 1, 0, 3998, store)  # the oldest was dropped: read again
    assert store.reads[-1] == (0, 3998)


def test_several_series_are_read_in_one_call_each_from_where_it_was_left() -> None:
    stores = {1: Store(3_000), 2: Store(3_000)}
    windows, run, calls = SeriesWindows(), uuid.uuid4(), []

    def read_many(ranges: dict[int, tuple[int, int]]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        calls.append(dict(ranges))
        return {sid: stores[sid].read(*bounds) for sid, bounds in ranges.items()}

    windows.points_many(run, {1: 0, 2: 100}, 1000, read_many)
    got = windows.points_many(run, {1: 0, 2: 50}, 2000, read_many)  # series 2 looks further back
    assert calls == [{1: (0, 1000), 2: (100, 1000)}, {1: (1001, 2000), 2: (50, 2000)}]
    for sid, lo in ((1, 0), (2, 50)):
        want = Store(3_000).read(lo, 2000)
        np.testing.assert_array_equal(got[sid][0], want[0])
        np.testing.assert_array_equal(got[sid][1], want[1])
    assert windows.points_many(run, {1: 0, 2: 50}, 2000, read_many)[1][0].size == 1001
    assert len(calls) == 2  # nothing new: no read at all
