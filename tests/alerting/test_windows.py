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


def test_rounds_read_only_what_is_new_and_see_what_a_full_read_sees() -> None:
    store, truth, windows, run = Store(10_000), Store(10_000), SeriesWindows(), uuid.uuid4()
    for lo, hi in ((0, 3000), (200, 3400), (1000, 3401), (1000, 3401), (3000, 9000)):
        steps, values = windows.points(run, 7, lo, hi, store.read)
        want_steps, want_values = truth.read(lo, hi)
        np.testing.assert_array_equal(steps, want_steps)
        np.testing.assert_array_equal(values, want_values)
    # The first round reads its range; later ones only the steps after the previous round's
    # (nothing at all when no step is new).
    assert store.reads == [(0, 3000), (3001, 3400), (3401, 3401), (3402, 9000)]


def test_fresh_state_an_earlier_start_or_a_shorter_run_read_everything_again() -> None:
    store, windows, run = Store(5_000), SeriesWindows(), uuid.uuid4()
    windows.points(run, 1, 500, 4000, store.read)
    windows.points(run, 1, 500, 4200, store.read, fresh=True)
    windows.points(run, 1, 100, 4300, store.read)  # a rule now looks further back
    windows.points(run, 1, 200, 3000, store.read)  # the run started over (fewer steps)
    assert store.reads == [(500, 4000), (500, 4200), (100, 4300), (200, 3000)]
    other = uuid.uuid4()  # another run's series with the same id is its own window
    windows.points(other, 1, 500, 4000, store.read)
    assert store.reads[-1] == (500, 4000)


def test_memory_stays_within_its_bound() -> None:
    store, windows = Store(2_000), SeriesWindows(max_points=3_000)
    runs = [uuid.uuid4() for _ in range(5)]
    for run in runs:
        windows.points(run, 1, 0, 3998, store.read)  # 2,000 points each
    assert windows._held <= 3_000
    before = len(store.reads)
    windows.points(runs[-1], 1, 0, 3998, store.read)  # the newest one is still held
    assert len(store.reads) == before
    windows.points(runs[0], 1, 0, 3998, store.read)  # the oldest was dropped: read again
    assert store.reads[-1] == (0, 3998)
