"""Request and response models of the REST API (pydantic v2).

Non-finite metric values travel as JSON strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``
in responses (valid JSON for every client). Requests may use those strings or the bare literals
Python's ``json`` module emits (``NaN``, ``Infinity``).
"""

from __future__ import annotations

import binascii
import math
import re
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from curvecast.contract import (
    BASE64_COLUMNS,
    KEY_PATTERN,
    MAX_STEP,
    NON_FINITE_STRINGS,
    PROJECT_CHARS,
    PROJECT_MAX_LENGTH,
    PROJECT_PATTERN,
)

#: A ``?project=`` filter: a project name, or empty (matches nothing).
PROJECT_FILTER_PATTERN = rf"^[{PROJECT_CHARS}]{{0,{PROJECT_MAX_LENGTH}}}$"

#: A run's status (the contract's ``RUN_STATUSES``; a test checks they agree).
RunStatus = Literal["running", "finished", "failed", "crashed", "lost"]
#: The statuses a client may set: ``lost`` is the service's judgement of a silent client.
ClientRunStatus = Literal["running", "finished", "failed", "crashed"]
TokenScope = Literal["read", "ingest", "admin"]
MetricKey = Annotated[str, StringConstraints(pattern=KEY_PATTERN)]
ProjectName = Annotated[str, StringConstraints(pattern=PROJECT_PATTERN)]
# Names are free text (escaped wherever shown) but without control characters.
PRINTABLE_PATTERN = r"^[^\x00-\x1f\x7f]+$"
RunName = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=PRINTABLE_PATTERN)]
Step = Annotated[StrictInt, Field(ge=0, le=MAX_STEP)]
# Strict: a JSON number (int or float), never a boolean or a numeric string.
WallTime = Annotated[float, Field(allow_inf_nan=False, strict=True)]
# A pattern rather than a Literal, so the strings are written once (in the contract).
NonFiniteString = Annotated[
    StrictStr,
    StringConstraints(pattern="^(" + "|".join(map(re.escape, NON_FINITE_STRINGS)) + ")$"),
]
_VALUE_HELP = "a number, null or one of " + ", ".join(f'"{s}"' for s in NON_FINITE_STRINGS)


def _explain_bad_item(items: Any, check: Any) -> PydanticCustomError:
    """Find the first bad item of a list (slow path, only on error) and describe it."""
    if not isinstance(items, list):
        return PydanticCustomError("list_type", f"must be a list, got {type(items).__name__}")
    for index, item in enumerate(items):
        if not check(item):
            # Pre-formatted: pydantic's message templates only substitute plain {names}.
            got = repr(item)[:50]
            return PydanticCustomError(
                "metric_value", f"item {index} must be {_VALUE_HELP}, got {got}"
            )
    return PydanticCustomError("metric_value", "invalid values")


def _is_metric_value(item: Any) -> bool:
    if item is None or item in NON_FINITE_STRINGS:
        return True
    return isinstance(item, int | float) and not isinstance(item, bool)


def _decode_base64(text: str, dtype: str) -> np.ndarray:
    """A base64 column (:data:`~curvecast.contract.BASE64_COLUMNS`) as a numpy array of its
    items (``<i8`` or ``<f8``), without a Python object per item."""
    kind = "int64" if dtype == "<i8" else "float64"
    try:
        raw = binascii.a2b_base64(text, strict_mode=True)
    except binascii.Error as exc:
        raise PydanticCustomError(
            "base64_column", f"must be an array or base64 text of little-endian {kind} ({exc})"
        ) from None
    if len(raw) % 8:
        raise PydanticCustomError(
            "base64_column",
            f"base64 text decodes to {len(raw)} bytes, not a whole number of 8-byte {kind} items",
        )
    return np.frombuffer(raw, dtype=dtype)


