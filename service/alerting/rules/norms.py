"""Drift of a positive series: the gradient-norm and weight-norm rules.

Both compare a recent rolling median of the log norm with a reference level. Per-step gradient norms
are heavy-tailed, so levels are medians, which one outlier batch cannot move. A healthy small run's
gradient norm keeps drifting at a steady rate in log space for its whole length (several-fold from
10% to 100% of the run on the test fixtures), so the gradient rule compares with the stretch just
before the recent window by default: a change in *rate* is what a fault looks like.
``reference: "burn_in"`` gives the fixed-level variant for runs known to be flat (AdamC at
scale); the weight rule uses it by default, with a rate check beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from curvecast.contract import telemetry_keys
from curvecast.service.alerting.rules.framework import (
    BURN_IN,
    KEYS,
    RESOLVE_RATIO,
    EvalContext,
    FloatArray,
    IntArray,
    Lookback,
    ParamSpec,
    RuleConfig,
    RuleOutput,
    RuleSpec,
    Series,
    auto_int,
    auto_steps,
    burn_in_step,
    factor_text,
    given_keys_or,
    observations,
    on_first_input,
    run_fraction,
    run_settings,
)
from curvecast.service.alerting.rules.stats import coarse, log_positive, rolling_median


def _drift(
    s: Series,
    ctx: EvalContext,
    p: Mapping[str, Any],
    memory: dict[str, Any],
    *,
    window_frac: float,
    ref_frac: float,
) -> tuple[IntArray, FloatArray, dict[str, Any]]:
    """Log ratio of the recent rolling median to the reference level, at each point after
    the burn-in (and after the first complete reference window)."""
    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    window = auto_steps(ctx, p.get("window_steps"), window_frac, 10, 100)
    ref_len = auto_steps(ctx, p.get("reference_steps"), ref_frac, 20, 1000)
    logs = log_positive(s.values)
    start = burn + ref_len + window
    eval_mask = (s.steps > max(ctx.after_step, start - 1)) & (s.steps <= ctx.last_step)
    at = s.steps[eval_mask]
    memory = dict(memory)
    if at.size == 0:
        return at, np.zeros(0), memory
    recent = rolling_median(s.steps, logs, window, at, resolution=coarse(window))
    if p.get("reference", "trailing") == "burn_in":
        ref = memory.get("reference")
        if ref is None:
            m = (s.steps > burn) & (s.steps <= burn + ref_len)
            finite = logs[m][np.isfinite(logs[m])]
            if finite.size == 0:
                return at[:0], np.zeros(0), memory
            ref = float(np.median(finite))
            memory["reference"] = ref
        reference = np.full(at.size, float(ref))
    else:
        # The level of the stretch just before the recent window: a change of rate, not the
        # slow steady drift every healthy run shows.
        reference = rolling_median(s.steps, logs, ref_len, at - window,
                                    resolution=coarse(ref_len))
    return at, recent - reference, memory


def _drift_lookback(window_frac: float, ref_frac: float) -> Lookback:
    def lookback(ctx: EvalContext, cfg: RuleConfig, memory: Mapping[str, Any]) -> int:
        p = cfg.params
        burn = burn_in_step(ctx, p.get("burn_in_steps"))
        window = auto_steps(ctx, p.get("window_steps"), window_frac, 10, 100)
        ref_len = auto_steps(ctx, p.get("reference_steps"), ref_frac, 20, 1000)
        if p.get("reference", "trailing") == "burn_in" and "reference" not in memory:
            return burn
        return max(0, ctx.after_step - window - ref_len)

    return lookback


# --- gradient-norm drift ------------------------------------------------------------------------

_GRAD_WINDOW, _GRAD_REF = 0.015, 0.10


def grad_inputs(cfg: RuleConfig) -> list[list[str]]:
    """The gradient norm a rule reads: its ``keys``, else ``grad_<norm>`` (L1 or L2)."""
    return given_keys_or(cfg, telemetry_keys(f"grad_{cfg.params['norm']}"))


def _eval_grad(
    s: Series, key: str, ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    p = cfg.params
    at, d, memory = _drift(s, ctx, p, memory, window_frac=_GRAD_WINDOW, ref_frac=_GRAD_REF)
    up, down = math.log(p["rise_factor"]), math.log(p["fall_factor"])
    ok = np.isfinite(d)
    dd = np.where(ok, d, 0.0)
    active = ok & ((dd > up) | (dd < -down))
    clear = ok & (dd < up * p["resolve_ratio"]) & (dd > -down * p["resolve_ratio"])
    return RuleOutput(observations(at, active, clear, np.exp(d)), memory, key)


def _describe_grad(
    value: float, cfg: RuleConfig, key: str | None, _ctx: EvalContext
) -> tuple[str, str]:
    direction = "risen" if value >= 1 else "fallen"
    ref = (
        "its level after the burn-in"
        if cfg.params["reference"] == "burn_in"
        else "its level over the preceding stretch"
    )
    return (
        f"gradient norm has {direction} {factor_text(value)}",
        f"The smoothed {key or 'gradient norm'} has {direction} by {factor_text(value)} "
        f"relative to {ref}. A rising gradient norm means a rising effective learning rate "
        "(paper: 'Handling Gradient Norm Drift'); check weight decay and weight norms.",
    )


GRAD_NORM_DRIFT = RuleSpec(
    name="grad_norm_drift",
    title="Gradient-norm drift",
    description=(
        "The rolling median of log ||g|| (L1 by default, logged every step) has moved "
        "beyond rise_factor (or below 1/fall_factor) relative to the level of the "
        "preceding reference stretch (reference='trailing', default) or of the stretch "
        "right after the burn-in (reference='burn_in')."
    ),
    severity="warning",
    params={
        "norm": ParamSpec("l1", "choice", "which gradient norm", choices=("l1", "l2")),
        "keys": KEYS,
        "reference": ParamSpec(
            "trailing",
            "choice",
            "trailing: the stretch before the recent window; "
            "burn_in: the stretch right after the burn-in",
            choices=("trailing", "burn_in"),
        ),
        "rise_factor": ParamSpec(1.8, "float", "fire above this ratio", lo=1.01, hi=1e6),
        "fall_factor": ParamSpec(
            3.0, "float", "fire below 1/this ratio (falls are less harmful)", lo=1.01, hi=1e6
        ),
        "resolve_ratio": RESOLVE_RATIO,
        "window_steps": auto_int("rolling-median window; auto: 1.5% of total_steps (>= 10)"),
        "reference_steps": auto_int("reference stretch; auto: 10% of total_steps (>= 20)"),
        "burn_in_steps": BURN_IN,
    },
    evaluate=on_first_input(grad_inputs, _eval_grad),
    describe=_describe_grad,
    for_auto=run_fraction(0.01, 10, 100),
    resolve_auto=run_fraction(0.02, 20, 200),
    lookback=_drift_lookback(_GRAD_WINDOW, _GRAD_REF),
    inputs=grad_inputs,
)


# --- weight-norm drift --------------------------------------------------------------------------

_W_WINDOW, _W_REF = 0.03, 0.05
#: The rate check: the level (median over 1% of the run) now against the level 5% earlier.
_W_RATE_WINDOW, _W_RATE_SPAN = 0.01, 0.05


def _weight_inputs(cfg: RuleConfig) -> list[list[str]]:
    return given_keys_or(cfg, telemetry_keys(f"{cfg.params['which']}_l2"))


def _weight_rate_lengths(ctx: EvalContext, p: Mapping[str, Any]) -> tuple[int, int]:
    """The rate check's span (``rate_steps``) and the window of the levels it compares."""
    return (
        auto_steps(ctx, p.get("rate_steps"), _W_RATE_SPAN, 20, 500),
        auto_steps(ctx, None, _W_RATE_WINDOW, 10, 100),
    )


