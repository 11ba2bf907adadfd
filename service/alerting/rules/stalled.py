"""Stalled: a run marked running, or lost (its client went silent too), that has sent nothing
for a while. About wall-clock silence, not data: the worker checks it between ingests, and a
replay of stored data skips it. A lost run is not ended (it may come back), so the service
marking it does not close this alert: on-call hears of a run that died without a word."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from curvecast.contract import LOST_RUN_STATUS
from curvecast.service.alerting.lifecycle import Observation
from curvecast.service.alerting.rules.framework import (
    EvalContext,
    RuleConfig,
    RuleOutput,
    RuleSpec,
    Series,
    auto_int,
    immediately,
    since_last_round,
)

#: The run statuses whose silence the rule watches: a run that ended has nothing left to send.
SILENCE_WATCHED = ("running", LOST_RUN_STATUS)


def _evaluate(
    series: Mapping[str, Series], ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    after = cfg.params.get("after_s")
    limit = float(after) if after is not None else ctx.stalled_after_s
    silent = ctx.seconds_since_ingest
    if silent is None:
        return RuleOutput([], memory)
    active = ctx.status in SILENCE_WATCHED and silent > limit
    # Stalls are judged at the run's last step: the step does not move while a run is silent,
    # so the observation is always "new" to the lifecycle (see lifecycle.advance).
    obs = Observation(step=max(ctx.last_step, 0), active=active, clear=not active, value=silent)
    return RuleOutput([obs], memory)


def _inputs(_cfg: RuleConfig) -> list[list[str]]:
    return []


def _describe(
    value: float, cfg: RuleConfig, key: str | None, _ctx: EvalContext
) -> tuple[str, str]:
    minutes = value / 60 if math.isfinite(value) else math.nan
    return (
        f"run has sent nothing for {minutes:.0f} min",
        f"The run has not ended but the service has received nothing from it for "
        f"{minutes:.1f} minutes (a run whose client sends no heartbeat either is marked lost). "
        "The job may have hung, been killed without reporting, or lost its network; the "
        "client spools to disk and will catch up if it is only offline.",
    )


STALLED = RuleSpec(
    name="stalled",
    title="Run stalled",
    description=(
        "The run is `running` or `lost` but has sent nothing for after_s seconds (default: "
        "the service setting CURVECAST_STALLED_AFTER_S)."
    ),
    severity="warning",
    params={
        "after_s": auto_int("seconds of silence; auto: the service setting stalled_after_s"),
    },
    evaluate=_evaluate,
    describe=_describe,
    for_auto=immediately,
    resolve_auto=immediately,
    lookback=since_last_round,
    inputs=_inputs,
    for_steps=0,
    resolve_for_steps=0,
    for_reason="the silence itself is the duration",
)
