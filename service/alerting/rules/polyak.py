"""The Polyak step size eta: a spike (a vanishing denominator blows the step up) and a
collapse (a numerator F + I - f* <= 0 stops the optimizer)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from curvecast.contract import telemetry_keys
from curvecast.service.alerting.rules.framework import (
    BURN_IN,
    KEYS,
    EvalContext,
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
    immediately,
    observations,
    on_first_input,
    run_fraction,
)
from curvecast.service.alerting.rules.stats import coarse, rolling_mean, rolling_median

# --- spike ----------------------------------------------------------------------------------------

_SPIKE_REF = 0.05


def _spike_inputs(cfg: RuleConfig) -> list[list[str]]:
    return given_keys_or(cfg, telemetry_keys("eta"))


def _eval_spike(
    s: Series, key: str, ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    p = cfg.params
    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    ref_len = auto_steps(ctx, p.get("reference_steps"), _SPIKE_REF, 20, 500)
    window = max(1, int(p["window_steps"]))
    mask = (s.steps > max(ctx.after_step, burn + ref_len)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    # eta = 0 is a collapse, not a spike: a zero never counts as the recent level.
    positive = np.where(s.values > 0, s.values, np.nan)
    recent = rolling_median(s.steps, positive, window, at)
    reference = rolling_median(s.steps, positive, ref_len, at - window,
                               resolution=coarse(ref_len))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = recent / reference
    ok = np.isfinite(ratio)
    r = np.where(ok, ratio, 0.0)
    active = ok & (r > p["factor"])
    clear = ok & (r < p["resolve_factor"])
    return RuleOutput(observations(at, active, clear, ratio), memory, key)


def _spike_lookback(ctx: EvalContext, cfg: RuleConfig, memory: Mapping[str, Any]) -> int:
    ref_len = auto_steps(ctx, cfg.params.get("reference_steps"), _SPIKE_REF, 20, 500)
    return max(0, ctx.after_step - ref_len - int(cfg.params["window_steps"]))


def _describe_spike(
    value: float, cfg: RuleConfig, key: str | None, _ctx: EvalContext
) -> tuple[str, str]:
    return (
        f"Polyak step size jumped {factor_text(value)} above its recent median",
        f"{key or 'eta'} is {factor_text(value)} its median over the preceding stretch. A "
        "vanishing Polyak denominator (tiny gradients) blows the step up and can destabilise "
        "training; check the loss scaling and the gradient norms.",
    )


POLYAK_SPIKE = RuleSpec(
    name="polyak_spike",
    title="Polyak step spike",
    description=(
        "The Polyak step eta (median over window_steps) is more than factor times its "
        "median over the preceding reference stretch."
    ),
    severity="warning",
    params={
        "keys": KEYS,
        "factor": ParamSpec(5.0, "float", "fire above this ratio", lo=1.01, hi=1e9),
        "resolve_factor": ParamSpec(2.0, "float", "clear below this ratio", lo=1.0, hi=1e9,
                                    below="factor"),
        "window_steps": ParamSpec(3, "int", "recent window (steps)", lo=1),
        "reference_steps": auto_int("reference stretch; auto: 5% of total_steps (>= 20)"),
        "burn_in_steps": BURN_IN,
    },
    evaluate=on_first_input(_spike_inputs, _eval_spike),
    describe=_describe_spike,
    for_auto=immediately,
    resolve_auto=run_fraction(0.01, 10, 100),
    lookback=_spike_lookback,
    inputs=_spike_inputs,
    for_steps=0,
    for_reason="a spike does its damage in one step",
)


# --- collapse -------------------------------------------------------------------------------------

_COLLAPSE_WINDOW = 0.02


def _collapse_inputs(cfg: RuleConfig) -> list[list[str]]:
    # eta <= 0 exactly when the clipped numerator F + I - f* is <= 0: either key works.
    return given_keys_or(cfg, telemetry_keys("eta") + telemetry_keys("numerator"))


def _collapse_window(ctx: EvalContext, cfg: RuleConfig) -> int:
    return auto_steps(ctx, cfg.params.get("window_steps"), _COLLAPSE_WINDOW, 10, 50)


def _eval_collapse(
    s: Series, key: str, ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    p = cfg.params
    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    mask = (s.steps > max(ctx.after_step, burn)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    zero = np.where(np.isfinite(s.values), (s.values <= 0).astype(np.float64), np.nan)
    frac = rolling_mean(s.steps, zero, _collapse_window(ctx, cfg), at)
    ok = np.isfinite(frac)
    f = np.where(ok, frac, 0.0)
    active = ok & (f >= p["min_fraction"])
    clear = ok & (f <= p["clear_fraction"])
    return RuleOutput(observations(at, active, clear, frac), memory, key)


def _collapse_lookback(ctx: EvalContext, cfg: RuleConfig, memory: Mapping[str, Any]) -> int:
    return max(0, ctx.after_step - _collapse_window(ctx, cfg))


def _describe_collapse(
    value: float, cfg: RuleConfig, key: str | None, _ctx: EvalContext
) -> tuple[str, str]:
    pct = f"{100 * value:.0f}%" if math.isfinite(value) else "most"
    return (
        "Polyak step size collapsed to zero",
        f"The Polyak step was zero on {pct} of the recent steps ({key}): the numerator "
        "F + I - f* is <= 0, so the optimizer takes no steps. Check f_star (it must be below "
        "the reachable loss) and the inner-product term.",
    )


POLYAK_COLLAPSE = RuleSpec(
    name="polyak_collapse",
    title="Polyak step collapse",
    description=(
        "eta = 0 (the numerator F + I - f* <= 0) on at least min_fraction of the steps "
        "of a rolling window: the optimizer has stopped moving."
    ),
    severity="critical",
    params={
        "keys": KEYS,
        "min_fraction": ParamSpec(0.8, "float", "fire at this zero fraction", lo=0.01, hi=1.0),
        "clear_fraction": ParamSpec(
            0.2, "float", "clear at or below this fraction", lo=0.0, hi=0.99,
            below="min_fraction",
        ),
        "window_steps": auto_int("rolling window; auto: 2% of total_steps (>= 10)"),
        "burn_in_steps": BURN_IN,
    },
    evaluate=on_first_input(_collapse_inputs, _eval_collapse),
    describe=_describe_collapse,
    for_auto=run_fraction(0.005, 5, 50),
    resolve_auto=run_fraction(0.01, 10, 100),
    lookback=_collapse_lookback,
    inputs=_collapse_inputs,
)
