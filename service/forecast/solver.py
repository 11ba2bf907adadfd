"""The solver: ``f(t) = a / sqrt(t + b) + c`` fitted to a training-loss curve.

Arrays in, a :class:`~curvecast.service.forecast.fit.Fit` out; no I/O, no service imports, numpy
and scipy only (the value type and its intervals need no scipy: :mod:`.fit`). Nothing in this
module raises on bad data: odd inputs (too few points, NaN, a flat or rising curve, a huge spike)
come back as a :class:`Fit` whose ``status`` says what happened.

The method, in short (docs/forecast.md has the long form):

1. *Clean*: keep finite (step, loss) pairs, sort by step.
2. *Burn-in*: drop the steps before averaging starts -- the explicit ``burn_in``, else the run's
   config (``RunConfig.averaging_start`` of :mod:`curvecast.contract`: ``c_warmup``, else the
   paper's heuristic ``2 * warmup_steps``), else chosen from the data (5% of the latest step,
   moved later when a later start extrapolates better on the run's own recent past).
3. *Bin* long series (``bin_series``: equal-count bins, median loss per bin) so a refit costs the
   same however many raw points the series has.
4. *Variable projection*: for a fixed ``b`` the model is linear in ``(a, c)``, solved in closed
   form with ``a >= 0`` (and ``c >= 0`` when every loss is positive). The 1-D profile over
   ``q = log(t0 + b)`` is scanned on a grid (vectorised), then polished with a bounded scalar
   search. A weak Gaussian prior on ``q`` keeps short prefixes from running off to the linear
   (``b -> inf``) or singular (``b -> -t0``) ends.
5. *Robustness*: Huber iteratively reweighted least squares (scale from the MAD of residuals), so
   spikes and outliers lose their pull. Steps 4 and 5 are :mod:`.robust_fit`'s.
6. *Uncertainty* (what the :class:`Fit` answers with): delta-method standard errors (inflated
   for residual autocorrelation) combined with the residual scale and a term proportional to the
   predicted remaining decay; the interval multipliers for that combined scale are empirical
   quantiles fitted offline on the curve corpus (``service/forecast/calibration.py``, written by
   ``bench/forecast/forecast_calibrate.py``), as a function of the extrapolation ratio.
7. *Off-model*: the recent part of the window is compared with a fit on the data before it; a
   sustained departure (the median of the latest points, several standard errors away and well
   beyond the predicted decay: an LR decay began, or a divergence) sets ``off_model``
   (:mod:`.off_model`).

This module runs the steps and decides the status; :mod:`.burn_in` chooses where the fit
starts, and :mod:`.reached` records where the data's smoothed loss fell (the fit's ``reached``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike

from curvecast.contract import ForecastStatus, RunConfig
from curvecast.service.forecast.binning import DEFAULT_MAX_BINS, bin_sorted, clean_series
from curvecast.service.forecast.burn_in import choose_burn_in, data_burn_in
from curvecast.service.forecast.curve import (
    DIVERGED_MIN_POINTS,
    FitParams,
    FloatArray,
    as_float,
    finite_or_none,
    level_points,
    valid_confidence,
)
from curvecast.service.forecast.fit import Fit
from curvecast.service.forecast.off_model import flat_fit, mark_off_model
from curvecast.service.forecast.reached import reached_pairs
from curvecast.service.forecast.robust_fit import (
    MIN_POINTS,
    covariance,
    fit_vp,
    location_scale,
    median,
    n_effective,
)
from curvecast.service.forecast.schedule import (
    CONSTANT_LR_ASSUMED,
    assumes_constant_lr,
    lr_decay,
)

__all__ = ["MIN_POINTS", "choose_burn_in", "fit_curve"]

# --- tuning constants (why each value: docs/forecast.md, "Method") -----------------------------
_GROSS_OUTLIER: Final = 1e6  # losses this many robust scales from the median are dropped
_DATA_BURN_IN_FRACTION: Final = 0.05  # the paper drops the first 5% of the run
# Whether the data may also move a burn-in the config gives (the averaging start) later. Off:
# on our ScheduleFree+ runs the `ok` fits it gave covered the final loss too rarely (fewer
# points, intervals too narrow; BENCHMARKS.md, "Forecast backtest on our ScheduleFree+ runs").
_DATA_MOVES_CONFIG_BURN_IN = False
# The transient after averaging starts (docs/forecast.md, "Statuses"): until the run has averaged
# for as long as it ran before averaging (2x the averaging start) the fit is ``too_early``; a
# plateau or a rise (the "hump" at x) up to 3x the averaging start is the transient too.
_TRANSIENT_FACTOR: Final = 2.0
_HUMP_FACTOR: Final = 3.0
_PLATEAU_FRACTION: Final = 0.5  # a flat fit before half of total_steps is a plateau, too_early
_DECAY_WINDOW: Final = 0.6  # the current decay rate: a log-log slope from 60% of the last step
_REACHED_BINS: Final = 256  # the data's running minimum is kept at this resolution ...
_REACHED_SMOOTH: Final = 3  # ... of medians of this many consecutive bins


# --- public entry point -------------------------------------------------------------------------
def fit_curve(
    steps: ArrayLike,
    values: ArrayLike,
    *,
    burn_in: float | None = None,
    config: RunConfig | Mapping[str, Any] | None = None,
    warm_start: FitParams | None = None,
    confidence: float = 0.9,
    max_bins: int = DEFAULT_MAX_BINS,
    check_off_model: bool = True,
    lr: tuple[ArrayLike, ArrayLike] | None = None,
    ends_non_finite: bool = False,
) -> Fit:
    """Fit ``f(t) = a / sqrt(t + b) + c`` robustly to a loss curve. Pure; never raises.

    Args:
        steps: training steps (any order; non-finite pairs are dropped).
        values: losses at those steps.
        burn_in: first step allowed into the fit. When ``None``: the run's ``config`` decides
            (:func:`choose_burn_in`), else a warm start's burn-in, else the data.
        config: the run's config (a stored dict or a read :class:`~curvecast.contract.RunConfig`);
            only its averaging start matters here, forecasts take the horizon as an argument.
        warm_start: parameters of a previous fit of the same run; narrows the search (faster)
            and reuses its burn-in.
        confidence: default confidence of the returned fit's interval queries.
        max_bins: series longer than this are binned (``binning.bin_series``) first.
        check_off_model: run the off-model test (one extra fit on the older part of the data).
        lr: ``(steps, values)`` of the learning rate the optimizer logged (``opt/lr``), if any:
            once it decays below its peak (:func:`~.schedule.lr_decay`) the fit is
            ``off_model``, as it is when the config declares a decaying ``lr_schedule``.
        ends_non_finite: the series goes on after ``steps`` with non-finite values only (the
            service reads finite points; it says so from the latest stored ones). The same is
            seen in ``values`` themselves when they end in ``DIVERGED_MIN_POINTS`` of them.

    Returns:
        A :class:`Fit`. ``status`` is ``diverged`` when the series ends in non-finite values
        (no forecast), ``insufficient_data`` with fewer than 4 usable points,
        ``too_early`` while the run is in the transient after averaging starts, ``flat`` when
        the data show no significant decay, ``off_model`` when the recent data left the model or
        the learning rate decays, ``no_asymptote`` when ``c`` sits at its floor,
        ``no_convergence`` if the optimiser failed, else ``ok`` (docs/forecast.md, "Statuses").
    """
    conf = valid_confidence(confidence, 0.9)
    try:
        # Odd data (1e300 spikes, 1e-300 losses) overflow intermediate sums: that is handled by
        # the finiteness checks, so numpy's warnings would only be noise.
        with np.errstate(all="ignore"):
            cfg = config if isinstance(config, RunConfig) else RunConfig.read(config)
            t_all, y_all = clean_series(steps, values)
            if ends_non_finite or _ends_non_finite(steps, t_all):
                # No forecast; the targets the finite points reached are still answered.
                return replace(_diverged(t_all, conf), reached=reached_pairs(t_all, y_all))
            floor = _loss_floor(y_all, cfg)
            fit = _fit_curve(t_all, y_all, burn_in, cfg, warm_start, conf, max_bins,
                             check_off_model, floor)
            fit = _transient(fit, t_all, y_all, burn_in, cfg, conf, max_bins, floor)
            why = _decaying_schedule(cfg, lr, float(t_all[-1]) if t_all.size else None)
            if why is not None and fit.has_forecast:
                # The model is for anytime runs; the numbers extrapolate the pace so far and
                # cannot see the decay to come.
                fit = replace(fit, status=ForecastStatus.OFF_MODEL, off_model=True,
                              useful_from_step=None,
                              message=f"{why}: a/sqrt(t+b)+c describes constant-LR and "
                              "schedule-free runs; read the forecast with care")
            elif fit.status == ForecastStatus.OK and assumes_constant_lr(cfg, lr is not None):
                fit = replace(fit, assumes_constant_lr=True, message="; ".join(
                    m for m in (fit.message, CONSTANT_LR_ASSUMED) if m))
            return replace(fit, loss_floor=floor, reached=reached_pairs(t_all, y_all))
    except (ValueError, FloatingPointError, ArithmeticError, np.linalg.LinAlgError) as exc:
        # Defensive: numerical corner cases must come back as a status, not an exception.
        return Fit(status=ForecastStatus.NO_CONVERGENCE, confidence=conf,
                   message=f"fit failed: {exc}")


def _decaying_schedule(config: RunConfig, lr: tuple[ArrayLike, ArrayLike] | None,
                       upto: float | None) -> str | None:
    """Why the run's learning rate decays, in words, or ``None``: the config declares a
    decaying ``lr_schedule``, or the logged rate fell below its peak (up to the fit's last
    step: a forecast made then could have known no more)."""
    if config.decaying_schedule:
        return f"the run's config declares a decaying learning-rate schedule ({config.lr_schedule})"
    if lr is not None:
        decay = lr_decay(lr[0], lr[1], upto=upto)
        if decay is not None:
            return decay.message()
    return None


def _loss_floor(y: FloatArray, config: RunConfig) -> float | None:
    """The config's declared lower bound, else 0 for a loss that was never negative."""
    if config.loss_lower_bound is not None:
        return config.loss_lower_bound
    return 0.0 if y.size and float(np.min(y)) >= 0 else None


