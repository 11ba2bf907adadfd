"""Imported runs: ``runs.source``, where a run imported by ``curvecast import`` came from (the
tracker, its path or URI and the source's own run id, and how far each file was read, so that
running the import again continues where it stopped). NULL for runs a client streamed.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column without a default: a plain ADD COLUMN on both backends, no rewrite.
    op.add_column(
        "runs",
        sa.Column("source", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                  nullable=True),
    )


def downgrade() -> None:
    # batch mode: SQLite cannot drop a column in place, so alembic copies the table there.
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("source")
