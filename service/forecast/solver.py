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
   same for 10^3 or 10^6 raw points.
4. *Variable projection*: for a fixed ``b`` the model is linear in ``(a, c)``, solved in closed
   form with ``a >= 0`` (and ``c >= 0`` when every loss is positive). The 1-D profile over
   ``q = log(t0 + b)`` is scanned on a grid (vectorised), then polished with a bounded scalar
   search. A weak Gaussian prior on ``q`` keeps short prefixes from running off to the linear
   (``b -> inf``) or singular (``b -> -t0``) ends.
5. *Robustness*: Huber iteratively reweighted least squares (scale from the MAD of residuals), so
   spikes and outliers lose their pull.
6. *Uncertainty* (what the :class:`Fit` answers with): delta-method standard errors (inflated
   for residual autocorrelation) combined with the residual scale and a term proportional to the
   predicted remaining decay; the interval multipliers for that combined scale are empirical
   quantiles fitted offline on the curve corpus (``service/forecast/calibration.py``, written by
   ``bench/forecast/forecast_calibrate.py``), as a function of the extrapolation ratio.
7. *Off-model*: the recent part of the window is compared with a fit on the data before it; a
   sustained departure (the median of the latest points, several standard errors away and well
   beyond the predicted decay: an LR decay began, or a divergence) sets ``off_model``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import minimize_scalar

from curvecast.contract import ForecastStatus, RunConfig
from curvecast.service.forecast.binning import DEFAULT_MAX_BINS, bin_sorted, clean_series
from curvecast.service.forecast.fit import (
    DIVERGED_MIN_POINTS,
    Fit,
    FitParams,
    FloatArray,
    as_float,
    curve_gradients,
    finite_or_none,
    level_points,
    model,
    valid_confidence,
)
from curvecast.service.forecast.reached import REACHED_MAX_POINTS, smoothed_reached
from curvecast.service.forecast.schedule import (
    CONSTANT_LR_ASSUMED,
    assumes_constant_lr,
    lr_decay,
)

__all__ = ["MIN_POINTS", "choose_burn_in", "fit_curve"]

# --- tuning constants (why each value: docs/forecast.md, "Method") -----------------------------
MIN_POINTS: Final = 4  # three parameters need at least one residual degree of freedom
_GROSS_OUTLIER: Final = 1e6  # losses this many robust scales from the median are dropped
_Q_SPAN_LO: Final = -7.0  # grid for q = log(t0 + b), relative to log of the reference scale
_Q_SPAN_HI: Final = 9.0
_GRID: Final = 65
_WARM_HALF_WIDTH: Final = 1.5  # a warm start scans q within +-1.5 of the previous fit
_WARM_GRID: Final = 13
_PRIOR_MU: Final = -0.5  # prior mean of log((t0 + b) / t0): b ~ -0.4 t0 on the corpus
_PRIOR_TAU: Final = 1.5  # weak: moves q only where the data cannot tell
_HUBER_K: Final = 1.5  # Huber threshold in robust standard deviations
_IRLS_ITERS: Final = 3
_DATA_BURN_IN_FRACTION: Final = 0.05  # the paper drops the first 5% of the run
_BURN_IN_CANDIDATES: Final = (0.05, 0.1, 0.2, 0.3)  # fractions of the latest step
_BURN_IN_TOLERANCE: Final = 1.5  # a later start must extrapolate 1.5x better to be chosen
# Whether the data may also move a burn-in the config gives (the averaging start) later. Tried
# on our ScheduleFree+ runs (bench/forecast/forecast_sfplus.py, "config burn-in moved by the
# data"): the median error fell at 20% and 50% of a run, but the `ok` fits at 30% covered the
# final loss about half the time (fewer points, intervals too narrow). Off.
_DATA_MOVES_CONFIG_BURN_IN = False
_RECENT_FRACTION: Final = 0.3  # off-model test: the last 30% of the fitted step range ...
# ... sits, as a block (median), below the older fit by >= 3 standard errors and >= 10% more
# decay than it predicted, or by >= 2 standard errors and twice the predicted decay (an LR decay
# began); or above it by >= 3 standard errors, having given back more than the whole predicted
# decay (a rise). Thresholds chosen on the corpus: <= 5% of anytime fits flagged at any cut.
_OFF_RULES_BELOW: Final = ((3.0, 0.1), (2.0, 1.0))
_OFF_RULE_ABOVE: Final = (3.0, 1.0)
_OFF_Z: Final = 3.0  # a flat fit's upward trend, in standard errors, that counts as a rise
# The transient after averaging starts (docs/forecast.md, "Statuses"): until the run has averaged
# for as long as it ran before averaging (2x the averaging start) the fit is ``too_early``; a
# plateau or a rise (the "hump" at x) up to 3x the averaging start is the transient too.
_TRANSIENT_FACTOR: Final = 2.0
_HUMP_FACTOR: Final = 3.0
_PLATEAU_FRACTION: Final = 0.5  # a flat fit before half of total_steps is a plateau, too_early
_DECAY_WINDOW: Final = 0.6  # the current decay rate: a log-log slope from 60% of the last step
_REACHED_BINS: Final = 256  # the data's running minimum is kept at this resolution ...
_REACHED_SMOOTH: Final = 3  # ... of medians of this many consecutive bins


