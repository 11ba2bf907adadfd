"""The rule table, a project's configuration of a rule (defaults plus a validated override),
and the one entry point that evaluates a rule. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from curvecast.service.alerting.rules.competitive import NOT_COMPETITIVE
from curvecast.service.alerting.rules.framework import (
    SEVERITIES,
    EvalContext,
    ParamSpec,
    RuleConfig,
    RuleOutput,
    RuleSpec,
    Series,
)
from curvecast.service.alerting.rules.non_finite import NON_FINITE
from curvecast.service.alerting.rules.norms import GRAD_NORM_DRIFT, WEIGHT_NORM_DRIFT
from curvecast.service.alerting.rules.off_curve import OFF_CURVE
from curvecast.service.alerting.rules.polyak import POLYAK_COLLAPSE, POLYAK_SPIKE
from curvecast.service.alerting.rules.stalled import STALLED
from curvecast.service.alerting.rules.trend import GRAD_NORM_TREND

#: Every rule by name, in the order the API lists them and the engine evaluates them.
RULES: dict[str, RuleSpec] = {
    spec.name: spec
    for spec in (
        GRAD_NORM_DRIFT,
        GRAD_NORM_TREND,
        WEIGHT_NORM_DRIFT,
        POLYAK_SPIKE,
        POLYAK_COLLAPSE,
        NON_FINITE,
        OFF_CURVE,
        STALLED,
        NOT_COMPETITIVE,
    )
}

_TOP_LEVEL = ("enabled", "severity", "for_steps", "resolve_for_steps", "params")
_DURATION = ParamSpec(None, "auto_int", "", lo=0, hi=10**12)


def validate_override(rule: str, override: Mapping[str, Any]) -> dict[str, Any]:
    """Check a project's override of ``rule`` and return it normalised.

    The override may set any of ``enabled``, ``severity``, ``for_steps``,
    ``resolve_for_steps`` and ``params`` (a subset of the rule's thresholds); what it leaves
    out keeps the default.

    Raises:
        KeyError: ``rule`` is not a known rule.
        ValueError: a field is unknown or out of range; the message names it.
    """
    spec = RULES[rule]
    unknown = sorted(set(override) - set(_TOP_LEVEL))
    if unknown:
        raise ValueError(
            f"unknown field(s) {', '.join(unknown)}; a rule config has {', '.join(_TOP_LEVEL)}"
        )
    out: dict[str, Any] = {}
    if "enabled" in override:
        if not isinstance(override["enabled"], bool):
            raise ValueError("enabled must be true or false")
        out["enabled"] = override["enabled"]
    if "severity" in override:
        if override["severity"] not in SEVERITIES:
            raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}")
        out["severity"] = override["severity"]
    for name in ("for_steps", "resolve_for_steps"):
        if name in override:
            out[name] = _DURATION.check(name, override[name])
    params = override.get("params") or {}
    if not isinstance(params, Mapping):
        raise ValueError("params must be an object of threshold names to values")
    bad = sorted(set(params) - set(spec.params))
    if bad:
        raise ValueError(
            f"rule {rule!r} has no parameter(s) {', '.join(bad)}; "
            f"it has {', '.join(sorted(spec.params))}"
        )
    checked = {k: spec.params[k].check(f"params.{k}", v) for k, v in params.items()}
    _check_consistency(spec, {**spec.default_config().params, **checked})
    if checked:
        out["params"] = checked
    return out


def _check_consistency(spec: RuleSpec, params: Mapping[str, Any]) -> None:
    """Cross-parameter checks, as the rule's parameters declare them (``ParamSpec.below``)."""
    for name, param in spec.params.items():
        if param.below is None:
            continue
        value, bound = params[name], params[param.below]
        if value > bound or (value == bound and not param.or_equal):
            op = "<=" if param.or_equal else "<"
            raise ValueError(f"params.{name} must be {op} params.{param.below}")


def rule_config(rule: str, override: Mapping[str, Any] | None = None) -> RuleConfig:
    """The effective configuration: the rule's defaults with a (validated) override applied."""
    base = RULES[rule].default_config()
    if not override:
        return base
    o = validate_override(rule, override)
    return RuleConfig(
        enabled=o.get("enabled", base.enabled),
        severity=o.get("severity", base.severity),
        for_steps=o.get("for_steps", base.for_steps),
        resolve_for_steps=o.get("resolve_for_steps", base.resolve_for_steps),
        params={**base.params, **o.get("params", {})},
    )


def evaluate_rule(
    rule: str,
    series: Mapping[str, Series],
    ctx: EvalContext,
    cfg: RuleConfig,
    memory: Mapping[str, Any] | None = None,
) -> RuleOutput:
    """Evaluate one rule on the steps after ``ctx.after_step``. Pure."""
    return RULES[rule].evaluate(series, ctx, cfg, dict(memory or {}))


def durations(rule: str, ctx: EvalContext, cfg: RuleConfig) -> tuple[int, int]:
    """The effective ``for`` and resolve durations (in steps) of a rule for a run."""
    spec = RULES[rule]
    for_steps = cfg.for_steps if cfg.for_steps is not None else spec.for_auto(ctx)
    resolve = (
        cfg.resolve_for_steps if cfg.resolve_for_steps is not None else spec.resolve_auto(ctx)
    )
    return int(for_steps), int(resolve)
