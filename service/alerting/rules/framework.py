"""What every rule is made of: its inputs (:class:`Series`, :class:`EvalContext`), its
definition (:class:`RuleSpec` with :class:`ParamSpec` thresholds), a project's configuration of
it (:class:`RuleConfig`) and its verdicts (:class:`RuleOutput`). Also the helpers every family
of rules shares: the burn-in, run-length-scaled durations, key lookup. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from curvecast.contract import KEY_PATTERN, RunConfig, is_valid_key
from curvecast.service.alerting.lifecycle import Observation, Observations
from curvecast.service.forecast import Fit

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]
Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")

#: Longest automatic window: beyond this a median is as good as it gets, and every round of the
#: worker reads the window's points again.
MAX_AUTO_WINDOW = 10_000


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
        config: the run's stored config (read through :attr:`run_config`).
        last_step: the run's last step (observations are made up to it).
        after_step: observations are made only at steps after this one (the previous
            evaluation's ``last_step``; -1 for the first).
        status: the run's status (``running``, ``finished``, ...).
        seconds_since_ingest: seconds since the run last sent anything, if known.
        stalled_after_s: the service-wide default of the ``stalled`` rule's ``after_s``.
        fit: the latest stored forecast fit (parsed once, by the store) and ``fit_key`` the
            series it was fitted on, for the off-curve rule.
        acknowledged: the rules whose open alert of this run someone acknowledged (a
            ``non_finite`` alert resolves only once acknowledged).
        project_best: the lowest final loss of the project's other finished runs on the
            fitted series, and that run's name, for the ``not_competitive`` rule (the worker
            reads it only while that rule is enabled and needs it).
        seconds_per_step: the run's wall seconds per step so far, if known (what stopping
            it would save, in time).
    """

    config: Mapping[str, Any]
    last_step: int
    after_step: int = -1
    status: str = "running"
    seconds_since_ingest: float | None = None
    stalled_after_s: float = 900.0
    fit: Fit | None = None
    fit_key: str | None = None
    acknowledged: frozenset[str] = frozenset()
    project_best: tuple[float, str] | None = None
    seconds_per_step: float | None = None

    @cached_property
    def run_config(self) -> RunConfig:
        """The config, typed (read once per round: every rule asks)."""
        return RunConfig.read(self.config)

    @property
    def total_steps(self) -> int | None:
        """The planned length of the run, if the config says."""
        return self.run_config.total_steps


def burn_in_step(ctx: EvalContext, override: int | None = None) -> int:
    """The last step of the burn-in: ``override`` (a rule's ``burn_in_steps``) if given, else
    the contract's alert burn-in (:meth:`curvecast.contract.RunConfig.alert_burn_in`)."""
    if override is not None:
        return int(override)
    return ctx.run_config.alert_burn_in(ctx.total_steps)


def auto_steps(
    ctx: EvalContext,
    value: int | None,
    fraction: float,
    floor: int,
    fallback: int,
    cap: int | None = MAX_AUTO_WINDOW,
) -> int:
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
    """The first candidate the run has points for."""
    return next((k for k in candidates if k in series and len(series[k]) > 0), None)


def first_present(names: Collection[str], candidates: Sequence[str]) -> str | None:
    """The first candidate among ``names`` (a run's metric keys)."""
    return next((k for k in candidates if k in names), None)


def observations(
    steps: IntArray, active: BoolArray, clear: BoolArray, values: FloatArray
) -> Observations:
    """Per-step verdicts as the lifecycle takes them (kept as arrays: see
    :class:`~curvecast.service.alerting.lifecycle.Observations`)."""
    return Observations(np.asarray(steps, dtype=np.int64), np.asarray(active, dtype=np.bool_),
                        np.asarray(clear, dtype=np.bool_), np.asarray(values, dtype=np.float64))


def run_settings(ctx: EvalContext) -> str:
    """The run's weight decay and warmups as its config states them (for alert advice)."""
    rc = ctx.run_config

    def show(value: float | None) -> str:
        return "not in the run config" if value is None else f"{value:g}"

    return (
        f"This run: weight_decay (AdamC lambda) {show(rc.weight_decay)}, warmup_steps "
        f"{show(rc.warmup_steps)}, c_warmup {show(rc.c_warmup)}."
    )


def factor_text(value: float) -> str:
    """A ratio for people: ``x2.50``, or ``x0.40 (/2.50)`` for a fall."""
    if not math.isfinite(value):
        return "an unknown factor"
    return f"x{value:.2f}" if value >= 1 else f"x{value:.2f} (/{1 / value:.2f})"


# ---------------------------------------------------------------------------------------------
# Rule definitions and per-project configuration
# ---------------------------------------------------------------------------------------------

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
        below: the parameter this one must stay below (a clearing threshold is stricter than
            the firing one it pairs with); checked on every override.
        or_equal: with ``below``, equal is allowed too.
    """

    default: Any
    kind: ParamKind
    doc: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    below: str | None = None
    or_equal: bool = False

    def check(self, name: str, value: Any) -> Any:
        """Validate one value; returns it normalised. Raises ValueError naming ``name``."""
        if self.kind == "keys":
            return _check_keys(name, value)
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


def _check_keys(name: str, value: Any) -> list[str] | None:
    """A ``keys`` parameter: one metric name or a non-empty list of them (``None``: default)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(is_valid_key(v) for v in value):
        raise ValueError(
            f"{name} must be a metric name ({KEY_PATTERN}) or a non-empty list of them"
        )
    return list(value)


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

    observations: Sequence[Observation]
    memory: dict[str, Any]
    #: The metric the rule read (for labels and messages), if any.
    key: str | None = None