def _level(t: FloatArray, y: FloatArray) -> tuple[float | None, float | None]:
    """The current loss and the step it stands for: the median of the latest points (robust to
    a last spike) and the median of their steps.

    On a falling curve the median value is that of the window's middle point, not of its last:
    extended from the last step, it carried half a window of lag (a run's forecast at its own
    last step sat above the loss it had reached, with an interval that missed it)."""
    if y.size == 0:
        return None, None
    n = level_points(int(y.size))
    return median(y[-n:]), median(t[-n:])


def _decay_rate(t: FloatArray, y: FloatArray, counts: Any) -> float | None:
    """How fast the loss falls now: minus the slope of ``log(loss)`` against ``log(step)``
    over the latest steps (from 60% of the last fitted step on; the whole window when that
    holds fewer than 4 points), weighted by point counts. ``None`` for a loss that is not
    positive there or too few points."""
    t_last = float(t[-1])
    recent = t >= _DECAY_WINDOW * t_last
    if int(recent.sum()) < MIN_POINTS:
        recent = np.ones(t.size, dtype=bool)
    tr, yr = t[recent], y[recent]
    if tr.size < MIN_POINTS or float(tr[0]) <= 0 or not np.all(yr > 0):
        return None
    lt, ly = np.log(tr), np.log(yr)
    w = np.asarray(counts, dtype=np.float64)[recent]
    mt = float(w @ lt) / float(w.sum())
    den = float(w @ (lt - mt) ** 2)
    if not den > 0:
        return None
    slope = float(w @ ((lt - mt) * (ly - float(w @ ly) / float(w.sum())))) / den
    return -slope if math.isfinite(slope) else None


