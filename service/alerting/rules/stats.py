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


def rolling_median(
    steps: IntArray, values: FloatArray, window: int, at: IntArray | None = None
) -> FloatArray:
    """Median of the finite values with step in ``(s - window, s]`` for each ``s`` in ``at``
    (default: every step), NaN where there is none.

    A regular series (constant stride) is done in one vectorised pass; an irregular one with
    a loop over the points asked for.
    """
    if at is None:
        at = steps
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
        for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
            if b - a > MEDIAN_SAMPLE:
                out[i] = np.nanmedian(values[np.linspace(a, b - 1, MEDIAN_SAMPLE).astype(int)])
            elif b > a:
                out[i] = np.nanmedian(values[a:b])
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
