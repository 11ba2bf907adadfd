"""Trend rules: the slow, steady drift the paper's "Handling Gradient Norm Drift" is about.

The drift rules of :mod:`.norms` compare the recent level with the stretch just before it, so a
change of *rate* (a ramp, a loss-scaling bug) fires them while a steady climb over the whole run
never does. These rules compare the smoothed norm *now* with its level at the end of the
burn-in: a gradient norm that has grown several-fold since then means the effective learning
rate of an Adam-like method (proportional to lr * ||g||_1) has grown with it.

The thresholds and the advice come from the lambda sweep of ``bench/alerts/drift_study.py`` (numbers
in BENCHMARKS.md, "drift"); see docs/alerts.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from curvecast.service.alerting.rules.framework import (
    BURN_IN,
    KEYS,
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
    on_first_input,
    run_fraction,
    run_settings,
)
from curvecast.service.alerting.rules.norms import grad_inputs
from curvecast.service.alerting.rules.stats import coarse, log_positive, rolling_median

#: The reference level is the median over this fraction of the run right after the burn-in,
#: the level now the median over the same length ending at the step judged.
_REF_FRAC = _WINDOW_FRAC = 0.05
#: The rate of the climb is measured over this fraction of the run.
_RATE_FRAC = 0.10
_MIN_LEN, _UNKNOWN_LEN = 20, 200


def _lengths(ctx: EvalContext, p: Mapping[str, Any]) -> tuple[int, int, int]:
    """The burn-in's last step, the reference stretch and the smoothing window."""
    return (
        burn_in_step(ctx, p.get("burn_in_steps")),
        auto_steps(ctx, p.get("reference_steps"), _REF_FRAC, _MIN_LEN, _UNKNOWN_LEN),
        auto_steps(ctx, p.get("window_steps"), _WINDOW_FRAC, _MIN_LEN, _UNKNOWN_LEN),
    )


