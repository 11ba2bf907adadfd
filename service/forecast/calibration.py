"""Interval calibration constants for the forecast (pure data + interpolation, no I/O).

The blocks between the ``BEGIN/END GENERATED`` markers are written by
``python -m bench run forecast_calibrate`` from the curve corpora; do not edit them by hand.

How the constants are used (docs/forecast.md, "Intervals"): for a forecast ``y_hat(t)`` the
fit computes a scale ``S(t) = sqrt(SE_FACTOR * se(t)^2 + sigma^2 + (DECAY_FACTOR * drop(t))^2)``
(delta-method variance, residual scale, and the predicted remaining decay since the last fitted
step).
The interval is ``[y_hat + z_lo * S, y_hat + z_hi * S]`` where ``z_lo, z_hi`` are empirical
quantiles of the standardised error ``(y_true - y_hat) / S`` measured on held-out parts of real
curves, tabulated by extrapolation ratio ``r = (t - t0) / (t_last - t0)`` and probability.

When the model cannot say where the curve levels off -- ``too_early`` (the transient after
averaging starts) and ``no_asymptote`` (``c`` at its floor) -- the answer extends the current
loss instead (:func:`transient_band`): ``level * (t / t_last) ** -g``, where the exponent ``g``
is what runs like it did afterwards. Its quantiles (:class:`TransientTable`) are measured on our
own ScheduleFree+ runs and the public anytime curves: for ``too_early`` the exponent itself, for
``no_asymptote`` its ratio to the decay rate the run shows now.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass
from typing import Final, TypeVar

import numpy as np
from numpy.typing import NDArray

from curvecast.contract import ForecastStatus

# BEGIN GENERATED
CALIBRATION_ID: Final = "corpus-232curves-2641fits"
SE_FACTOR: Final = 1.0
DECAY_FACTOR: Final = 0.1
RATIOS: Final[tuple[float, ...]] = (
    1.388, 1.959, 3.199, 5.017, 9.500, 21.227,
)
PROBS: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 0.75, 0.85, 0.9, 0.95, 0.975, 0.99, 0.995,
)
QUANTILES: Final[tuple[tuple[float, ...], ...]] = (
    (
        -3.9661, -3.3320, -2.4964, -2.0544, -1.5090, -1.2034, -0.5616, 0.2268, 1.0559, 1.8177,
        2.3730, 2.9076, 3.8250, 5.7926, 6.0733,
    ),
    (
        -6.2893, -4.7556, -3.6905, -2.9644, -2.0316, -1.2560, -0.3136, 0.4398, 1.5451, 2.6449,
        3.0964, 3.8121, 5.5936, 6.3616, 6.4759,
    ),
    (
        -7.4018, -6.8126, -5.2753, -3.6444, -1.9557, -1.2724, -0.5158, 0.3322, 1.4092, 2.4532,
        3.0227, 3.8670, 4.6718, 5.3059, 5.6474,
    ),
    (
        -6.8954, -5.7510, -4.3133, -2.7699, -1.5824, -1.0964, -0.5117, 0.3431, 1.4860, 2.3306,
        2.9053, 3.4375, 4.2628, 5.0211, 5.5464,
    ),
    (
        -9.5909, -8.2515, -6.4395, -5.0581, -2.1747, -1.3355, -0.5899, 0.2009, 1.2540, 1.9568,
        2.3948, 3.3001, 3.7735, 4.3368, 4.9574,
    ),
    (
        -12.5824, -8.7911, -5.7140, -2.4837, -1.0965, -0.7931, -0.3922, 0.1451, 1.0577, 1.5068,
        1.9914, 2.7001, 3.2859, 5.0164, 6.8569,
    ),
)
# END GENERATED

#: Largest tabulated extrapolation ratio (used for f*, which is never observed).
MAX_RATIO: Final = RATIOS[-1]
_LOG_RATIOS: Final = tuple(math.log(x) for x in RATIOS)


def _interp(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    j = bisect.bisect_right(xs, x)
    x0, x1 = xs[j - 1], xs[j]
    w = (x - x0) / (x1 - x0)
    return ys[j - 1] * (1.0 - w) + ys[j] * w


@functools.lru_cache(maxsize=256)
def _column(prob: float) -> tuple[float, ...]:
    """The calibrated quantile at ``prob`` for each tabulated ratio (computed once per
    probability: an interval query is then one interpolation in ``log(ratio)``)."""
    return tuple(_interp(prob, PROBS, row) for row in QUANTILES)


def quantile(ratio: float, prob: float) -> float:
    """Calibrated quantile of the standardised error at extrapolation ``ratio``.

    Interpolates linearly in probability between tabulated probabilities (clamped to the
    outermost ones) and linearly in ``log(ratio)`` between tabulated ratios (clamped at the
    ends): bilinear on the table.
    """
    r = ratio if math.isfinite(ratio) and ratio > 1.0 else 1.0
    return _interp(math.log(r), _LOG_RATIOS, _column(prob))


def _tails(confidence: float) -> tuple[float, float]:
    c = confidence if 0.0 < confidence < 1.0 else 0.9
    tail = 0.5 * (1.0 - c)
    return tail, 1.0 - tail


def multipliers(ratio: float, confidence: float) -> tuple[float, float]:
    """``(z_lo, z_hi)`` of a central ``confidence`` interval at extrapolation ``ratio``."""
    lo, hi = _tails(confidence)
    return quantile(ratio, lo), quantile(ratio, hi)


def multipliers_many(ratios: NDArray[np.float64], confidence: float
                     ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """:func:`multipliers` for an array of ratios, in one pass."""
    zlo, zhi = quantile_grid(ratios, np.asarray(_tails(confidence)))
    return zlo, zhi


def quantile_grid(ratios: NDArray[np.float64], probs: NDArray[np.float64]
                  ) -> NDArray[np.float64]:
    """:func:`quantile` at each of ``probs`` (rows) and ``ratios`` (columns), in one pass."""
    r = np.where(np.isfinite(ratios) & (ratios > 1.0), ratios, 1.0)
    lr = np.log(r)
    return np.array([np.interp(lr, _LOG_RATIOS, _column(float(p))) for p in probs])


# --- the transient: too_early and no_asymptote ---------------------------------------------------
#: A float, or an array of them (:func:`widen_by_noise` takes either).
_Values = TypeVar("_Values", float, NDArray[np.float64])


@dataclass(frozen=True)
class TransientTable:
    """Quantiles of the decay exponent ``g`` in ``loss(t) = level * (t / t_last) ** -g`` that
    runs showed after a ``too_early`` or a ``no_asymptote`` fit (``python -m bench run
    forecast_calibrate`` measures them; the benches rebuild them without the run they score).

    Attributes:
        probs: the tabulated probabilities (ascending).
        too_early: quantiles of ``g`` after a ``too_early`` fit.
        no_asymptote: quantiles of ``g / decay_rate`` after a ``no_asymptote`` fit, where
            ``decay_rate`` is the decay the data showed then (``Fit.decay_rate``).
        no_asymptote_plain: quantiles of ``g`` after a ``no_asymptote`` fit (for the fits whose
            data gave no decay rate).
        id: names the measurement (stored with each fit's answers as ``calibration``).
    """

    probs: tuple[float, ...]
    too_early: tuple[float, ...]
    no_asymptote: tuple[float, ...]
    no_asymptote_plain: tuple[float, ...]
    id: str = ""

    def exponents(self, kind: ForecastStatus, decay_rate: float | None, confidence: float
                  ) -> tuple[float, float, float]:
        """``(g_low, g_mid, g_high)``: exponents of a central ``confidence`` interval and the
        median, for a fit of status ``kind`` (``too_early`` or ``no_asymptote``)."""
        c = confidence if 0.0 < confidence < 1.0 else 0.9
        tail = 0.5 * (1.0 - c)
        if kind == ForecastStatus.TOO_EARLY:
            row, scale = self.too_early, 1.0
        elif decay_rate is not None and math.isfinite(decay_rate) and decay_rate > 0:
            row, scale = self.no_asymptote, decay_rate
        else:
            row, scale = self.no_asymptote_plain, 1.0
        return (scale * _interp(tail, self.probs, row), scale * _interp(0.5, self.probs, row),
                scale * _interp(1.0 - tail, self.probs, row))


def transient_band(level: float, t_last: float, t: float, kind: ForecastStatus,
                   decay_rate: float | None, confidence: float,
                   table: TransientTable | None = None, *,
                   sigma: float | None = None) -> tuple[float, float, float]:
    """``(value, lo, hi)`` of the loss at step ``t >= t_last`` extending the current ``level``.

    ``value = level * (t / t_last) ** -g_mid``; the interval takes the high exponent for its low
    end and the low exponent for its high end (a negative one: the loss may also rise), widened
    by the loss's own noise ``sigma`` (:func:`widen_by_noise`). NaN when the inputs cannot give
    an answer (no level, a step before ``t_last``).
    """
    tab = table if table is not None else TRANSIENT
    if not (math.isfinite(level) and math.isfinite(t) and t_last > 0 and t >= t_last):
        return math.nan, math.nan, math.nan
    value, lo, hi = extend_level(level, math.log(t / t_last),
                                 tab.exponents(kind, decay_rate, confidence), sigma, confidence)
    return float(value), float(lo), float(hi)


def extend_level(level: float, x: _Values, exponents: tuple[float, float, float],
                 sigma: float | None, confidence: float) -> tuple[_Values, _Values, _Values]:
    """``(value, lo, hi)`` of ``level * exp(-g * x)`` at ``x = log(t / t_last)`` (a float or
    an array), for the exponents ``(g_low, g_mid, g_high)`` of
    :meth:`TransientTable.exponents`: the median exponent gives the value, the high one the
    low end, the low one the high end; the ends widened by the noise ``sigma``
    (:func:`widen_by_noise`)."""
    g_lo, g_mid, g_hi = exponents
    value = level * np.exp(-g_mid * x)
    lo, hi = widen_by_noise(value, level * np.exp(-g_hi * x), level * np.exp(-g_lo * x),
                            sigma, confidence)
    return value, lo, hi


def widen_by_noise(value: _Values, lo: _Values, hi: _Values, sigma: float | None,
                   confidence: float) -> tuple[_Values, _Values]:
    """A transient band's ``(lo, hi)`` widened by the loss's noise: each half-width combined in
    quadrature with ``sigma`` (the fit's residual scale) times the multipliers at extrapolation
    ratio 1, as an ``ok`` forecast's scale includes it.

    The exponents alone give a band of width 0 at the last fitted step (``(t / t_last) ** -g``
    is 1 there whatever ``g``): the forecast of a run's final loss once the run got there was a
    point, while the loss observed there scatters by its noise around the level. The exponent
    tables were measured at least 1.25x past the last step
    (``bench/forecast/forecast_calibrate.py``), where this term is small against the band.
    """
    if sigma is None or not (math.isfinite(sigma) and sigma > 0.0):
        return lo, hi
    z_lo, z_hi = multipliers(1.0, confidence)
    return (value - np.sqrt((value - lo) ** 2 + (z_lo * sigma) ** 2),
            value + np.sqrt((hi - value) ** 2 + (z_hi * sigma) ** 2))


# BEGIN GENERATED TRANSIENT
TRANSIENT: Final = TransientTable(
    probs=PROBS,
    too_early=(
        -0.3834, -0.2627, -0.1250, -0.0237, 0.0226, 0.0549, 0.1140, 0.1974, 0.2688, 0.3185, 0.3543,
        0.4162, 0.5011, 0.7174, 1.0603,
    ),
    no_asymptote=(
        -3.3694, -2.5256, -0.6664, -0.0580, 0.2431, 0.4707, 0.6295, 0.8393, 1.0914, 1.2298, 1.3402,
        1.5686, 1.7527, 2.1573, 3.1240,
    ),
    no_asymptote_plain=(
        -1.7849, -0.9662, -0.2133, -0.0067, 0.0292, 0.0742, 0.1576, 0.2293, 0.3525, 0.4076, 0.4810,
        0.5715, 0.7773, 2.8885, 3.8098,
    ),
    id="transient-49runs-232curves-4724comparisons",
)
# END GENERATED TRANSIENT
