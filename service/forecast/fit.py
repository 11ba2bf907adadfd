"""A fitted loss curve ``f(t) = a / sqrt(t + b) + c`` and what it says: the value type.

:class:`Fit` holds the parameters and diagnostics of one fit and answers every question asked of
it (the loss at a step with a calibrated interval, the asymptote f*, when a target loss is
reached) without refitting; :meth:`Fit.to_dict` / :meth:`Fit.from_dict` store it as JSON.
numpy only: the readers of a stored fit (the REST answers, the pages, the alert rules) never load
the solver's scipy. Fitting lives in :mod:`curvecast.service.forecast.solver`; the model curve
and the value types the queries answer with in :mod:`.curve`; the stored JSON in
:mod:`.fit_json`.

The interval scale at a step combines the delta-method standard error of the curve, the residual
scale and a term proportional to the predicted remaining decay; the multipliers for that scale
are empirical quantiles fitted offline on the curve corpus
(:mod:`curvecast.service.forecast.calibration`, written by
``bench/forecast/forecast_calibrate.py``), as a function of the extrapolation ratio.
docs/forecast.md has the long form.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike

from curvecast.contract import FIT_STATUSES, LEVEL_EXTENDING_STATUSES, ForecastStatus
from curvecast.service.forecast import calibration as _cal
from curvecast.service.forecast.curve import (
    FitParams,
    FloatArray,
    Interval,
    TargetEstimate,
    as_float,
    curve_gradient,
    curve_gradients,
    model,
    valid_confidence,
)
from curvecast.service.forecast.fit_json import fit_from_dict, fit_to_dict

__all__ = ["STATUSES", "Fit"]

#: Every status a fit can have (:class:`~curvecast.contract.ForecastStatus` but ``pending``;
#: docs/forecast.md, "Statuses", says what each means).
STATUSES: Final = FIT_STATUSES
#: The statuses whose forecast has a value.
_WITH_FORECAST: Final = (ForecastStatus.OK, ForecastStatus.TOO_EARLY, ForecastStatus.NO_ASYMPTOTE,
                         ForecastStatus.OFF_MODEL, ForecastStatus.FLAT)
_MAX_TARGET_FACTOR: Final = 1e4  # steps_to searches up to this multiple of the fitted range


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
        fitted_from_step: the first fitted step (the first bin's mean step when the series
            was binned: ``cov`` is parametrised there).
        fitted_upto_step: the last step fitted, a step of the data (not a bin's centre).
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
        loss_floor: no forecast, interval or f* goes below it (the config's declared lower
            bound, else 0 for a loss that was never negative); ``None``: no floor.
        level: the current loss (robust level of the latest fitted points); f* is at most it
            when it is not identified, and a ``too_early`` or ``no_asymptote`` forecast extends
            it (:func:`~.calibration.transient_band`).
        level_step: the step ``level`` stands for (the median step of those points), from
            which such a forecast extends it (:meth:`from_dict` estimates it for fits stored
            before it; ``None``: the last fitted step).
        decay_rate: how fast the loss falls now: ``-d log(loss) / d log(step)`` over the latest
            part of the fitted window (a log-log slope; ``None`` when the data cannot say). A
            ``no_asymptote`` forecast extends it, slowed as runs like this one slowed.
        useful_from_step: for ``too_early``, the step from which a forecast is expected to be
            useful (the averaging start's transient is over).
        reached: ``((step, loss), ...)``, the smoothed series' running minimum at the steps it
            fell, ending with the last step's loss by the rule of the forecast's ``reached``
            where that is lower: passed targets are answered from it (data, not the model).
        assumes_constant_lr: an ``ok`` fit of a run that gives no sign of its learning-rate
            schedule (:func:`~.schedule.assumes_constant_lr`); its message says so.
    """

    status: ForecastStatus
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
    loss_floor: float | None = None
    level: float | None = None
    useful_from_step: float | None = None
    reached: tuple[tuple[float, float], ...] | None = None
    decay_rate: float | None = None
    level_step: float | None = None
    assumes_constant_lr: bool = False

    # -- convenience ------------------------------------------------------------------------
    @property
    def has_forecast(self) -> bool:
        """Whether queries return numbers (every status but ``insufficient_data`` and
        ``no_convergence``)."""
        return self.status in _WITH_FORECAST and self.c is not None

    @property
    def f_star_identified(self) -> bool:
        """Whether the asymptote c is an estimate of f* (not at its floor, not too early)."""
        return self.has_forecast and self.status not in LEVEL_EXTENDING_STATUSES

    def _clip(self, x: float) -> float:
        return x if self.loss_floor is None or not math.isfinite(x) else max(x, self.loss_floor)

    @property
    def params(self) -> FitParams | None:
        """The parameters as a warm start for the next fit, or ``None``."""
        if (not self.has_forecast or self.a is None or self.c is None
                or self.status == ForecastStatus.TOO_EARLY):
            return None  # a too_early fit may be provisional (another burn-in): start afresh
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

    @property
    def _extends_level(self) -> bool:
        """Whether forecasts beyond the data extend the current level (the model cannot yet say
        where the curve levels off: still in the transient, or ``c`` at its floor, where the
        fit is a straight line's optimism) instead of evaluating the fitted curve."""
        return (self.status in LEVEL_EXTENDING_STATUSES and self.level is not None
                and self.fitted_upto_step is not None and self.fitted_upto_step > 0)

    @property
    def level_anchor(self) -> float:
        """The step a ``too_early`` or ``no_asymptote`` forecast extends the level from."""
        assert self.fitted_upto_step is not None
        step = self.level_step
        return step if step is not None and 0.0 < step <= self.fitted_upto_step else \
            self.fitted_upto_step

    def _band(self, t: float, confidence: float) -> tuple[float, float, float]:
        if self._extends_level and t >= (self.fitted_upto_step or 0.0):
            assert self.level is not None and self.fitted_upto_step is not None
            value, lo, hi = _cal.transient_band(self.level, self.level_anchor, t,
                                                self.status, self.decay_rate, confidence,
                                                sigma=self.residual_scale)
            return self._clip(value), self._clip(lo), self._clip(hi)
        value = self._value(t)
        if not math.isfinite(value):
            return math.nan, math.nan, math.nan
        zlo, zhi = _cal.multipliers(self._ratio(t), confidence)
        s = self._scale(t)
        return self._clip(value), self._clip(value + zlo * s), self._clip(value + zhi * s)

    # -- public queries ---------------------------------------------------------------------
    def predict(self, step: float, confidence: float | None = None) -> Interval:
        """The loss expected at ``step`` with a calibrated two-sided interval.

        Args:
            step: the training step to forecast: from the first fitted step on (before it the
                model describes nothing: the burn-in's plateau or hump, or the start of the
                run, which the fitted curve extended backwards misses by far; NaN there).
            confidence: interval coverage in (0, 1); default ``self.confidence``.

        Returns:
            ``Interval(value, lo, hi)``; NaN everywhere when there is no forecast. Past the
            last fitted step the fitted curve's interval ends are held as in
            :meth:`predict_many`, so this agrees with it step for step.
        """
        conf = valid_confidence(confidence, self.confidence)
        t = as_float(step)
        if not self.has_forecast or not math.isfinite(t) or self.before_fitted_range(t):
            return Interval(math.nan, math.nan, math.nan)
        value, lo, hi = self._band(t, conf)
        if self._holds_band:
            ends = np.array([lo]), np.array([hi])
            self._hold_ends(np.array([t]), *ends, conf)
            lo, hi = float(ends[0][0]), float(ends[1][0])
        return Interval(value, lo, hi)

    @property
    def _holds_band(self) -> bool:
        """Whether the band past the last fitted step is held to its lowest ends so far
        (the fitted curve's band; see :meth:`predict_many`)."""
        return not self._extends_level and self.fitted_upto_step is not None

    def before_fitted_range(self, step: float) -> bool:
        """Whether ``step`` comes before the first fitted step: the model describes nothing
        there, so :meth:`predict` answers NaN (the API and the CLI say why)."""
        return self.fitted_from_step is not None and step < self.fitted_from_step

    def predict_many(self, steps: ArrayLike, confidence: float | None = None
                     ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """:meth:`predict` at many steps in one numpy pass: ``(value, lo, hi)`` arrays (NaN
        where there is no forecast). Charts, the target table and the alert rules ask for
        hundreds of steps of one fit at a time."""
        conf = valid_confidence(confidence, self.confidence)
        t = np.asarray(steps, dtype=np.float64).ravel()
        value, lo, hi = self._raw_band_many(t, conf)
        if self._holds_band:
            self._hold_ends(t, lo, hi, conf)
        return value, lo, hi

    def _hold_ends(self, t: FloatArray, lo: FloatArray, hi: FloatArray, conf: float) -> None:
        """Hold the band's ends at ``t`` (in place) at their lowest since the last fitted step.

        Past that step neither end of the band rises again. The fitted curve falls, but the
        calibrated band's ends did not always: its multipliers are measured per extrapolation
        ratio and are noisy from one ratio to the next, and the scale grows with the horizon: a
        later step's forecast could rule out a loss a nearer one allowed. The lowest ends so far
        are read at the steps of the crossing table. What it did to coverage and width:
        BENCHMARKS.md, "The forecast band past the data, held".
        """
        future = np.isfinite(lo) & (t > (self.fitted_upto_step or 0.0))
        if not future.any():
            return
        table_steps, lo_table, hi_table = _crossing_table(self, conf)
        j = np.searchsorted(table_steps, t[future], side="right") - 1
        ok = j >= 0
        j = np.maximum(j, 0)
        lo[future] = np.where(ok, np.fmin(lo[future], lo_table[j]), lo[future])
        hi[future] = np.where(ok, np.fmin(hi[future], hi_table[j]), hi[future])

    def _raw_band_many(self, t: FloatArray, conf: float
                       ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """The calibrated band at each of ``t``, step by step (:meth:`predict_many` without
        holding its ends)."""
        value, lo, hi = (np.full(t.size, np.nan) for _ in range(3))
        if not self.has_forecast or self.a is None or self.c is None:
            return value, lo, hi
        todo = np.isfinite(t)
        if self.fitted_from_step is not None:
            todo &= t >= self.fitted_from_step
        if self._extends_level:
            assert self.level is not None and self.fitted_upto_step is not None
            future = todo & (t >= self.fitted_upto_step)
            value[future], lo[future], hi[future] = _cal.extend_level(
                self.level, np.log(t[future] / self.level_anchor),
                _cal.TRANSIENT.exponents(self.status, self.decay_rate, conf),
                self.residual_scale, conf)
            todo &= ~future
        v, scale, ratio = self._curve_parts(t[todo])
        zlo, zhi = _cal.multipliers_many(ratio, conf)
        finite = np.isfinite(v)
        value[todo] = np.where(finite, v, np.nan)
        lo[todo] = np.where(finite, v + zlo * scale, np.nan)
        hi[todo] = np.where(finite, v + zhi * scale, np.nan)
        if self.loss_floor is not None:
            for arr in (value, lo, hi):
                np.maximum(arr, self.loss_floor, out=arr, where=np.isfinite(arr))
        return value, lo, hi

    def _curve_parts(self, tm: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """What the fitted curve's band at each of ``tm`` needs whatever its confidence: the
        curve, the interval scale and the extrapolation ratio (module docstring)."""
        assert self.a is not None and self.c is not None
        v = self._values(tm)
        se2 = np.zeros(tm.size)
        if self.cov is not None and self.b is not None and self.fitted_from_step is not None:
            grad = curve_gradients(tm, self.a, self.b, self.fitted_from_step)
            cov = np.asarray(self.cov, dtype=np.float64)
            se2 = np.maximum(np.einsum("ij,jk,ik->i", grad, cov, grad), 0.0)
        sigma = self.residual_scale or 0.0
        last = self._value(self.fitted_upto_step) if self.fitted_upto_step is not None else np.nan
        drop = np.maximum(last - v, 0.0)
        drop = np.where(np.isfinite(drop), drop, 0.0)
        scale = np.sqrt(_cal.SE_FACTOR * se2 + sigma * sigma + (_cal.DECAY_FACTOR * drop) ** 2)
        t0, tk = self.fitted_from_step, self.fitted_upto_step
        ratio = (np.maximum((tm - t0) / (tk - t0), 1.0) if t0 is not None and tk is not None
                 and tk > t0 else np.ones(tm.size))
        return v, scale, ratio

    def predict_quantiles(self, step: float, probs: ArrayLike) -> FloatArray:
        """The calibrated quantile at ``step`` for each of ``probs``, in one pass: for p below
        1/2 the low end of :meth:`predict`'s central ``1 - 2p`` interval, above it the high
        end of the ``2p - 1`` one (each end held as :meth:`predict` holds it; a test keeps the
        two equal). NaN where :meth:`predict` is.

        A forecast's predictive distribution is 16 quantiles at one step, and P(best) asks for
        one per run of a project: the curve, its scale and the steps the held ends are read at
        (:func:`_table_steps`, up to ``step``) are computed once for all of them. A band that
        extends the level is :meth:`predict`'s, one quantile at a time.
        """
        t = as_float(step)
        ps = np.asarray(probs, dtype=np.float64).ravel()
        if (not self.has_forecast or not self._holds_band or not math.isfinite(t)
                or self.before_fitted_range(t) or self.a is None or self.c is None):
            return np.asarray([self._quantile_by_predict(t, float(p)) for p in ps])
        assert self.fitted_upto_step is not None
        table = _table_steps(self)
        # The band at the table's steps up to ``t`` (each end's lowest there is the held end,
        # as :meth:`_hold_ends` reads it off the table), and at ``t`` last.
        at = np.append(table[table <= t], t) if t > self.fitted_upto_step else np.array([t])
        v, scale, ratio = self._curve_parts(at)
        q = v + _cal.quantile_grid(ratio, ps) * scale  # (probs, steps)
        q[:, ~np.isfinite(v)] = np.nan
        if self.loss_floor is not None:
            np.maximum(q, self.loss_floor, out=q, where=np.isfinite(q))
        out: FloatArray = q[:, -1]
        if at.size > 1:  # past the last fitted step: hold each finite end (as _hold_ends)
            out = np.where(np.isfinite(out), np.fmin(out, np.fmin.reduce(q[:, :-1], axis=1)),
                           out)
        return out

    def _quantile_by_predict(self, t: float, p: float) -> float:
        band = self.predict(t, max(abs(1.0 - 2.0 * p), 1e-9))
        return band.lo if p <= 0.5 else band.hi

    def _values(self, t: FloatArray) -> FloatArray:
        """The fitted curve at each of ``t`` (NaN where ``t + b <= 0``); a flat fit is ``c``."""
        assert self.a is not None and self.c is not None
        if self.b is None or self.a == 0.0:
            return np.full(t.size, self.c)
        return model(t, self.a, self.b, self.c)

    def f_star(self, confidence: float | None = None) -> Interval:
        """The asymptote ``c`` (an estimate of f*) with an interval.

        The interval is the calibrated band at the largest extrapolation the calibration covers,
        with the whole remaining decay ``a / sqrt(t_last + b)`` as the drop term: f* is never
        observed, so this is the widest honest statement the corpus supports.
        """
        conf = valid_confidence(confidence, self.confidence)
        if not self.has_forecast or self.c is None or self.a is None:
            return Interval(math.nan, math.nan, math.nan)
        if not self.f_star_identified:
            # Not identifiable yet: no value, only "at most the current loss" (and the floor).
            lo = self.loss_floor if self.loss_floor is not None else math.nan
            hi = self.level if self.level is not None else math.nan
            return Interval(math.nan, lo, hi)
        if self.a == 0.0 or self.b is None or self.fitted_upto_step is None:
            zlo, zhi = _cal.multipliers(_cal.MAX_RATIO, conf)
            s = self.residual_scale or 0.0
            return Interval(self._clip(self.c), self._clip(self.c + zlo * s),
                            self._clip(self.c + zhi * s))
        sigma = self.residual_scale or 0.0
        se2 = 0.0
        if self.cov is not None:
            se2 = float(max(self.cov[2][2], 0.0))
        drop = max(self._value(self.fitted_upto_step) - self.c, 0.0)
        s = math.sqrt(_cal.SE_FACTOR * se2 + sigma * sigma + (_cal.DECAY_FACTOR * drop) ** 2)
        zlo, zhi = _cal.multipliers(_cal.MAX_RATIO, conf)
        lo, hi = self._clip(self.c + zlo * s), self._clip(self.c + zhi * s)
        # The asymptote of a falling curve is below the loss at any step: its high end is no
        # higher than the held band's anywhere (predict_many), nor than the loss the run is at
        # now (as when f* is not identified). Its low end stays the calibrated one: the solver
        # reads it to tell whether f* is identified at all.
        hi = float(np.fmin(hi, _crossing_table(self, conf)[2][-1]))
        if self.level is not None and math.isfinite(self.level):
            hi = min(hi, self.level)
        value = self._clip(self.c)
        return Interval(value, lo, max(hi, value))

    def reached_at(self, loss: float) -> float | None:
        """First step where the smoothed data were at or below ``loss``; ``None`` if never."""
        if not self.reached or not math.isfinite(loss):
            return None
        for step, low in self.reached:
            if low <= loss:
                return step
        return None

    def steps_to(self, loss: float, confidence: float | None = None) -> TargetEstimate:
        """When the loss reaches ``loss``, with an interval (see :class:`TargetEstimate`).

        In order: a target the smoothed data already reached is answered from the data
        (``reached``, with or without a forecast); a target below the loss floor or below f*'s
        interval is not reachable (with the reason); otherwise the fitted curve's crossing,
        never before the last fitted step, with the band's crossings as the interval. The
        band's crossings are computed once per fit and confidence (:func:`_crossing_table`),
        then looked up.
        """
        conf = valid_confidence(confidence, self.confidence)
        target = as_float(loss)
        if not math.isfinite(target):
            return TargetEstimate(target, None, None, None, False, reason="not a number")
        # A target the data reached is a fact, forecast or not (a run that diverged since).
        passed = self.reached_at(target)
        if passed is not None:
            return TargetEstimate(target, passed, passed, passed, True, reached=True)
        if not self.has_forecast or self.c is None or self.fitted_upto_step is None:
            reason = self.message if self.status == ForecastStatus.DIVERGED else "no forecast yet"
            return TargetEstimate(target, None, None, None, False, reason=reason)
        t_last = self.fitted_upto_step
        if self.loss_floor is not None and target < self.loss_floor:
            return TargetEstimate(target, None, None, None, False,
                                  reason=f"below the loss floor {self.loss_floor:g}")
        fs = self.f_star(conf)
        if self.f_star_identified and math.isfinite(fs.lo) and target < fs.lo:
            return TargetEstimate(target, None, None, None, False,
                                  reason=f"below f*'s {conf:.0%} interval "
                                  f"[{fs.lo:.4g}, {fs.hi:.4g}]")
        steps, lo_band, hi_band = _crossing_table(self, conf)
        lo = _first_at_or_below(steps, lo_band, target)
        central = self._central_crossing(target)
        if central is None:
            reason = (f"at or below the fitted asymptote c = {self.c:.4g}"
                      if not self._extends_level else
                      "not reached at the pace runs like this one keep")
            return TargetEstimate(target, None, lo, None, False, reason=reason)
        step = max(central, t_last)  # the data have not reached it: not in the past
        hi = _first_at_or_below(steps, hi_band, target)
        lo = step if lo is None else min(lo, step)
        hi = None if hi is None else max(hi, step)
        return TargetEstimate(target, step, lo, hi, True)

    def _central_crossing(self, target: float) -> float | None:
        """Step where the central forecast equals ``target``; ``None`` if it never does."""
        if self._extends_level:
            assert self.level is not None and self.fitted_upto_step is not None
            g = _cal.TRANSIENT.exponents(self.status, self.decay_rate, self.confidence)[1]
            if target >= self.level:
                return self.fitted_upto_step  # about where the run is now
            if not 0.0 < target or not g > 0:
                return None
            return float(self.level_anchor * (self.level / target) ** (1.0 / g))
        if self.a is None or self.c is None or self.b is None or self.a == 0.0:
            return None
        if target <= self.c:
            return None
        return float((self.a / (target - self.c)) ** 2 - self.b)

    # -- (de)serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN and inf become ``None``); :meth:`from_dict` inverts it
        (:mod:`.fit_json`)."""
        return fit_to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fit:
        """Rebuild a :class:`Fit` stored with :meth:`to_dict`. Unknown keys are ignored."""
        return fit_from_dict(cls, data)


_TABLE_POINTS: Final = 240  # steps of the crossing table (geometric from the last fitted step)


def _table_steps(fit: Fit) -> FloatArray:
    """The steps of :func:`_crossing_table`: the last fitted step, then geometric to far
    beyond it."""
    t_last = fit.fitted_upto_step or 0.0
    span = max(t_last - (fit.fitted_from_step or 0.0), 1.0)
    steps = t_last + np.concatenate(
        ([0.0], np.geomspace(1e-3 * max(t_last, 1.0), _MAX_TARGET_FACTOR * span, _TABLE_POINTS)))
    if fit._holds_band:
        # The steps of the calibration's tabulated ratios too: the band's ends have their
        # kinks there (the multipliers are interpolated between them), so a held end does not
        # miss a low between two of the table's steps.
        t0 = t_last - span
        steps = np.union1d(steps, t0 + np.asarray(_cal.RATIOS) * span)
    return steps


@functools.lru_cache(maxsize=1024)
def _crossing_table(fit: Fit, confidence: float) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(steps, lo, hi)``: the band from the last fitted step to far beyond, computed once per
    fit and confidence (a target query is then a lookup, not ~300 band evaluations). For the
    fitted curve's band each end is held at its lowest since the last fitted step
    (:meth:`Fit.predict_many`)."""
    steps = _table_steps(fit)
    _, lo, hi = fit._raw_band_many(steps, confidence)
    if fit._holds_band:  # each end held at its lowest so far (Fit.predict_many)
        lo, hi = np.fmin.accumulate(lo), np.fmin.accumulate(hi)
    return steps, lo, hi


def _first_at_or_below(steps: FloatArray, band: FloatArray, target: float) -> float | None:
    """First step where ``band`` (falling) is at or below ``target``, interpolated linearly
    between the table's steps; ``None`` if it never is."""
    hit = np.nonzero(band <= target)[0]
    if hit.size == 0:
        return None
    j = int(hit[0])
    if j == 0:
        return float(steps[0])
    y0, y1 = float(band[j - 1]), float(band[j])
    frac = (y0 - target) / (y0 - y1) if y0 > y1 else 1.0
    return float(steps[j - 1] + frac * (steps[j] - steps[j - 1]))
