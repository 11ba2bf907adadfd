"""The statistics the rules share: rolling medians and means over step windows, and logs of
positive series. Pure numpy.

Windows are in steps, not points: ``(s - window, s]``. A run may log a statistic every step
or every tenth, and a window means the same stretch of training either way.
"""

from __future__ import annotations

import warnings

import numpy as np

from curvecast.service.alerting.rules.framework import FloatArray, IntArray

#: A window's median is taken over at most this many evenly spread points.
MEDIAN_SAMPLE = 256
#: Windows reduced per numpy call (bounds the temporary array: 4096 x 256 floats = 8 MiB).
_ROWS_PER_CALL = 4096
#: A median over W steps is taken on a grid of W / 16 steps (:func:`coarse`): it moves by a
#: sixteenth of its window at most between grid points, and the long windows (references of
#: hundreds of steps, judged at every new step) were most of an alert round's CPU.
GRID_PER_WINDOW = 16


def coarse(window: int) -> int:
    """The grid a median over ``window`` steps may be taken on (1: every step, for windows
    under ``2 * GRID_PER_WINDOW`` steps)."""
    return max(1, int(window) // GRID_PER_WINDOW)


def rolling_median(
    steps: IntArray, values: FloatArray, window: int, at: IntArray | None = None,
    *, resolution: int = 1,
) -> FloatArray:
    """Median of the finite values with step in ``(s - window, s]`` for each ``s`` in ``at``
    (default: every step), NaN where there is none.

    With ``resolution`` r > 1 each ``s`` takes the median at the grid point ``r * (s // r)``
    at or before it (computed once per grid point; the grid is the same whatever steps are
    asked, so the answer for a step does not depend on how a run's points arrived).

    A regular series (constant stride) is done in one vectorised pass; an irregular one with
    a loop over the points asked for.
    """
    if at is None:
        at = steps
    if resolution > 1 and at.size:
        cells, inverse = np.unique((at // resolution) * resolution, return_inverse=True)
        return rolling_median(steps, values, window, cells)[inverse.ravel()]
    out = np.full(at.size, np.nan)
    if steps.size == 0 or at.size == 0:
        return out
    window = max(int(window), 1)
    if steps.size > 2:
        stride = np.diff(steps)
        regular = bool(np.all(stride == stride[0]))
    else:
        regular = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows give NaN: wanted
        if regular and at is steps:
            k = max(1, min(steps.size, -(-window // int(stride[0]))))
            padded = np.concatenate((np.full(k - 1, np.nan), values))
            windows = np.lib.stride_tricks.sliding_window_view(padded, k)
            return np.asarray(np.nanmedian(windows, axis=1), dtype=np.float64)
        hi = np.searchsorted(steps, at, side="right")
        lo = np.searchsorted(steps, at - window, side="right")
        # Windows of equal length (all but a few at the series' start, in a regular series)
        # are gathered into one 2-D array and reduced in one call, a block of rows at a time:
        # a median per asked step was most of an alert round's CPU.
        lengths = hi - lo
        for length in np.unique(lengths).tolist():
            if length <= 0:
                continue
            rows = np.flatnonzero(lengths == length)
            for block in range(0, rows.size, _ROWS_PER_CALL):
                part = rows[block:block + _ROWS_PER_CALL]
                start = lo[part]
                if length > MEDIAN_SAMPLE:
                    index = np.linspace(start, start + length - 1, MEDIAN_SAMPLE,
                                        axis=1).astype(int)
                else:
                    index = start[:, None] + np.arange(length)
                out[part] = _row_nanmedians(values[index])
    return out


def _row_nanmedians(block: FloatArray) -> FloatArray:
    """``np.nanmedian(block, axis=1)``, exactly, without numpy's masked-array path for short
    rows (most of a round's CPU): a sort puts the NaN last, and each row's median is read off
    at its own count of finite values (the mean of the two middle ones for an even count)."""
    ordered = np.sort(block, axis=1)
    count = np.count_nonzero(~np.isnan(block), axis=1)
    rows = np.arange(block.shape[0])
    low = ordered[rows, np.maximum(count - 1, 0) // 2]
    high = ordered[rows, np.minimum(count // 2, block.shape[1] - 1)]
    with np.errstate(invalid="ignore", over="ignore"):
        middle = np.where(count % 2 == 1, low, (low + high) / 2)
    out: FloatArray = np.where(count > 0, middle, np.nan)
    return out


def rolling_mean(steps: IntArray, values: FloatArray, window: int, at: IntArray) -> FloatArray:
    """Mean of the finite values with step in ``(s - window, s]`` for each ``s`` in ``at``."""
    finite = np.isfinite(values)
    csum = np.concatenate(([0.0], np.cumsum(np.where(finite, values, 0.0))))
    ccount = np.concatenate(([0], np.cumsum(finite)))
    hi = np.searchsorted(steps, at, side="right")
    lo = np.searchsorted(steps, at - max(int(window), 1), side="right")
    n = ccount[hi] - ccount[lo]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (csum[hi] - csum[lo]) / n
    return np.where(n > 0, out, np.nan)


def log_positive(values: FloatArray) -> FloatArray:
    """``log(values)``, NaN where a value is not positive and finite (norms and step sizes
    are multiplicative: a drift is a ratio, and ratios are differences of logs)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(values)
    out[~np.isfinite(out)] = np.nan
    return out