def _ends_non_finite(steps: ArrayLike, t_all: FloatArray) -> bool:
    """Whether at least ``DIVERGED_MIN_POINTS`` points lie after the last finite one
    (``t_all[-1]``): all of them non-finite, or they would be in ``t_all``. One vectorised
    comparison: a long series' fit must stay cheap."""
    try:
        t = np.asarray(steps, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        return False
    if t.size < DIVERGED_MIN_POINTS:
        return False
    last = t_all[-1] if t_all.size else -np.inf
    return int(np.count_nonzero(t > last)) >= DIVERGED_MIN_POINTS


def _diverged(t_all: FloatArray, conf: float) -> Fit:
    """The answer for a series that ends in NaN or infinite values: nothing to extrapolate."""
    last = float(t_all[-1]) if t_all.size else None
    after = f"after step {last:g}" if last is not None else "from its first point"
    return Fit(status=ForecastStatus.DIVERGED, confidence=conf, n_points=int(t_all.size),
               fitted_upto_step=last,
               message=f"the loss is not finite {after}: its latest points are NaN or "
                       "infinite (the run diverged); no forecast")


def _transient(fit: Fit, t_all: FloatArray, y_all: FloatArray, burn_in: float | None,
               config: RunConfig, conf: float, max_bins: int, floor: float | None) -> Fit:
    """``too_early`` while the run is still in the transient after averaging starts.

    Known only from the config (its averaging start ``s``): before the run has averaged for as
    long as it ran before averaging (``2 s``), and, up to ``3 s``, while the fit sees a plateau
    or a rise (the "hump" of the loss at x). Before ``s`` itself there is nothing to fit after
    the burn-in: the fit then uses the data from the paper's 5% rule, for a provisional
    forecast with the wide ``too_early`` interval. A flat fit in the first half of a run with
    a planned ``total_steps`` is a plateau: ``too_early`` as well.
    """
    if burn_in is not None or t_all.size == 0:
        return fit
    start = config.averaging_start or 0
    t_last = float(t_all[-1])
    useful = _TRANSIENT_FACTOR * start
    if fit.status == ForecastStatus.INSUFFICIENT_DATA:
        provisional = _fit_curve(t_all, y_all, None, RunConfig(), None, conf, max_bins, False,
                                 floor)
        if not provisional.has_forecast:
            return fit
        fit = provisional
    elif not fit.has_forecast:
        return fit
    hump = fit.status == ForecastStatus.FLAT or (
        fit.status == ForecastStatus.OFF_MODEL and (fit.off_model_score or 0) > 0)
    total = config.total_steps
    # The config names an optimizer that does not average (AdamW, say): its start is ScheduleFree+'s
    # rule applied to its warmup, and the messages say so rather than speak of averaging.
    averages = config.c_warmup is not None or config.optimizer is None or config.schedule_free
    begins = (f"averaging starts (step {start:g})" if averages else
              f"warmup (the fit starts at step {start:g}, twice warmup_steps as ScheduleFree+ "
              "starts averaging; c_warmup in the config moves it)")
    if t_last < useful:
        why = f"still in the transient after {begins}"
    elif hump and t_last < _HUMP_FACTOR * start:
        useful = _HUMP_FACTOR * start
        why = f"a plateau or rise right after {begins}"
    elif (fit.status == ForecastStatus.FLAT and total is not None
          and t_last < _PLATEAU_FRACTION * total):
        # A plateau in the first half of a planned run: on the corpus these runs fell again.
        useful = min(2.0 * t_last, float(total))
        why = "a plateau in the first half of the run"
    else:
        return fit
    when = f"a useful forecast is expected from step {useful:g}"
    if total is not None and useful > total:
        # The run as planned never gets there: say so, and what a run this short needs.
        when += f", after this run's planned {total:,} steps, so it will get none: " + (
            f"averaging starts at step {start:g} (c_warmup; ScheduleFree+'s default is twice "
            "its 500-step warmup); for a short run pass warmup_steps of a tenth to a quarter of "
            "it and c_warmup 1.5x that" if averages else
            "pass c_warmup, the step from which the loss follows a/sqrt(t+b)+c (the end of "
            "warmup, say), to start the fit earlier")
    return replace(
        fit, status=ForecastStatus.TOO_EARLY, off_model=False, useful_from_step=useful,
        message=(f"{why}: {when}; until then the forecast extends the current loss at the "
                 "pace runs like this one kept, with a wide interval"),
    )


def _fit_curve(t_all: FloatArray, y_all: FloatArray, burn_in: float | None,
               config: RunConfig, warm_start: FitParams | None,
               conf: float, max_bins: int, check_off_model: bool, floor: float | None) -> Fit:
    if t_all.size == 0:
        return Fit(status=ForecastStatus.INSUFFICIENT_DATA, confidence=conf,
                   message="no finite (step, loss) pairs")

    # 1. burn-in
    source: str | None
    b_in = as_float(burn_in)
    if math.isfinite(b_in):
        source = "argument"
    else:
        cfg_b, source = choose_burn_in(config)
        if cfg_b is not None:
            b_in = cfg_b
        elif warm_start is not None and warm_start.burn_in is not None:
            b_in, source = float(warm_start.burn_in), "warm_start"
        else:
            b_in, source = math.nan, "data"
    q_center = None
    if warm_start is not None and math.isfinite(warm_start.b):
        q_center = warm_start.b  # converted once t0 is known

    if source == "data":
        # The paper's rule first (drop the first 5% of the steps seen so far); the data may move
        # it later (below), on the binned series.
        b_in = max(float(t_all[0]), _DATA_BURN_IN_FRACTION * float(t_all[-1]))
    first = int(np.searchsorted(t_all, b_in, side="left")) if math.isfinite(b_in) else 0
    t_raw, y_raw = t_all[first:], y_all[first:]  # sorted: a slice (a view, no copy)

    # 2. binning (and the data-driven burn-in, on the bins)
    binned = bin_sorted(t_raw, y_raw, max_bins)
    t, y, counts = binned.steps, binned.values, binned.counts
    if np.unique(t).size < MIN_POINTS:
        n_raw = int(t_raw.size)
        return Fit(status=ForecastStatus.INSUFFICIENT_DATA, n_points=n_raw,
                   burn_in=finite_or_none(b_in), burn_in_source=source, confidence=conf,
                   fitted_from_step=float(t_raw[0]) if n_raw else None,
                   fitted_upto_step=float(t_raw[-1]) if n_raw else None,
                   message=f"{n_raw} usable points after burn-in; at least {MIN_POINTS} "
                   "distinct steps are needed")
    # Robust normalisation: the optimiser works on (y - median) / scale, so losses of 1e-300 or
    # 1e300 neither underflow nor overflow its sums, and gross outliers (a 1e300 spike: more than
    # 1e6 scales from the median) are dropped outright -- Huber weights handle the rest.
    y_mid, y_scale = location_scale(y)
    sane = np.abs(y - y_mid) <= _GROSS_OUTLIER * y_scale
    if not sane.all():
        t, y, counts = t[sane], y[sane], counts[sane]
        if np.unique(t).size < MIN_POINTS:
            return Fit(status=ForecastStatus.INSUFFICIENT_DATA, n_points=int(counts.sum()),
                       burn_in=finite_or_none(b_in), burn_in_source=source, confidence=conf,
                       message="too few points left after removing gross outliers")
    cmin = ((floor if floor is not None else -math.inf) - y_mid) / y_scale
    y = (y - y_mid) / y_scale
    if source == "data" or (_DATA_MOVES_CONFIG_BURN_IN and (source or "").startswith("config:")):
        # The data may move the start later than the paper's 5% (see data_burn_in).
        start = data_burn_in(t, y, counts.astype(np.float64), cmin)
        if start > b_in:
            sel = t >= start
            t, y, counts = t[sel], y[sel], counts[sel]
            b_in, source = start, "data"
    n_raw = int(counts.sum())
    w0 = counts.astype(np.float64)
    w0 /= w0.mean()
    qc = None
    if q_center is not None and q_center + t[0] > 0:
        qc = math.log(q_center + float(t[0]))

    raw = fit_vp(t, y, w0, cmin, qc)
    if raw is None or not all(math.isfinite(v) for v in (raw.a, raw.b, raw.c)):
        return Fit(status=ForecastStatus.NO_CONVERGENCE, n_points=n_raw, n_fitted=int(t.size),
                   burn_in=finite_or_none(b_in), burn_in_source=source, confidence=conf,
                   message="the optimiser did not find finite parameters")

    n_eff = n_effective(raw.residuals)
    sigma = raw.sigma * y_scale
    level, level_step = _level(t_raw, y_raw)
    base: dict[str, Any] = {
        # From the first bin's centre (the fit's q is parametrised there) up to the last point
        # fitted: the data's own last step, not its bin's centre ("up to step 1,998" for a run
        # at step 2,000; a block's centre, thousands of steps back, on a long run).
        "n_points": n_raw, "n_fitted": int(t.size), "fitted_from_step": float(t[0]),
        "fitted_upto_step": float(t_raw[-1]), "residual_scale": sigma,
        "burn_in": finite_or_none(b_in),
        "burn_in_source": source, "n_eff": n_eff, "confidence": conf,
        "level": level, "level_step": level_step,
        "decay_rate": _decay_rate(t, y * y_scale + y_mid, counts),
    }

    # 3. flat (or rising) curves: no significant decay over the window
    u0 = math.exp(raw.q)  # t0 + b
    drop = raw.a * (1.0 / math.sqrt(u0) - 1.0 / math.sqrt(u0 + float(t[-1] - t[0])))
    if raw.a <= 0.0 or drop < 3.0 * raw.sigma / math.sqrt(n_eff):
        return flat_fit(t, y, base, y_mid, y_scale)

    cov = covariance(raw, t, n_eff)
    cov_t = None
    if cov is not None:
        d = np.array([y_scale, 1.0, y_scale])  # back to loss units for a and c
        cov = cov * np.outer(d, d)
        cov_t = tuple((float(r[0]), float(r[1]), float(r[2])) for r in cov)
    a, c = raw.a * y_scale, raw.c * y_scale + y_mid
    if not (math.isfinite(a) and math.isfinite(c)):
        return Fit(status=ForecastStatus.NO_CONVERGENCE, n_points=n_raw, n_fitted=int(t.size),
                   burn_in=finite_or_none(b_in), burn_in_source=source, confidence=conf,
                   message="the parameters overflow in loss units")
    fit = Fit(status=ForecastStatus.OK, a=a, b=raw.b, c=c, cov=cov_t, **base)

    # 4. off-model test on the recent part of the window
    if check_off_model:
        fit = mark_off_model(fit, t, y, raw.weights, cmin, raw.q)
    if fit.status == ForecastStatus.OK:
        why = _unidentified_f_star(fit, raw.c <= cmin + 1e-9, floor)
        if why is not None:
            level = base["level"]
            at_most = f" (at most the current loss {level:.4g})" if level is not None else ""
            fit = replace(fit, status=ForecastStatus.NO_ASYMPTOTE, message=(
                f"{why}: f* is not identifiable yet{at_most}; the forecast extends the current "
                "loss at the pace runs like this one kept (docs/forecast.md, \"Statuses\")"))
    return fit


def _unidentified_f_star(fit: Fit, c_at_floor: bool, floor: float | None) -> str | None:
    """Why the fit's asymptote says nothing about f*, or ``None`` when it does.

    ``c`` on its floor: the data fit a line better than a curve that levels off. Or f*'s own
    interval reaches the floor: "f* = c +- most of the loss" is no estimate either. Both make
    the fit's extrapolation the optimistic end of what is possible (BENCHMARKS.md, "Forecast
    backtest on our ScheduleFree+ runs").
    """
    if c_at_floor:
        return "the asymptote c is at its floor"
    if floor is not None:
        star = fit.f_star()
        if math.isfinite(star.lo) and star.lo <= floor:
            return f"the asymptote's {fit.confidence:.0%} interval reaches the loss floor {floor:g}"
    return None
