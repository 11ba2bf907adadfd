"""SQLAlchemy 2.0 tables. Only the store layer (``service/store``) imports these.

The schema is created and changed only by the Alembic migrations in ``migrations/versions``;
these classes describe it for queries. ``tests/service/test_migrations.py`` checks that the two
agree.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    UniqueConstraint,
    Uuid,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from curvecast.service.db import Base

JsonType = JSON().with_variant(JSONB(), "postgresql")


class Project(Base):
    """A namespace for runs; tokens are scoped to one project."""

    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Run(Base):
    """One training run. Its id is a UUID the client may choose, so creation is idempotent."""

    __tablename__ = "runs"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    project_id: Mapped[int] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict[str, Any]] = mapped_column(JsonType)
    status: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_step: Mapped[int | None] = mapped_column(BigInteger)
    n_points: Mapped[int] = mapped_column(BigInteger, default=0)
    last_ingest_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: The last request of the run's client other than points (create, PATCH, heartbeat): with
    #: ``last_ingest_at`` it tells a quiet run from one whose client is gone (worker/liveness).
    last_seen_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: Why the run has its status (the client's reason, or the service's when it marked it).
    status_reason: Mapped[str | None] = mapped_column(String(200))
    #: Where an imported run came from (``curvecast import``: the tracker, its path or URI, the
    #: source's run id, how far each file was read); NULL for a run a client streamed
    #: (migration 0008).
    source: Mapped[dict[str, Any] | None] = mapped_column(JsonType)


class Series(Base):
    """One metric key of one run. Points reference it by a small integer id, which keeps the
    points table narrow (bytes per point matter at 10^6 points per run)."""

    __tablename__ = "series"
    __table_args__ = (UniqueConstraint("run_id", "key", name="uq_series_run_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(200))


class MetricPoint(Base):
    """A value of one series at one step; (series, step) is the identity that makes ingest
    idempotent. ``value`` NULL encodes NaN: SQLite cannot store NaN in a REAL column (it turns it
    into NULL), so both backends use the same encoding. ±Infinity is stored natively."""

    __tablename__ = "metric_points"

    series_id: Mapped[int] = mapped_column(
        ForeignKey("series.id", ondelete="CASCADE"), primary_key=True
    )
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    value: Mapped[float | None] = mapped_column(Double)
    wall_time: Mapped[float | None] = mapped_column(Double)


class ApiToken(Base):
    """A project-scoped bearer token. Only a SHA-256 digest of the secret is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    scope: Mapped[str] = mapped_column(String(16))
    prefix: Mapped[str] = mapped_column(String(32), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class MetricRollup(Base):
    """Aggregates of one series over a block of ``ROLLUP_WIDTHS[level]`` steps (block = step //
    width): count, extremes, the last point, and the sum of the finite values (block means for
    refits). Maintained at ingest, in the same transaction as the points, so downsampled reads
    and refits of long series touch thousands of rows, not millions."""

    __tablename__ = "metric_rollups"

    series_id: Mapped[int] = mapped_column(
        ForeignKey("series.id", ondelete="CASCADE"), primary_key=True
    )
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    block: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger)
    vmin: Mapped[float | None] = mapped_column(Double)
    vmax: Mapped[float | None] = mapped_column(Double)
    last_step: Mapped[int] = mapped_column(BigInteger)
    last_value: Mapped[float | None] = mapped_column(Double)
    vsum: Mapped[float | None] = mapped_column(Double)  # sum of the finite values
    nsum: Mapped[int] = mapped_column(BigInteger)  # how many values vsum adds up


class RunWork(Base):
    """Background-work bookkeeping per run, apart from ``runs`` so that a worker holding it
    never blocks ingest (which locks the run's row)."""

    __tablename__ = "run_work"

    run_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    fit_n_points: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    fit_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    fit_lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class FitRecord(Base):
    """One stored forecast fit (the fit history). ``fit`` is ``Fit.to_dict()``."""

    __tablename__ = "fits"
    __table_args__ = (
        Index("ix_fits_run_id_id", "run_id", "id"),
        Index("ix_fits_run_id_key_id", "run_id", "key", "id"),  # migration 0007
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(32))
    n_points: Mapped[int] = mapped_column(BigInteger)
    run_n_points: Mapped[int] = mapped_column(BigInteger)
    fitted_upto_step: Mapped[int | None] = mapped_column(BigInteger)
    fit: Mapped[dict[str, Any]] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    #: A fit of the run's default series (the contract's ``fit_key``), which every answer uses
    #: unless a ``?key=`` names another (migration 0007).
    is_default: Mapped[bool] = mapped_column(default=True, server_default=true())
    #: The run's recent step rate when the fit was made: target ETAs read it with the fit.
    steps_per_second: Mapped[float | None] = mapped_column(Double)


