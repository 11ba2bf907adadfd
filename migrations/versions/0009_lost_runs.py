"""Lost runs: a run whose client went silent is ``lost`` (its own status) instead of ``crashed``
with a reason starting "silent:". ``runs.status`` is a plain string column (no constraint to
change); the rows the service marked before get the new status, so the liveness check, ingest
and ``PATCH`` (which revive only ``lost`` runs) bring them back when their client speaks.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "UPDATE runs SET status = 'lost' "
        "WHERE status = 'crashed' AND status_reason LIKE 'silent:%'"
    )


def downgrade() -> None:
    # The older code revives only crashed runs whose reason starts "silent:".
    op.execute(
        "UPDATE runs SET status = 'crashed', status_reason = CASE "
        "WHEN status_reason LIKE 'silent:%' THEN status_reason "
        "ELSE substr('silent: ' || coalesce(status_reason, 'client gone'), 1, 200) END "
        "WHERE status = 'lost'"
    )
