"""Not competitive: a running run whose calibrated forecast gives it too little chance of
ending below the project's best finished run (or a ``target_loss``) by its planned end.

Opt-in per project (disabled by default): stopping runs is a decision about a sweep, which only
the project knows it is running. The chance is the decision core's
(:mod:`curvecast.service.forecast.chances`), from the run's latest fit, the same one the
ranking, ``GET .../forecast/beat`` and the Optuna pruner use. A forecast that does not know says
nothing: no verdict while the fit is not ``ok`` (``too_early``, ``no_asymptote``,
``off_model``, ``flat``, none yet), before the alert burn-in, without a planned end
(``total_steps``) or without something to beat; an open alert then stays as it is until the
forecast knows again, and resolves once the chance is back at ``resolve_threshold``.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from typing import Any, Final

from curvecast.contract import ForecastStatus
from curvecast.service.alerting.lifecycle import Observation
from curvecast.service.alerting.rules.framework import (
    BURN_IN,
    EvalContext,
    ParamSpec,
    RuleConfig,
    RuleOutput,
    RuleSpec,
    Series,
    burn_in_step,
    run_fraction,
    since_last_round,
)
from curvecast.service.forecast.chances import RunInput, outlook

_RUN: Final = uuid.UUID(int=0)


def _inputs(_cfg: RuleConfig) -> list[list[str]]:
    # The rule reads the run's fit and the project's best from the context, no series.
    return []


def _to_beat(ctx: EvalContext, cfg: RuleConfig) -> tuple[float, str] | None:
    """The loss to beat and what it is, in words: the target, else the project's best."""
    target = cfg.params.get("target_loss")
    if target is not None:
        return float(target), f"the target loss {float(target):.4g}"
    if ctx.project_best is None:
        return None
    loss, name = ctx.project_best
    return loss, f"the project's best finished run ({name}, {loss:.4g})"


def chance_to_beat(ctx: EvalContext, cfg: RuleConfig) -> float | None:
    """P(the run's loss at its planned end < the loss to beat), or None when the forecast does
    not know (module docstring)."""
    beat = _to_beat(ctx, cfg)
    total = ctx.total_steps
    fit = ctx.fit
    if (beat is None or total is None or fit is None or fit.status != ForecastStatus.OK
            or ctx.status != "running" or ctx.last_step >= total
            or ctx.last_step <= burn_in_step(ctx, cfg.params.get("burn_in_steps"))):
        return None
    run = RunInput(run_id=_RUN, name="run", status="running", fit=fit, total_steps=total,
                   last_step=ctx.last_step)
    return outlook(run, total).chance_below(beat[0])


def _evaluate(
    series: Mapping[str, Series], ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    if ctx.last_step <= ctx.after_step:
        return RuleOutput([], memory)
    chance = chance_to_beat(ctx, cfg)
    if chance is None:
        return RuleOutput([], memory)
    p = cfg.params
    obs = Observation(step=ctx.last_step, active=chance < p["threshold"],
                      clear=chance >= p["resolve_threshold"], value=chance)
    return RuleOutput([obs], memory, ctx.fit_key)


def _saving(ctx: EvalContext) -> str:
    """What stopping now saves: the steps left, and the wall time where the pace is known."""
    total = ctx.total_steps
    if total is None:
        return ""
    left = max(0, total - ctx.last_step)
    out = f"Stopping it now saves {left:,} of its {total:,} planned steps"
    if ctx.seconds_per_step is not None and math.isfinite(ctx.seconds_per_step):
        hours = left * ctx.seconds_per_step / 3600.0
        out += (f", about {hours:,.1f} hours of wall time at its pace so far (GPU-hours: that "
                "times its GPUs)")
    return out + "."


def _describe(
    value: float, cfg: RuleConfig, key: str | None, ctx: EvalContext
) -> tuple[str, str]:
    beat = _to_beat(ctx, cfg)
    what = beat[1] if beat is not None else "the project's best finished run"
    chance = f"{value:.1%}" if math.isfinite(value) else "a small"
    total = ctx.total_steps
    end = f"by its planned end (step {total:,})" if total is not None else "by its end"
    return (
        f"{chance} chance to beat {what}",
        f"The calibrated forecast of {key or 'the loss'} gives this run a {chance} chance of "
        f"ending below {what} {end}, under the rule's threshold of "
        f"{cfg.params['threshold']:.0%}. {_saving(ctx)}".rstrip(),
    )


NOT_COMPETITIVE = RuleSpec(
    name="not_competitive",
    title="Run not competitive",
    description=(
        "Opt-in (disabled by default). A running run's calibrated forecast gives it less than "
        "`threshold` chance of ending below the project's best finished run on the same "
        "series (or `target_loss`) by its planned end (`total_steps`); resolves at "
        "`resolve_threshold`. Judged only from an `ok` fit, after the burn-in: never while "
        "the fit is too_early, no_asymptote, off_model or flat."
    ),
    severity="info",
    params={
        "threshold": ParamSpec(0.05, "float", "fire below this chance of beating the best",
                               lo=0.001, hi=0.5, below="resolve_threshold", or_equal=True),
        "resolve_threshold": ParamSpec(0.1, "float", "resolve at this chance or more",
                                       lo=0.001, hi=0.9),
        "target_loss": ParamSpec(None, "float", "beat this loss instead of the project's "
                                 "best finished run"),
        "burn_in_steps": BURN_IN,
    },
    evaluate=_evaluate,
    describe=_describe,
    for_auto=run_fraction(0.02, 20, 200),
    resolve_auto=run_fraction(0.02, 20, 200),
    lookback=since_last_round,
    inputs=_inputs,
    enabled=False,
)
