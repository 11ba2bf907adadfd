"""Interval calibration constants for the forecast (pure data + interpolation, no I/O).

The block between the ``BEGIN/END GENERATED`` markers is written by
``python -m bench.forecast_calibrate`` from the curve corpus; do not edit it by hand.

How the constants are used (docs/forecast.md, "Intervals"): for a forecast ``y_hat(t)`` the
fit computes a scale ``S(t) = sqrt(SE_FACTOR * se(t)^2 + sigma^2 + (DECAY_FACTOR * drop(t))^2)``
(delta-method variance, residual scale, and the predicted remaining decay since the last fitted
step).
The interval is ``[y_hat + z_lo * S, y_hat + z_hi * S]`` where ``z_lo, z_hi`` are empirical
quantiles of the standardised error ``(y_true - y_hat) / S`` measured on held-out parts of real
curves, tabulated by extrapolation ratio ``r = (t - t0) / (t_last - t0)`` and probability.
"""

from __future__ import annotations

import bisect
import math
from typing import Final

# BEGIN GENERATED
CALIBRATION_ID: Final = "corpus-228curves-2595fits"
SE_FACTOR: Final = 1.0
DECAY_FACTOR: Final = 0.1
RATIOS: Final[tuple[float, ...]] = (
    1.409, 1.962, 3.205, 5.104, 9.500, 21.455,
)
PROBS: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 0.75, 0.85, 0.9, 0.95, 0.975, 0.99, 0.995,
)
QUANTILES: Final[tuple[tuple[float, ...], ...]] = (
    (
        -3.8936, -3.2963, -2.3620, -1.9049, -1.3941, -1.0637, -0.4688, 0.2425, 1.1216, 1.8553,
        2.3501, 2.8867, 3.7533, 5.5931, 6.0173,
    ),
    (
        -5.7761, -4.3302, -3.4183, -2.6122, -1.5422, -0.6352, -0.3381, 0.4249, 1.4995, 2.6098,
        3.0525, 3.6352, 5.5706, 6.3458, 6.4440,
    ),
    (
        -6.7106, -5.8335, -3.9243, -2.7471, -1.5754, -0.9451, -0.4440, 0.4201, 1.7624, 2.7519,
        3.1050, 3.9523, 4.7276, 5.3961, 5.5952,
    ),
    (
        -6.4846, -5.5948, -4.0607, -2.3027, -1.3543, -1.0019, -0.4061, 0.3707, 1.5392, 2.3311,
        2.8300, 3.3533, 4.1224, 4.6136, 5.5218,
    ),
    (
        -9.3250, -7.9499, -5.9924, -3.6230, -1.7472, -0.8762, -0.3730, 0.3228, 1.3208, 1.9767,
        2.3189, 2.9976, 3.6786, 4.2129, 4.6799,
    ),
    (
        -6.7312, -6.3412, -2.6221, -1.2976, -0.8307, -0.5405, -0.1920, 0.3794, 1.1941, 1.6117,
        1.7129, 2.3230, 2.9627, 3.5916, 6.4901,
    ),
)
# END GENERATED

#: Largest tabulated extrapolation ratio (used for f*, which is never observed).
MAX_RATIO: Final = RATIOS[-1]


def _interp(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    j = bisect.bisect_right(xs, x)
    x0, x1 = xs[j - 1], xs[j]
    w = (x - x0) / (x1 - x0)
    return ys[j - 1] * (1.0 - w) + ys[j] * w


def quantile(ratio: float, prob: float) -> float:
    """Calibrated quantile of the standardised error at extrapolation ``ratio``.

    Interpolates linearly in ``log(ratio)`` between tabulated ratios (clamped at the ends) and
    linearly in probability between tabulated probabilities (clamped to the outermost ones).
    """
    r = ratio if math.isfinite(ratio) and ratio > 1.0 else 1.0
    lr = math.log(r)
    log_ratios = tuple(math.log(x) for x in RATIOS)
    row = [_interp(lr, log_ratios, tuple(q[i] for q in QUANTILES)) for i in range(len(PROBS))]
    return _interp(prob, PROBS, tuple(row))


def multipliers(ratio: float, confidence: float) -> tuple[float, float]:
    """``(z_lo, z_hi)`` of a central ``confidence`` interval at extrapolation ``ratio``."""
    c = confidence if 0.0 < confidence < 1.0 else 0.9
    tail = 0.5 * (1.0 - c)
    return quantile(ratio, tail), quantile(ratio, 1.0 - tail)
