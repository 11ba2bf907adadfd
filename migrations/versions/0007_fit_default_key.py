"""Fits of every loss series: ``fits.is_default`` marks the fits of the series a forecast uses
when nobody names one (the contract's ``fit_key``); the worker also fits the other loss series so
``?key=`` can answer for them. Existing fits were all of the default series.
``fits.steps_per_second``: the run's step rate when the fit was made, so a target query's ETA
reads nothing but the fit.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A constant server default: PostgreSQL 11+ and SQLite add it without rewriting the table.
    op.add_column("fits", sa.Column("is_default", sa.Boolean(), nullable=False,
                                    server_default=sa.true()))
    op.add_column("fits", sa.Column("steps_per_second", sa.Double(), nullable=True))
    # "The newest fit of series K of run R": the ?key= reads and the refit's previous fit.
    op.create_index("ix_fits_run_id_key_id", "fits", ["run_id", "key", "id"])


def downgrade() -> None:
    op.drop_index("ix_fits_run_id_key_id", table_name="fits")
    with op.batch_alter_table("fits") as batch:
        batch.drop_column("steps_per_second")
        batch.drop_column("is_default")
