"""Alert rules: definitions with documented defaults, and pure evaluators. No I/O.

Every rule turns a run's series (step and value arrays per metric key), its config and its
forecast into :class:`~curvecast.service.alerting.lifecycle.Observation` verdicts, one per
evaluated step; :mod:`curvecast.service.alerting.lifecycle` turns verdicts into
pending/firing/resolved alerts. The service's worker, the quality bench
(``bench/alerts/alerts_quality.py``) and the tests all call :func:`evaluate_rule` (through
:mod:`curvecast.service.alerting.engine`), so what the bench measures is what the service does.

The modules: :mod:`.framework` (what a rule is made of), :mod:`.stats` (rolling statistics),
one module per family of rules with each rule's definition beside its evaluator
(:mod:`.norms`, :mod:`.polyak`, :mod:`.non_finite`, :mod:`.off_curve`, :mod:`.stalled`,
:mod:`.competitive`, the opt-in ``not_competitive``), and
:mod:`.registry` (the rule table and a project's configuration of a rule).

Why the rules look the way they do (docs/alerts.md has the long form and the measurements):

* **Log space, medians.** Norms and step sizes are positive and multiplicative: a drift is a
  ratio, and ratios are differences of logs. Per-step gradient norms are heavy-tailed, so levels
  are rolling medians, which one outlier batch cannot move.
* **Burn-in.** Nothing but non-finite values and stalls is judged before the burn-in
  (:meth:`curvecast.contract.RunConfig.alert_burn_in`): the larger of twice the step where
  averaging starts and 10% of ``total_steps``. Norms move a lot while averaging starts: on
  real runs gradient norms change several-fold during the first 10% of a healthy run
  (BENCHMARKS.md, "drift").
* **Durations in steps, scaled to the run.** ``auto`` windows and ``for`` durations are fractions
  of ``total_steps`` (with floors), so the same defaults serve a 1,000-step test and a 10^6-step
  pre-training run; without ``total_steps`` fixed fallbacks apply.
* **Telemetry names from the contract.** Rules read the optimizer's statistics under every name
  :func:`curvecast.contract.telemetry_keys` lists (``opt/<stat>`` first, then the legacy names).
"""

from curvecast.service.alerting.rules.framework import (
    SEVERITIES,
    EvalContext,
    ParamSpec,
    RuleConfig,
    RuleOutput,
    RuleSpec,
    Series,
    burn_in_step,
    first_present,
)
from curvecast.service.alerting.rules.registry import (
    RULES,
    durations,
    evaluate_rule,
    rule_config,
    validate_override,
)
from curvecast.service.alerting.rules.stats import rolling_median

__all__ = [
    "RULES",
    "SEVERITIES",
    "EvalContext",
    "ParamSpec",
    "RuleConfig",
    "RuleOutput",
    "RuleSpec",
    "Series",
    "burn_in_step",
    "durations",
    "evaluate_rule",
    "first_present",
    "rolling_median",
    "rule_config",
    "validate_override",
]