def _weight_rate(s: Series, ctx: EvalContext, p: Mapping[str, Any]) -> tuple[IntArray, FloatArray]:
    """Log change of the level over the last ``rate_steps``, at each point from the end of the
    burn-in (the earlier level may lie inside it: too little weight decay shows from step 1)."""
    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    span, window = _weight_rate_lengths(ctx, p)
    logs = log_positive(s.values)
    mask = (s.steps >= max(ctx.after_step + 1, burn)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    if at.size == 0:
        return at, np.zeros(0)
    now = rolling_median(s.steps, logs, window, at, resolution=coarse(window))
    before = rolling_median(s.steps, logs, window, at - span, resolution=coarse(window))
    return at, now - before


def _eval_weight(
    s: Series, key: str, ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    p = cfg.params
    # Two questions: how far is the level from where it settled after the burn-in (a slow,
    # steady climb), and how fast is it moving now (a climb from the start, when no settled
    # level exists yet). Verdicts are made where the rate is known; the level check joins in
    # once its windows are complete.
    at, rate = _weight_rate(s, ctx, p)
    level_at, level, memory = _drift(s, ctx, p, memory, window_frac=_W_WINDOW, ref_frac=_W_REF)
    d = np.full(at.size, np.nan)
    d[np.isin(at, level_at)] = level[np.isin(level_at, at)]
    up, down = math.log(p["rise_factor"]), math.log(p["fall_factor"])
    rate_limit = math.log(p["rate_factor"])
    level_score = np.where(np.isfinite(d), np.where(d >= 0, d / up, -d / down), 0.0)
    rate_score = np.where(np.isfinite(rate), np.abs(rate) / rate_limit, 0.0)
    active = (level_score > 1) | (rate_score > 1)
    ratio = p["resolve_ratio"]
    clear = (level_score < ratio) & (rate_score < ratio) & (np.isfinite(d) | np.isfinite(rate))
    # The value shown is whichever statistic is closer to (or further past) its threshold.
    value = np.exp(np.where(level_score >= rate_score, d, rate))
    return RuleOutput(observations(at, active, clear, value), memory, key)


def _weight_lookback(ctx: EvalContext, cfg: RuleConfig, memory: Mapping[str, Any]) -> int:
    p = cfg.params
    span, window = _weight_rate_lengths(ctx, p)
    first = min(ctx.after_step + 1, burn_in_step(ctx, p.get("burn_in_steps")))
    return min(
        _drift_lookback(_W_WINDOW, _W_REF)(ctx, cfg, memory), max(0, first - span - window)
    )


def _describe_weight(
    value: float, cfg: RuleConfig, key: str | None, ctx: EvalContext
) -> tuple[str, str]:
    direction = "grown" if value >= 1 else "shrunk"
    return (
        f"weight norm of {cfg.params['which']} has {direction} {factor_text(value)}",
        f"The norm of the {'averaged iterate x' if cfg.params['which'] == 'x' else 'point y'} "
        f"({key}) has {direction} by {factor_text(value)}: beyond rise_factor (fall_factor) "
        "relative to its level after the burn-in, or beyond rate_factor within rate_steps. "
        "Growing weight norms point to too little weight decay; shrinking ones drive "
        f"gradient norms (and the effective learning rate) up. {run_settings(ctx)}",
    )


WEIGHT_NORM_DRIFT = RuleSpec(
    name="weight_norm_drift",
    title="Weight-norm drift",
    description=(
        "The rolling median of log ||x|| (or ||y||) has moved beyond rise_factor (or "
        "below 1/fall_factor) relative to its level right after the burn-in, or beyond "
        "rate_factor (either way) within the last rate_steps."
    ),
    severity="warning",
    params={
        "which": ParamSpec("x", "choice", "which iterate", choices=("x", "y")),
        "keys": KEYS,
        "reference": ParamSpec(
            "burn_in",
            "choice",
            "burn_in: the stretch right after the burn-in; "
            "trailing: the stretch before the recent window",
            choices=("burn_in", "trailing"),
        ),
        "rise_factor": ParamSpec(
            3.0, "float", "fire above this ratio to the level after the burn-in", lo=1.01, hi=1e6
        ),
        "fall_factor": ParamSpec(
            4.0, "float", "fire below 1/this ratio to the level after the burn-in", lo=1.01,
            hi=1e6,
        ),
        "rate_factor": ParamSpec(
            2.2,
            "float",
            "fire when the level moves beyond this ratio (up or down) within rate_steps",
            lo=1.01,
            hi=1e6,
        ),
        "rate_steps": auto_int("span of the rate check; auto: 5% of total_steps (>= 20)"),
        "resolve_ratio": RESOLVE_RATIO,
        "window_steps": auto_int("rolling-median window; auto: 3% of total_steps (>= 10)"),
        "reference_steps": auto_int("reference stretch; auto: 5% of total_steps (>= 20)"),
        "burn_in_steps": BURN_IN,
    },
    evaluate=on_first_input(_weight_inputs, _eval_weight),
    describe=_describe_weight,
    for_auto=run_fraction(0.01, 10, 100),
    resolve_auto=run_fraction(0.02, 20, 200),
    lookback=_weight_lookback,
    inputs=_weight_inputs,
)
