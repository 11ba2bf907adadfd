"""Adding a rule is one edit: its automatic durations describe themselves, and a clearing
threshold names the firing one it must stay below, so the registry repeats no number."""

from __future__ import annotations

import pytest

from curvecast.service.alerting.rules.framework import EvalContext, RunFraction
from curvecast.service.alerting.rules.registry import RULES, validate_override


def _ctx(total_steps: int | None) -> EvalContext:
    config = {} if total_steps is None else {"total_steps": total_steps}
    return EvalContext(config=config, last_step=0)


def test_an_automatic_duration_says_what_it_computes() -> None:
    auto = RunFraction(0.02, 20, 200)
    assert auto.describe() == "auto: 2% of total_steps (>= 20; 200 if unknown)"
    assert (auto(_ctx(5_000)), auto(_ctx(100)), auto(_ctx(None))) == (100, 20, 200)


def test_every_rule_documents_its_automatic_for_from_the_function() -> None:
    for spec in RULES.values():
        if isinstance(spec.for_auto, RunFraction):
            assert spec.for_doc == spec.for_auto.describe()
        else:
            assert spec.for_auto(_ctx(10_000)) == 0 and spec.for_doc.startswith("0: ")


@pytest.mark.parametrize(("rule", "params", "message"), [
    ("off_curve", {"resolve_confidence": 0.995},
     "params.resolve_confidence must be <= params.confidence"),
    ("polyak_spike", {"factor": 3.0, "resolve_factor": 3.0},
     "params.resolve_factor must be < params.factor"),
    ("polyak_collapse", {"clear_fraction": 0.9},
     "params.clear_fraction must be < params.min_fraction"),
])
def test_a_clearing_threshold_must_stay_below_its_firing_one(
        rule: str, params: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        validate_override(rule, {"params": params})
    firing = next(RULES[rule].params[name].below for name in params
                  if RULES[rule].params[name].below)
    assert firing is not None
    validate_override(rule, {"params": {firing: RULES[rule].params[firing].default}})
