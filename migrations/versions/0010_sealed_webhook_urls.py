"""Webhook URLs that carry a token (a Slack or Discord webhook, ``?token=``, a generated path
segment) are credentials: ``webhooks.url`` now holds the URL as reads show it, the token parts
replaced by ``***`` (``service/alerting/webhook_urls.py``), and the new ``webhooks.url_sealed``
the whole URL, sealed like ``webhooks.secret``.

The upgrade moves each such URL out of ``url``: into ``url_sealed`` in clear (a migration has
no key), where ``curvecast migrate`` seals it right after, as it does a clear-text secret; a
webhook named after its URL (the default) is renamed after the masked one. (The database's
free space may keep the old values until it is vacuumed.)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from curvecast.service.alerting.webhook_urls import masked_url

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_SEALED_PREFIX = "fernet:v1:"
_WEBHOOKS = sa.table(
    "webhooks",
    sa.column("id", sa.Integer),
    sa.column("name", sa.String),
    sa.column("url", sa.String),
    sa.column("url_sealed", sa.String),
    sa.column("enabled", sa.Boolean),
)


def upgrade() -> None:
    op.add_column("webhooks", sa.Column("url_sealed", sa.String(3000), nullable=True))
    bind = op.get_bind()
    rows = bind.execute(sa.select(_WEBHOOKS.c.id, _WEBHOOKS.c.name, _WEBHOOKS.c.url)).all()
    for webhook_id, name, url in rows:
        shown = masked_url(url)
        if shown == url:
            continue
        values = {"url": shown[:2000], "url_sealed": url}
        if name == url[:200]:
            values["name"] = shown[:200]
        bind.execute(sa.update(_WEBHOOKS).where(_WEBHOOKS.c.id == webhook_id).values(**values))


def downgrade() -> None:
    # A URL kept in clear goes back into ``url``; a sealed one cannot be opened here (no key):
    # its webhook keeps the masked URL and is disabled rather than posting to it.
    bind = op.get_bind()
    rows = bind.execute(sa.select(_WEBHOOKS.c.id, _WEBHOOKS.c.url_sealed)
                        .where(_WEBHOOKS.c.url_sealed.is_not(None))).all()
    for webhook_id, full in rows:
        values = ({"enabled": False} if full.startswith(_SEALED_PREFIX) else {"url": full})
        bind.execute(sa.update(_WEBHOOKS).where(_WEBHOOKS.c.id == webhook_id).values(**values))
    with op.batch_alter_table("webhooks") as batch:
        batch.drop_column("url_sealed")
