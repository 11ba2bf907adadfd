"""The facts every part of curvecast agrees on, in one place.

The client hook, the service's API, the forecast worker, the alert rules, the pages, the offline
CLI and the benches all ask this module; none of them defines these facts again. Standard
library only, so the training-machine client imports it without the server's dependencies.

What lives here:

* **Wire limits**: the metric-key and project-name patterns, the step range, and how a
  non-finite value travels in JSON.
* **Telemetry names**: the ONE prefix the optimizer's statistics are logged under
  (:data:`TELEMETRY_PREFIX`, ``opt/``) and the names of those statistics. Data stored before the
  prefix was fixed may carry ``sfplus/`` or no prefix; readers find it through
  :func:`telemetry_keys`, which lists the current name first and the legacy ones after it.
* **Which series is "the loss"** a forecast fits (:func:`loss_key`): the caller's choice
  (``?key=`` / ``--key``), else the run config's ``fit_key``, else the first evaluation-loss key
  present, else the training loss ``loss``.
* **Forecast statuses** (:class:`ForecastStatus`): what a forecast answer's ``status`` says,
  one enum for the fit, the service's answers, their schema, the pages and the benches.
* **Typed reading of a run's config** (:class:`RunConfig`): the planned horizon, the step where
  averaging starts (the forecast's burn-in), the alert rules' burn-in, AdamC's lambda and the
  warmups. A stored config is a plain dict; every consumer reads it through this class.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

__all__ = [
    "ALERT_BURN_IN_C_WARMUPS",
    "ALERT_BURN_IN_FRACTION",
    "CONSTANT_SCHEDULES",
    "EVAL_LOSS_KEYS",
    "BASE64_COLUMNS",
    "ENDED_RUN_STATUSES",
    "FINAL_RUN_STATUSES",
    "FIT_STATUSES",
    "INGEST_ENCODINGS_HEADER",
    "REPLAY_HEADER",
    "KEY_CHARS",
    "LR_STAT",
    "KEY_MAX_LENGTH",
    "KEY_PATTERN",
    "LEGACY_TELEMETRY_PREFIXES",
    "LEVEL_EXTENDING_STATUSES",
    "LOST_RUN_STATUS",
    "LOSS_KEYS",
    "MIN_EVAL_POINTS",
    "MAX_STEP",
    "NON_FINITE_STRINGS",
    "NORM_STATS",
    "OPTIMIZER_STATS",
    "PROJECT_CHARS",
    "PROJECT_MAX_LENGTH",
    "PROJECT_PATTERN",
    "RUN_STATUSES",
    "TELEMETRY_PREFIX",
    "TELEMETRY_PREFIXES",
    "TRAIN_LOSS_KEY",
    "TRAIN_LOSS_KEYS",
    "ForecastStatus",
    "RunConfig",
    "is_valid_key",
    "key_for_name",
    "project_for_name",
    "fit_candidates",
    "fit_key",
    "fit_ready",
    "loss_key",
    "lr_key",
    "telemetry_key",
    "telemetry_keys",
    "telemetry_prefix",
]

# --- wire limits ---------------------------------------------------------------------------------
#: The characters a metric name may use (a regex character class's body) and its longest length.
KEY_CHARS = "A-Za-z0-9_./-"
KEY_MAX_LENGTH = 200
#: A metric name: 1-200 characters from ``A-Z a-z 0-9 _ . / -`` (``loss``, ``eval/loss``).
KEY_PATTERN = rf"^[{KEY_CHARS}]{{1,{KEY_MAX_LENGTH}}}$"
#: The characters a project name may use (a metric name's without ``/``) and its longest length.
PROJECT_CHARS = "A-Za-z0-9_.-"
PROJECT_MAX_LENGTH = 100
#: A project name: like a metric name without ``/``, at most 100 characters.
PROJECT_PATTERN = rf"^[{PROJECT_CHARS}]{{1,{PROJECT_MAX_LENGTH}}}$"
#: Steps are integers in ``[0, MAX_STEP]`` (fits a signed 64-bit column with room to spare).
MAX_STEP = 2**62
#: How NaN and infinities travel in JSON: as these strings (what Python's ``json`` would emit
#: bare, and what strict JSON parsers refuse). ``null`` is accepted as NaN on the way in.
NON_FINITE_STRINGS = ("NaN", "Infinity", "-Infinity")

#: Columns of a metrics batch may also travel as base64 strings instead of JSON arrays: the
#: standard base64 (RFC 4648, with padding) of the column's little-endian bytes, int64 for
#: ``steps`` and float64 for ``wall_time`` (NaN: no wall time for that row) and each ``values``
#: column (every entry is a point, NaN included; a column with missing entries travels as an
#: array with ``null``). Formatting a float as decimal text was most of the client hook's
#: background CPU; this is the name of that encoding.
BASE64_COLUMNS = "base64"
#: The response header with which a service that reads base64 columns answers the run's
#: ``PUT``: its value lists the encodings it reads (comma-separated). A client sends plain JSON
#: arrays to a service that does not say so (an older version).
INGEST_ENCODINGS_HEADER = "Curvecast-Ingest-Encodings"
#: The request header with which a client marks a metrics batch it sends from its spool (it
#: could not be sent when logged; or ``curvecast sync`` uploads it): the service counts them.
REPLAY_HEADER = "Curvecast-Replay"

#: The states a run ends in (``Monitor.finish(status)``; the service records when it ended).
FINAL_RUN_STATUSES = ("finished", "failed", "crashed")
#: The status the service gives a ``running`` run whose client it has not heard from (no
#: points, no request, no heartbeat) for its ``client_gone_after_s``: presumed dead (a process
#: killed by SIGKILL or the OOM killer, a lost node) but not known to have ended, so the run
#: is ``running`` again as soon as its client speaks. Never shown, compared or forecast as live.
LOST_RUN_STATUS = "lost"
#: The statuses of runs that are not training, as far as the service knows: the final ones and
#: ``lost``. Pages, comparisons and ETAs treat such a run as stopped at its last step.
ENDED_RUN_STATUSES = (*FINAL_RUN_STATUSES, LOST_RUN_STATUS)
#: The statuses of runs that stopped without finishing: they will not train to their planned
#: end, so no page or decision shows or compares a forecast of where they would have got.
STOPPED_RUN_STATUSES = ("failed", "crashed", LOST_RUN_STATUS)
#: Every status a run can have.
RUN_STATUSES = ("running", *ENDED_RUN_STATUSES)

_KEY_RE = re.compile(KEY_PATTERN)


def is_valid_key(key: object) -> bool:
    """Whether ``key`` is a metric name the service accepts."""
    return isinstance(key, str) and _KEY_RE.match(key) is not None


_NOT_KEY_CHARS = re.compile(f"[^{KEY_CHARS}]+")


def key_for_name(name: str) -> str | None:
    """The metric key a name from another tracker is stored under (a TensorBoard tag, an MLflow
    metric, a W&B history column; ``curvecast.SummaryWriter``'s tags).

    The rule: a name that is already a valid key is kept as it is (``Loss/train``,
    ``eval/loss``); otherwise every run of characters outside ``A-Z a-z 0-9 _ . / -`` becomes one
    ``_``, underscores so made at either end are dropped (``train loss`` -> ``train_loss``,
    ``acc@1`` -> ``acc_1``, ``loss (val)`` -> ``loss_val``), and the result is cut to
    :data:`KEY_MAX_LENGTH` characters. None when nothing is left (a name of symbols only).
    """
    if _KEY_RE.match(name):
        return name
    key = _NOT_KEY_CHARS.sub("_", name)
    start = 1 if key[:1] == "_" and name[:1] != "_" else 0
    end = len(key) - 1 if key[-1:] == "_" and name[-1:] != "_" else len(key)
    key = key[start:end][:KEY_MAX_LENGTH]
    return key if _KEY_RE.match(key) else None


_NOT_PROJECT_CHARS = re.compile(f"[^{PROJECT_CHARS}]+")


def project_for_name(name: str) -> str | None:
    """A project name from another tool's (an MLflow experiment's, an Optuna study's), by the
    same rule as :func:`key_for_name` (``/`` is not allowed in a project); None when nothing is
    left."""
    project = _NOT_PROJECT_CHARS.sub("_", name).strip("_")[:PROJECT_MAX_LENGTH]
    return project or None


# --- optimizer telemetry -------------------------------------------------------------------------
#: The prefix of every optimizer statistic the hook logs (``opt/eta``, ``opt/grad_l1``, ...).
TELEMETRY_PREFIX = "opt/"
#: Prefixes of data stored before the prefix was fixed, still read (never written).
LEGACY_TELEMETRY_PREFIXES = ("sfplus/", "")
#: Every prefix a reader tries, the current one first.
TELEMETRY_PREFIXES = (TELEMETRY_PREFIX, *LEGACY_TELEMETRY_PREFIXES)
#: ScheduleFree+'s per-step statistics (``ScheduleFreePlus.stats()``, in its order), without
#: prefix; free to read every step (see the optimizer's ``stats()`` for what each one means).
OPTIMIZER_STATS = (
    "step",
    "loss",
    "inner",
    "numerator",
    "grad_l1",
    "denom_ema",
    "eta",
    "alpha",
    "gamma_max",
    "c",
    "sf_beta",
    "warmup",
)
#: The weight and gradient norms, computed every ``norm_every`` steps (they cost a pass).
NORM_STATS = ("x_l2", "y_l2", "z_l2", "grad_l2")


#: The learning rate ``Monitor.watch()`` logs for any optimizer that is not ScheduleFree+
#: (``opt/lr``; with several parameter groups ``opt/lr/0``, ``opt/lr/1``, ...). The forecast
#: reads it: a decaying rate makes a fit ``off_model``.
LR_STAT = "lr"


def lr_key(present: Collection[str]) -> str | None:
    """The logged learning rate among the ``present`` keys: ``opt/lr`` (or a legacy spelling,
    or a plain ``lr`` the script logs itself), else the first parameter group's; ``None``."""
    names = telemetry_keys(LR_STAT)
    for key in (*names, *(name + "/0" for name in names)):
        if key in present:
            return key
    return None


def telemetry_key(stat: str) -> str:
    """The name the hook logs an optimizer statistic under (``opt/<stat>``)."""
    return TELEMETRY_PREFIX + stat


def telemetry_keys(stat: str) -> tuple[str, ...]:
    """Names one statistic may be stored under, in order of preference (current name first)."""
    return tuple(prefix + stat for prefix in TELEMETRY_PREFIXES)


def telemetry_prefix(keys_present: Iterable[str]) -> str:
    """The prefix a run's telemetry is stored under: the first of :data:`TELEMETRY_PREFIXES`
    that names any known statistic, else the current prefix."""
    present = set(keys_present)
    names = OPTIMIZER_STATS + NORM_STATS
    for prefix in TELEMETRY_PREFIXES:
        if prefix and any(prefix + name in present for name in names):
            return prefix
    return TELEMETRY_PREFIX


# --- the loss series a forecast fits -------------------------------------------------------------
#: Evaluation-loss names, in order of preference. Evaluation loss is measured at x (the averaged
#: iterate), the point whose loss the paper's model describes.
EVAL_LOSS_KEYS = ("eval_loss", "val_loss", "eval/loss", "val/loss", "validation/loss")
#: The per-step training loss the hook logs (measured at y).
TRAIN_LOSS_KEY = "loss"
#: Names a densely logged training loss may carry.
TRAIN_LOSS_KEYS = (TRAIN_LOSS_KEY, "train_loss", "train/loss")
#: ``lr_schedule`` values that do not decay (a warmup is fine: the burn-in drops it).
CONSTANT_SCHEDULES = ("constant", "constant_with_warmup", "schedule_free", "schedule-free",
                      "none")
#: What a forecast fits when nobody chose: the first evaluation loss present, else ``loss``.
LOSS_KEYS = (*EVAL_LOSS_KEYS, TRAIN_LOSS_KEY)


# --- forecast statuses ---------------------------------------------------------------------------
class ForecastStatus(StrEnum):
    """The status of a forecast: what its fit made of the data (docs/forecast.md, "Statuses").

    ``ok``, ``too_early``, ``no_asymptote``, ``off_model`` and ``flat`` carry a forecast;
    ``insufficient_data``, ``diverged`` and ``no_convergence`` carry none (their numbers are
    null); ``pending`` is no fit status: the run has no fit yet. A string enum: in JSON, in the
    database and in text each status is its value.
    """

    OK = "ok"
    TOO_EARLY = "too_early"
    NO_ASYMPTOTE = "no_asymptote"
    OFF_MODEL = "off_model"
    FLAT = "flat"
    INSUFFICIENT_DATA = "insufficient_data"
    DIVERGED = "diverged"
    NO_CONVERGENCE = "no_convergence"
    PENDING = "pending"


#: Every status a fit can have: all but ``pending`` (which says there is no fit).
FIT_STATUSES = tuple(s for s in ForecastStatus if s is not ForecastStatus.PENDING)
#: Forecast statuses whose answers beyond the data extend the current loss (at the pace runs
#: like it kept) instead of evaluating the fitted curve, which is then not the forecast
#: (docs/forecast.md, "Statuses"): the service answers so, the pages draw the answers.
LEVEL_EXTENDING_STATUSES = (ForecastStatus.TOO_EARLY, ForecastStatus.NO_ASYMPTOTE)


def loss_key(
    keys_present: Collection[str],
    config: RunConfig | Mapping[str, Any] | None = None,
    override: str | None = None,
) -> str | None:
    """The series that is "the loss" of a run, for forecasts and everything that shows them.

    Args:
        keys_present: metric names the run has data for.
        config: the run's config; its ``fit_key``, when set, is the run owner's choice.
        override: the caller's choice (``?key=``, ``--key``); wins over everything.

    Returns:
        The chosen name, or None when the run has none of them. An explicit choice
        (``override`` or ``fit_key``) is returned even before its first point arrives, so a
        forecast says "no data for <key>" instead of quietly fitting another series.
    """
    if override:
        return override
    cfg = config if isinstance(config, RunConfig) else RunConfig.read(config)
    if cfg.fit_key:
        return cfg.fit_key
    present = set(keys_present)
    return next((key for key in LOSS_KEYS if key in present), None)


#: An evaluation loss is fitted once it has this many points; until then the forecast fits the
#: training loss (a handful of evaluations cannot pin a curve).
MIN_EVAL_POINTS = 8


def fit_candidates(config: RunConfig) -> tuple[str, ...]:
    """The series a forecast may be fitted to: the loss names, and the config's ``fit_key``.

    Whoever counts points for :func:`fit_key` reads only these.
    """
    if config.fit_key and config.fit_key not in LOSS_KEYS:
        return (*LOSS_KEYS, config.fit_key)
    return LOSS_KEYS


def fit_ready(counts: Mapping[str, int]) -> list[str]:
    """The series with enough points to fit, given each one's point count: any data, and for an
    evaluation loss :data:`MIN_EVAL_POINTS`. :func:`fit_key` picks among these; the worker fits
    all of them."""
    return [k for k, n in counts.items()
            if n > 0 and (k not in EVAL_LOSS_KEYS or n >= MIN_EVAL_POINTS)]


def fit_key(
    counts: Mapping[str, int],
    config: RunConfig | Mapping[str, Any] | None = None,
    override: str | None = None,
) -> str | None:
    """The series a forecast is fitted to, given each loss-like series' point count.

    :func:`loss_key` among the series with enough points (an evaluation loss needs
    :data:`MIN_EVAL_POINTS`), else among all of them. A chosen key with no data yet is passed
    over: there is nothing to fit. The worker's refit and the alert replay both ask this, so
    they fit the same series at the same point of a run.
    """
    ready = fit_ready(counts)
    key = loss_key(ready, config, override)
    if key is not None and key in ready:
        return key
    key = loss_key([k for k, n in counts.items() if n > 0])
    return key


# --- a run's config ------------------------------------------------------------------------------
#: The alert rules' burn-in lasts at least this fraction of ``total_steps`` ...
ALERT_BURN_IN_FRACTION = 0.10
#: ... and at least this many times the step where averaging starts: once averaging starts, x is
#: an average of few points and its norm (and the loss: the paper's "hump") moves a lot until the
#: average has a history comparable to the steps before it.
ALERT_BURN_IN_C_WARMUPS = 2.0


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def _non_negative(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True)
class RunConfig:
    """The keys of a run's config that curvecast reads, typed and checked once.

    The service validates configs at the edge (``service.schemas.RunConfigIn``) and stores them
    as plain JSON; :meth:`read` turns a stored dict back into this, ignoring values of the wrong
    type (a config written by an older client), so no consumer needs its own guards.
    """

    total_steps: int | None = None
    warmup_steps: int | None = None
    c_warmup: int | None = None
    weight_decay: float | None = None
    fit_key: str | None = None
    #: The lowest value the loss can take, when it is not 0 (a loss that can go negative, or
    #: one with a known positive floor such as a label-noise entropy). Forecasts, intervals and
    #: f* never go below it; without it a loss that was never negative has the floor 0.
    loss_lower_bound: float | None = None
    #: The learning-rate schedule, as the training framework names it ("constant", "linear",
    #: "cosine", "wsd", ...; the Hugging Face callback sends ``lr_scheduler_type``). A decaying
    #: one makes every forecast ``off_model``: a/sqrt(t+b)+c describes anytime runs.
    lr_schedule: str | None = None
    #: The optimizer's class name (``Monitor.watch()`` sends ``"optimizer": {"name": ...}``;
    #: a bare string is read too).
    optimizer: str | None = None

    #: Other names :meth:`read` accepts for a key (a key's own name wins over its alias).
    ALIASES: ClassVar[Mapping[str, str]] = {"warmup": "warmup_steps"}

    @classmethod
    def keys_read(cls) -> frozenset[str]:
        """Every top-level key :meth:`read` looks at: the fields and their aliases."""
        return frozenset(f.name for f in dataclasses.fields(cls)) | frozenset(cls.ALIASES)

    @classmethod
    def read(cls, raw: Mapping[str, Any] | None) -> RunConfig:
        """Typed view of a stored config; missing or ill-typed keys read as None."""
        if not raw:
            return cls()
        total = _positive(raw.get("total_steps"))
        warmup = _positive(raw.get("warmup_steps", raw.get("warmup")))  # ALIASES
        c_warmup = _positive(raw.get("c_warmup"))
        fit_key = raw.get("fit_key")
        bound = raw.get("loss_lower_bound")
        schedule = raw.get("lr_schedule")
        optimizer = raw.get("optimizer")
        if isinstance(optimizer, Mapping):
            optimizer = optimizer.get("name")
        return cls(
            total_steps=int(total) if total is not None else None,
            warmup_steps=int(warmup) if warmup is not None else None,
            c_warmup=int(c_warmup) if c_warmup is not None else None,
            weight_decay=_non_negative(raw.get("weight_decay")),
            fit_key=fit_key if is_valid_key(fit_key) else None,
            loss_lower_bound=(float(bound) if isinstance(bound, int | float)
                              and not isinstance(bound, bool) and math.isfinite(bound)
                              else None),
            lr_schedule=(schedule.strip().lower() or None) if isinstance(schedule, str) else None,
            optimizer=(optimizer.strip() or None) if isinstance(optimizer, str) else None,
        )

    @property
    def decaying_schedule(self) -> bool:
        """Whether the config declares a learning-rate schedule that decays (anything but
        :data:`CONSTANT_SCHEDULES`)."""
        return self.lr_schedule is not None and self.lr_schedule not in CONSTANT_SCHEDULES

    @property
    def schedule_free(self) -> bool:
        """Whether the optimizer is schedule-free (ScheduleFree+, or the ``schedulefree``
        package's ``AdamWScheduleFree`` and kin): it has no learning-rate schedule to decay."""
        name = (self.optimizer or "").lower().replace("_", "").replace("-", "")
        return "schedulefree" in name

    def horizon(self, last_step: int | None) -> int | None:
        """The default forecast horizon: the planned ``total_steps``, else the last step logged.

        The API, the pages' headline numbers, the runs list and the CLI all answer for this step.
        """
        if self.total_steps is not None:
            return self.total_steps
        return int(last_step) if last_step is not None and last_step > 0 else None

    @property
    def averaging_start(self) -> int | None:
        """The step where ScheduleFree+ starts averaging: ``c_warmup``, else the paper's heuristic
        ``2 * warmup_steps``, else None (unknown). The forecast's burn-in."""
        if self.c_warmup is not None:
            return self.c_warmup
        if self.warmup_steps is not None:
            return 2 * self.warmup_steps
        return None

    @property
    def averaging_start_source(self) -> str | None:
        """Which config key :attr:`averaging_start` came from (``config:c_warmup`` or
        ``config:warmup_steps``), for the fit's ``burn_in_source``."""
        if self.c_warmup is not None:
            return "config:c_warmup"
        if self.warmup_steps is not None:
            return "config:warmup_steps"
        return None

    def alert_burn_in(self, total_steps: int | None = None) -> int:
        """The last step of the alert rules' burn-in: the larger of
        :data:`ALERT_BURN_IN_C_WARMUPS` × :attr:`averaging_start` and
        :data:`ALERT_BURN_IN_FRACTION` of the run's length (``total_steps``, or the one given)."""
        total = self.total_steps if self.total_steps is not None else total_steps
        start = self.averaging_start or 0
        frac = ALERT_BURN_IN_FRACTION * total if total else 0.0
        return int(math.ceil(max(ALERT_BURN_IN_C_WARMUPS * start, frac)))