def _validate_values(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    if isinstance(value, str):  # base64 float64: every entry is a point, NaN included
        return _decode_base64(value, "<f8")
    # Fast path: pydantic-core validates the whole list in Rust. Only when that fails do we
    # scan in Python, to give one clear message with the index instead of one error per
    # union member.
    try:
        return handler(value)
    except ValidationError:
        raise _explain_bad_item(value, _is_metric_value) from None


def _validate_steps(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    if not isinstance(value, str):
        return handler(value)
    steps = _decode_base64(value, "<i8")
    bad = np.flatnonzero((steps < 0) | (steps > MAX_STEP))
    if bad.size:
        index = int(bad[0])
        raise PydanticCustomError(
            "step_range", f"item {index} must be between 0 and 2**62, got {int(steps[index])}"
        )
    return steps


def _validate_wall_times(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    if not isinstance(value, str):
        return handler(value)
    walls = _decode_base64(value, "<f8")  # NaN: this row has no wall time
    bad = np.flatnonzero(np.isinf(walls))
    if bad.size:
        index = int(bad[0])
        raise PydanticCustomError(
            "finite_number",
            f"item {index} must be a finite number or NaN, got {float(walls[index])}",
        )
    return walls


def _or_base64(items: Any, what: str) -> WithJsonSchema:
    """The JSON schema of a column: its array form, or base64 text of its bytes."""
    return WithJsonSchema({
        "anyOf": [
            TypeAdapter(items).json_schema(),
            {"type": "string", "contentEncoding": BASE64_COLUMNS,
             "description": f"base64 of little-endian {what}"},
        ]
    })


# A column validates into a list (from a JSON array) or, from base64 text, a numpy array of
# its items (no Python object per item); the store takes either. Pydantic is given the array
# form only (a union would report every bad array item twice, once per member): the wrap
# validators return the numpy array themselves, which is what the type checker is told.
if TYPE_CHECKING:
    MetricValues: TypeAlias = list[float | str | None] | np.ndarray
    StepColumn: TypeAlias = list[int] | np.ndarray
    WallTimeColumn: TypeAlias = list[float | None] | np.ndarray
else:
    MetricValues = Annotated[
        list[StrictFloat | None | NonFiniteString],
        WrapValidator(_validate_values),
        _or_base64(list[StrictFloat | None | NonFiniteString], "float64 (every entry a point)"),
    ]
    StepColumn = Annotated[
        list[Step], WrapValidator(_validate_steps), _or_base64(list[Step], "int64")
    ]
    WallTimeColumn = Annotated[
        list[WallTime | None],
        WrapValidator(_validate_wall_times),
        _or_base64(list[WallTime | None], "float64 (NaN: no wall time)"),
    ]


_SURROGATE = re.compile(r"[\ud800-\udfff]")
#: Deepest nesting a config value may have (deeper JSON is refused with 422, not a crash).
MAX_CONFIG_DEPTH = 32


def check_storable_text(value: str, where: str) -> None:
    """Reject text no database can store: NUL characters (PostgreSQL text and JSONB refuse
    them) and unpaired UTF-16 surrogates (``"\\ud800"`` in JSON; not encodable as UTF-8)."""
    if "\x00" in value or _SURROGATE.search(value):
        raise ValueError(f"{where} must not contain NUL characters or unpaired surrogates")


def _check_json_safe(value: Any, where: str, depth: int = 0) -> None:
    """Config must be plain JSON: finite numbers only (Postgres JSONB rejects NaN), text that
    can be stored (see :func:`check_storable_text`), at most ``MAX_CONFIG_DEPTH`` levels."""
    if depth > MAX_CONFIG_DEPTH:
        raise ValueError(f"{where[:100]} is nested deeper than {MAX_CONFIG_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number (got {value})")
    if isinstance(value, str):
        check_storable_text(value, where)
    if isinstance(value, dict):
        for key, item in value.items():
            check_storable_text(str(key), f"{where}: key {str(key)[:50]!r}")
            _check_json_safe(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_json_safe(item, f"{where}[{index}]", depth + 1)


class RunConfigIn(BaseModel):
    """A run's configuration as a request carries it, checked at the edge.

    The typed keys are the ones :class:`curvecast.contract.RunConfig` reads back from the stored
    dict; anything else (optimizer hyper-parameters, model size, ...) is kept as given.
    """

    model_config = ConfigDict(extra="allow")

    # Bounded by the contract's MAX_STEP, like every step: an unbounded horizon was stored and
    # then made the run's figures and every comparison including it answer 422.
    total_steps: Annotated[StrictInt, Field(gt=0, le=MAX_STEP)] | None = Field(
        default=None, description="Planned number of steps: the default forecast horizon."
    )
    warmup_steps: Annotated[StrictInt, Field(ge=0, le=MAX_STEP)] | None = None
    c_warmup: Annotated[StrictInt, Field(ge=0, le=MAX_STEP)] | None = Field(
        default=None, description="Steps before averaging starts: the forecast's burn-in."
    )
    weight_decay: Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)] | None = Field(
        default=None, description="AdamC lambda, for the steady-state norm ratio sqrt(2*lambda)."
    )
    fit_key: MetricKey | None = Field(
        default=None, description="Which series the forecast fits (default: eval loss, else loss)."
    )
    loss_lower_bound: Annotated[float, Field(allow_inf_nan=False, strict=True)] | None = Field(
        default=None, description="The lowest value the loss can take when it is not 0: no "
        "forecast, interval or f* goes below it.",
    )
    lr_schedule: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        default=None, description="The learning-rate schedule (constant, linear, cosine, wsd, "
        "...): a decaying one makes every forecast off_model.",
    )

    @model_validator(mode="after")
    def _json_safe(self) -> RunConfigIn:
        for key, value in (self.model_extra or {}).items():
            check_storable_text(key, f"config key {key[:50]!r}")
            _check_json_safe(value, key)
        return self


class RunCreate(BaseModel):
    """Body of ``PUT /api/v1/runs/{run_id}`` (create-or-get)."""

    model_config = ConfigDict(extra="forbid")

    project: ProjectName
    name: RunName | None = None
    config: RunConfigIn = Field(default_factory=RunConfigIn)


class RunUpdate(BaseModel):
    """Body of ``PATCH /api/v1/runs/{run_id}``; ``config`` keys merge into the stored config."""

    model_config = ConfigDict(extra="forbid")

    status: ClientRunStatus | None = None
    status_reason: str | None = Field(
        default=None, max_length=200,
        description="Why the run has this status (stored with it; e.g. 'SIGTERM').",
    )
    name: RunName | None = None
    config: RunConfigIn | None = None


class RunOut(BaseModel):
    """A run as the API returns it."""

    id: uuid.UUID
    project: str
    name: str
    config: dict[str, Any]
    status: RunStatus
    status_reason: str | None = Field(
        default=None,
        description="Why the run has its status: the client's reason (e.g. 'SIGTERM', 'SIGHUP', "
        "'KeyboardInterrupt'), or the service's when it marked a run whose client went silent "
        "'lost'.",
    )
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None
    last_step: int | None
    n_points: int
    last_seen_at: datetime | None = Field(
        default=None, description="When the run's client was last heard from (points or not)."
    )
    source: dict[str, Any] | None = Field(
        default=None,
        description="Where an imported run came from (`curvecast import`: kind, path or URI, "
        "the source's run id, when it was imported); null for a run a client streamed.",
    )


class ProjectOut(BaseModel):
    """A project as the API returns it: its runs counted by status, its last change and its
    firing alerts."""

    name: str
    runs: int = Field(description="How many runs the project has.")
    runs_by_status: dict[str, int] = Field(
        description="Runs per status; only the statuses that have runs.")
    last_update: datetime | None = Field(
        description="When a run of the project last changed (null: no runs).")
    firing_alerts: int


class ProjectList(BaseModel):
    """Every project the caller may see, by name."""

    projects: list[ProjectOut]


class RunPage(BaseModel):
    """One page of runs; pass ``next_page_token`` back as ``page_token`` for the next one."""

    runs: list[RunOut]
    next_page_token: str | None


class MetricBatch(BaseModel):
    """A columnar batch: one ``steps`` array, and per metric key a ``values`` array of the same
    length (``null`` where the key was not measured at that step).

    Any of these columns may instead be base64 text of its little-endian bytes (int64 steps,
    float64 wall times and values; see :data:`curvecast.contract.BASE64_COLUMNS`), as the
    client hook sends them; validation decodes those to numpy arrays (int64 steps, float64
    wall times with NaN for none, float64 values)."""

    model_config = ConfigDict(extra="forbid")

    steps: StepColumn
    wall_time: WallTimeColumn | None = Field(
        default=None, description="Seconds since the epoch, one per step (optional)."
    )
    values: dict[MetricKey, MetricValues]

    @field_validator("values")
    @classmethod
    def _some_keys(cls, values: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if not values:
            raise ValueError("must contain at least one metric key")
        return values

    def n_points(self) -> int:
        """The points the batch holds: every entry of a base64 column, the non-null entries
        of an array."""
        return sum(
            len(column) if isinstance(column, np.ndarray) else len(column) - column.count(None)
            for column in self.values.values()
        )

    def max_step(self) -> int | None:
        """The batch's largest step (None for a batch without rows)."""
        steps = self.steps
        if not len(steps):
            return None
        return int(steps.max()) if isinstance(steps, np.ndarray) else max(steps)

    @model_validator(mode="after")
    def _lengths_match(self) -> MetricBatch:
        n = len(self.steps)
        if self.wall_time is not None and len(self.wall_time) != n:
            raise ValueError(f"wall_time has {len(self.wall_time)} items but steps has {n}")
        for key, column in self.values.items():
            if len(column) != n:
                raise ValueError(f"values.{key} has {len(column)} items but steps has {n}")
        return self


class IngestResult(BaseModel):
    """What an ingest request stored: ``accepted`` new points, ``duplicates`` already stored."""

    accepted: int
    duplicates: int


class SeriesOut(BaseModel):
    """One metric series. When ``downsampled`` is true each entry is a bucket: ``steps`` and
    ``values`` are the bucket's last point, ``min``/``max`` its extremes (spikes stay visible)
    and ``count`` how many points it holds."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    key: str
    total_points: int
    downsampled: bool
    steps: list[int]
    values: list[float]
    wall_time: list[float | None] | None = None
    min: list[float] | None = None
    max: list[float] | None = None
    count: list[int] | None = None


class MetricsOut(BaseModel):
    """Series of one run."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    run_id: uuid.UUID
    series: list[SeriesOut]


class LossReachedOut(BaseModel):
    """The loss a run has reached: its training loss (else its first evaluation loss) at its
    newest step, by the forecast's ``reached`` rule (the median of the series' points over the
    last 1% of the steps up to it, at most its 256 latest; the newest point alone where no other
    falls there). The run page's card, the runs list and the demo show this one number, named
    "train loss reached"."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    key: str
    step: int
    value: float = Field(description="NaN (\"NaN\" in JSON) when the newest point is not finite.")


class TokenCreated(BaseModel):
    """A freshly created token; ``token`` is shown this once and never stored."""

    id: int
    project: str
    name: str
    scope: TokenScope
    token: str


class TokenInfo(BaseModel):
    """A stored token, without its secret."""

    id: int
    project: str
    name: str
    scope: TokenScope
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


class Principal(BaseModel):
    """Who is calling: a token's project and scope, or everyone when auth is off."""

    project: str | None
    scope: TokenScope
    token_id: int | None = None

    def can(self, needed: TokenScope) -> bool:
        """Scopes nest: admin ⊇ ingest ⊇ read."""
        order = {"read": 0, "ingest": 1, "admin": 2}
        return order[self.scope] >= order[needed]


class ErrorOut(BaseModel):
    """Every error answer: a stable machine-readable code and a message that says what to fix."""

    error_code: str
    message: str


class Health(BaseModel):
    """Liveness / readiness answer."""

    status: Literal["ok", "unavailable"]
    database: str | None = None
    schema_revision: str | None = None
