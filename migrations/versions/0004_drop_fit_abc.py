"""Drop the fit history's ``a``, ``b``, ``c`` columns: written but never read (every reader
rebuilds the fit from its ``fit`` JSON, which carries the parameters).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_PARAMS = ("a", "b", "c")


def upgrade() -> None:
    # batch mode: SQLite cannot drop a column in place, so alembic copies the table there (and
    # issues plain ALTER TABLE on PostgreSQL).
    with op.batch_alter_table("fits") as batch:
        for name in _PARAMS:
            batch.drop_column(name)


def downgrade() -> None:
    # The values are not restored: nothing read them, and the fit JSON still has them.
    with op.batch_alter_table("fits") as batch:
        for name in _PARAMS:
            batch.add_column(sa.Column(name, sa.Double(), nullable=True))
