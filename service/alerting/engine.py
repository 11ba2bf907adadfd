"""One evaluation round of one run: every rule's evaluator, then the lifecycle. Pure.

The worker (:mod:`curvecast.service.worker.alerts`) calls :func:`evaluate_round` with what it
read from the database and records the returned transitions; :func:`replay` calls it on stored
data in chunks, as a client would stream it, for the quality bench and the tests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from curvecast.contract import FINAL_RUN_STATUSES, RunConfig, fit_candidates
from curvecast.contract import fit_key as contract_fit_key
from curvecast.service.alerting.lifecycle import Event, RuleLifecycle, advance
from curvecast.service.alerting.rules import (
    RULES,
    EvalContext,
    RuleConfig,
    Series,
    durations,
    evaluate_rule,
    rule_config,
)
from curvecast.service.forecast import Fit

__all__ = ["ReplayEvent", "Transition", "evaluate_round", "replay"]


@dataclass(frozen=True)
class Transition:
    """A lifecycle event of one rule, with what an alert shows."""

    rule: str
    event: Event
    severity: str
    summary: str
    description: str
    key: str | None
    #: Why an alert closed when not because its condition cleared (``run ended``, ...).
    reason: str | None = None


def evaluate_round(
    series: Mapping[str, Series],
    ctx: EvalContext,
    configs: Mapping[str, RuleConfig],
    state: Mapping[str, Any] | None,
    *,
    rules: tuple[str, ...] | None = None,
) -> tuple[dict[str, Any], list[Transition]]:
    """Evaluate ``rules`` (default: all enabled ones) on the steps after ``ctx.after_step``.

    Args:
        series: the run's series (at least the keys and step range the rules need).
        ctx: the run's context.
        configs: effective configuration per rule.
        state: per rule ``{"lifecycle": ..., "memory": ...}`` from the previous round.
        rules: evaluate only these (the stalled check runs alone between ingests).

    Returns:
        The new state (JSON-ready) and the transitions, in rule order.
    """
    new_state: dict[str, Any] = {k: dict(v) for k, v in (state or {}).items()}
    out: list[Transition] = []
    for name in tuple(RULES) if rules is None else rules:
        cfg = configs.get(name) or rule_config(name)
        previous = new_state.get(name, {})
        life = RuleLifecycle.from_dict(previous.get("lifecycle"))
        if not cfg.enabled:
            if life.state != "inactive":
                # Disabling a rule closes its open alert (resolved, people are told).
                event = _closing(life, math.nan)
                out.append(_transition(name, event, cfg, previous.get("key"), ctx))
            new_state.pop(name, None)
            continue
        result = evaluate_rule(name, series, ctx, cfg, previous.get("memory"))
        for_steps, resolve_steps = durations(name, ctx, cfg)
        life, events = advance(
            life, result.observations, for_steps=for_steps, resolve_for_steps=resolve_steps
        )
        key = result.key or previous.get("key")
        new_state[name] = {"lifecycle": life.to_dict(), "memory": result.memory, "key": key}
        out.extend(_transition(name, e, cfg, key, ctx) for e in events)
    if ctx.status in FINAL_RUN_STATUSES:
        # The points it sent before it ended have been judged; nothing is left to watch.
        # Said so: an on-call reader of "resolved" should not take it for a fix.
        out += _close_all(new_state, ctx, configs,
                          f"run ended ({ctx.status}) while the condition still held")
    return new_state, out


def _close_all(
    state: dict[str, Any], ctx: EvalContext, configs: Mapping[str, RuleConfig], reason: str
) -> list[Transition]:
    """A run that ended has no condition left to watch: every open alert closes (a firing one
    resolves with ``reason``, a pending one is dropped), in ``state`` too, so nothing stays
    open. Each rule's memory is kept, in case the run comes back (a run marked crashed for
    its silence is revived by its next point)."""
    out: list[Transition] = []
    for name, previous in state.items():
        life = RuleLifecycle.from_dict(previous.get("lifecycle"))
        if life.state == "inactive" or name not in RULES:
            continue
        cfg = configs.get(name) or rule_config(name)
        value = life.value if life.value is not None else math.nan
        transition = _transition(name, _closing(life, value), cfg, previous.get("key"), ctx)
        out.append(replace(transition, reason=reason))
        state[name] = {**previous, "lifecycle": RuleLifecycle().to_dict()}
    return out


def _closing(life: RuleLifecycle, value: float) -> Event:
    """The event that closes an open alert from outside its rule: a firing one resolves (people
    are told), a pending one is cancelled."""
    kind: Literal["resolved", "cancelled"] = "resolved" if life.state == "firing" else "cancelled"
    return Event(kind, life.step or 0, value, life.since_step or 0)


def _transition(
    rule: str, event: Event, cfg: RuleConfig, key: str | None, ctx: EvalContext
) -> Transition:
    summary, description = RULES[rule].describe(event.value, cfg, key, ctx)
    return Transition(rule, event, cfg.severity, summary, description, key)


# ---------------------------------------------------------------------------------------------
# Replaying stored data
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReplayEvent:
    """A transition seen while replaying, at the step of the chunk that produced it."""

    rule: str
    kind: str
    step: int
    since_step: int
    value: float
    summary: str


def replay(
    series: Mapping[str, Series],
    config: Mapping[str, Any],
    *,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    chunk: int = 25,
    refit_growth: float = 0.05,
    with_forecast: bool = True,
    project_best: tuple[float, str] | None = None,
) -> list[ReplayEvent]:
    """Stream stored series through :func:`evaluate_round` ``chunk`` steps at a time.

    The forecast is refitted like the worker does (when the fitted series has grown by
    ``refit_growth``), so the off-curve rule sees what it would see live. The ``stalled`` rule
    is not replayed (it is about wall-clock silence, not data). ``project_best`` is the loss
    (and the run's name) ``not_competitive`` must beat, as the worker reads it from the
    project's finished runs; without it that rule, enabled or not, never judges.

    Returns:
        Every transition, in order.
    """
    from curvecast.service.forecast.solver import fit_curve  # scipy: only when replaying

    configs = {name: rule_config(name, (overrides or {}).get(name)) for name in RULES}
    configs["stalled"] = replace(configs["stalled"], enabled=False)
    cfg = RunConfig.read(config)
    last = max((int(s.steps[-1]) for s in series.values() if len(s)), default=-1)
    loss_series = {k: series[k] for k in fit_candidates(cfg) if k in series}
    fit_key: str | None = None
    fit: Fit | None = None
    fitted_n = 0
    state: dict[str, Any] = {}
    events: list[ReplayEvent] = []
    after = -1
    for upto in range(chunk - 1 if chunk > 0 else last, last + chunk, max(chunk, 1)):
        upto = min(upto, last)
        if upto <= after:
            continue
        if with_forecast:
            # The series the forecast fits, chosen from the points so far exactly as the
            # worker's refit chooses it (the contract's fit_key).
            counts = {k: int(np.searchsorted(s.steps, upto, side="right"))
                      for k, s in loss_series.items()}
            key = contract_fit_key(counts, cfg)
            if key != fit_key:
                fit_key, fit, fitted_n = key, None, 0
            n = counts.get(fit_key, 0) if fit_key is not None else 0
            if fit_key is not None and n >= 4 and n >= fitted_n * (1 + refit_growth) \
                    and n > fitted_n:
                fs = series[fit_key]
                fit = fit_curve(fs.steps[:n], fs.values[:n], config=config)  # as the worker
                fitted_n = n
        ctx = EvalContext(config=config, last_step=upto, after_step=after, fit=fit,
                          fit_key=fit_key, project_best=project_best)
        state, transitions = evaluate_round(series, ctx, configs, state)
        for t in transitions:
            events.append(ReplayEvent(t.rule, t.event.kind, t.event.step, t.event.since_step,
                                      t.event.value, t.summary))
        after = upto
    return events
