"""Alembic environment. The database URL comes from the caller (``curvecast migrate`` passes it)
or, when Alembic is run by hand, from the service settings (``CURVECAST_DATABASE_URL``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from curvecast.service.config import Settings, normalise_database_url

config = context.config


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    return normalise_database_url(url) if url else Settings().database_url


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of executing it (``alembic upgrade --sql``)."""
    context.configure(url=_url(), literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against a live database, on a connection given by the caller if there is one."""
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
