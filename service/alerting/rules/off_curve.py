"""Off the forecast curve: the loss has left the interval of its fitted curve a / sqrt(t + b) + c.

Two series are judged. The forecast's own series (an eval loss if logged) against the forecast
interval; and, when that series is sparse, the densely logged training loss through its gap to
the forecast, which catches a corrupted data shard several evaluations earlier. Each point is
judged against a fit made from data at least ``lag_steps`` older: a refit that includes an
excursion bends towards it and widens its interval, which would hide it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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

    def at(self, step: int) -> Fit | None:
        """The fit for ``step``, or ``None``."""
        j = int(np.searchsorted(self.uptos, step - self.lag, side="right")) - 1
        if j < 0:
            return None
        if j not in self._cache:
            self._cache[j] = Fit.from_dict(self.fits[j])
        fit = self._cache[j]
        return fit if fit.has_forecast else None


class _AtSteps:
    """Each fit's forecast at the steps a round judges, computed once per fit and confidence
    in one vectorised pass (``Fit.predict_many``) instead of one ``predict`` per step: the
    round's loop then only looks values up."""

    def __init__(self, steps: np.ndarray) -> None:
        self.steps = steps.astype(np.float64)
        self._done: dict[tuple[int, float], tuple[Fit, tuple[np.ndarray, ...]]] = {}

    def __call__(self, fit: Fit, confidence: float) -> tuple[np.ndarray, ...]:
        """``(value, lo, hi)`` arrays of ``fit`` at the steps."""
        key = (id(fit), confidence)
        if key not in self._done:  # the fit is kept with its values: its id stays its own
            self._done[key] = (fit, fit.predict_many(self.steps, confidence))
        return self._done[key][1]


def _window(ctx: EvalContext, p: Mapping[str, Any]) -> int:
    return auto_steps(ctx, p.get("window_steps"), _OFF_WINDOW, 10, 100)


def _reference_len(ctx: EvalContext, p: Mapping[str, Any]) -> int:
    return auto_steps(ctx, p.get("reference_steps"), _OFF_REF, 20, 1000)


def _judge_fitted(
    s: Series, ctx: EvalContext, p: Mapping[str, Any], fits: _LaggedFits, memory: dict[str, Any]
) -> Verdicts:
    """The forecast's own series: its rolling median against the forecast interval."""
    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    window = _window(ctx, p)
    mask = (s.steps > max(ctx.after_step, burn + window)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    smooth = rolling_median(s.steps, s.values, window, at, resolution=coarse(window))
    active = np.zeros(at.size, dtype=bool)
    clear = np.zeros(at.size, dtype=bool)
    excess = np.full(at.size, np.nan)
    stored = memory.get("pinned")
    pinned = Fit.from_dict(stored) if stored is not None else None
    forecast = _AtSteps(at)
    for i, (t, y) in enumerate(zip(at.tolist(), smooth.tolist(), strict=True)):
        fit = pinned if pinned is not None else fits.at(t)
        if fit is None or not fit.has_forecast or not math.isfinite(y):
            continue
        hi = float(forecast(fit, p["confidence"])[2][i])
        hi_clear = float(forecast(fit, p["resolve_confidence"])[2][i])
        if not (math.isfinite(hi) and math.isfinite(hi_clear)):
            continue
        active[i], clear[i], excess[i] = y > hi, y <= hi_clear, y - hi
        # While the excursion lasts, keep judging against the fit from before it began.
        if active[i] and pinned is None:
            pinned = fit
        elif clear[i]:
            pinned = None
    _remember(memory, "pinned", pinned.to_dict() if pinned is not None else None)
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
    at the averaged point) follows a few evaluations later.
    """
    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    window, ref_len = _window(ctx, p), _reference_len(ctx, p)
    mask = (s.steps > max(ctx.after_step, burn + window + ref_len)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    active = np.zeros(at.size, dtype=bool)
    clear = np.zeros(at.size, dtype=bool)
    excess = np.full(at.size, np.nan)
    if at.size == 0:
        return at, active, clear, excess
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
    stored = memory.get("dense_pinned")
    # (fit, gap) judged against while an excursion lasts, parsed once.
    pinned = (Fit.from_dict(stored["fit"]), float(stored["gap"])) if stored else None
    forecast, middle = _AtSteps(at), _AtSteps(at - window - ref_len / 2)
    for i, t in enumerate(at.tolist()):
        if pinned is not None:
            fit, gap = pinned
        else:
            lagged = fits.at(t)
            if lagged is None:
                continue
            fit = lagged
            # The gap over the reference stretch, measured against the forecast at its middle.
            gap = float(reference[i]) - float(middle(fit, fit.confidence)[0][i])
        y, sd = float(smooth[i]), float(sigma[i])
        value, _, pred_hi = (float(x[i]) for x in forecast(fit, p["confidence"]))
        clear_value, _, clear_hi = (float(x[i]) for x in forecast(fit, p["resolve_confidence"]))
        if not all(math.isfinite(v) for v in (y, sd, gap, pred_hi, clear_hi)):
            continue
        hi = value + gap + math.hypot(pred_hi - value, z * sd)
        hi_clear = clear_value + gap + math.hypot(clear_hi - clear_value, z_clear * sd)
        active[i], clear[i], excess[i] = y > hi, y <= hi_clear, y - hi
        if active[i] and pinned is None:
            pinned = (fit, gap)
        elif clear[i]:
            pinned = None
    _remember(
        memory,
        "dense_pinned",
        {"fit": pinned[0].to_dict(), "gap": pinned[1]} if pinned is not None else None,
    )
    return at, active, clear, excess


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
    active = np.zeros(steps.size, dtype=bool)
    clear = np.zeros(steps.size, dtype=bool)
    excess = np.full(steps.size, np.nan)
    cursors = [0] * len(parts)
    for i, t in enumerate(steps.tolist()):
        for k, (at, act, clr, exc) in enumerate(parts):
            while cursors[k] < at.size and at[cursors[k]] <= t:
                j = cursors[k]
                if math.isfinite(exc[j]):
                    carried[k] = [bool(act[j]), bool(clr[j]), float(exc[j])]
                cursors[k] += 1
        known = [c for c in carried if c is not None]
        if not known:
            continue
        active[i] = any(c[0] for c in known)
        clear[i] = all(c[1] for c in known)
        excess[i] = max(c[2] for c in known)
    memory["last"] = carried
    return steps, active, clear, excess


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
            fits.append(ctx.fit.to_dict())
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
            0.9, "float", "interval that clears", lo=0.5, hi=0.9999
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
    for_doc="auto: 2% of total_steps (>= 20; 200 if unknown)",
)
