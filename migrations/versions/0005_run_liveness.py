"""Run liveness: ``runs.last_seen_at`` (the last request the run's client made: create, config
or status change, heartbeat) and ``runs.status_reason`` (why a run ended as it did, e.g. the
client's "SIGTERM" or the service's "silent: ..." when it marked a vanished run ``crashed``).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable columns without defaults: a plain ALTER TABLE ... ADD COLUMN on both backends,
    # no table rewrite, so this is instant on a large database.
    op.add_column("runs", sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("runs", sa.Column("status_reason", sa.String(200), nullable=True))


def downgrade() -> None:
    # batch mode: SQLite cannot drop a column in place, so alembic copies the table there.
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("status_reason")
        batch.drop_column("last_seen_at")
