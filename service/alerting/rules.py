"""Alert rules: definitions with documented defaults, and a pure evaluator. No I/O.

Every rule turns a run's series (step and value arrays per metric key), its config and its
forecast into :class:`~service.alerting.lifecycle.Observation` verdicts, one per evaluated step;
:mod:`curvecast.service.alerting.lifecycle` turns verdicts into pending/firing/resolved alerts. The
service's
worker, the quality bench (``bench/alerts_quality.py``) and the tests all call
:func:`evaluate_rule` / :func:`evaluate_run`, so what the bench measures is what the service does.

Why the rules look the way they do (docs/alerts.md has the long form and the measurements):

* **Log space, medians.** Norms and step sizes are positive and multiplicative: a drift is a
  ratio, and ratios are differences of logs. Per-step gradient norms are heavy-tailed, so levels
  are rolling medians, which one outlier batch cannot move.
* **Burn-in.** Nothing but non-finite values and stalls is judged before the burn-in: the larger
  of the run's ``c_warmup`` (else ``2 * warmup_steps``, the paper's heuristic) and 10% of
  ``total_steps``. Norms move a lot while averaging starts; the measurements on real runs show
  gradient norms change 2-5x during the first 10% of a healthy run.
* **Trailing reference for gradient norms.** A healthy small run's gradient norm keeps drifting
  at a steady rate in log space for its whole length (1.5-4x from 10% to 100% on the fixtures),
  so a level fixed right after the burn-in would either page on every healthy run or be blind to
  anything short of a tenfold change. The default compares the recent level with the level of
  the stretch just before it: a change in *rate* is what a fault looks like. ``reference:
  "burn_in"`` gives the fixed-level variant for runs known to be flat (AdamC at scale).
* **Durations in steps, scaled to the run.** ``auto`` windows and ``for`` durations are fractions
  of ``total_steps`` (with floors), so the same defaults serve a 1,000-step test and a 10^6-step
  pre-training run; without ``total_steps`` fixed fallbacks apply.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from curvecast.service.alerting.lifecycle import Observation
from curvecast.service.schemas import KEY_PATTERN

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")

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
    "evaluate_rule",
    "evaluate_run",
    "rule_config",
    "validate_override",
]

#: Fraction of ``total_steps`` that is always burn-in (see the module docstring).
BURN_IN_FRACTION = 0.10
#: The burn-in lasts at least this many times ``c_warmup``: once averaging starts, x is an
#: average of few points and its norm (and the loss: the paper's "hump") moves a lot until the
#: average has a history comparable to the steps before it.
BURN_IN_C_WARMUPS = 2.0
#: Metric-name prefixes the optimizer's telemetry may carry: ``sfplus/`` (the brief's naming),
#: ``opt/`` (the client hook's default ``watch(prefix="opt/")``) and none.
STAT_PREFIXES = ("sfplus/", "opt/", "")


def stat_keys(stat: str) -> list[str]:
    """Candidate metric names of one optimizer statistic, in order of preference."""
    return [prefix + stat for prefix in STAT_PREFIXES]


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """One metric: ascending unique steps and float values (NaN where NaN was logged)."""

    steps: IntArray
    values: FloatArray

    @classmethod
    def of(cls, steps: Sequence[int] | IntArray, values: Sequence[float] | FloatArray) -> Series:
        """Build from any sequences (sorted by step; the first of repeated steps wins)."""
        s = np.asarray(steps, dtype=np.int64)
        v = np.asarray(values, dtype=np.float64)
        if s.shape != v.shape:
            raise ValueError(f"steps has {s.size} items but values has {v.size}")
        if s.size > 1 and not np.all(np.diff(s) > 0):
            order = np.argsort(s, kind="stable")
            s, v = s[order], v[order]
            keep = np.concatenate(([True], np.diff(s) > 0))
            s, v = s[keep], v[keep]
        return cls(s, v)

    def after(self, step: int) -> Series:
        """The points with ``step`` > ``step``."""
        i = int(np.searchsorted(self.steps, step, side="right"))
        return Series(self.steps[i:], self.values[i:])

    def __len__(self) -> int:
        return int(self.steps.size)


@dataclass(frozen=True)
class EvalContext:
    """What a rule may know about a run besides its series.

    Attributes:
        config: the run's config (``total_steps``, ``warmup_steps``, ``c_warmup``,
            ``weight_decay`` are read).
        last_step: the run's last step (observations are made up to it).
        after_step: observations are made only at steps after this one (the previous
            evaluation's ``last_step``; -1 for the first).
        status: the run's status (``running``, ``finished``, ...).
        seconds_since_ingest: seconds since the run last sent anything, if known.
        stalled_after_s: the service-wide default of the ``stalled`` rule's ``after_s``.
        fit: the latest stored forecast fit (``Fit.to_dict()``) and ``fit_key`` the series it
            was fitted on, for the off-curve rule.
    """

    config: Mapping[str, Any]
    last_step: int
    after_step: int = -1
    status: str = "running"
    seconds_since_ingest: float | None = None
    stalled_after_s: float = 900.0
    fit: Mapping[str, Any] | None = None
    fit_key: str | None = None

    @property
    def total_steps(self) -> int | None:
        """The planned length of the run, if the config says."""
        total = self.config.get("total_steps")
        return int(total) if isinstance(total, int | float) and total > 0 else None


# ---------------------------------------------------------------------------------------------
# Rule definitions and per-project configuration
# ---------------------------------------------------------------------------------------------

_METRIC_KEY = re.compile(KEY_PATTERN)
ParamKind = Literal["float", "int", "choice", "keys", "auto_int"]


@dataclass(frozen=True)
class ParamSpec:
    """One tunable threshold of a rule.

    Attributes:
        default: the default (``None`` for ``auto_int``: computed from the run, see ``doc``).
        kind: ``float``, ``int``, ``auto_int`` (an int or ``None`` = auto), ``choice`` or
            ``keys`` (a list of metric names; the first one the run has is used).
        doc: what it means and why the default.
        lo, hi: inclusive bounds for numbers.
        choices: allowed values for ``choice``.
    """

    default: Any
    kind: ParamKind
    doc: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()

    def check(self, name: str, value: Any) -> Any:
        """Validate one value; returns it normalised. Raises ValueError naming ``name``."""
        if self.kind == "keys":
            if value is None:
                return None
            if isinstance(value, str):
                value = [value]
            if (
                not isinstance(value, list)
                or not value
                or not all(isinstance(v, str) and _METRIC_KEY.match(v) for v in value)
            ):
                raise ValueError(
                    f"{name} must be a metric name ({KEY_PATTERN}) or a non-empty list of them"
                )
            return list(value)
        if self.kind == "choice":
            if value not in self.choices:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, self.choices))}")
            return value
        if self.kind == "auto_int" and value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(float(value)):
            raise ValueError(f"{name} must be finite")
        if self.kind in ("int", "auto_int"):
            if float(value) != int(value):
                raise ValueError(f"{name} must be a whole number of steps, got {value!r}")
            value = int(value)
        else:
            value = float(value)
        if self.lo is not None and value < self.lo:
            raise ValueError(f"{name} must be >= {self.lo:g}, got {value:g}")
        if self.hi is not None and value > self.hi:
            raise ValueError(f"{name} must be <= {self.hi:g}, got {value:g}")
        return value


@dataclass(frozen=True)
class RuleConfig:
    """The effective configuration of one rule for one project (defaults + overrides).

    Attributes:
        enabled: evaluate the rule at all.
        severity: ``info``, ``warning`` or ``critical`` (a label on alerts and webhooks).
        for_steps: steps the condition must hold before firing; ``None`` = the rule's auto.
        resolve_for_steps: steps the condition must be clear before resolving; ``None`` = auto.
        params: the rule's thresholds (every key of its :attr:`RuleSpec.params`).
    """

    enabled: bool
    severity: Severity
    for_steps: int | None
    resolve_for_steps: int | None
    params: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        return {
            "enabled": self.enabled,
            "severity": self.severity,
            "for_steps": self.for_steps,
            "resolve_for_steps": self.resolve_for_steps,
            "params": dict(self.params),
        }


@dataclass(frozen=True)
class RuleOutput:
    """A rule's verdicts on the new steps, and its memory for the next evaluation."""

    observations: list[Observation]
    memory: dict[str, Any]
    #: The metric the rule read (for labels and messages), if any.
    key: str | None = None


Evaluator = Callable[[Mapping[str, Series], EvalContext, RuleConfig, dict[str, Any]], RuleOutput]
Describer = Callable[[float, RuleConfig, str | None], tuple[str, str]]


@dataclass(frozen=True)
class RuleSpec:
    """A rule: name, what it means, defaults, and its evaluator.

    Attributes:
        name: identifier used in the API and in alert labels.
        title: one line for people.
        description: what the rule checks and why (shown by ``GET .../rules``).
        severity: default severity.
        for_steps: default ``for`` (``None``: auto, see ``for_doc``).
        resolve_for_steps: default resolve duration (``None``: auto).
        params: the thresholds.
        evaluate: the pure evaluator.
        describe: ``(value, cfg, key) -> (summary, description)`` for an alert.
        for_auto: ``(context) -> steps`` for ``for_steps=None``.
        resolve_auto: ``(context) -> steps`` for ``resolve_for_steps=None``.
        lookback: ``(context, cfg, memory) -> first step the evaluator needs``.
        inputs: ``(cfg) -> candidate key lists`` the evaluator reads.
    """

    name: str
    title: str
    description: str
    severity: Severity
    params: Mapping[str, ParamSpec]
    evaluate: Evaluator
    describe: Describer
    for_auto: Callable[[EvalContext], int]
    resolve_auto: Callable[[EvalContext], int]
    lookback: Callable[[EvalContext, RuleConfig, Mapping[str, Any]], int]
    inputs: Callable[[RuleConfig], list[list[str]]]
    for_steps: int | None = None
    resolve_for_steps: int | None = None
    for_doc: str = ""
    defaults_doc: dict[str, str] = field(default_factory=dict)

    def default_config(self) -> RuleConfig:
        """The rule's configuration when a project overrides nothing."""
        return RuleConfig(
            enabled=True,
            severity=self.severity,
            for_steps=self.for_steps,
            resolve_for_steps=self.resolve_for_steps,
            params={k: p.default for k, p in self.params.items()},
        )


_TOP_LEVEL = ("enabled", "severity", "for_steps", "resolve_for_steps", "params")


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
            out[name] = ParamSpec(None, "auto_int", "", lo=0, hi=10**12).check(
                name, override[name]
            )
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
    _check_consistency(rule, {**spec.default_config().params, **checked})
    if checked:
        out["params"] = checked
    return out


def _check_consistency(rule: str, params: Mapping[str, Any]) -> None:
    """Cross-field checks: a resolving threshold must be stricter than the firing one."""
    if "confidence" in params and "resolve_confidence" in params:
        if params["resolve_confidence"] > params["confidence"]:
            raise ValueError("params.resolve_confidence must be <= params.confidence")
    if "resolve_ratio" in params and not 0 <= params["resolve_ratio"] <= 1:
        raise ValueError("params.resolve_ratio must be in [0, 1]")
    if "min_fraction" in params and "clear_fraction" in params:
        if params["clear_fraction"] >= params["min_fraction"]:
            raise ValueError("params.clear_fraction must be < params.min_fraction")
    if "factor" in params and "resolve_factor" in params:
        if params["resolve_factor"] >= params["factor"]:
            raise ValueError("params.resolve_factor must be < params.factor")


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


# ---------------------------------------------------------------------------------------------
# Shared arithmetic
# ---------------------------------------------------------------------------------------------


def burn_in_step(ctx: EvalContext, override: int | None = None) -> int:
    """The last step of the burn-in: ``override`` if given, else the larger of
    ``BURN_IN_C_WARMUPS * c_warmup`` (``c_warmup`` defaulting to ``2 * warmup_steps``) and
    ``BURN_IN_FRACTION`` of ``total_steps``."""
    if override is not None:
        return int(override)
    cfg = ctx.config
    c_warm = _num(cfg.get("c_warmup"))
    if c_warm is None:
        warm = _num(cfg.get("warmup_steps"))
        c_warm = 2 * warm if warm is not None else 0.0
    total = ctx.total_steps
    frac = BURN_IN_FRACTION * total if total else 0.0
    return int(math.ceil(max(BURN_IN_C_WARMUPS * c_warm, frac)))


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


#: Longest automatic window: beyond this a median is as good as it gets, and every round of the
#: worker reads the window's points again.
MAX_AUTO_WINDOW = 10_000
#: A window's median is taken over at most this many evenly spread points.
MEDIAN_SAMPLE = 256


def auto_steps(ctx: EvalContext, value: int | None, fraction: float, floor: int,
               fallback: int, cap: int | None = MAX_AUTO_WINDOW) -> int:
    """``value`` if set, else ``fraction`` of ``total_steps`` (at least ``floor``, at most
    ``cap``), else ``fallback`` when the run's length is unknown."""
    if value is not None:
        return int(value)
    total = ctx.total_steps
    if total is None:
        return fallback
    steps = max(floor, int(round(fraction * total)))
    return min(steps, cap) if cap is not None else steps


def pick_key(series: Mapping[str, Series], candidates: Sequence[str]) -> str | None:
    """The first candidate the run has."""
    return next((k for k in candidates if k in series and len(series[k]) > 0), None)


def first_present(names: Collection[str], candidates: Sequence[str]) -> str | None:
    """The first candidate among ``names`` (a run's metric keys)."""
    return next((k for k in candidates if k in names), None)


def rolling_median(
    steps: IntArray, values: FloatArray, window: int, at: IntArray | None = None
) -> FloatArray:
    """Median of the finite values with step in ``(s - window, s]`` for each ``s`` in ``at``
    (default: every step), NaN where there is none.

    A regular series (constant stride) is done in one vectorised pass; an irregular one with
    a loop over the points asked for.
    """
    if at is None:
        at = steps
    out = np.full(at.size, np.nan)
    if steps.size == 0 or at.size == 0:
        return out
    window = max(int(window), 1)
    if steps.size > 2:
        stride = np.diff(steps)
        regular = bool(np.all(stride == stride[0]))
    else:
        regular = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows give NaN: wanted
        if regular and at is steps:
            k = max(1, min(steps.size, -(-window // int(stride[0]))))
            padded = np.concatenate((np.full(k - 1, np.nan), values))
            windows = np.lib.stride_tricks.sliding_window_view(padded, k)
            return np.asarray(np.nanmedian(windows, axis=1), dtype=np.float64)
        hi = np.searchsorted(steps, at, side="right")
        lo = np.searchsorted(steps, at - window, side="right")
        for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
            if b - a > MEDIAN_SAMPLE:
                out[i] = np.nanmedian(values[np.linspace(a, b - 1, MEDIAN_SAMPLE).astype(int)])
            elif b > a:
                out[i] = np.nanmedian(values[a:b])
    return out


def _log(values: FloatArray) -> FloatArray:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(values)
    out[~np.isfinite(out)] = np.nan
    return out


def _observations(
    steps: IntArray, active: NDArray[np.bool_], clear: NDArray[np.bool_], values: FloatArray,
    after: int,
) -> list[Observation]:
    keep = steps > after
    return [
        Observation(int(s), bool(a), bool(c), float(v))
        for s, a, c, v in zip(
            steps[keep].tolist(), active[keep].tolist(), clear[keep].tolist(),
            values[keep].tolist(), strict=True,
        )
    ]


# ---------------------------------------------------------------------------------------------
# Drift of a positive series (gradient norms, weight norms)
# ---------------------------------------------------------------------------------------------


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
    logs = _log(s.values)
    start = burn + ref_len + window
    eval_mask = (s.steps > max(ctx.after_step, start - 1)) & (s.steps <= ctx.last_step)
    at = s.steps[eval_mask]
    memory = dict(memory)
    if at.size == 0:
        return at, np.zeros(0), memory
    recent = rolling_median(s.steps, logs, window, at)
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
        reference = rolling_median(s.steps, logs, ref_len, at - window)
    return at, recent - reference, memory


def _drift_lookback(
    window_frac: float, ref_frac: float
) -> Callable[[EvalContext, RuleConfig, Mapping[str, Any]], int]:
    def lookback(ctx: EvalContext, cfg: RuleConfig, memory: Mapping[str, Any]) -> int:
        p = cfg.params
        burn = burn_in_step(ctx, p.get("burn_in_steps"))
        window = auto_steps(ctx, p.get("window_steps"), window_frac, 10, 100)
        ref_len = auto_steps(ctx, p.get("reference_steps"), ref_frac, 20, 1000)
        if p.get("reference", "trailing") == "burn_in" and "reference" not in memory:
            return burn
        return max(0, ctx.after_step - window - ref_len)

    return lookback


def _factor_text(value: float) -> str:
    if not math.isfinite(value):
        return "an unknown factor"
    return f"x{value:.2f}" if value >= 1 else f"x{value:.2f} (/{1 / value:.2f})"


# -- 1. gradient-norm drift --------------------------------------------------------------------

_GRAD_WINDOW, _GRAD_REF = 0.015, 0.10


def _grad_inputs(cfg: RuleConfig) -> list[list[str]]:
    keys = cfg.params.get("keys")
    return [list(keys) if keys else stat_keys(f"grad_{cfg.params['norm']}")]


def _eval_grad(
    series: Mapping[str, Series], ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    p = cfg.params
    key = pick_key(series, _grad_inputs(cfg)[0])
    if key is None:
        return RuleOutput([], memory)
    at, d, memory = _drift(series[key], ctx, p, memory, window_frac=_GRAD_WINDOW,
                           ref_frac=_GRAD_REF)
    up, down = math.log(p["rise_factor"]), math.log(p["fall_factor"])
    ok = np.isfinite(d)
    dd = np.where(ok, d, 0.0)
    active = ok & ((dd > up) | (dd < -down))
    clear = ok & (dd < up * p["resolve_ratio"]) & (dd > -down * p["resolve_ratio"])
    return RuleOutput(_observations(at, active, clear, np.exp(d), -1), memory, key)


def _describe_grad(value: float, cfg: RuleConfig, key: str | None) -> tuple[str, str]:
    direction = "risen" if value >= 1 else "fallen"
    ref = "its level after the burn-in" if cfg.params["reference"] == "burn_in" else (
        "its level over the preceding stretch")
    return (
        f"gradient norm has {direction} {_factor_text(value)}",
        f"The smoothed {key or 'gradient norm'} has {direction} by {_factor_text(value)} "
        f"relative to {ref}. A rising gradient norm means a rising effective learning rate "
        "(paper: 'Handling Gradient Norm Drift'); check weight decay and weight norms.",
    )


# -- 2. weight-norm drift ----------------------------------------------------------------------

_W_WINDOW, _W_REF = 0.03, 0.05
#: The rate check: the level (median over 1% of the run) now against the level 5% earlier.
_W_RATE_WINDOW, _W_RATE_SPAN = 0.01, 0.05


def _weight_inputs(cfg: RuleConfig) -> list[list[str]]:
    keys = cfg.params.get("keys")
    return [list(keys) if keys else stat_keys(f"{cfg.params['which']}_l2")]


def _weight_rate_lengths(ctx: EvalContext, p: Mapping[str, Any]) -> tuple[int, int]:
    """The rate check's span (``rate_steps``) and the window of the levels it compares."""
    return (auto_steps(ctx, p.get("rate_steps"), _W_RATE_SPAN, 20, 500),
            auto_steps(ctx, None, _W_RATE_WINDOW, 10, 100))


def _weight_rate(
    s: Series, ctx: EvalContext, p: Mapping[str, Any]
) -> tuple[IntArray, FloatArray]:
    """Log change of the level over the last ``rate_steps``, at each point from the end of the
    burn-in (the earlier level may lie inside it: too little weight decay shows from step 1)."""
    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    span, window = _weight_rate_lengths(ctx, p)
    logs = _log(s.values)
    mask = (s.steps >= max(ctx.after_step + 1, burn)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    if at.size == 0:
        return at, np.zeros(0)
    now = rolling_median(s.steps, logs, window, at)
    before = rolling_median(s.steps, logs, window, at - span)
    return at, now - before


def _eval_weight(
    series: Mapping[str, Series], ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    p = cfg.params
    key = pick_key(series, _weight_inputs(cfg)[0])
    if key is None:
        return RuleOutput([], memory)
    # Two questions: how far is the level from where it settled after the burn-in (a slow,
    # steady climb), and how fast is it moving now (a climb from the start, when no settled
    # level exists yet). Verdicts are made where the rate is known; the level check joins in
    # once its windows are complete.
    at, rate = _weight_rate(series[key], ctx, p)
    level_at, level, memory = _drift(series[key], ctx, p, memory, window_frac=_W_WINDOW,
                                     ref_frac=_W_REF)
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
    return RuleOutput(_observations(at, active, clear, value, -1), memory, key)


def _weight_lookback(ctx: EvalContext, cfg: RuleConfig, memory: Mapping[str, Any]) -> int:
    p = cfg.params
    span, window = _weight_rate_lengths(ctx, p)
    first = min(ctx.after_step + 1, burn_in_step(ctx, p.get("burn_in_steps")))
    return min(_drift_lookback(_W_WINDOW, _W_REF)(ctx, cfg, memory),
               max(0, first - span - window))


def _describe_weight(value: float, cfg: RuleConfig, key: str | None) -> tuple[str, str]:
    direction = "grown" if value >= 1 else "shrunk"
    return (
        f"weight norm of {cfg.params['which']} has {direction} {_factor_text(value)}",
        f"The norm of the {'averaged iterate x' if cfg.params['which'] == 'x' else 'point y'} "
        f"({key}) has {direction} by {_factor_text(value)}: beyond rise_factor (fall_factor) "
        "relative to its level after the burn-in, or beyond rate_factor within rate_steps. "
        "Growing weight norms point to too little weight decay; shrinking ones drive "
        "gradient norms (and the effective learning rate) up.",
    )


# -- 3. Polyak step spike and collapse -----------------------------------------------------------

_SPIKE_REF = 0.05


def _spike_inputs(cfg: RuleConfig) -> list[list[str]]:
    keys = cfg.params.get("keys")
    return [list(keys) if keys else stat_keys("eta")]


def _eval_spike(
    series: Mapping[str, Series], ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    p = cfg.params
    key = pick_key(series, _spike_inputs(cfg)[0])
    if key is None:
        return RuleOutput([], memory)
    s = series[key]
    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    ref_len = auto_steps(ctx, p.get("reference_steps"), _SPIKE_REF, 20, 500)
    window = max(1, int(p["window_steps"]))
    mask = (s.steps > max(ctx.after_step, burn + ref_len)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    # eta = 0 is a collapse, not a spike: a zero never counts as the recent level.
    positive = np.where(s.values > 0, s.values, np.nan)
    recent = rolling_median(s.steps, positive, window, at)
    reference = rolling_median(s.steps, positive, ref_len, at - window)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = recent / reference
    ok = np.isfinite(ratio)
    r = np.where(ok, ratio, 0.0)
    active = ok & (r > p["factor"])
    clear = ok & (r < p["resolve_factor"])
    return RuleOutput(_observations(at, active, clear, ratio, -1), memory, key)


def _spike_lookback(ctx: EvalContext, cfg: RuleConfig, memory: Mapping[str, Any]) -> int:
    ref_len = auto_steps(ctx, cfg.params.get("reference_steps"), _SPIKE_REF, 20, 500)
    return max(0, ctx.after_step - ref_len - int(cfg.params["window_steps"]))


def _describe_spike(value: float, cfg: RuleConfig, key: str | None) -> tuple[str, str]:
    return (
        f"Polyak step size jumped {_factor_text(value)} above its recent median",
        f"{key or 'eta'} is {_factor_text(value)} its median over the preceding stretch. A "
        "vanishing Polyak denominator (tiny gradients) blows the step up and can destabilise "
        "training; check the loss scaling and the gradient norms.",
    )


_COLLAPSE_WINDOW = 0.02


def _collapse_inputs(cfg: RuleConfig) -> list[list[str]]:
    keys = cfg.params.get("keys")
    return [list(keys) if keys else stat_keys("eta") + stat_keys("numerator")]


def _eval_collapse(
    series: Mapping[str, Series], ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    p = cfg.params
    key = pick_key(series, _collapse_inputs(cfg)[0])
    if key is None:
        return RuleOutput([], memory)
    s = series[key]
    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    window = auto_steps(ctx, p.get("window_steps"), _COLLAPSE_WINDOW, 10, 50)
    mask = (s.steps > max(ctx.after_step, burn)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    # eta <= 0 exactly when the clipped numerator F + I - f* is <= 0 (either key works).
    zero = np.where(np.isfinite(s.values), (s.values <= 0).astype(np.float64), np.nan)
    frac = rolling_mean(s.steps, zero, window, at)
    ok = np.isfinite(frac)
    f = np.where(ok, frac, 0.0)
    active = ok & (f >= p["min_fraction"])
    clear = ok & (f <= p["clear_fraction"])
    return RuleOutput(_observations(at, active, clear, frac, -1), memory, key)


def rolling_mean(
    steps: IntArray, values: FloatArray, window: int, at: IntArray
) -> FloatArray:
    """Mean of the finite values with step in ``(s - window, s]`` for each ``s`` in ``at``."""
    finite = np.isfinite(values)
    csum = np.concatenate(([0.0], np.cumsum(np.where(finite, values, 0.0))))
    ccount = np.concatenate(([0], np.cumsum(finite)))
    hi = np.searchsorted(steps, at, side="right")
    lo = np.searchsorted(steps, at - max(int(window), 1), side="right")
    n = ccount[hi] - ccount[lo]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (csum[hi] - csum[lo]) / n
    return np.where(n > 0, out, np.nan)


def _collapse_lookback(ctx: EvalContext, cfg: RuleConfig, memory: Mapping[str, Any]) -> int:
    window = auto_steps(ctx, cfg.params.get("window_steps"), _COLLAPSE_WINDOW, 10, 50)
    return max(0, ctx.after_step - window)


def _describe_collapse(value: float, cfg: RuleConfig, key: str | None) -> tuple[str, str]:
    pct = f"{100 * value:.0f}%" if math.isfinite(value) else "most"
    return (
        "Polyak step size collapsed to zero",
        f"The Polyak step was zero on {pct} of the recent steps ({key}): the numerator "
        "F + I - f* is <= 0, so the optimizer takes no steps. Check f_star (it must be below "
        "the reachable loss) and the inner-product term.",
    )


# -- 4. non-finite values ----------------------------------------------------------------------

_NON_FINITE_DEFAULT_KEYS = list(
    dict.fromkeys(
        ["loss", "eval_loss"]
        + [k for stat in ("loss", "grad_l1", "grad_l2", "x_l2", "y_l2", "z_l2", "eta")
           for k in stat_keys(stat)]
    )
)


def _nf_inputs(cfg: RuleConfig) -> list[list[str]]:
    keys = cfg.params.get("keys")
    return [[k] for k in (keys or _NON_FINITE_DEFAULT_KEYS)]


def _eval_non_finite(
    series: Mapping[str, Series], ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    present = [k for (k,) in _nf_inputs(cfg) if k in series]
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
        memory["key"] = first_bad.get(int(np.argmax(active)), memory.get("key"))
    return RuleOutput(
        _observations(steps, active, clear, bad.astype(np.float64), -1), memory,
        memory.get("key"),
    )


def _describe_non_finite(value: float, cfg: RuleConfig, key: str | None) -> tuple[str, str]:
    return (
        f"non-finite values in {key or 'the run'}",
        f"{key or 'A metric'} is NaN or infinite. The run has diverged (or a batch produced "
        "NaN): it will not recover on its own; restore the last good checkpoint.",
    )


# -- 5. off the forecast curve -----------------------------------------------------------------

_OFF_WINDOW = 0.02
_OFF_LAG = 0.05
_OFF_REF = 0.10
#: Densely logged training losses the rule also judges when the forecast's series is another
#: (typically a sparse eval loss), in order of preference.
DENSE_LOSS_KEYS = ("loss", "train_loss", "train/loss")
#: median(|X1 - X2|) of two independent normal draws, in units of their standard deviation.
_MEDIAN_ABS_DIFF = 0.6744897501960817 * math.sqrt(2.0)
#: Standard error of a median of n normal draws is about this times sigma / sqrt(n).
_MEDIAN_SE = math.sqrt(math.pi / 2.0)


def _off_inputs(cfg: RuleConfig) -> list[list[str]]:
    # The fitted series is named by the fit (EvalContext.fit_key); this is the dense one.
    keys = cfg.params.get("dense_keys")
    return [list(keys) if keys else list(DENSE_LOSS_KEYS)]


#: Fits kept in the off-curve rule's memory (enough to look back ``lag_steps`` at any refit
#: cadence the worker uses).
_MAX_FITS = 12


def _z(confidence: float) -> float:
    """Two-sided normal quantile: 2.58 for 0.99, 1.64 for 0.9."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


class _LaggedFits:
    """The fit each step is judged against: the newest one made from data at least ``lag``
    steps older (a refit that includes an excursion bends towards it and widens its interval,
    which would hide it)."""

    def __init__(self, fits: list[dict[str, Any]], lag: int) -> None:
        from curvecast.service.forecast import Fit

        self._from_dict = Fit.from_dict
        self.fits = fits
        self.uptos = np.array([float(f["fitted_upto_step"]) for f in fits])
        self.lag = lag
        self._cache: dict[int, Any] = {}

    def at(self, step: int) -> Any:
        """The :class:`~service.forecast.Fit` for ``step``, or ``None``."""
        j = int(np.searchsorted(self.uptos, step - self.lag, side="right")) - 1
        if j < 0:
            return None
        if j not in self._cache:
            self._cache[j] = self._from_dict(self.fits[j])
        fit = self._cache[j]
        return fit if fit.has_forecast else None


Verdicts = tuple[IntArray, NDArray[np.bool_], NDArray[np.bool_], FloatArray]


def _judge_fitted(
    s: Series, ctx: EvalContext, p: Mapping[str, Any], fits: _LaggedFits,
    memory: dict[str, Any],
) -> Verdicts:
    """The forecast's own series: its rolling median against the forecast interval."""
    from curvecast.service.forecast import Fit

    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    window = auto_steps(ctx, p.get("window_steps"), _OFF_WINDOW, 10, 100)
    mask = (s.steps > max(ctx.after_step, burn + window)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    smooth = rolling_median(s.steps, s.values, window, at)
    active = np.zeros(at.size, dtype=bool)
    clear = np.zeros(at.size, dtype=bool)
    excess = np.full(at.size, np.nan)
    stored = memory.get("pinned")
    pinned = Fit.from_dict(stored) if stored is not None else None
    for i, (t, y) in enumerate(zip(at.tolist(), smooth.tolist(), strict=True)):
        fit = pinned if pinned is not None else fits.at(t)
        if fit is None or not fit.has_forecast or not math.isfinite(y):
            continue
        hi = fit.predict(float(t), p["confidence"]).hi
        hi_clear = fit.predict(float(t), p["resolve_confidence"]).hi
        if not (math.isfinite(hi) and math.isfinite(hi_clear)):
            continue
        active[i], clear[i], excess[i] = y > hi, y <= hi_clear, y - hi
        # While the excursion lasts, keep judging against the fit from before it began.
        if active[i] and pinned is None:
            pinned = fit
        elif clear[i]:
            pinned = None
    _remember(memory, "pinned", pinned.to_dict() if pinned is not None else None)
    return at, active, clear, excess


def _judge_dense(
    s: Series, ctx: EvalContext, p: Mapping[str, Any], fits: _LaggedFits,
    memory: dict[str, Any],
) -> Verdicts:
    """A densely logged training loss, against the forecast of another series.

    The training loss sits at its own distance from the forecast's (eval) curve: the
    generalisation gap, and the difference between the averaged point the eval loss is measured
    at and the point the gradients are taken at. That gap moves slowly, so the training loss
    minus its gap over the preceding reference stretch must follow the forecast; it is judged
    against the forecast interval widened by the noise of its own rolling median. A corrupted
    data shard moves the training loss at once, while the eval loss (every few hundred steps,
    at the averaged point) follows a few evaluations later.
    """
    from curvecast.service.forecast import Fit

    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    window = auto_steps(ctx, p.get("window_steps"), _OFF_WINDOW, 10, 100)
    ref_len = auto_steps(ctx, p.get("reference_steps"), _OFF_REF, 20, 1000)
    mask = (s.steps > max(ctx.after_step, burn + window + ref_len)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    active = np.zeros(at.size, dtype=bool)
    clear = np.zeros(at.size, dtype=bool)
    excess = np.full(at.size, np.nan)
    if at.size == 0:
        return at, active, clear, excess
    smooth = rolling_median(s.steps, s.values, window, at)
    reference = rolling_median(s.steps, s.values, ref_len, at - window)
    # The per-point noise from successive differences (a level shift is one big difference,
    # which a median ignores), and the standard error of a median over the window.
    jumps = np.abs(np.diff(s.values))
    noise = rolling_median(s.steps[1:], jumps, ref_len, at - window) / _MEDIAN_ABS_DIFF
    counts = (np.searchsorted(s.steps, at, side="right")
              - np.searchsorted(s.steps, at - window, side="right"))
    sigma = _MEDIAN_SE * noise / np.sqrt(np.maximum(counts, 1))
    z, z_clear = _z(p["confidence"]), _z(p["resolve_confidence"])
    stored = memory.get("dense_pinned")
    # (fit, gap) judged against while an excursion lasts, parsed once.
    pinned = (Fit.from_dict(stored["fit"]), float(stored["gap"])) if stored else None
    for i, t in enumerate(at.tolist()):
        if pinned is not None:
            fit, gap = pinned
        else:
            fit = fits.at(t)
            if fit is None:
                continue
            # The gap over the reference stretch, measured against the forecast at its middle.
            gap = float(reference[i]) - fit.predict(float(t - window - ref_len / 2)).value
        y, sd = float(smooth[i]), float(sigma[i])
        pred = fit.predict(float(t), p["confidence"])
        pred_clear = fit.predict(float(t), p["resolve_confidence"])
        if not all(math.isfinite(v) for v in (y, sd, gap, pred.hi, pred_clear.hi)):
            continue
        hi = pred.value + gap + math.hypot(pred.hi - pred.value, z * sd)
        hi_clear = pred.value + gap + math.hypot(pred_clear.hi - pred_clear.value, z_clear * sd)
        active[i], clear[i], excess[i] = y > hi, y <= hi_clear, y - hi
        if active[i] and pinned is None:
            pinned = (fit, gap)
        elif clear[i]:
            pinned = None
    _remember(memory, "dense_pinned",
              {"fit": pinned[0].to_dict(), "gap": pinned[1]} if pinned is not None else None)
    return at, active, clear, excess


def _remember(memory: dict[str, Any], name: str, value: Any) -> None:
    if value is None:
        memory.pop(name, None)
    else:
        memory[name] = value


def _merge_verdicts(parts: list[Verdicts], memory: dict[str, Any]) -> Verdicts:
    """One verdict per step of the union of the parts' steps: each part's latest verdict at or
    before the step (carried over from the previous evaluation through ``memory``). Active if
    any part is; clear if every part with a verdict is."""
    steps = np.unique(np.concatenate([p[0] for p in parts])) if parts else np.zeros(0, np.int64)
    carried: list[list[Any] | None] = list(memory.get("last") or [])[: len(parts)]
    carried += [None] * (len(parts) - len(carried))
    active = np.zeros(steps.size, dtype=bool)
    clear = np.zeros(steps.size, dtype=bool)
    excess = np.full(steps.size, np.nan)
    cursors = [0] * len(parts)
    for i, t in enumerate(steps.tolist()):
        for k, (at, act, clr, exc) in enumerate(parts):
            while cursors[k] < at.size and at[cursors[k]] <= t:
                j = cursors[k]
                if math.isfinite(exc[j]):
                    carried[k] = [bool(act[j]), bool(clr[j]), float(exc[j])]
                cursors[k] += 1
        known = [c for c in carried if c is not None]
        if not known:
            continue
        active[i] = any(c[0] for c in known)
        clear[i] = all(c[1] for c in known)
        excess[i] = max(c[2] for c in known)
    memory["last"] = carried
    return steps, active, clear, excess


def _eval_off_curve(
    series: Mapping[str, Series], ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    p = cfg.params
    key = ctx.fit_key
    if key is None or key not in series:
        return RuleOutput([], memory)
    memory = dict(memory)
    # The memory keeps the recent fits, oldest first (see _LaggedFits).
    fits: list[dict[str, Any]] = list(memory.get("fits") or [])
    if ctx.fit and ctx.fit.get("fitted_upto_step") is not None:
        upto = float(ctx.fit["fitted_upto_step"])
        if not fits or upto > float(fits[-1]["fitted_upto_step"]):
            fits.append(dict(ctx.fit))
    lag = auto_steps(ctx, p.get("lag_steps"), _OFF_LAG, 20, 500)
    lagged = _LaggedFits(fits, lag)
    parts = [_judge_fitted(series[key], ctx, p, lagged, memory)]
    dense = pick_key(series, _off_inputs(cfg)[0])
    if dense is not None and dense != key:
        parts.append(_judge_dense(series[dense], ctx, p, lagged, memory))
    at, active, clear, excess = _merge_verdicts(parts, memory)
    # Keep the fits still needed: everything newer than last_step - lag, and the newest older.
    keep = int(np.searchsorted(lagged.uptos, ctx.last_step - lag, side="right")) - 1
    memory["fits"] = fits[max(0, keep):][-_MAX_FITS:]
    return RuleOutput(_observations(at, active, clear, excess, -1), memory, key)


def _off_lookback(ctx: EvalContext, cfg: RuleConfig, memory: Mapping[str, Any]) -> int:
    window = auto_steps(ctx, cfg.params.get("window_steps"), _OFF_WINDOW, 10, 100)
    ref_len = auto_steps(ctx, cfg.params.get("reference_steps"), _OFF_REF, 20, 1000)
    # The dense check reads the reference stretch before the window, and one point more for
    # the successive differences.
    return max(0, ctx.after_step - window - ref_len - 1)


def _describe_off_curve(value: float, cfg: RuleConfig, key: str | None) -> tuple[str, str]:
    by = f" by {value:.3g}" if math.isfinite(value) else ""
    return (
        f"{key or 'loss'} is above its forecast interval",
        f"The smoothed {key or 'loss'} has stayed above the upper end of the "
        f"{100 * cfg.params['confidence']:.0f}% forecast interval{by} for a sustained stretch: "
        "the run is no longer following its fitted curve a / sqrt(t + b) + c.",
    )


# -- 6. stalled ---------------------------------------------------------------------------------


def _eval_stalled(
    series: Mapping[str, Series], ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
) -> RuleOutput:
    after = cfg.params.get("after_s")
    limit = float(after) if after is not None else ctx.stalled_after_s
    silent = ctx.seconds_since_ingest
    if silent is None:
        return RuleOutput([], memory)
    running = ctx.status == "running"
    active = running and silent > limit
    # Stalls are judged at the run's last step: the step does not move while a run is silent,
    # so the observation is always "new" to the lifecycle (see lifecycle.advance).
    obs = Observation(step=max(ctx.last_step, 0), active=active, clear=not active, value=silent)
    return RuleOutput([obs], memory)


def _describe_stalled(value: float, cfg: RuleConfig, key: str | None) -> tuple[str, str]:
    minutes = value / 60 if math.isfinite(value) else math.nan
    return (
        f"run has sent nothing for {minutes:.0f} min",
        f"The run is marked running but the service has received nothing from it for "
        f"{minutes:.1f} minutes. The job may have hung, crashed without reporting, or lost "
        "its network; the client spools to disk and will catch up if it is only offline.",
    )


# ---------------------------------------------------------------------------------------------
# The rule table
# ---------------------------------------------------------------------------------------------


def _steps(frac: float, floor: int, fallback: int) -> Callable[[EvalContext], int]:
    def auto(ctx: EvalContext) -> int:
        return auto_steps(ctx, None, frac, floor, fallback, cap=None)

    return auto


def _zero(_ctx: EvalContext) -> int:
    return 0


def _after_prev(ctx: EvalContext, cfg: RuleConfig, memory: Mapping[str, Any]) -> int:
    return max(0, ctx.after_step)


def _no_inputs(cfg: RuleConfig) -> list[list[str]]:
    return []


_BURN_IN = ParamSpec(
    None, "auto_int",
    "last step of the burn-in; auto: max(2 * c_warmup (c_warmup defaults to 2 * warmup_steps), "
    "10% of total_steps)",
    lo=0,
)
_RESOLVE_RATIO = ParamSpec(
    0.5, "float", "clear when |log ratio| < this fraction of the threshold", lo=0.0, hi=1.0,
)
_KEYS = ParamSpec(None, "keys", "metric name(s) to read instead of the defaults (first present)")

RULES: dict[str, RuleSpec] = {
    spec.name: spec
    for spec in (
        RuleSpec(
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
                "keys": _KEYS,
                "reference": ParamSpec(
                    "trailing", "choice", "trailing: the stretch before the recent window; "
                    "burn_in: the stretch right after the burn-in", choices=("trailing", "burn_in"),
                ),
                "rise_factor": ParamSpec(1.8, "float", "fire above this ratio", lo=1.01, hi=1e6),
                "fall_factor": ParamSpec(
                    3.0, "float", "fire below 1/this ratio (falls are less harmful)", lo=1.01,
                    hi=1e6,
                ),
                "resolve_ratio": _RESOLVE_RATIO,
                "window_steps": ParamSpec(
                    None, "auto_int", "rolling-median window; auto: 1.5% of total_steps (>= 10)",
                    lo=1,
                ),
                "reference_steps": ParamSpec(
                    None, "auto_int", "reference stretch; auto: 10% of total_steps (>= 20)", lo=1,
                ),
                "burn_in_steps": _BURN_IN,
            },
            evaluate=_eval_grad,
            describe=_describe_grad,
            for_auto=_steps(0.01, 10, 100),
            resolve_auto=_steps(0.02, 20, 200),
            lookback=_drift_lookback(_GRAD_WINDOW, _GRAD_REF),
            inputs=_grad_inputs,
            for_doc="auto: 1% of total_steps (>= 10; 100 if unknown)",
        ),
        RuleSpec(
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
                "keys": _KEYS,
                "reference": ParamSpec(
                    "burn_in", "choice", "burn_in: the stretch right after the burn-in; "
                    "trailing: the stretch before the recent window",
                    choices=("burn_in", "trailing"),
                ),
                "rise_factor": ParamSpec(3.0, "float", "fire above this ratio to the level "
                                         "after the burn-in", lo=1.01, hi=1e6),
                "fall_factor": ParamSpec(4.0, "float", "fire below 1/this ratio to the level "
                                         "after the burn-in", lo=1.01, hi=1e6),
                "rate_factor": ParamSpec(
                    2.2, "float", "fire when the level moves beyond this ratio (up or down) "
                    "within rate_steps", lo=1.01, hi=1e6,
                ),
                "rate_steps": ParamSpec(
                    None, "auto_int", "span of the rate check; auto: 5% of total_steps (>= 20)",
                    lo=1,
                ),
                "resolve_ratio": _RESOLVE_RATIO,
                "window_steps": ParamSpec(
                    None, "auto_int", "rolling-median window; auto: 3% of total_steps (>= 10)",
                    lo=1,
                ),
                "reference_steps": ParamSpec(
                    None, "auto_int", "reference stretch; auto: 5% of total_steps (>= 20)", lo=1,
                ),
                "burn_in_steps": _BURN_IN,
            },
            evaluate=_eval_weight,
            describe=_describe_weight,
            for_auto=_steps(0.01, 10, 100),
            resolve_auto=_steps(0.02, 20, 200),
            lookback=_weight_lookback,
            inputs=_weight_inputs,
            for_doc="auto: 1% of total_steps (>= 10; 100 if unknown)",
        ),
        RuleSpec(
            name="polyak_spike",
            title="Polyak step spike",
            description=(
                "The Polyak step eta (median over window_steps) is more than factor times its "
                "median over the preceding reference stretch."
            ),
            severity="warning",
            params={
                "keys": _KEYS,
                "factor": ParamSpec(5.0, "float", "fire above this ratio", lo=1.01, hi=1e9),
                "resolve_factor": ParamSpec(2.0, "float", "clear below this ratio", lo=1.0,
                                            hi=1e9),
                "window_steps": ParamSpec(3, "int", "recent window (steps)", lo=1),
                "reference_steps": ParamSpec(
                    None, "auto_int", "reference stretch; auto: 5% of total_steps (>= 20)", lo=1,
                ),
                "burn_in_steps": _BURN_IN,
            },
            evaluate=_eval_spike,
            describe=_describe_spike,
            for_auto=_zero,
            resolve_auto=_steps(0.01, 10, 100),
            lookback=_spike_lookback,
            inputs=_spike_inputs,
            for_steps=0,
            for_doc="0: a spike does its damage in one step",
        ),
        RuleSpec(
            name="polyak_collapse",
            title="Polyak step collapse",
            description=(
                "eta = 0 (the numerator F + I - f* <= 0) on at least min_fraction of the steps "
                "of a rolling window: the optimizer has stopped moving."
            ),
            severity="critical",
            params={
                "keys": _KEYS,
                "min_fraction": ParamSpec(0.8, "float", "fire at this zero fraction", lo=0.01,
                                          hi=1.0),
                "clear_fraction": ParamSpec(0.2, "float", "clear at or below this fraction",
                                            lo=0.0, hi=0.99),
                "window_steps": ParamSpec(
                    None, "auto_int", "rolling window; auto: 2% of total_steps (>= 10)", lo=1,
                ),
                "burn_in_steps": _BURN_IN,
            },
            evaluate=_eval_collapse,
            describe=_describe_collapse,
            for_auto=_steps(0.005, 5, 50),
            resolve_auto=_steps(0.01, 10, 100),
            lookback=_collapse_lookback,
            inputs=_collapse_inputs,
            for_doc="auto: 0.5% of total_steps (>= 5; 50 if unknown)",
        ),
        RuleSpec(
            name="non_finite",
            title="Non-finite loss or norms",
            description=(
                "Any of the watched metrics (loss, eval loss, the optimizer's loss, gradient and "
                "weight norms, eta) is NaN or infinite. Judged from step 0, fires at once."
            ),
            severity="critical",
            params={"keys": ParamSpec(None, "keys", "metrics to watch instead of the defaults")},
            evaluate=_eval_non_finite,
            describe=_describe_non_finite,
            for_auto=_zero,
            resolve_auto=_steps(0.02, 20, 200),
            lookback=_after_prev,
            inputs=_nf_inputs,
            for_steps=0,
            for_doc="0: immediate",
        ),
        RuleSpec(
            name="off_curve",
            title="Loss off its forecast curve",
            description=(
                "The rolling median of the forecast's series (eval loss if logged, else loss) "
                "is above the upper end of the forecast interval at `confidence`; clears below "
                "the upper end at `resolve_confidence`. Each point is judged against a fit made "
                "from data at least lag_steps older, and during an excursion against the fit "
                "from before it began. When that series is not the densely logged training "
                "loss, the training loss is judged too: its rolling median minus its gap to the "
                "forecast over the preceding reference stretch, against the interval widened by "
                "its own noise."
            ),
            severity="warning",
            params={
                "confidence": ParamSpec(0.99, "float", "interval that fires", lo=0.5, hi=0.9999),
                "resolve_confidence": ParamSpec(0.9, "float", "interval that clears", lo=0.5,
                                                hi=0.9999),
                "window_steps": ParamSpec(
                    None, "auto_int", "rolling-median window; auto: 2% of total_steps (>= 10)",
                    lo=1,
                ),
                "lag_steps": ParamSpec(
                    None, "auto_int", "judge each point against a forecast made from data at "
                    "least this many steps older; auto: 5% of total_steps (>= 20)", lo=0,
                ),
                "dense_keys": ParamSpec(
                    None, "keys", "densely logged training loss judged alongside a sparse "
                    "forecast series (through its gap to the forecast); default: loss, "
                    "train_loss, train/loss",
                ),
                "reference_steps": ParamSpec(
                    None, "auto_int", "stretch over which the training loss's gap to the "
                    "forecast is measured; auto: 10% of total_steps (>= 20)", lo=1,
                ),
                "burn_in_steps": _BURN_IN,
            },
            evaluate=_eval_off_curve,
            describe=_describe_off_curve,
            for_auto=_steps(0.02, 20, 200),
            resolve_auto=_steps(0.02, 20, 200),
            lookback=_off_lookback,
            inputs=_off_inputs,
            for_doc="auto: 2% of total_steps (>= 20; 200 if unknown)",
        ),
        RuleSpec(
            name="stalled",
            title="Run stalled",
            description=(
                "The run is `running` but has sent nothing for after_s seconds (default: the "
                "service setting CURVECAST_STALLED_AFTER_S)."
            ),
            severity="warning",
            params={
                "after_s": ParamSpec(None, "auto_int", "seconds of silence; auto: the service "
                                     "setting stalled_after_s", lo=1),
            },
            evaluate=_eval_stalled,
            describe=_describe_stalled,
            for_auto=_zero,
            resolve_auto=_zero,
            lookback=_after_prev,
            inputs=_no_inputs,
            for_steps=0,
            resolve_for_steps=0,
            for_doc="0: the silence itself is the duration",
        ),
    )
}


def evaluate_rule(
    rule: str,
    series: Mapping[str, Series],
    ctx: EvalContext,
    cfg: RuleConfig,
    memory: Mapping[str, Any] | None = None,
) -> RuleOutput:
    """Evaluate one rule on the steps after ``ctx.after_step``. Pure."""
    return RULES[rule].evaluate(series, ctx, cfg, dict(memory or {}))


def evaluate_run(
    series: Mapping[str, Series],
    ctx: EvalContext,
    configs: Mapping[str, RuleConfig],
    memories: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, RuleOutput]:
    """Evaluate every enabled rule of ``configs``. Pure."""
    memories = memories or {}
    return {
        name: evaluate_rule(name, series, ctx, cfg, memories.get(name))
        for name, cfg in configs.items()
        if cfg.enabled
    }


def durations(rule: str, ctx: EvalContext, cfg: RuleConfig) -> tuple[int, int]:
    """The effective ``for`` and resolve durations (in steps) of a rule for a run."""
    spec = RULES[rule]
    for_steps = cfg.for_steps if cfg.for_steps is not None else spec.for_auto(ctx)
    resolve = (
        cfg.resolve_for_steps if cfg.resolve_for_steps is not None else spec.resolve_auto(ctx)
    )
    return int(for_steps), int(resolve)
