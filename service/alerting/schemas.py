"""Request and response models of the alerting API (pydantic v2)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from curvecast.service.alerting.webhook import validate_webhook_url

AlertState = Literal["pending", "firing", "resolved"]
DeliveryStatus = Literal["pending", "delivered", "failed"]
_PRINTABLE = r"^[^\x00-\x1f\x7f]+$"


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

    until: datetime | None = Field(description="UTC time the silence ends (ISO 8601)")

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
    url: str
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
