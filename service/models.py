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
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base

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
    width): count, extremes, and the last point. Maintained at ingest, in the same transaction
    as the points, so downsampled reads of long series touch thousands of rows, not millions."""

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
    __table_args__ = (Index("ix_fits_run_id_id", "run_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(32))
    n_points: Mapped[int] = mapped_column(BigInteger)
    run_n_points: Mapped[int] = mapped_column(BigInteger)
    fitted_upto_step: Mapped[int | None] = mapped_column(BigInteger)
    a: Mapped[float | None] = mapped_column(Double)
    b: Mapped[float | None] = mapped_column(Double)
    c: Mapped[float | None] = mapped_column(Double)
    fit: Mapped[dict[str, Any]] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