Evaluator = Callable[[Mapping[str, Series], EvalContext, RuleConfig, dict[str, Any]], RuleOutput]
#: An evaluator of one series: ``(series, its key, context, cfg, memory) -> output``.
SeriesEvaluator = Callable[[Series, str, EvalContext, RuleConfig, dict[str, Any]], RuleOutput]
#: ``(value, cfg, key, context) -> (summary, description)`` of an alert.
Describer = Callable[[float, RuleConfig, str | None, EvalContext], tuple[str, str]]
Lookback = Callable[[EvalContext, RuleConfig, Mapping[str, Any]], int]


@dataclass(frozen=True)
class RuleSpec:
    """A rule: name, what it means, defaults, and its evaluator.

    Attributes:
        name: identifier used in the API and in alert labels.
        title: one line for people.
        description: what the rule checks and why (shown by ``GET .../rules``).
        severity: default severity.
        params: the thresholds.
        evaluate: the pure evaluator.
        describe: ``(value, cfg, key, context) -> (summary, description)`` for an alert
            (the context gives the run's config: its λ and warmups, for advice).
        for_auto: ``(context) -> steps`` for ``for_steps=None``.
        resolve_auto: ``(context) -> steps`` for ``resolve_for_steps=None``.
        lookback: ``(context, cfg, memory) -> first step the evaluator needs``.
        inputs: ``(cfg) -> candidate key lists`` the evaluator reads.
        for_steps: default ``for`` (``None``: auto, see :attr:`for_doc`).
        resolve_for_steps: default resolve duration (``None``: auto).
        for_reason: why an automatic ``for`` of 0 steps (``for_auto=immediately``) is right.
        enabled: whether a project that overrides nothing evaluates it (an opt-in rule: no).
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
    lookback: Lookback
    inputs: Callable[[RuleConfig], list[list[str]]]
    for_steps: int | None = None
    resolve_for_steps: int | None = None
    for_reason: str = ""
    enabled: bool = True

    @property
    def for_doc(self) -> str:
        """How the automatic ``for`` is chosen, for people (from ``for_auto`` itself)."""
        if isinstance(self.for_auto, RunFraction):
            return self.for_auto.describe()
        return f"0: {self.for_reason or 'immediate'}"

    def default_config(self) -> RuleConfig:
        """The rule's configuration when a project overrides nothing."""
        return RuleConfig(
            enabled=self.enabled,
            severity=self.severity,
            for_steps=self.for_steps,
            resolve_for_steps=self.resolve_for_steps,
            params={k: p.default for k, p in self.params.items()},
        )


@dataclass(frozen=True)
class RunFraction:
    """An automatic duration: ``frac`` of ``total_steps`` (at least ``floor``; ``fallback``
    when the run's length is unknown), which also says so in words (:meth:`describe`)."""

    frac: float
    floor: int
    fallback: int

    def __call__(self, ctx: EvalContext) -> int:
        return auto_steps(ctx, None, self.frac, self.floor, self.fallback, cap=None)

    def describe(self) -> str:
        """``auto: 2% of total_steps (>= 20; 200 if unknown)``."""
        return (f"auto: {self.frac * 100:g}% of total_steps (>= {self.floor}; "
                f"{self.fallback} if unknown)")


def run_fraction(frac: float, floor: int, fallback: int) -> RunFraction:
    """An automatic duration: ``frac`` of ``total_steps`` (see :class:`RunFraction`)."""
    return RunFraction(frac, floor, fallback)


def immediately(_ctx: EvalContext) -> int:
    """An automatic duration of 0 steps."""
    return 0


def since_last_round(ctx: EvalContext, _cfg: RuleConfig, _memory: Mapping[str, Any]) -> int:
    """A lookback for rules that judge each new point on its own."""
    return max(0, ctx.after_step)


def given_keys_or(cfg: RuleConfig, defaults: Sequence[str]) -> list[list[str]]:
    """A rule's one input: its ``keys`` parameter if set, else ``defaults``."""
    keys = cfg.params.get("keys")
    return [list(keys) if keys else list(defaults)]


def on_first_input(
    inputs: Callable[[RuleConfig], list[list[str]]], judge: SeriesEvaluator
) -> Evaluator:
    """The evaluator of a rule that reads one series: ``judge`` the first key of its input
    (``inputs(cfg)[0]``) the run has points for; no verdicts while it has none."""

    def evaluate(
        series: Mapping[str, Series], ctx: EvalContext, cfg: RuleConfig, memory: dict[str, Any]
    ) -> RuleOutput:
        key = pick_key(series, inputs(cfg)[0])
        if key is None:
            return RuleOutput([], memory)
        return judge(series[key], key, ctx, cfg, memory)

    return evaluate


def auto_int(doc: str, lo: float = 1) -> ParamSpec:
    """A whole-number threshold whose default (``None``) is computed from the run (``doc``
    says how)."""
    return ParamSpec(None, "auto_int", doc, lo=lo)


# Parameters several rules share.
BURN_IN = auto_int(
    "last step of the burn-in; auto: max(2 * c_warmup (c_warmup defaults to 2 * warmup_steps), "
    "10% of total_steps)",
    lo=0,
)
RESOLVE_RATIO = ParamSpec(
    0.5, "float", "clear when |log ratio| < this fraction of the threshold", lo=0.0, hi=1.0
)
KEYS = ParamSpec(None, "keys", "metric name(s) to read instead of the defaults (first present)")
