"""Cleaning and binning a loss series before a fit (numpy only).

:func:`clean_series` keeps finite (step, loss) pairs sorted by step; :func:`bin_series` reduces a
long series to at most ``max_bins`` equal-count bins (median loss per bin), so a refit costs the
same for 10^3 or 10^6 raw points.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from curvecast.service.forecast.curve import FloatArray

__all__ = ["DEFAULT_MAX_BINS", "BinnedSeries", "bin_series", "bin_sorted", "clean_series"]

DEFAULT_MAX_BINS: Final = 400  # the profile scan costs O(grid * bins); 400 bins keep a fit ~ms
_MEDIAN_SAMPLE: Final = 512  # bin medians use at most this many evenly spread points per bin


@dataclass(frozen=True)
class BinnedSeries:
    """Output of :func:`bin_series`: per-bin step centre, median loss and raw point count."""

    steps: FloatArray
    values: FloatArray
    counts: NDArray[np.int64]



def bin_series(steps: ArrayLike, values: ArrayLike, max_bins: int = DEFAULT_MAX_BINS
               ) -> BinnedSeries:
    """Reduce a long series to at most ``max_bins`` equal-count bins.

    Each bin reports the mean step of its points, the median loss (robust to spikes) and the
    number of points. Non-finite pairs are dropped; unsorted input is sorted first. Series with at
    most ``max_bins`` points come back one point per bin. Never raises on bad input (returns an
    empty series).

    Equal-count bins (rather than equal-width) let the bulk of the work be one ``reshape`` and one
    ``np.median(axis=1)`` (a partition, O(n)); for evenly logged runs they are equal-width too.

    Args:
        steps: training steps.
        values: losses, same length as ``steps``.
        max_bins: upper bound on the number of bins (at least 1).

    Returns:
        A :class:`BinnedSeries`.
    """
    t, y = clean_series(steps, values)
    return bin_sorted(t, y, max_bins)


def bin_sorted(t: FloatArray, y: FloatArray, max_bins: int) -> BinnedSeries:
    """:func:`bin_series` on data already cleaned and sorted by step."""
    n = t.size
    nb = max(int(max_bins), 1)
    if n <= nb:
        return BinnedSeries(t, y, np.ones(n, dtype=np.int64))
    size = n // nb
    n_big = n - size * nb  # this many bins take one extra point
    n_small = nb - n_big
    cut = n_small * size
    parts_t = [t[:cut].reshape(n_small, size)]
    parts_y = [y[:cut].reshape(n_small, size)]
    counts = [np.full(n_small, size, dtype=np.int64)]
    if n_big:
        parts_t.append(t[cut:].reshape(n_big, size + 1))
        parts_y.append(y[cut:].reshape(n_big, size + 1))
        counts.append(np.full(n_big, size + 1, dtype=np.int64))
    bt = np.concatenate([p.mean(axis=1) for p in parts_t])
    by = np.concatenate([_bin_medians(p) for p in parts_y])
    return BinnedSeries(bt, by, np.concatenate(counts))


def _bin_medians(block: FloatArray) -> FloatArray:
    """Row medians; rows longer than ``_MEDIAN_SAMPLE`` use an evenly strided subsample.

    The median of 512 evenly spread points of a bin is within ~0.06 noise standard deviations of
    the full bin's median, and it keeps binning 10^6 points at a few milliseconds.
    """
    size = block.shape[1]
    if size > _MEDIAN_SAMPLE:
        block = block[:, :: -(-size // _MEDIAN_SAMPLE)]
    out: FloatArray = np.median(block, axis=1)
    return out


def clean_series(steps: ArrayLike, values: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Finite (step, value) pairs as float arrays sorted by step; empty on malformed input."""
    try:
        t = np.asarray(steps, dtype=np.float64).ravel()
        y = np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        return np.empty(0), np.empty(0)
    if t.size != y.size:
        m = min(t.size, y.size)
        t, y = t[:m], y[:m]
    ok = np.isfinite(t) & np.isfinite(y)
    if not ok.all():
        t, y = t[ok], y[ok]
    if t.size > 1 and np.any(t[1:] < t[:-1]):
        order = np.argsort(t, kind="stable")
        t, y = t[order], y[order]
    return t, y