# --- burn-in -------------------------------------------------------------------------------------
def choose_burn_in(
    config: RunConfig | Mapping[str, Any] | None,
) -> tuple[float | None, str | None]:
    """Burn-in step from a run's config and where it came from, or ``(None, None)``.

    The contract's :attr:`~curvecast.contract.RunConfig.averaging_start` (``c_warmup``, else the
    paper's ``2 * warmup_steps``): the step where ScheduleFree+ starts averaging.
    """
    cfg = config if isinstance(config, RunConfig) else RunConfig.read(config)
    start = cfg.averaging_start
    return (None, None) if start is None else (float(start), cfg.averaging_start_source)


# --- the optimiser -------------------------------------------------------------------------------
@dataclass
class _Raw:
    """Internal result of one robust variable-projection fit."""

    a: float
    b: float
    c: float
    q: float
    t0: float
    residuals: FloatArray
    weights: FloatArray
    sigma: float


def _solve_ac(x: FloatArray, y: FloatArray, w: FloatArray, cmin: float
              ) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Weighted least squares ``y ~ a x + c`` for every row of ``x`` at once, ``a >= 0``,
    ``c >= cmin``. Returns ``(a, c, sse)`` per row.

    From weighted sums, with two passes over ``x`` (a product with ``[w, w y]`` and one with
    ``w`` of ``x * x``): a fit scans hundreds of rows, and forming each row's residuals cost
    three times as much. The SSE loses a few of float64's digits to cancellation on a very
    good fit; the grid only ranks rows by it, and the chosen row is re-solved exactly.
    """
    wsum = float(w.sum())
    sy = float(w @ y)
    syy = float(w @ (y * y))
    sx_sxy = x @ np.stack((w, w * y), axis=1)
    sx, sxy = sx_sxy[:, 0], sx_sxy[:, 1]
    sxx = (x * x) @ w
    cxx = sxx - sx * sx / wsum  # centred: the slope's normal equation
    cxy = sxy - sx * sy / wsum
    safe = np.where(cxx > 0, cxx, 1.0)
    a = np.maximum(np.where(cxx > 0, cxy / safe, 0.0), 0.0)
    c = (sy - a * sx) / wsum
    low = c < cmin
    if np.any(low):
        # The asymptote hit its bound: re-solve a with c fixed at the bound.
        num = sxy - cmin * sx
        a2 = np.maximum(np.where(sxx > 0, num / np.where(sxx > 0, sxx, 1.0), 0.0), 0.0)
        a = np.where(low, a2, a)
        c = np.where(low, cmin, c)
    sse = syy - 2.0 * a * sxy - 2.0 * c * sy + a * a * sxx + 2.0 * a * c * sx + c * c * wsum
    return a, c, np.maximum(sse, 0.0)


def _design(t: FloatArray, qs: FloatArray) -> FloatArray:
    """``1 / sqrt(exp(q) + t - t[0])``: one row per ``q`` of the grid (in place: no temporaries)."""
    u: FloatArray = np.exp(qs)[:, None] + (t[None, :] - t[0])
    np.sqrt(u, out=u)
    np.divide(1.0, u, out=u)
    return u


def _median(x: FloatArray) -> float:
    """``np.median`` of a non-empty 1-d array, the same value, without its generic machinery
    (about 7x faster on the few hundred points of a fit, which asks for dozens of medians)."""
    s = np.sort(x)
    h = s.size // 2
    return float(s[h]) if s.size % 2 else float((s[h - 1] + s[h]) / 2.0)


def _robust_sigma(r: FloatArray) -> float:
    if r.size == 0:
        return 0.0
    mad = _median(np.abs(r - _median(r))) * 1.4826
    if mad > 0:
        return mad
    return float(np.sqrt(np.mean(r * r)))


def _fit_vp(t: FloatArray, y: FloatArray, w0: FloatArray, cmin: float,
            q_center: float | None = None, half_width: float = _WARM_HALF_WIDTH,
            iters: int = _IRLS_ITERS) -> _Raw | None:
    """Robust variable-projection fit on sorted data (``t[0]`` is the first fitted step).

    ``q = log(t0 + b)``; with ``q_center`` (a warm start) only a narrow grid around it is scanned.
    """
    t0 = float(t[0])
    span = float(t[-1] - t0)
    ref = max(t0, 0.02 * float(t[-1]), 1e-9 * max(span, 1.0), 1e-12)
    log_ref = math.log(ref)
    mu = log_ref + _PRIOR_MU if t0 > 0 else log_ref
    if q_center is not None and math.isfinite(q_center):
        n_grid = max(_WARM_GRID, int(round(_WARM_GRID * half_width / _WARM_HALF_WIDTH)))
        qs = np.linspace(q_center - half_width, q_center + half_width, n_grid)
    else:
        qs = np.linspace(log_ref + _Q_SPAN_LO, log_ref + _Q_SPAN_HI, _GRID)
    tr = t - t0  # the design only needs t - t0, which keeps precision at large steps
    w = w0.copy()
    scale_y = max(float(np.max(np.abs(y))), 1.0)  # data are normalised: O(1)
    best: _Raw | None = None
    x, x_qs = _design(t, qs), qs
    for it in range(iters):
        if qs is not x_qs and not np.array_equal(qs, x_qs):
            # A pass whose optimum is the previous grid's centre scans the same grid again
            # (only the weights changed): the design is reused.
            x, x_qs = _design(t, qs), qs
        _, _, sse_g = _solve_ac(x, y, w, cmin)
        dof = max(float(w.sum() / w.max()) - 3.0, 1.0)
        s2 = max(float(sse_g.min()) / dof, (1e-12 * scale_y) ** 2)
        obj = sse_g / (2.0 * s2) + (qs - mu) ** 2 / (2.0 * _PRIOR_TAU**2)
        obj[np.isnan(obj)] = np.inf  # what np.nanargmin does, without its overhead
        i = int(np.argmin(obj))
        if not math.isfinite(float(obj[i])):
            return None
        q = float(qs[i])
        lo, hi = float(qs[max(i - 1, 0)]), float(qs[min(i + 1, qs.size - 1)])
        line = _LineFit(y, w, cmin)
        if it == iters - 1 and hi > lo:
            # Polish the last pass only: earlier passes just need weights.
            def objective(q: float, line: _LineFit = line, s2: float = s2) -> float:
                return (line.sse(1.0 / np.sqrt(math.exp(q) + tr)) / (2.0 * s2)
                        + (q - mu) ** 2 / (2.0 * _PRIOR_TAU**2))

            res = minimize_scalar(objective, bounds=(lo, hi), method="bounded",
                                  options={"xatol": 1e-4})
            if res.success and float(res.fun) <= float(obj[i]):
                q = float(res.x)
        xq = 1.0 / np.sqrt(math.exp(q) + tr)
        a, c = line.ac(xq)
        r = y - (a * xq + c)
        sigma = _robust_sigma(r)
        b = math.exp(q) - t0
        best = _Raw(a=a, b=b, c=c, q=q, t0=t0, residuals=r, weights=w.copy(), sigma=sigma)
        if sigma <= 0:
            break
        if it < iters - 1:
            k = _HUBER_K * sigma
            w = w0 * np.minimum(1.0, k / np.maximum(np.abs(r), 1e-300))
            if q_center is None:
                # After the first pass, scan a finer grid around the optimum only.
                qs = np.linspace(q - 2.0, q + 2.0, 33)
    return best


class _LineFit:
    """The constrained weighted fit ``y ~ a x + c`` (``a >= 0``, ``c >= cmin``) of fixed data
    ``(y, w)`` against one design vector ``x`` at a time: what the 1-d polish asks for a dozen
    times per pass, so the sums that do not depend on ``x`` are formed once."""

    __slots__ = ("cmin", "my", "w", "wsum", "wyc", "y")

    def __init__(self, y: FloatArray, w: FloatArray, cmin: float) -> None:
        self.y, self.w, self.cmin = y, w, cmin
        self.wsum = float(w.sum())
        self.my = float(w @ y) / self.wsum
        self.wyc = w * (y - self.my)

    def ac(self, x: FloatArray) -> tuple[float, float]:
        """``(a, c)`` for the design vector ``x``."""
        w = self.w
        mx = float(w @ x) / self.wsum
        dx = x - mx
        sxx = float(w @ (dx * dx))
        a = max(float(dx @ self.wyc) / sxx, 0.0) if sxx > 0 else 0.0
        c = self.my - a * mx
        if c < self.cmin:
            # The asymptote hit its bound: re-solve a with c fixed at the bound.
            c = self.cmin
            sx2 = float(w @ (x * x))
            a = max(float(w @ (x * (self.y - c))) / sx2, 0.0) if sx2 > 0 else 0.0
        return a, c

    def sse(self, x: FloatArray) -> float:
        """The weighted sum of squared residuals of the fit on ``x``."""
        a, c = self.ac(x)
        r = self.y - (a * x + c)
        return float(self.w @ (r * r))


def _n_eff(r: FloatArray) -> float:
    """Effective sample size under AR(1) residuals: n (1 - rho) / (1 + rho)."""
    n = r.size
    if n < 3:
        return float(n)
    den = float(r @ r)
    if den <= 0:
        return float(n)
    rho = float(r[1:] @ r[:-1]) / den
    rho = min(max(rho, 0.0), 0.95)
    return max(n * (1.0 - rho) / (1.0 + rho), 2.0)


def _covariance(raw: _Raw, t: FloatArray, n_eff: float) -> FloatArray | None:
    """Delta-method covariance of (a, q, c), inflated by n / n_eff, with the prior on q."""
    u = np.exp(raw.q) + (t - raw.t0)
    inv = 1.0 / np.sqrt(u)
    jac = np.column_stack([inv, -0.5 * raw.a * inv / u * np.exp(raw.q), np.ones_like(t)])
    w = raw.weights
    s2 = max(float(w @ raw.residuals**2) / max(float(w.sum()) - 3.0, 1.0), raw.sigma**2)
    if s2 <= 0:
        s2 = 1e-30
    info = (jac * w[:, None]).T @ jac / s2
    info[1, 1] += 1.0 / _PRIOR_TAU**2
    try:
        cov = np.linalg.pinv(info) * (t.size / max(n_eff, 1.0))
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(cov)):
        return None
    out: FloatArray = 0.5 * (cov + cov.T)
    return out


def _location_scale(y: FloatArray) -> tuple[float, float]:
    """Median and a robust, strictly positive scale (IQR, else MAD, else the level)."""
    mid = _median(y)
    q25, q75 = np.percentile(y, [25.0, 75.0])
    scale = float(q75 - q25) / 1.349
    if not scale > 0:
        scale = 1.4826 * _median(np.abs(y - mid))
    if not scale > 0:
        scale = abs(mid) if mid != 0 else 1.0
    return mid, scale


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
                return replace(_diverged(t_all, conf), reached=_reached(t_all, y_all))
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
            return replace(fit, loss_floor=floor, reached=_reached(t_all, y_all))
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
    return _median(y[-n:]), _median(t[-n:])


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


def _reached(t: FloatArray, y: FloatArray) -> tuple[tuple[float, float], ...] | None:
    """``((step, loss), ...)``: where the smoothed series' running minimum fell.

    Medians of equal-count bins, then the median of each window of three bins (one low eval
    batch does not count as reaching a target), then the running minimum, kept at the steps it
    fell: at most ~256 pairs per fit. The last step ends it with the loss the series had there
    by :func:`~.reached.smoothed_reached`'s rule, where that is lower.
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
    # median lags the newest points, so at a run's end an eval loss of 2.384 was "reached
    # there" while a target of 2.39 was "not reached".
    # The series is sorted by step: its newest points are its tail, newest first (sorting a
    # million-point series again, as loss_reached does for any order, cost a refit 100 ms).
    newest = zip(t[:-REACHED_MAX_POINTS - 1:-1].tolist(), y[:-REACHED_MAX_POINTS - 1:-1].tolist(),
                 strict=True)
    last = smoothed_reached(list(newest), float(t[-1]))
    if last is not None and last < pairs[-1][1]:
        pairs.append((float(t[-1]), last))
    return tuple(pairs)


