"""Non-finite values: a NaN or infinite loss or optimizer statistic means the run diverged.

Judged from step 0 (no burn-in) and fires at once: a diverged run does not recover on its own.

It does not resolve itself while the run goes on: a critical alert that says "restore the last
good checkpoint" needs a person, and one that resolved six seconds later (the run logged finite
values again after a bad batch) read as a fix nobody made. It stays firing until someone
acknowledges it (``POST /api/v1/alerts/{id}/ack``); from then on it resolves once every watched
metric has been finite for 2% of the run (20 to 200 steps; 200 without ``total_steps``). The
run's end closes it, as it closes every alert, with that reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from curvecast.contract import EVAL_LOSS_KEYS, MAX_STEP, TRAIN_LOSS_KEYS, telemetry_keys
from curvecast.service.alerting.rules.framework import (
    EvalContext,
    ParamSpec,
    RuleConfig,
    RuleOutput,
    RuleSpec,
    Series,
    immediately,
    observations,
    run_fraction,
    since_last_round,
)

#: Every loss the run may log, and the optimizer's loss, gradient and weight norms and step.
_DEFAULT_KEYS = list(
    dict.fromkeys(
        [*TRAIN_LOSS_KEYS, *EVAL_LOSS_KEYS]
        + [
            key
            for stat in ("loss", "grad_l1", "grad_l2", "x_l2", "y_l2", "z_l2", "eta")
            for key in telemetry_keys(stat)
        ]
    )
)


#: A resolve duration no run reaches: the alert stays firing while unacknowledged.
UNTIL_ACKNOWLEDGED = MAX_STEP + 1
_RECOVERED = run_fraction(0.02, 20, 200)


def _resolve_after(ctx: EvalContext) -> int:
    """Steps of finite values before the alert resolves: never before it is acknowledged."""
    return _RECOVERED(ctx) if "non_finite" in ctx.acknowledged else UNTIL_ACKNOWLEDGED


def _inputs(cfg: RuleConfig) -> list[list[str]]:
    # Every key is its own input: all of them are watched, not the first present.
    keys = cfg.params.get("keys")
    return [[k] for k in (keys or _DEFAULT_KEYS)]


def _evaluate(
    series: Mapping[str, Series], ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    present = [k for (k,) in _inputs(cfg) if k in series]
    if not present:
        return RuleOutput([], memory)
    chunks = [series[k].after(ctx.after_step) for k in present]
    steps = np.unique(np.concatenate([c.steps for c in chunks]))
    steps = steps[steps <= ctx.last_step]
    bad = np.zeros(steps.size, dtype=np.int64)
    seen = np.zeros(steps.size, dtype=bool)
    first_bad: dict[int, str] = {}
    for key, c in zip(present, chunks, strict=True):
        idx = np.searchsorted(steps, c.steps)
        ok_idx = idx < steps.size
        idx, vals = idx[ok_idx], c.values[ok_idx]
        nonfinite = ~np.isfinite(vals)
        np.add.at(bad, idx, nonfinite.astype(np.int64))
        seen[idx] = True
        for i in idx[nonfinite][:1].tolist():
            first_bad.setdefault(i, key)
    active = bad > 0
    clear = seen & ~active
    memory = dict(memory)
    if active.any():
        # The key named in the alert: the first one that went bad at the first bad step.
        memory["key"] = first_bad.get(int(np.argmax(active)), memory.get("key"))
    return RuleOutput(
        observations(steps, active, clear, bad.astype(np.float64)), memory, memory.get("key")
    )


def _describe(
    value: float, cfg: RuleConfig, key: str | None, _ctx: EvalContext
) -> tuple[str, str]:
    return (
        f"non-finite values in {key or 'the run'}",
        f"{key or 'A metric'} is NaN or infinite. The run has diverged (or a batch produced "
        "NaN): it will not recover on its own; restore the last good checkpoint.",
    )


NON_FINITE = RuleSpec(
    name="non_finite",
    title="Non-finite loss or norms",
    description=(
        "Any of the watched metrics (loss, eval loss, the optimizer's loss, gradient and "
        "weight norms, eta) is NaN or infinite. Judged from step 0, fires at once; "
        "resolves only once acknowledged, after 2% of the run with finite values."
    ),
    severity="critical",
    params={"keys": ParamSpec(None, "keys", "metrics to watch instead of the defaults")},
    evaluate=_evaluate,
    describe=_describe,
    for_auto=immediately,
    resolve_auto=_resolve_after,
    lookback=since_last_round,
    inputs=_inputs,
    for_steps=0,
)
