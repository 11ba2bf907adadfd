"""A fitted loss curve ``f(t) = a / sqrt(t + b) + c`` and what it says: the value type.

:class:`Fit` holds the parameters and diagnostics of one fit and answers every question asked of
it (the loss at a step with a calibrated interval, the asymptote f*, when a target loss is
reached) without refitting; :meth:`Fit.to_dict` / :meth:`Fit.from_dict` store it as JSON.
numpy only: the readers of a stored fit (the REST answers, the pages, the alert rules) never load
the solver's scipy. Fitting lives in :mod:`curvecast.service.forecast.solver`.

The interval scale at a step combines the delta-method standard error of the curve, the residual
scale and a term proportional to the predicted remaining decay; the multipliers for that scale
are empirical quantiles fitted offline on the curve corpus
(:mod:`curvecast.service.forecast.calibration`, written by ``bench/forecast_calibrate.py``), as a
function of the extrapolation ratio. docs/forecast.md has the long form.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from curvecast.service.forecast import calibration as _cal

FloatArray = NDArray[np.float64]

__all__ = [
    "FLAT",
    "INSUFFICIENT",
    "NO_CONVERGENCE",
    "OFF_MODEL",
    "OK",
    "STATUSES",
    "Fit",
    "FitParams",
    "FloatArray",
    "Interval",
    "TargetEstimate",
    "as_float",
    "curve_gradient",
    "finite_or_none",
    "model",
    "valid_confidence",
]

# --- statuses -----------------------------------------------------------------------------------
OK: Final = "ok"
OFF_MODEL: Final = "off_model"
FLAT: Final = "flat"
INSUFFICIENT: Final = "insufficient_data"
NO_CONVERGENCE: Final = "no_convergence"
#: Every status a fit can have. ``ok``, ``off_model`` and ``flat`` carry a usable
#: forecast; ``insufficient_data`` and ``no_convergence`` carry none (queries answer NaN).
STATUSES: Final = (OK, OFF_MODEL, FLAT, INSUFFICIENT, NO_CONVERGENCE)

_MAX_TARGET_FACTOR: Final = 1e4  # steps_to searches up to this multiple of the fitted range


# --- small value types --------------------------------------------------------------------------
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
    target. ``reachable`` is ``False`` when the target is at or below the fitted asymptote ``c``;
    then ``step`` is ``None`` (and ``lo`` may still say when it is possible at the optimistic end).
    """

    loss: float
    step: float | None
    lo: float | None
    hi: float | None
    reachable: bool


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