def _ends_non_finite(steps: ArrayLike, t_all: FloatArray) -> bool:
    """Whether at least ``DIVERGED_MIN_POINTS`` points lie after the last finite one
    (``t_all[-1]``): all of them non-finite, or they would be in ``t_all``. One vectorised
    comparison (a fit of 10^6 points must stay within its few milliseconds)."""
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
    if t_last < useful:
        why = f"still in the transient after averaging starts (step {start:g})"
    elif hump and t_last < _HUMP_FACTOR * start:
        useful = _HUMP_FACTOR * start
        why = f"a plateau or rise right after averaging starts (step {start:g})"
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
        when += (f", after this run's planned {total:,} steps, so it will get none: averaging "
                 f"starts at step {start:g} (c_warmup; ScheduleFree+'s default is twice its "
                 "500-step warmup); for a short run pass warmup_steps of a tenth to a quarter of "
                 "it and c_warmup 1.5x that")
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
    y_mid, y_scale = _location_scale(y)
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
        # The data may move the start later than the paper's 5% (see _data_burn_in).
        start = _data_burn_in(t, y, counts.astype(np.float64), cmin)
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

    raw = _fit_vp(t, y, w0, cmin, qc)
    if raw is None or not all(math.isfinite(v) for v in (raw.a, raw.b, raw.c)):
        return Fit(status=ForecastStatus.NO_CONVERGENCE, n_points=n_raw, n_fitted=int(t.size),
                   burn_in=finite_or_none(b_in), burn_in_source=source, confidence=conf,
                   message="the optimiser did not find finite parameters")

    n_eff = _n_eff(raw.residuals)
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
        return _flat_fit(t, y, base, y_mid, y_scale)

    cov = _covariance(raw, t, n_eff)
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
        stats = _off_model_stats(t, y, raw.weights, cmin, raw.q)
        if stats is not None:
            z, excess = stats
            below = any(z < -zt and excess < -et for zt, et in _OFF_RULES_BELOW)
            above = z > _OFF_RULE_ABOVE[0] and excess > _OFF_RULE_ABOVE[1]
            off = below or above
            msg = ""
            if off:
                where = "below" if below else "above"
                msg = (f"the recent data left the model: {abs(z):.1f} standard errors {where} "
                       f"a fit on the older data ({excess:+.0%} of its predicted decay)")
            fit = replace(fit, off_model=off, off_model_score=z, off_model_excess=excess,
                          status=ForecastStatus.OFF_MODEL if off else ForecastStatus.OK,
                          message=msg)
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
    the fit's extrapolation the optimistic end of what is possible (on our runs it missed by
    17% at the median where the interval reached the floor, 5% elsewhere; BENCHMARKS.md).
    """
    if c_at_floor:
        return "the asymptote c is at its floor"
    if floor is not None:
        star = fit.f_star()
        if math.isfinite(star.lo) and star.lo <= floor:
            return f"the asymptote's {fit.confidence:.0%} interval reaches the loss floor {floor:g}"
    return None


def _flat_fit(t: FloatArray, y: FloatArray, base: dict[str, Any], y_mid: float, y_scale: float
              ) -> Fit:
    """Constant fit for a curve without significant decay; flags a significant rise.

    ``y`` is normalised (``(loss - y_mid) / y_scale``); the level and scale are reported in loss
    units.
    """
    level_n = _median(y)
    level = level_n * y_scale + y_mid
    base = dict(base, residual_scale=_robust_sigma(y - level_n) * y_scale)
    # A significant upward trend (divergence) is a departure from the model, not just "flat".
    tt = t - t.mean()
    den = float(tt @ tt)
    off = False
    score: float | None = None
    if den > 0 and t.size >= MIN_POINTS:
        slope = float(tt @ (y - y.mean())) / den
        resid = y - y.mean() - slope * tt
        n_eff = _n_eff(resid)
        s = _robust_sigma(resid)
        se = s / math.sqrt(den) * math.sqrt(t.size / max(n_eff, 1.0)) if s > 0 else 0.0
        if se > 0:
            score = slope / se  # the trend in standard errors
        elif slope > 0:
            score = math.inf
        off = bool(score is not None and score > _OFF_Z)
    if off:
        return Fit(status=ForecastStatus.OFF_MODEL, a=0.0, b=None, c=level, off_model=True,
                   off_model_score=finite_or_none(score),
                   message="the loss is rising: no decay to extrapolate", **base)
    return Fit(status=ForecastStatus.FLAT, a=0.0, b=None, c=level, off_model=False,
               off_model_score=finite_or_none(score),
               message="no significant decay: the forecast is the current level", **base)


def _off_model_stats(t: FloatArray, y: FloatArray, w: FloatArray, cmin: float, q_main: float
                     ) -> tuple[float, float] | None:
    """``(z, excess)``: departure of the recent window from a fit on the data before it.

    The recent window is the last 30% of the fitted step range (at least 3 points); the older
    data (at least 5 points) are fitted alone. ``z`` is the median over recent points of the
    residual from that older fit divided by ``sqrt(se^2 + sigma^2)`` (its delta-method forecast
    error and noise); ``excess`` is the median residual divided by the decay the older fit
    predicted across the recent window. Medians, so a single spike cannot move them; both signs,
    so a divergence shows as well as an LR decay. Returns ``None`` when there is too little data
    or the older part shows no decay to extrapolate.
    """
    t_split = float(t[-1] - _RECENT_FRACTION * (t[-1] - t[0]))
    recent = t > t_split
    if int(recent.sum()) < 3:
        recent = np.zeros(t.size, dtype=bool)
        recent[-3:] = True
    hist = ~recent
    if int(hist.sum()) < MIN_POINTS + 1:
        return None
    th, yh, wh = t[hist], y[hist], w[hist]
    # The main fit's robust weights already mark the outliers: one pass (plus polish) suffices.
    raw = _fit_vp(th, yh, wh, cmin, q_main, half_width=2.5, iters=1)
    if raw is None or raw.a <= 0:
        return None
    t_split = float(th[-1])
    cov = _covariance(raw, th, _n_eff(raw.residuals))
    tr = t[recent]
    pred = model(tr, raw.a, raw.b, raw.c)
    resid = y[recent] - pred
    if cov is not None:
        grads = curve_gradients(tr, raw.a, raw.b, raw.t0)
        se2 = np.maximum(np.einsum("ij,jk,ik->i", grads, cov, grads), 0.0)
    else:
        se2 = np.zeros(tr.size)
    decay = float(model(np.array([t_split]), raw.a, raw.b, raw.c)[0] - pred[-1])
    if not decay > 0 or not np.all(np.isfinite(resid)):
        return None
    # Noise averages down over a block of m recent points (variance of a median: pi/2 s^2/m,
    # fewer effective points when residuals are autocorrelated); the older fit's own forecast
    # error (se^2) does not, it is shared by the whole block.
    phi = _n_eff(raw.residuals) / max(raw.residuals.size, 1)
    noise2 = raw.sigma**2 * (0.5 * math.pi) / phi
    # Scan the suffixes (the last 3, 4, ... recent points): a change that began inside the
    # window shows in the suffix after it even when it is not yet the window's majority.
    best: tuple[float, float] = (0.0, 0.0)
    lengths = sorted({min(int(round(3 * 1.25**i)), resid.size) for i in range(40)})
    medians = _suffix_medians(resid, lengths)
    for m, med in zip(lengths, medians.tolist(), strict=True):
        var = float(np.mean(se2[-m:])) + noise2 / m
        if var <= 0:
            continue
        z = med / math.sqrt(var)
        if abs(z) > abs(best[0]):
            best = (z, med / decay)
    return best


def _suffix_medians(x: FloatArray, lengths: Sequence[int]) -> FloatArray:
    """``np.median(x[-m:])`` for every ``m`` in ``lengths`` (finite ``x``), with one sort
    instead of a median call per suffix (a fit scans about twenty): row ``i`` holds the last
    ``m_i`` values padded with +inf, so once sorted its middle elements are the suffix's."""
    m = np.asarray(lengths, dtype=np.int64)
    rows = np.where(np.arange(x.size)[None, :] < m[:, None], x[::-1][None, :], np.inf)
    rows.sort(axis=1)
    at = np.arange(m.size)
    lo, hi = rows[at, (m - 1) // 2], rows[at, m // 2]
    # As np.median: the middle value, or the mean of the two middle values.
    out: FloatArray = np.where(m % 2 == 1, lo, (lo + hi) / 2.0)
    return out


def _data_burn_in(t: FloatArray, y: FloatArray, w: FloatArray, cmin: float) -> float:
    """Burn-in chosen from the (binned) data when neither the caller nor the config gives one.

    The data start at the paper's rule (5% of the latest step). A later start (10%, 20%, 30% of
    the latest step) is taken only when a fit from it extrapolates the most recent quarter of the
    data clearly (by a factor ``_BURN_IN_TOLERANCE`` in median absolute error) better than the
    start chosen so far: early transients (the fast initial drop, the pre-averaging phase) bend
    the fit and show up as a worse extrapolation of the run's own recent past.
    """
    base = float(t[0])
    if t.size < 2 * MIN_POINTS + 2:
        return base
    t_last = float(t[-1])
    split = t_last - 0.25 * (t_last - base)
    held = t > split
    if int(held.sum()) < 2:
        return base
    end = int(np.argmax(held))  # t is sorted: the held-out quarter is t[end:]
    chosen, best_err = base, math.inf
    tried = -1
    for frac in _BURN_IN_CANDIDATES:
        start = max(base, frac * t_last)
        first = int(np.searchsorted(t, start, side="left"))
        if first == tried:
            continue  # no point between this start and the last: the same fit, the same error
        tried = first
        if end - first < MIN_POINTS + 1:
            continue
        m = slice(first, end)
        raw = _fit_vp(t[m], y[m], w[m], cmin, None)
        if raw is None:
            continue
        err = _median(np.abs(model(t[held], raw.a, raw.b, raw.c) - y[held]))
        if not math.isfinite(err):
            continue
        if not math.isfinite(best_err) or err * _BURN_IN_TOLERANCE < best_err:
            chosen, best_err = start, err
    return chosen
