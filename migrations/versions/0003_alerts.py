"""Alerts: per-project rule overrides, alerts with their history, per-run evaluation
bookkeeping, webhooks and the delivery outbox.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_OPEN = sa.text("state IN ('pending', 'firing')")


def _ts(name: str, nullable: bool = True) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "alert_rules",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "project_id",
            sa.Integer(),
            sa.ForeignKey("projects.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("rule", sa.String(64), nullable=False),
        sa.Column("config", _json, nullable=False),
        _ts("updated_at", nullable=False),
        sa.UniqueConstraint("project_id", "rule", name="uq_alert_rules_project_rule"),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "run_id", sa.Uuid(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column(
            "project_id",
            sa.Integer(),
            sa.ForeignKey("projects.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("rule", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("summary", sa.String(), nullable=False),
        sa.Column("description", sa.String(), nullable=False),
        sa.Column("key", sa.String(200), nullable=True),
        sa.Column("labels", _json, nullable=False),
        sa.Column("since_step", sa.BigInteger(), nullable=True),
        sa.Column("fired_step", sa.BigInteger(), nullable=True),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("value", sa.Double(), nullable=True),
        _ts("started_at", nullable=False),
        _ts("fired_at"),
        _ts("resolved_at"),
        _ts("acknowledged_at"),
        _ts("silenced_until"),
        _ts("updated_at", nullable=False),
    )
    op.create_index("ix_alerts_run_id_id", "alerts", ["run_id", "id"])
    op.create_index("ix_alerts_project_id_state", "alerts", ["project_id", "state"])
    # One open (pending or firing) alert per (run, rule); resolved ones are the history. A
    # partial unique index works the same on SQLite and PostgreSQL.
    op.create_index(
        "uq_alerts_open",
        "alerts",
        ["run_id", "rule"],
        unique=True,
        sqlite_where=_OPEN,
        postgresql_where=_OPEN,
    )
    op.create_table(
        "alert_eval",
        sa.Column(
            "run_id", sa.Uuid(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("evaluated_step", sa.BigInteger(), nullable=True),
        sa.Column("n_points", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("state", _json, nullable=False),
        _ts("evaluated_at"),
        _ts("next_check_at"),
        _ts("lease_until"),
        sa.Column("lease_token", sa.Uuid(), nullable=True),
    )
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "project_id",
            sa.Integer(),
            sa.ForeignKey("projects.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("secret", sa.String(200), nullable=True),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        _ts("created_at", nullable=False),
    )
    op.create_index("ix_webhooks_project_id", "webhooks", ["project_id"])
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column(
            "webhook_id",
            sa.Integer(),
            sa.ForeignKey("webhooks.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "alert_id",
            sa.Integer(),
            sa.ForeignKey("alerts.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("body", sa.String(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        _ts("next_attempt_at", nullable=False),
        _ts("lease_until"),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(), nullable=True),
        _ts("created_at", nullable=False),
        _ts("delivered_at"),
    )
    op.create_index(
        "ix_alert_deliveries_status_next", "alert_deliveries", ["status", "next_attempt_at"]
    )
    op.create_index(
        "ix_alert_deliveries_webhook_id", "alert_deliveries", ["webhook_id", "created_at"]
    )
    op.create_table(
        "alert_delivery_attempts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "delivery_id",
            sa.Uuid(),
            sa.ForeignKey("alert_deliveries.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        _ts("at", nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(), nullable=True),
        sa.Column("duration_ms", sa.Double(), nullable=True),
    )
    op.create_index(
        "ix_alert_delivery_attempts_delivery_id", "alert_delivery_attempts", ["delivery_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_alert_delivery_attempts_delivery_id", table_name="alert_delivery_attempts")
    op.drop_table("alert_delivery_attempts")
    op.drop_index("ix_alert_deliveries_webhook_id", table_name="alert_deliveries")
    op.drop_index("ix_alert_deliveries_status_next", table_name="alert_deliveries")
    op.drop_table("alert_deliveries")
    op.drop_index("ix_webhooks_project_id", table_name="webhooks")
    op.drop_table("webhooks")
    op.drop_table("alert_eval")
    op.drop_index("uq_alerts_open", table_name="alerts")
    op.drop_index("ix_alerts_project_id_state", table_name="alerts")
    op.drop_index("ix_alerts_run_id_id", table_name="alerts")
    op.drop_table("alerts")
    op.drop_table("alert_rules")
