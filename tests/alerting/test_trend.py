"""The gradient-norm trend rule on planted series, through the same pure evaluator and
lifecycle the worker uses: a steady climb since the burn-in warns (once), a small one does not,
a climb that comes back resolves; its message speaks of the effective learning rate and of the
run's own lambda and warmups."""

from __future__ import annotations

import math

import numpy as np

from curvecast.service.alerting.engine import evaluate_round
from curvecast.service.alerting.rules import RULES, EvalContext, Series, burn_in_step, rule_config
from tests.alerting.test_rules import CONFIG, base_series, fired, planted, run_all

RULE = "grad_norm_trend"
N = 1000


def _steady(factor: float, start: int = 100):  # type: ignore[no-untyped-def]
    """A climb even in log space from ``start`` to the end, ``factor`` in all."""
    return lambda s, v: v * np.exp(np.clip((s - start) / (N - start), 0, 1) * math.log(factor))


def test_a_steady_x5_climb_warns_once_before_60_percent() -> None:
    events = run_all(planted(base_series(), "sfplus/grad_l1", _steady(5.0)))
    steps = fired(events, RULE)
    assert len(steps) == 1, "one alert: no re-firing while the climb goes on"
    assert steps[0] < 0.6 * N
    firing = next(e for e in events if e.rule == RULE and e.kind == "firing")
    # Even in log space, x5 in all is only about x2 at 60%: the rule fires on the course the
    # climb is on (past min_factor, heading beyond projected_factor), not on a level of x3.
    assert firing.value > RULES[RULE].default_config().params["min_factor"]


def test_a_x1_5_climb_is_quiet_from_every_drift_rule() -> None:
    events = run_all(planted(base_series(), "sfplus/grad_l1", _steady(1.5)))
    assert fired(events) == []


def test_a_climb_that_comes_back_resolves() -> None:
    def up_then_down(s: np.ndarray, v: np.ndarray) -> np.ndarray:
        level = np.interp(s, [0, 200, 550, 750, N], [0, 0, math.log(5.0), 0, 0])
        return v * np.exp(level)

    events = [
        e for e in run_all(planted(base_series(), "sfplus/grad_l1", up_then_down)) if e.rule == RULE
    ]
    kinds = [e.kind for e in events if e.kind in ("firing", "resolved")]
    assert kinds == ["firing", "resolved"]


def test_the_l2_norm_when_asked() -> None:
    series = base_series()
    steps = series["sfplus/grad_l1"].steps
    series["opt/grad_l2"] = Series.of(steps, _steady(5.0)(steps, np.ones(steps.size)))
    overrides = {RULE: {"params": {"norm": "l2"}}}
    assert fired(run_all(series, overrides=overrides), RULE)
    assert not fired(run_all(series), RULE)  # L1 (flat) by default


def test_the_message_gives_the_factor_the_meaning_and_the_runs_settings() -> None:
    config = {**CONFIG, "weight_decay": 0.5, "warmup_steps": 20, "c_warmup": 40}
    series = planted(base_series(), "sfplus/grad_l1", _steady(5.0))
    cfg = {name: rule_config(name) for name in RULES}
    state: dict = {}
    transitions = []
    for upto in range(99, N, 100):
        ctx = EvalContext(config=config, last_step=upto, after_step=upto - 100)
        state, out = evaluate_round(series, ctx, cfg, state)
        transitions += [t for t in out if t.rule == RULE and t.event.kind == "firing"]
    [t] = transitions
    assert t.severity == "warning"
    assert "effective learning rate" in t.summary
    assert "weight_decay (AdamC lambda) 0.5" in t.description
    assert "warmup_steps 20" in t.description and "c_warmup 40" in t.description
    burn = burn_in_step(EvalContext(config=config, last_step=N))
    assert f"end of the burn-in (step {burn})" in t.description
