"""The loss a series "reached" at a step it got to: the ONE rule, pure (numpy only, no I/O).

The loss a run reached at a step is its series smoothed there, so one noisy training batch is
not "the final loss". The forecast answers give it beside the forecast for that step
(``PredictionOut.reached``), the pages call it "train loss reached", and a fit's ``reached``
pairs end with it. Every caller applies the same rule from where its points are:

* :func:`loss_reached` -- over the points at hand (the offline CLI, the demo's terminal);
* :func:`smoothed_reached` -- from a series' latest points, newest first (the store reads those
  from the database with one statement and hands them over);
* :data:`ReachedReader` -- how the answer builders ask for it, whoever reads the points;
* :func:`reached_pairs` -- where a fitted series' smoothed running minimum fell, ending with
  the rule's loss at its last step (a fit's ``reached``: targets the data passed are answered
  from it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np
from numpy.typing import ArrayLike

from curvecast.service.forecast.binning import bin_sorted
from curvecast.service.forecast.curve import FloatArray

__all__ = [
    "REACHED_MAX_POINTS",
    "REACHED_WINDOW",
    "ReachedReader",
    "loss_reached",
    "reached_pairs",
    "smoothed_reached",
]

#: Reads the loss a run had for series ``key`` (None: the one at hand) at ``step`` once it
#: got there (:func:`smoothed_reached`), else None: :func:`loss_reached` over the points at
#: hand, or the store's over the database. The answer builders call it for the horizon they
#: resolve, so no caller resolves it again.
ReachedReader = Callable[[str | None, int], float | None]

#: The loss a run "reached" at a step is its series smoothed there: the median of the points
#: logged over the last ``REACHED_WINDOW`` of the steps up to it (as the target answers'
#: smoothing: medians over ~1% of a run), so one noisy training batch is not "the final loss".
#: A sparse series (an eval every few percent) has one point there: its value is that point.
REACHED_WINDOW: Final = 0.01
#: ... at most this many of them, the latest (a dense series' window stays a cheap read).
REACHED_MAX_POINTS: Final = 256
_REACHED_BINS: Final = 256  # a fit's running minimum is kept at this resolution ...
_REACHED_SMOOTH: Final = 3  # ... of medians of this many consecutive bins


def smoothed_reached(latest: Sequence[tuple[float, float]], step: float) -> float | None:
    """The loss a series had at ``step`` (:data:`REACHED_WINDOW`'s rule), from its latest
    points at or before ``step``, newest first (at least the :data:`REACHED_MAX_POINTS` latest
    of them, or all there are).

    The median of the finite values over ``(step * (1 - REACHED_WINDOW), step]``, or, where no
    point falls there, the newest point alone. None with no point, or where the newest is NaN
    or infinite (the series has no loss there: it diverged).
    """
    if not latest or not math.isfinite(latest[0][1]):
        return None
    start = step * (1.0 - REACHED_WINDOW)
    window = [v for s, v in latest[:REACHED_MAX_POINTS] if s > start and math.isfinite(v)]
    return float(np.median(window)) if len(window) > 1 else latest[0][1]


def loss_reached(steps: ArrayLike, values: ArrayLike, step: float) -> float | None:
    """The loss a series had at ``step`` once it got there (:func:`smoothed_reached`),
    provided it has a point at or after ``step``; else None.

    The offline CLI reads it from the points it fits; the store reads the same from the
    database (``store.forecasts.loss_reached``).
    """
    t = np.asarray(steps, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if t.size == 0 or t.max() < step:
        return None
    before = np.flatnonzero(t <= step)
    newest = before[np.argsort(-t[before], kind="stable")[:REACHED_MAX_POINTS]]
    return smoothed_reached(list(zip(t[newest].tolist(), y[newest].tolist(), strict=True)),
                            step)


def reached_pairs(t: FloatArray, y: FloatArray) -> tuple[tuple[float, float], ...] | None:
    """``((step, loss), ...)``: where the smoothed series' running minimum fell.

    Medians of equal-count bins, then the median of each window of three bins (one low eval
    batch does not count as reaching a target), then the running minimum, kept at the steps it
    fell: at most ~256 pairs per fit. The last step ends it with the loss the series had there
    by :func:`smoothed_reached`'s rule, where that is lower.
    """
    if t.size == 0:
        return None
    binned = bin_sorted(t, y, _REACHED_BINS)
    # Each bin stands at its last step, a logged one: its median is known there, not at the
    # bin's mean step (which read as "reached at step 1180.5", half a bin before the data).
    bt, by = t[np.cumsum(binned.counts) - 1], binned.values
    k = min(_REACHED_SMOOTH, by.size)
    if k > 1:
        if k == 3:  # the median of three, elementwise (np.median's machinery costs more)
            p, q, r = by[:-2], by[1:-1], by[2:]
            by = np.maximum(np.minimum(p, q), np.minimum(np.maximum(p, q), r))
        else:
            by = np.median(np.lib.stride_tricks.sliding_window_view(by, k), axis=1)
        bt = bt[k - 1:]  # a window's value is known at its last bin's last step
    low = np.minimum.accumulate(by)
    fell = np.concatenate(([True], low[1:] < low[:-1]))
    pairs = list(zip(bt[fell].tolist(), low[fell].tolist(), strict=True))
    # The last step by the rule of the loss "reached there" (prediction.reached): the three-bin
    # median lags the newest points, so at a run's end a loss the answers call "reached there"
    # would otherwise be a target "not reached".
    # The series is sorted by step: its newest points are its tail, newest first (no second
    # sort of a long series, as loss_reached needs for points in any order).
    newest = zip(t[:-REACHED_MAX_POINTS - 1:-1].tolist(), y[:-REACHED_MAX_POINTS - 1:-1].tolist(),
                 strict=True)
    last = smoothed_reached(list(newest), float(t[-1]))
    if last is not None and last < pairs[-1][1]:
        pairs.append((float(t[-1]), last))
    return tuple(pairs)
