"""Off the forecast curve: the loss has left the interval of its fitted curve a / sqrt(t + b) + c.

Two series are judged. The forecast's own series (an eval loss if logged) against the forecast
interval; and, when that series is sparse, the densely logged training loss through its gap to
the forecast, which catches a corrupted data shard several evaluations earlier. Each point is
judged against a fit made from data at least ``lag_steps`` older: a refit that includes an
excursion bends towards it and widens its interval, which would hide it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from statistics import NormalDist
from typing import Any

import numpy as np

from curvecast.contract import TRAIN_LOSS_KEYS
from curvecast.service.alerting.rules.framework import (
    BURN_IN,
    BoolArray,
    EvalContext,
    FloatArray,
    IntArray,
    ParamSpec,
    RuleConfig,
    RuleOutput,
    RuleSpec,
    Series,
    auto_int,
    auto_steps,
    burn_in_step,
    observations,
    pick_key,
    run_fraction,
)
from curvecast.service.alerting.rules.stats import coarse, rolling_median
from curvecast.service.forecast import Fit

_OFF_WINDOW = 0.02
_OFF_LAG = 0.05
_OFF_REF = 0.10
#: median(|X1 - X2|) of two independent normal draws, in units of their standard deviation.
_MEDIAN_ABS_DIFF = 0.6744897501960817 * math.sqrt(2.0)
#: Standard error of a median of n normal draws is about this times sigma / sqrt(n).
_MEDIAN_SE = math.sqrt(math.pi / 2.0)
#: Fits kept in the rule's memory (enough to look back ``lag_steps`` at any refit cadence the
#: worker uses).
_MAX_FITS = 12

#: Steps judged, and at each: active, clear, and how far above the threshold (the value shown).
Verdicts = tuple[IntArray, BoolArray, BoolArray, FloatArray]


def _inputs(cfg: RuleConfig) -> list[list[str]]:
    # The fitted series is named by the fit (EvalContext.fit_key); this is the dense one.
    keys = cfg.params.get("dense_keys")
    return [list(keys) if keys else list(TRAIN_LOSS_KEYS)]


def _z(confidence: float) -> float:
    """Two-sided normal quantile: 2.58 for 0.99, 1.64 for 0.9."""
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


class _LaggedFits:
    """The fit each step is judged against: the newest one made from data at least ``lag``
    steps older."""

    def __init__(self, fits: list[dict[str, Any]], lag: int) -> None:
        self.fits = fits
        self.uptos = np.array([float(f["fitted_upto_step"]) for f in fits])
        self.lag = lag
        self._cache: dict[int, Fit] = {}

    def indices(self, steps: IntArray) -> IntArray:
        """Index of the fit for each of ``steps`` (-1: none, or one without a forecast)."""
        j = np.searchsorted(self.uptos, steps - self.lag, side="right") - 1
        for k in np.unique(j[j >= 0]).tolist():
            if not self.fit(k).has_forecast:
                j[j == k] = -1
        return j

    def fit(self, j: int) -> Fit:
        """The ``j``-th fit, parsed once."""
        if j not in self._cache:
            self._cache[j] = Fit.from_dict(self.fits[j])
        return self._cache[j]


class _AtSteps:
    """Each fit's forecast at the steps a round judges, computed once per fit and confidence
    in one vectorised pass (``Fit.predict_many``)."""

    def __init__(self, steps: np.ndarray) -> None:
        self.steps = steps.astype(np.float64)
        self._done: dict[tuple[int, float], tuple[Fit, tuple[np.ndarray, ...]]] = {}

    def __call__(self, fit: Fit, confidence: float) -> tuple[np.ndarray, ...]:
        """``(value, lo, hi)`` arrays of ``fit`` at the steps."""
        key = (id(fit), confidence)
        if key not in self._done:  # the fit is kept with its values: its id stays its own
            self._done[key] = (fit, fit.predict_many(self.steps, confidence))
        return self._done[key][1]


#: The reference an excursion pins (the fitted series: a fit; the dense one: a fit and gap).
_Pin = Any
#: A judgement of every step against one reference: valid, active, clear, excess.
_Judged = tuple[BoolArray, BoolArray, BoolArray, FloatArray]


def _judge_with_pins(
    n: int,
    free: Callable[[], tuple[_Judged, Callable[[int], _Pin]]],
    against: Callable[[_Pin], _Judged],
    pinned: _Pin | None,
) -> tuple[BoolArray, BoolArray, FloatArray, _Pin | None]:
    """Verdicts of ``n`` steps in order, where an excursion pins its reference until it clears.

    Step by step this is: skip an invalid step; while nothing is pinned, judge against the
    lagged fit (``free``) and pin that step's reference (``free``'s second value) at the first
    active step; while pinned, judge against the pin (``against``) and unpin at the first clear
    step. Each stretch between two such changes is judged as one array, so a round costs a few
    numpy passes instead of a Python loop over its steps (excursions are rare).

    Returns:
        active, clear, excess, and the pin still held after the last step.
    """
    active = np.zeros(n, dtype=bool)
    clear = np.zeros(n, dtype=bool)
    excess = np.full(n, np.nan)
    free_judged: tuple[_Judged, Callable[[int], _Pin]] | None = None
    i = 0
    while i < n:
        if pinned is None:
            if free_judged is None:
                free_judged = free()
            (valid, act, clr, exc), pin_at = free_judged
            turns = valid[i:] & act[i:]  # the first active step pins
        else:
            valid, act, clr, exc = against(pinned)
            turns = valid[i:] & clr[i:]  # the first clear step unpins
        hit = int(np.argmax(turns)) if turns.any() else -1
        end = n if hit < 0 else i + hit + 1
        ok = valid[i:end]
        active[i:end] = act[i:end] & ok
        clear[i:end] = clr[i:end] & ok
        excess[i:end] = np.where(ok, exc[i:end], np.nan)
        if hit >= 0:
            pinned = pin_at(end - 1) if pinned is None else None
        i = end
    return active, clear, excess, pinned


def _window(ctx: EvalContext, p: Mapping[str, Any]) -> int:
    return auto_steps(ctx, p.get("window_steps"), _OFF_WINDOW, 10, 100)


def _reference_len(ctx: EvalContext, p: Mapping[str, Any]) -> int:
    return auto_steps(ctx, p.get("reference_steps"), _OFF_REF, 20, 1000)


def _judge_fitted(
    s: Series, ctx: EvalContext, p: Mapping[str, Any], fits: _LaggedFits, memory: dict[str, Any]
) -> Verdicts:
    """The forecast's own series: its rolling median against the forecast interval (while an
    excursion lasts, against the fit from before it began)."""
    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    window = _window(ctx, p)
    mask = (s.steps > max(ctx.after_step, burn + window)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    smooth = rolling_median(s.steps, s.values, window, at, resolution=coarse(window))
    forecast = _AtSteps(at)
    finite_y = np.isfinite(smooth)

    def judge(hi: FloatArray, hi_clear: FloatArray, valid: BoolArray) -> _Judged:
        valid = valid & finite_y & np.isfinite(hi) & np.isfinite(hi_clear)
        with np.errstate(invalid="ignore"):
            return valid, smooth > hi, smooth <= hi_clear, smooth - hi

    def bounds(fit: Fit) -> tuple[FloatArray, FloatArray]:
        return forecast(fit, p["confidence"])[2], forecast(fit, p["resolve_confidence"])[2]

    def free() -> tuple[_Judged, Callable[[int], Fit]]:
        j = fits.indices(at)
        hi, hi_clear = np.full(at.size, np.nan), np.full(at.size, np.nan)
        for k in np.unique(j[j >= 0]).tolist():
            rows = j == k
            fit_hi, fit_clear = bounds(fits.fit(k))
            hi[rows], hi_clear[rows] = fit_hi[rows], fit_clear[rows]
        return judge(hi, hi_clear, j >= 0), lambda i: fits.fit(int(j[i]))

    def against(fit: Fit) -> _Judged:
        return judge(*bounds(fit), np.full(at.size, fit.has_forecast))

    stored = memory.get("pinned")
    pinned = Fit.from_dict(stored) if stored is not None else None
    active, clear, excess, held = _judge_with_pins(at.size, free, against, pinned)
    _remember(memory, "pinned", _stored(held) if held is not None else None)
    return at, active, clear, excess


def _judge_dense(
    s: Series, ctx: EvalContext, p: Mapping[str, Any], fits: _LaggedFits, memory: dict[str, Any]
) -> Verdicts:
    """A densely logged training loss, against the forecast of another series.

    The training loss sits at its own distance from the forecast's (eval) curve: the
    generalisation gap, and the difference between the averaged point the eval loss is measured
    at and the point the gradients are taken at. That gap moves slowly, so the training loss
    minus its gap over the preceding reference stretch must follow the forecast; it is judged
    against the forecast interval widened by the noise of its own rolling median. A corrupted
    data shard moves the training loss at once, while the eval loss (every few hundred steps,
    at the averaged point) follows a few evaluations later. While an excursion lasts it is
    judged against the fit and gap from before it began.
    """
    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    window, ref_len = _window(ctx, p), _reference_len(ctx, p)
    mask = (s.steps > max(ctx.after_step, burn + window + ref_len)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    if at.size == 0:
        return at, np.zeros(0, dtype=bool), np.zeros(0, dtype=bool), np.full(0, np.nan)
    smooth = rolling_median(s.steps, s.values, window, at, resolution=coarse(window))
    reference = rolling_median(s.steps, s.values, ref_len, at - window,
                               resolution=coarse(ref_len))
    # The per-point noise from successive differences (a level shift is one big difference,
    # which a median ignores), and the standard error of a median over the window.
    jumps = np.abs(np.diff(s.values))
    noise = rolling_median(s.steps[1:], jumps, ref_len, at - window,
                           resolution=coarse(ref_len)) / _MEDIAN_ABS_DIFF
    counts = np.searchsorted(s.steps, at, side="right") - np.searchsorted(
        s.steps, at - window, side="right"
    )
    sigma = _MEDIAN_SE * noise / np.sqrt(np.maximum(counts, 1))
    z, z_clear = _z(p["confidence"]), _z(p["resolve_confidence"])
    forecast, middle = _AtSteps(at), _AtSteps(at - window - ref_len / 2)
    base_ok = np.isfinite(smooth) & np.isfinite(sigma)

    def judge(fit: Fit, gap: FloatArray | float) -> _Judged:
        """Every step against ``fit`` and ``gap``."""
        value, _, pred_hi = forecast(fit, p["confidence"])
        clear_value, _, clear_hi = forecast(fit, p["resolve_confidence"])
        with np.errstate(invalid="ignore"):
            hi = value + gap + np.hypot(pred_hi - value, z * sigma)
            hi_clear = clear_value + gap + np.hypot(clear_hi - clear_value, z_clear * sigma)
            valid = (base_ok & np.isfinite(gap) & np.isfinite(pred_hi)
                     & np.isfinite(clear_hi))
            return valid, smooth > hi, smooth <= hi_clear, smooth - hi

    def free() -> tuple[_Judged, Callable[[int], tuple[Fit, float]]]:
        j = fits.indices(at)
        valid = np.zeros(at.size, dtype=bool)
        act, clr, exc = valid.copy(), valid.copy(), np.full(at.size, np.nan)
        gaps = np.full(at.size, np.nan)
        for k in np.unique(j[j >= 0]).tolist():
            rows = j == k
            fit = fits.fit(k)
            # The gap over the reference stretch, measured against the forecast at its middle.
            gap = reference - middle(fit, fit.confidence)[0]
            gaps[rows] = gap[rows]
            v, a, c, e = judge(fit, gap)
            valid[rows], act[rows], clr[rows], exc[rows] = v[rows], a[rows], c[rows], e[rows]
        return (valid, act, clr, exc), lambda i: (fits.fit(int(j[i])), float(gaps[i]))

    def against(pin: tuple[Fit, float]) -> _Judged:
        return judge(*pin)

    stored = memory.get("dense_pinned")
    # (fit, gap) judged against while an excursion lasts, parsed once.
    pinned = (Fit.from_dict(stored["fit"]), float(stored["gap"])) if stored else None
    active, clear, excess, held = _judge_with_pins(at.size, free, against, pinned)
    _remember(
        memory,
        "dense_pinned",
        {"fit": _stored(held[0]), "gap": held[1]} if held is not None else None,
    )
    return at, active, clear, excess


def _stored(fit: Fit) -> dict[str, Any]:
    """``fit`` as the rule's memory keeps it (JSON, stored with the run's alert state every
    round): without ``reached``, which only answers target queries."""
    out = fit.to_dict()
    out.pop("reached", None)
    return out


def _remember(memory: dict[str, Any], name: str, value: Any) -> None:
    if value is None:
        memory.pop(name, None)
    else:
        memory[name] = value


def _merge_verdicts(parts: list[Verdicts], memory: dict[str, Any]) -> Verdicts:
    """One verdict per step of the union of the parts' steps: each part's latest verdict at or
    before the step (carried over from the previous evaluation through ``memory``). Active if
    any part is; clear if every part with a verdict is."""
    steps = np.unique(np.concatenate([p[0] for p in parts])) if parts else np.zeros(0, np.int64)
    carried: list[list[Any] | None] = list(memory.get("last") or [])[: len(parts)]
    carried += [None] * (len(parts) - len(carried))
    known_any = np.zeros(steps.size, dtype=bool)
    active = np.zeros(steps.size, dtype=bool)
    all_clear = np.ones(steps.size, dtype=bool)
    excess = np.full(steps.size, -np.inf)
    before_all = np.iinfo(np.int64).min
    for k, (at, act, clr, exc) in enumerate(parts):
        # Each part's latest verdict at or before every step: a forward fill of its steps with
        # a verdict (a finite excess), led by the one carried over from the previous round.
        judged = np.isfinite(exc)
        at_k, act_k, clr_k, exc_k = at[judged], act[judged], clr[judged], exc[judged]
        prev = carried[k]
        if prev is not None:
            prev_a, prev_c, prev_e = prev
            at_k, act_k = np.r_[before_all, at_k], np.r_[prev_a, act_k].astype(bool)
            clr_k, exc_k = np.r_[prev_c, clr_k].astype(bool), np.r_[prev_e, exc_k]
        if at_k.size == 0:
            continue
        latest = np.searchsorted(at_k, steps, side="right") - 1
        known = latest >= 0
        latest = np.maximum(latest, 0)
        known_any |= known
        active |= known & act_k[latest]
        all_clear &= ~known | clr_k[latest]
        excess = np.where(known, np.maximum(excess, exc_k[latest]), excess)
        carried[k] = [bool(act_k[-1]), bool(clr_k[-1]), float(exc_k[-1])]
    memory["last"] = carried
    return steps, active, known_any & all_clear, np.where(known_any, excess, np.nan)


def _evaluate(
    series: Mapping[str, Series], ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    p = cfg.params
    key = ctx.fit_key
    if key is None or key not in series:
        return RuleOutput([], memory)
    memory = dict(memory)
    # The memory keeps the recent fits, oldest first (see _LaggedFits).
    fits: list[dict[str, Any]] = list(memory.get("fits") or [])
    if ctx.fit is not None and ctx.fit.fitted_upto_step is not None:
        upto = float(ctx.fit.fitted_upto_step)
        if not fits or upto > float(fits[-1]["fitted_upto_step"]):
            # The memory is JSON (it is stored with the run's alert state).
            fits.append(_stored(ctx.fit))
    lag = auto_steps(ctx, p.get("lag_steps"), _OFF_LAG, 20, 500)
    lagged = _LaggedFits(fits, lag)
    parts = [_judge_fitted(series[key], ctx, p, lagged, memory)]
    dense = pick_key(series, _inputs(cfg)[0])
    if dense is not None and dense != key:
        parts.append(_judge_dense(series[dense], ctx, p, lagged, memory))
    at, active, clear, excess = _merge_verdicts(parts, memory)
    # Keep the fits still needed: everything newer than last_step - lag, and the newest older.
    keep = int(np.searchsorted(lagged.uptos, ctx.last_step - lag, side="right")) - 1
    memory["fits"] = fits[max(0, keep) :][-_MAX_FITS:]
    return RuleOutput(observations(at, active, clear, excess), memory, key)


def _lookback(ctx: EvalContext, cfg: RuleConfig, memory: Mapping[str, Any]) -> int:
    # The dense check reads the reference stretch before the window, and one point more for
    # the successive differences.
    window, ref_len = _window(ctx, cfg.params), _reference_len(ctx, cfg.params)
    return max(0, ctx.after_step - window - ref_len - 1)


def _describe(
    value: float, cfg: RuleConfig, key: str | None, _ctx: EvalContext
) -> tuple[str, str]:
    by = f" by {value:.3g}" if math.isfinite(value) else ""
    return (
        f"{key or 'loss'} is above its forecast interval",
        f"The smoothed {key or 'loss'} has stayed above the upper end of the "
        f"{100 * cfg.params['confidence']:.0f}% forecast interval{by} for a sustained stretch: "
        "the run is no longer following its fitted curve a / sqrt(t + b) + c.",
    )


OFF_CURVE = RuleSpec(
    name="off_curve",
    title="Loss off its forecast curve",
    description=(
        "The rolling median of the forecast's series (eval loss if logged, else loss) "
        "is above the upper end of the forecast interval at `confidence`; clears below "
        "the upper end at `resolve_confidence`. Each point is judged against a fit made "
        "from data at least lag_steps older, and during an excursion against the fit "
        "from before it began. When that series is not the densely logged training "
        "loss, the training loss is judged too: its rolling median minus its gap to the "
        "forecast over the preceding reference stretch, against the interval widened by "
        "its own noise."
    ),
    severity="warning",
    params={
        "confidence": ParamSpec(0.99, "float", "interval that fires", lo=0.5, hi=0.9999),
        "resolve_confidence": ParamSpec(
            0.9, "float", "interval that clears", lo=0.5, hi=0.9999, below="confidence",
            or_equal=True,
        ),
        "window_steps": auto_int("rolling-median window; auto: 2% of total_steps (>= 10)"),
        "lag_steps": auto_int(
            "judge each point against a forecast made from data at "
            "least this many steps older; auto: 5% of total_steps (>= 20)",
            lo=0,
        ),
        "dense_keys": ParamSpec(
            None,
            "keys",
            "densely logged training loss judged alongside a sparse "
            "forecast series (through its gap to the forecast); default: "
            + ", ".join(TRAIN_LOSS_KEYS),
        ),
        "reference_steps": auto_int(
            "stretch over which the training loss's gap to the "
            "forecast is measured; auto: 10% of total_steps (>= 20)"
        ),
        "burn_in_steps": BURN_IN,
    },
    evaluate=_evaluate,
    describe=_describe,
    for_auto=run_fraction(0.02, 20, 200),
    resolve_auto=run_fraction(0.02, 20, 200),
    lookback=_lookback,
    inputs=_inputs,
)
