"""Forecasts and fast reads: fit history, per-run background-work leases, and the
multi-resolution rollups of metric points.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "run_work",
        sa.Column(
            "run_id", sa.Uuid(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("fit_n_points", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("fit_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("fit_lease_until", sa.DateTime(timezone=True), nullable=True),
    )
    # Runs created before this revision get their work row now.
    op.execute("INSERT INTO run_work (run_id, fit_n_points) SELECT id, 0 FROM runs")
    op.create_table(
        "fits",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "run_id", sa.Uuid(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("n_points", sa.BigInteger(), nullable=False),
        sa.Column("run_n_points", sa.BigInteger(), nullable=False),
        sa.Column("fitted_upto_step", sa.BigInteger(), nullable=True),
        sa.Column("a", sa.Double(), nullable=True),
        sa.Column("b", sa.Double(), nullable=True),
        sa.Column("c", sa.Double(), nullable=True),
        sa.Column("fit", _json, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_fits_run_id_id", "fits", ["run_id", "id"])
    op.create_table(
        "metric_rollups",
        sa.Column(
            "series_id",
            sa.Integer(),
            sa.ForeignKey("series.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("block", sa.BigInteger(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("vmin", sa.Double(), nullable=True),
        sa.Column("vmax", sa.Double(), nullable=True),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("last_value", sa.Double(), nullable=True),
        sa.Column("vsum", sa.Double(), nullable=True),
        sa.Column("nsum", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("series_id", "level", "block", name="pk_metric_rollups"),
        sqlite_with_rowid=False,
    )
    # Points stored before this revision: build their rollups (see service.store.rollups).
    for level, width in enumerate((16, 128, 1024, 8192, 65536, 524288)):
        op.execute(
            "INSERT INTO metric_rollups (series_id, level, block, n, vmin, vmax, last_step,"
            f" last_value, vsum, nsum) SELECT p.series_id, {level}, p.step / {width}, count(*),"
            " min(p.value), max(p.value), max(p.step), NULL,"
            " sum(CASE WHEN p.value > -1e308 AND p.value < 1e308 THEN p.value ELSE 0 END),"
            " count(CASE WHEN p.value > -1e308 AND p.value < 1e308 THEN 1 END)"
            " FROM metric_points p"
            f" GROUP BY p.series_id, p.step / {width}"
        )
    op.execute(
        "UPDATE metric_rollups SET last_value = (SELECT p.value FROM metric_points p"
        " WHERE p.series_id = metric_rollups.series_id AND p.step = metric_rollups.last_step)"
    )


def downgrade() -> None:
    op.drop_table("metric_rollups")
    op.drop_index("ix_fits_run_id_id", table_name="fits")
    op.drop_table("fits")
    op.drop_table("run_work")