def growth(
    s: Series, ctx: EvalContext, p: Mapping[str, Any], memory: dict[str, Any]
) -> tuple[IntArray, FloatArray, dict[str, Any]]:
    """Log ratio of the smoothed level at each new step to the level at the end of the burn-in.

    The reference (a median over ``reference_steps`` after the burn-in) is computed once, as
    soon as the run has passed that stretch, and kept in the rule's memory. Steps are judged
    once their window lies wholly after the reference stretch.
    """
    burn, ref_len, window = _lengths(ctx, p)
    memory = dict(memory)
    empty = s.steps[:0], np.zeros(0)
    logs = log_positive(s.values)
    ref = memory.get("reference")
    if ref is None:
        if ctx.last_step < burn + ref_len:
            return *empty, memory
        m = (s.steps > burn) & (s.steps <= burn + ref_len)
        finite = logs[m][np.isfinite(logs[m])]
        if finite.size == 0:
            return *empty, memory
        ref = float(np.median(finite))
        memory["reference"] = ref
    start = burn + ref_len + window
    mask = (s.steps > max(ctx.after_step, start - 1)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    if at.size == 0:
        return at, np.zeros(0), memory
    level = rolling_median(s.steps, logs, window, at, resolution=coarse(window))
    return at, level - float(ref), memory


def _lookback(ctx: EvalContext, cfg: RuleConfig, memory: Mapping[str, Any]) -> int:
    burn, _ref_len, window = _lengths(ctx, cfg.params)
    if "reference" not in memory:
        return burn
    return max(0, ctx.after_step - window)


def _projection(
    s: Series, ctx: EvalContext, p: Mapping[str, Any], at: IntArray, d: FloatArray
) -> FloatArray:
    """The log growth each judged step is on course for at the end of the run: the level now
    plus its rate over the last ``rate_steps`` times the steps left (NaN when the run's length
    is unknown or the earlier level is not there yet)."""
    total = ctx.total_steps
    if total is None or at.size == 0:
        return np.full(at.size, np.nan)
    burn, ref_len, window = _lengths(ctx, p)
    span = auto_steps(ctx, p.get("rate_steps"), _RATE_FRAC, _MIN_LEN, _UNKNOWN_LEN)
    logs = log_positive(s.values)
    before = rolling_median(s.steps, logs, window, at - span, resolution=coarse(window))
    now = rolling_median(s.steps, logs, window, at, resolution=coarse(window))
    rate = (now - before) / span
    # The earlier level must itself lie after the reference stretch.
    rate = np.where(at - span >= burn + ref_len + window, rate, np.nan)
    projected: FloatArray = d + np.maximum(rate, 0.0) * np.maximum(total - at, 0)
    return projected


def _judge(
    s: Series, key: str, ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    p = cfg.params
    at, d, memory = growth(s, ctx, p, memory)
    up, floor = math.log(p["rise_factor"]), math.log(p["min_factor"])
    projected = _projection(s, ctx, p, at, d)
    ok = np.isfinite(d)
    dd = np.where(ok, d, 0.0)
    on_course = np.isfinite(projected) & (
        np.where(np.isfinite(projected), projected, 0.0) > math.log(p["projected_factor"])
    )
    # Fires when the climb is already large, or past min_factor and on course for
    # projected_factor by the end: an even climb in log space to x4 is only x2 at half way.
    active = ok & ((dd > up) | ((dd > floor) & on_course))
    clear = ok & (dd < floor * p["resolve_ratio"])
    return RuleOutput(observations(at, active, clear, np.exp(d)), memory, key)


# --- gradient norm ----------------------------------------------------------------------------

#: What the lambda sweep showed (BENCHMARKS.md, "drift"); said in every alert.
GRAD_ADVICE = (
    "Measured on the project's lambda sweep (bench/alerts/drift_study.py, 27 ScheduleFree+ runs, "
    "two model sizes): every run with lambda 0.5-50 that trained climbed x4-x8 after the burn-in, "
    "more decay meant more climb, and the best losses came from lambda 2-5 (x6); runs without "
    "decay did not climb, but their weights grew x3-x4 and they failed. So the climb alone is "
    "no reason to stop the run or lower lambda: check the loss against its forecast "
    "(off_curve) and the weight norms (weight_norm_drift). Longer warmups (300 steps, or "
    "c_warmup 1000) cut the climb to about x2; lambda 50 diverged on the small model."
)


def _describe_grad(
    value: float, cfg: RuleConfig, key: str | None, ctx: EvalContext
) -> tuple[str, str]:
    burn = burn_in_step(ctx, cfg.params.get("burn_in_steps"))
    if not math.isfinite(value):
        value_text = "an unknown factor"
    else:
        value_text = f"x{value:.1f}"
    return (
        f"gradient norm {value_text} since the burn-in: effective learning rate rising",
        f"The smoothed {key or 'gradient norm'} is {value_text} its level at the end of the "
        f"burn-in (step {burn}). For Adam-like methods the effective learning rate grows with "
        "lr * ||g||_1, so it has grown by about as much; the paper ('Handling Gradient Norm "
        "Drift') links such a climb to a worse final loss. "
        f"{run_settings(ctx)} {GRAD_ADVICE}",
    )


GRAD_NORM_TREND = RuleSpec(
    name="grad_norm_trend",
    title="Gradient-norm climb since the burn-in",
    description=(
        "The rolling median of log ||g|| (L1 by default) against its level right after the "
        "burn-in: fires when it has grown beyond rise_factor, or beyond min_factor while on "
        "course (at its rate over the last rate_steps) for projected_factor by the end of the "
        "run; resolves when it is back below min_factor ** resolve_ratio. A slow steady climb "
        "(the paper's gradient-norm drift) fires this rule; grad_norm_drift is for sudden "
        "changes of rate."
    ),
    severity="warning",
    params={
        "norm": ParamSpec("l1", "choice", "which gradient norm", choices=("l1", "l2")),
        "keys": KEYS,
        "rise_factor": ParamSpec(
            3.0, "float", "fire above this ratio to the level after the burn-in", lo=1.01, hi=1e6
        ),
        "min_factor": ParamSpec(
            2.0,
            "float",
            "fire above this ratio if the climb is on course for "
            "projected_factor by the end of the run",
            lo=1.01,
            hi=1e6,
        ),
        "projected_factor": ParamSpec(
            4.0,
            "float",
            "the growth by the end of the run (at the rate of the last "
            "rate_steps) that makes min_factor enough",
            lo=1.01,
            hi=1e6,
        ),
        "resolve_ratio": ParamSpec(
            0.5, "float", "clear below min_factor ** resolve_ratio", lo=0.0, hi=1.0
        ),
        "rate_steps": auto_int("span of the rate estimate; auto: 10% of total_steps (>= 20)"),
        "window_steps": auto_int("rolling-median window; auto: 5% of total_steps (>= 20)"),
        "reference_steps": auto_int(
            "stretch after the burn-in whose median is the reference; auto: 5% (>= 20)"
        ),
        "burn_in_steps": BURN_IN,
    },
    evaluate=on_first_input(grad_inputs, _judge),
    describe=_describe_grad,
    for_auto=run_fraction(0.02, 20, 200),
    resolve_auto=run_fraction(0.02, 20, 200),
    lookback=_lookback,
    inputs=grad_inputs,
)
