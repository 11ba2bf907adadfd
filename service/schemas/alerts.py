"""The alerting API's request and response models (pydantic v2), and the plain records the
alert store reads and writes.

The records are what the store hands the worker and what the worker hands back: the store
returns them instead of ORM rows, and :mod:`curvecast.service.alerting.decisions` turns them
into the writes the store then carries out. Nothing here imports the alerting code, so the
store depends on schemas alone.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from curvecast.service.schemas import PRINTABLE_PATTERN

AlertState = Literal["pending", "firing", "resolved"]
DeliveryStatus = Literal["pending", "delivered", "failed"]
_PRINTABLE = PRINTABLE_PATTERN  # the run names' (errors say it in words)




class AlertOut(BaseModel):
    """One alert. ``step``/``value``: the rule's statistic at the last evaluated step while the
    alert was open; ``since_step``: when its condition began; ``fired_step``: when it fired."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    id: int
    run_id: uuid.UUID
    project: str
    rule: str
    state: AlertState
    severity: str
    summary: str
    description: str
    started_at: datetime
    fired_at: datetime | None
    resolved_at: datetime | None
    acknowledged_at: datetime | None
    silenced_until: datetime | None
    step: int | None
    value: float | None
    since_step: int | None
    fired_step: int | None
    key: str | None
    labels: dict[str, str]


class AlertList(BaseModel):
    """Alerts, newest first."""

    alerts: list[AlertOut]


class SilenceIn(BaseModel):
    """Body of ``POST /api/v1/alerts/{id}/silence``: no notifications until ``until``
    (``null`` lifts a silence)."""

    model_config = ConfigDict(extra="forbid")

    until: datetime | None = Field(
        description="When the silence ends (ISO 8601 with a UTC offset; stored in UTC): in the "
        "future, at most 366 days ahead"
    )

    @field_validator("until")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("must carry a timezone, e.g. 2026-11-22T08:00:00Z")
        return value


class RuleOut(BaseModel):
    """A rule's effective configuration for a project, its defaults, and what it means."""

    rule: str
    title: str
    description: str
    enabled: bool
    severity: str
    for_steps: int | None = Field(description="null: auto (see for_doc)")
    resolve_for_steps: int | None
    for_doc: str
    params: dict[str, Any]
    param_docs: dict[str, str]
    defaults: dict[str, Any]
    overridden: bool


class RuleList(BaseModel):
    """Every rule of a project."""

    project: str
    rules: list[RuleOut]


class RuleOverrideIn(BaseModel):
    """Body of ``PUT /api/v1/projects/{project}/rules/{rule}``: the project's override. Fields
    left out keep the rule's default; ``params`` may name a subset of the thresholds. The body
    replaces any previous override (send ``{}`` to return to the defaults)."""

    model_config = ConfigDict(extra="forbid")

    enabled: Annotated[bool, Field(strict=True)] | None = None
    severity: Literal["info", "warning", "critical"] | None = None
    # Strict: 0 is not a boolean, false is not a step count (lax parsing took them).
    for_steps: Annotated[int, Field(ge=0, le=10**12, strict=True)] | None = None
    resolve_for_steps: Annotated[int, Field(ge=0, le=10**12, strict=True)] | None = None
    params: dict[str, Any] | None = None


def validate_webhook_url(url: str) -> str:
    """Check a webhook URL: ``http`` or ``https``, a host, no credentials, no fragment.

    Returns:
        The URL, stripped.

    Raises:
        ValueError: saying what is wrong.
    """
    url = url.strip()
    if len(url) > 2000:
        raise ValueError("is longer than 2000 characters")
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise ValueError("must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a non-numeric or out-of-range port
    except ValueError as exc:
        raise ValueError(f"is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(
            f"must start with http:// or https:// (got scheme {parts.scheme or 'none'!r})"
        )
    if not parts.hostname:
        raise ValueError("must name a host, e.g. https://hooks.example.com/curvecast")
    if parts.username or parts.password:
        raise ValueError("must not embed credentials; set a secret to sign requests instead")
    if parts.fragment:
        raise ValueError("must not have a #fragment")
    del port
    return url


class WebhookIn(BaseModel):
    """Body of ``POST /api/v1/projects/{project}/webhooks``."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="http:// or https:// URL that receives POSTs")
    # No control characters (NUL cannot be stored in PostgreSQL text: it was a 500).
    name: Annotated[str, Field(min_length=1, max_length=200, pattern=_PRINTABLE)] | None = None
    secret: Annotated[str, Field(min_length=16, max_length=200, pattern=_PRINTABLE)] | None = Field(
        default=None, description="Signs each delivery with HMAC-SHA256 (16-200 characters)"
    )
    enabled: Annotated[bool, Field(strict=True)] = True

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return validate_webhook_url(value)


class WebhookOut(BaseModel):
    """A webhook (its secret is never returned)."""

    id: int
    project: str
    name: str
    url: str = Field(description="The receiver's URL; a token it carries is shown as `***` "
                     "(shown whole once: in the answer to the request that adds the webhook)")
    url_masked: bool = Field(description="Whether the stored URL carries a token (stored "
                             "encrypted; `url` shows it masked except on creation)")
    enabled: bool
    has_secret: bool
    created_at: datetime


class WebhookList(BaseModel):
    """A project's webhooks."""

    webhooks: list[WebhookOut]


class AttemptOut(BaseModel):
    """One HTTP attempt of a delivery."""

    attempt: int
    at: datetime
    status_code: int | None
    error: str | None
    duration_ms: float | None


class DeliveryOut(BaseModel):
    """One notification to one webhook and its attempts so far."""

    id: uuid.UUID
    webhook_id: int
    alert_id: int
    event: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime | None
    last_status: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
    attempt_log: list[AttemptOut]


class DeliveryList(BaseModel):
    """Deliveries, newest first."""

    deliveries: list[DeliveryOut]


# ---------------------------------------------------------------------------------------------
# Records between the store and the worker (plain dataclasses, not API bodies)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalJob:
    """A run leased for alert evaluation."""

    run_id: uuid.UUID
    token: uuid.UUID
    project_id: int
    project: str
    run_name: str
    config: dict[str, Any]
    status: str
    last_step: int | None
    n_points: int
    last_ingest_at: datetime | None
    evaluated_step: int | None
    state: dict[str, Any]


@dataclass(frozen=True)
class AlertRow:
    """One alert row: read as an open alert, or written as what it becomes.

    Attributes:
        id: the row's id; ``None`` for an alert this evaluation creates.
        key, labels, since_step, started_at: set when the alert is created, never changed.
        silenced_until: set through the API only (read, never written by an evaluation).
    """

    id: int | None
    rule: str
    state: AlertState
    severity: str
    summary: str
    description: str
    key: str | None
    labels: dict[str, str]
    since_step: int | None
    step: int | None
    value: float | None
    started_at: datetime
    fired_at: datetime | None
    fired_step: int | None
    resolved_at: datetime | None
    silenced_until: datetime | None
    updated_at: datetime


@dataclass(frozen=True)
class WebhookTarget:
    """An enabled webhook of a project: where a notification goes."""

    id: int
    name: str


@dataclass(frozen=True)
class Notification:
    """One outbox row: a webhook's notification of an alert's change, body already encoded."""

    delivery_id: uuid.UUID
    webhook_id: int
    event: str
    body: str


@dataclass(frozen=True)
class AlertWrite:
    """What one evaluation does to one alert row: insert (``row.id`` is None), update, or
    delete it, then queue ``notifications`` for it."""

    row: AlertRow
    delete: bool = False
    notifications: tuple[Notification, ...] = field(default_factory=tuple)