# --- the fit result -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Fit:
    """Result of ``solver.fit_curve``: parameters, diagnostics, and what intervals need.

    Query it with :meth:`predict`, :meth:`f_star` and :meth:`steps_to`; store it with
    :meth:`to_dict` and rebuild it with :meth:`from_dict` (no refit needed to answer at another
    horizon or confidence).

    Attributes:
        status: one of :data:`STATUSES`.
        a, b, c: the fitted parameters (``None`` when there is no fit; ``b`` is ``None`` for a
            flat fit, which has ``a == 0``).
        n_points: raw points used (after burn-in, before binning).
        n_fitted: points the optimiser saw (bins when the series was binned).
        fitted_from_step, fitted_upto_step: the step range of the fitted data.
        residual_scale: robust (MAD) standard deviation of the fit residuals (of the fitted
            points: bins when the series was binned).
        off_model: the recent data left the model in a sustained way.
        off_model_score: median departure of the recent data from a fit on the older data,
            in standard errors of that fit's forecast (negative: below, as when an LR decay
            begins); ``None`` if not tested.
        off_model_excess: the same departure relative to the decay the older fit predicted
            over the recent window (-0.2: the loss fell 20% more than predicted).
        burn_in: the first step allowed into the fit; ``burn_in_source`` says where it came from
            (``"argument"``, ``"config:c_warmup"``, ``"config:warmup_steps"``, ``"data"``,
            ``"warm_start"``).
        n_eff: effective number of independent points (residual autocorrelation).
        cov: 3x3 covariance of ``(a, log(fitted_from_step + b), c)``, row-major.
        confidence: the default confidence of interval queries.
        message: a human-readable note on the status.
    """

    status: str
    a: float | None = None
    b: float | None = None
    c: float | None = None
    n_points: int = 0
    n_fitted: int = 0
    fitted_from_step: float | None = None
    fitted_upto_step: float | None = None
    residual_scale: float | None = None
    off_model: bool = False
    off_model_score: float | None = None
    off_model_excess: float | None = None
    burn_in: float | None = None
    burn_in_source: str | None = None
    n_eff: float | None = None
    cov: tuple[tuple[float, float, float], ...] | None = None
    confidence: float = 0.9
    message: str = ""
    calibration: str = field(default=_cal.CALIBRATION_ID)

    # -- convenience ------------------------------------------------------------------------
    @property
    def has_forecast(self) -> bool:
        """Whether queries return numbers (``ok``, ``off_model`` or ``flat``)."""
        return self.status in (OK, OFF_MODEL, FLAT) and self.c is not None

    @property
    def params(self) -> FitParams | None:
        """The parameters as a warm start for the next fit, or ``None``."""
        if not self.has_forecast or self.a is None or self.c is None:
            return None
        b = self.b if self.b is not None else 0.0
        return FitParams(a=self.a, b=b, c=self.c, burn_in=self.burn_in)

    def _value(self, t: float) -> float:
        if self.a is None or self.c is None:
            return math.nan
        if self.b is None or self.a == 0.0:
            return self.c
        u = t + self.b
        return self.a / math.sqrt(u) + self.c if u > 0 else math.nan

    def scale_components(self, step: float) -> tuple[float, float, float]:
        """``(se^2, sigma^2, drop)`` at ``step``: the inputs of the interval scale.

        ``se^2`` is the delta-method variance of the fitted curve, ``sigma^2`` the squared
        residual scale, ``drop`` the predicted decay from the last fitted step to ``step``. The
        interval scale is ``sqrt(SE_FACTOR * se^2 + sigma^2 + (DECAY_FACTOR * drop)^2)``; the
        calibration bench uses the components directly to fit both factors and the multipliers.
        """
        if self.a is None or self.c is None or self.fitted_upto_step is None:
            return math.nan, math.nan, math.nan
        sigma = self.residual_scale or 0.0
        se2 = 0.0
        if self.cov is not None and self.b is not None and self.fitted_from_step is not None:
            g = curve_gradient(step, self.a, self.b, self.fitted_from_step)
            cov = np.asarray(self.cov, dtype=np.float64)
            se2 = max(float(g @ cov @ g), 0.0)
        drop = max(self._value(self.fitted_upto_step) - self._value(step), 0.0)
        if not math.isfinite(drop):
            drop = 0.0
        return se2, sigma * sigma, drop

    def _scale(self, t: float) -> float:
        """Combined scale S(t) the calibrated multipliers apply to (see module docstring)."""
        se2, s2, drop = self.scale_components(t)
        return math.sqrt(_cal.SE_FACTOR * se2 + s2 + (_cal.DECAY_FACTOR * drop) ** 2)

    def ratio(self, step: float) -> float:
        """Extrapolation ratio ``(step - t0) / (t_last - t0)`` (at least 1) of a query."""
        return self._ratio(step)

    def _ratio(self, t: float) -> float:
        """Extrapolation ratio (t - t0) / (t_last - t0), at least 1."""
        t0, tk = self.fitted_from_step, self.fitted_upto_step
        if t0 is None or tk is None or tk <= t0:
            return 1.0
        return max((t - t0) / (tk - t0), 1.0)

    def _band(self, t: float, confidence: float) -> tuple[float, float, float]:
        value = self._value(t)
        if not math.isfinite(value):
            return math.nan, math.nan, math.nan
        zlo, zhi = _cal.multipliers(self._ratio(t), confidence)
        s = self._scale(t)
        return value, value + zlo * s, value + zhi * s

    # -- public queries ---------------------------------------------------------------------
    def predict(self, step: float, confidence: float | None = None) -> Interval:
        """The loss expected at ``step`` with a calibrated two-sided interval.

        Args:
            step: the training step to forecast (any step; before the fitted range the model is
                simply evaluated).
            confidence: interval coverage in (0, 1); default ``self.confidence``.

        Returns:
            ``Interval(value, lo, hi)``; NaN everywhere when there is no forecast.
        """
        conf = valid_confidence(confidence, self.confidence)
        t = as_float(step)
        if not self.has_forecast or not math.isfinite(t):
            return Interval(math.nan, math.nan, math.nan)
        return Interval(*self._band(t, conf))

    def f_star(self, confidence: float | None = None) -> Interval:
        """The asymptote ``c`` (an estimate of f*) with an interval.

        The interval is the calibrated band at the largest extrapolation the calibration covers,
        with the whole remaining decay ``a / sqrt(t_last + b)`` as the drop term: f* is never
        observed, so this is the widest honest statement the corpus supports.
        """
        conf = valid_confidence(confidence, self.confidence)
        if not self.has_forecast or self.c is None or self.a is None:
            return Interval(math.nan, math.nan, math.nan)
        if self.a == 0.0 or self.b is None or self.fitted_upto_step is None:
            zlo, zhi = _cal.multipliers(_cal.MAX_RATIO, conf)
            s = self.residual_scale or 0.0
            return Interval(self.c, self.c + zlo * s, self.c + zhi * s)
        sigma = self.residual_scale or 0.0
        se2 = 0.0
        if self.cov is not None:
            se2 = float(max(self.cov[2][2], 0.0))
        drop = max(self._value(self.fitted_upto_step) - self.c, 0.0)
        s = math.sqrt(_cal.SE_FACTOR * se2 + sigma * sigma + (_cal.DECAY_FACTOR * drop) ** 2)
        zlo, zhi = _cal.multipliers(_cal.MAX_RATIO, conf)
        return Interval(self.c, self.c + zlo * s, self.c + zhi * s)

    def steps_to(self, loss: float, confidence: float | None = None) -> TargetEstimate:
        """When the loss reaches ``loss``, with an interval (see :class:`TargetEstimate`).

        A target at or below the asymptote ``c`` is not reachable. A target the fitted curve has
        already passed gives the (past) step where the model crossed it, with a zero-width
        interval: that part of the curve is data, not extrapolation.
        """
        conf = valid_confidence(confidence, self.confidence)
        target = as_float(loss)
        if not self.has_forecast or not math.isfinite(target) or self.c is None:
            return TargetEstimate(target, None, None, None, False)
        t_last = self.fitted_upto_step
        if t_last is None:
            return TargetEstimate(target, None, None, None, False)
        step = self._central_crossing(target)
        if step is not None and self._value(t_last) <= target:
            return TargetEstimate(target, step, step, step, True)
        t_max = t_last + _MAX_TARGET_FACTOR * max(t_last - (self.fitted_from_step or 0.0), 1.0)
        lo = self._first_crossing(target, conf, 1, t_last, t_max)
        if step is None:
            return TargetEstimate(target, None, lo, None, False)
        hi = self._first_crossing(target, conf, 2, t_last, t_max)
        lo = step if lo is None else min(lo, step)
        hi = None if hi is None else max(hi, step)
        return TargetEstimate(target, step, lo, hi, True)

    def _first_crossing(self, target: float, conf: float, which: int, t_last: float,
                        t_max: float) -> float | None:
        """First step in [t_last, t_max] where band ``which`` (1 lower, 2 upper) is <= target."""
        if self._band(t_last, conf)[which] <= target:
            return t_last
        grid = t_last + np.geomspace(1e-3 * max(t_last, 1.0), t_max - t_last, 160)
        vals = np.array([self._band(float(t), conf)[which] for t in grid])
        hit = np.nonzero(vals <= target)[0]
        if hit.size == 0:
            return None
        j = int(hit[0])
        lo_t = t_last if j == 0 else float(grid[j - 1])
        hi_t = float(grid[j])
        for _ in range(50):  # bisection: the crossing to ~1e-15 of the bracket
            mid = 0.5 * (lo_t + hi_t)
            if self._band(mid, conf)[which] <= target:
                hi_t = mid
            else:
                lo_t = mid
        return hi_t

    def _central_crossing(self, target: float) -> float | None:
        """Step where the central curve equals ``target``; ``None`` if it never does."""
        if self.a is None or self.c is None or self.b is None or self.a == 0.0:
            return None
        if target <= self.c:
            return None
        return float((self.a / (target - self.c)) ** 2 - self.b)

    # -- (de)serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN and inf become ``None``); :meth:`from_dict` inverts it."""
        out: dict[str, Any] = {
            "status": self.status,
            "a": finite_or_none(self.a),
            "b": finite_or_none(self.b),
            "c": finite_or_none(self.c),
            "n_points": self.n_points,
            "n_fitted": self.n_fitted,
            "fitted_from_step": finite_or_none(self.fitted_from_step),
            "fitted_upto_step": finite_or_none(self.fitted_upto_step),
            "residual_scale": finite_or_none(self.residual_scale),
            "off_model": self.off_model,
            "off_model_score": finite_or_none(self.off_model_score),
            "off_model_excess": finite_or_none(self.off_model_excess),
            "burn_in": finite_or_none(self.burn_in),
            "burn_in_source": self.burn_in_source,
            "n_eff": finite_or_none(self.n_eff),
            "cov": None if self.cov is None else [[finite_or_none(x) for x in row]
                                                  for row in self.cov],
            "confidence": self.confidence,
            "message": self.message,
            "calibration": self.calibration,
        }
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fit:
        """Rebuild a :class:`Fit` stored with :meth:`to_dict`. Unknown keys are ignored."""

        def opt(key: str) -> float | None:
            v = data.get(key)
            f = as_float(v)
            return f if math.isfinite(f) else None

        cov_raw = data.get("cov")
        cov: tuple[tuple[float, float, float], ...] | None = None
        if isinstance(cov_raw, list | tuple) and len(cov_raw) == 3:
            rows: list[tuple[float, float, float]] = []
            for row in cov_raw:
                vals = [as_float(x) for x in row] if isinstance(row, list | tuple) else []
                if len(vals) != 3 or not all(math.isfinite(x) for x in vals):
                    rows = []
                    break
                rows.append((vals[0], vals[1], vals[2]))
            cov = tuple(rows) if rows else None
        status = str(data.get("status", NO_CONVERGENCE))
        return cls(
            status=status if status in STATUSES else NO_CONVERGENCE,
            a=opt("a"),
            b=opt("b"),
            c=opt("c"),
            n_points=int(data.get("n_points") or 0),
            n_fitted=int(data.get("n_fitted") or 0),
            fitted_from_step=opt("fitted_from_step"),
            fitted_upto_step=opt("fitted_upto_step"),
            residual_scale=opt("residual_scale"),
            off_model=bool(data.get("off_model", False)),
            off_model_score=opt("off_model_score"),
            off_model_excess=opt("off_model_excess"),
            burn_in=opt("burn_in"),
            burn_in_source=(None if data.get("burn_in_source") is None
                            else str(data.get("burn_in_source"))),
            n_eff=opt("n_eff"),
            cov=cov,
            confidence=valid_confidence(opt("confidence"), 0.9),
            message=str(data.get("message", "")),
            calibration=str(data.get("calibration", _cal.CALIBRATION_ID)),
        )


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

