"""Webhook secrets sealed at rest: ``webhooks.secret`` holds ``fernet:v1:<token>`` (up to 366
characters for the longest secret allowed, 200) instead of the secret itself.

The column only widens: existing clear-text secrets keep working, and ``curvecast migrate``
seals them after the upgrade when a key is available (``service/secrets.py``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # PostgreSQL: widening a varchar is a catalog change (no rewrite). SQLite does not enforce
    # lengths; batch mode copies the (small) table so the declared type matches the model.
    with op.batch_alter_table("webhooks") as batch:
        batch.alter_column("secret", type_=sa.String(500), existing_type=sa.String(200),
                           existing_nullable=True)


def downgrade() -> None:
    # Sealed values do not fit 200 characters: a downgrade needs them cleared first
    # (delete and re-create those webhooks with the older version).
    with op.batch_alter_table("webhooks") as batch:
        batch.alter_column("secret", type_=sa.String(200), existing_type=sa.String(500),
                           existing_nullable=True)
