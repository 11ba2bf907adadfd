"""The model curve ``f(t) = a / sqrt(t + b) + c`` and the small values and rules the fit, the
solver and the store share: the curve and its gradients, the value types a fit answers with
(:class:`Interval`, :class:`TargetEstimate`, :class:`FitParams`), number reading, and the rules
for a series' current level and for a series that ``diverged``. numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]

__all__ = [
    "DIVERGED_MIN_POINTS",
    "LEVEL_FRACTION",
    "LEVEL_MIN_POINTS",
    "FitParams",
    "FloatArray",
    "Interval",
    "TargetEstimate",
    "as_float",
    "curve_gradient",
    "curve_gradients",
    "ends_diverged",
    "finite_or_none",
    "level_points",
    "model",
    "valid_confidence",
]

#: Trailing non-finite points (NaN, ±inf) that make a series ``diverged``: one alone may be a
#: skipped mixed-precision step (an inf loss, and the next one finite).
DIVERGED_MIN_POINTS: Final = 3
#: The current level: the median of the latest ``LEVEL_FRACTION`` of the fitted points, at
#: least ``LEVEL_MIN_POINTS`` of them (the solver computes it and the step it stands for).
LEVEL_FRACTION: Final = 0.1
LEVEL_MIN_POINTS: Final = 3


def level_points(n_points: int) -> int:
    """How many of the latest ``n_points`` fitted points the current level is the median of."""
    return min(n_points, max(LEVEL_MIN_POINTS, int(round(LEVEL_FRACTION * n_points))))


def ends_diverged(latest: Sequence[float | None]) -> bool:
    """Whether a series whose latest values are ``latest`` (the newest
    :data:`DIVERGED_MIN_POINTS`, or all of a shorter series) ends ``diverged``: that many of
    them, none finite. The rule the solver applies to a whole series, for a caller that reads
    only its tail (the worker's store)."""
    return (len(latest) >= DIVERGED_MIN_POINTS
            and not any(v is not None and math.isfinite(v) for v in latest))


@dataclass(frozen=True)
class Interval:
    """A point value with a two-sided interval; all NaN when there is no forecast."""

    value: float
    lo: float
    hi: float


@dataclass(frozen=True)
class TargetEstimate:
    """When a run reaches ``loss``.

    ``step`` is the central estimate; ``lo`` the optimistic (earliest) and ``hi`` the pessimistic
    (latest) end of the interval. ``hi`` is ``None`` when the pessimistic band never reaches the
    target. ``reached`` is ``True`` when the data already got there: ``step`` is then the first
    step where the smoothed series was at or below ``loss`` (``lo == hi == step``: data, not a
    forecast). ``reachable`` is ``False`` when the target is below the loss floor, below f*'s
    interval, or at or below the central asymptote ``c``; then ``step`` is ``None`` (``lo`` may
    still say when it is possible at the optimistic end) and ``reason`` says why.
    """

    loss: float
    step: float | None
    lo: float | None
    hi: float | None
    reachable: bool
    reached: bool = False
    reason: str = ""


@dataclass(frozen=True)
class FitParams:
    """Parameters of a previous fit, to warm-start the next one (``solver.fit_curve(warm_start=)``).

    ``burn_in`` carries the burn-in the previous fit chose, so a warm refit does not search for it
    again.
    """

    a: float
    b: float
    c: float
    burn_in: float | None = None


def model(steps: ArrayLike, a: float, b: float, c: float) -> FloatArray:
    """Evaluate ``a / sqrt(t + b) + c`` (NaN where ``t + b <= 0``)."""
    t = np.asarray(steps, dtype=np.float64)
    u = t + b
    with np.errstate(divide="ignore", invalid="ignore"):
        out: FloatArray = np.where(u > 0, a / np.sqrt(np.where(u > 0, u, 1.0)) + c, np.nan)
    return out


def finite_or_none(x: float | None) -> float | None:
    """``x`` as a float, or None when it is missing, NaN or infinite (JSON has no NaN)."""
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def as_float(x: Any) -> float:
    """``x`` as a float; NaN when it is missing or not a number (stored data may be anything)."""
    if x is None:
        return math.nan
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def valid_confidence(value: float | None, default: float) -> float:
    """``value`` when it is a coverage in (0, 1), else ``default``."""
    c = as_float(value)
    if not math.isfinite(c) or not 0.0 < c < 1.0:
        return default
    return c


def curve_gradient(t: float, a: float, b: float, t0: float) -> FloatArray:
    """d f(t) / d (a, q, c) with q = log(t0 + b)."""
    u = t + b
    if u <= 0:
        return np.zeros(3)
    inv = 1.0 / math.sqrt(u)
    return np.array([inv, -0.5 * a * inv / u * (t0 + b), 1.0])


def curve_gradients(t: FloatArray, a: float, b: float, t0: float) -> FloatArray:
    """:func:`curve_gradient` at every step of ``t`` (one row each), in one numpy pass."""
    u = t + b
    ok = u > 0
    safe = np.where(ok, u, 1.0)
    inv = 1.0 / np.sqrt(safe)
    grads: FloatArray = np.column_stack([inv, -0.5 * a * inv / safe * (t0 + b),
                                         np.ones(t.size)]) * ok[:, None]
    return grads