# --- Alerts (migration 0003) ---------------------------------------------------------------------
# Unbounded text columns use String() and flags Mapped[bool] so that this block needs no imports
# beyond the ones above.


class AlertRuleOverride(Base):
    """A project's override of one alert rule's defaults (``service.alerting.rules``)."""

    __tablename__ = "alert_rules"
    __table_args__ = (UniqueConstraint("project_id", "rule", name="uq_alert_rules_project_rule"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    rule: Mapped[str] = mapped_column(String(64))
    config: Mapped[dict[str, Any]] = mapped_column(JsonType)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Alert(Base):
    """One alert of one (run, rule): pending, firing, or resolved (the history). At most one
    open (pending or firing) alert per (run, rule): the partial unique index ``uq_alerts_open``."""

    __tablename__ = "alerts"
    __table_args__ = (
        Index("ix_alerts_run_id_id", "run_id", "id"),
        Index("ix_alerts_project_id_state", "project_id", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    rule: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    severity: Mapped[str] = mapped_column(String(16))
    summary: Mapped[str] = mapped_column(String())
    description: Mapped[str] = mapped_column(String())
    key: Mapped[str | None] = mapped_column(String(200))
    labels: Mapped[dict[str, Any]] = mapped_column(JsonType)
    since_step: Mapped[int | None] = mapped_column(BigInteger)
    fired_step: Mapped[int | None] = mapped_column(BigInteger)
    step: Mapped[int | None] = mapped_column(BigInteger)
    value: Mapped[float | None] = mapped_column(Double)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    fired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    resolved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    acknowledged_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    silenced_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


_ALERT_OPEN = Alert.state.in_(["pending", "firing"])
Index(
    "uq_alerts_open",
    Alert.run_id,
    Alert.rule,
    unique=True,
    sqlite_where=_ALERT_OPEN,
    postgresql_where=_ALERT_OPEN,
)


class AlertEval(Base):
    """Alert-evaluation bookkeeping per run (apart from ``runs`` so that a worker holding it
    never blocks ingest): how far the rules got, their state, and a lease."""

    __tablename__ = "alert_eval"

    run_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    evaluated_step: Mapped[int | None] = mapped_column(BigInteger)
    n_points: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    state: Mapped[dict[str, Any]] = mapped_column(JsonType)
    evaluated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    next_check_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    lease_token: Mapped[uuid.UUID | None] = mapped_column(Uuid)


class Webhook(Base):
    """A project's webhook receiver. ``secret`` signs deliveries (HMAC-SHA256); it is never
    returned by the API. ``url`` is the address as reads show it: masked when it carries a
    token (a Slack or Discord webhook, ``?token=``: ``service/alerting/webhook_urls.py``), the
    whole URL then being in ``url_sealed``, sealed like ``secret``."""

    __tablename__ = "webhooks"
    __table_args__ = (Index("ix_webhooks_project_id", "project_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(String(2000))
    url_sealed: Mapped[str | None] = mapped_column(String(3000))
    secret: Mapped[str | None] = mapped_column(String(500))
    enabled: Mapped[bool]
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class AlertDelivery(Base):
    """The outbox: one notification of one alert transition to one webhook, written in the
    transaction that changed the alert, sent (and retried) by the worker until a 2xx."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (
        Index("ix_alert_deliveries_status_next", "status", "next_attempt_at"),
        Index("ix_alert_deliveries_webhook_id", "webhook_id", "created_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(16))
    body: Mapped[str] = mapped_column(String())
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(String())
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AlertDeliveryAttempt(Base):
    """One HTTP attempt of a delivery (visible through the API)."""

    __tablename__ = "alert_delivery_attempts"
    __table_args__ = (Index("ix_alert_delivery_attempts_delivery_id", "delivery_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("alert_deliveries.id", ondelete="CASCADE")
    )
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String())
    duration_ms: Mapped[float | None] = mapped_column(Double)
