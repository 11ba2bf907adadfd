"""Schema management through Alembic: upgrade, downgrade, and the start-up schema check."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from curvecast import migrations
from curvecast.service.errors import SchemaOutOfDate

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def alembic_config(database_url: str) -> Config:
    """An Alembic config pointing at ``migrations/`` and the given database."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Alembic's config is ConfigParser-based: a literal % must be doubled.
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    """Upgrade the schema to ``revision`` (default: the newest)."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    """Downgrade the schema to ``revision`` (``base`` removes every table)."""
    command.downgrade(alembic_config(database_url), revision)


def head_revision() -> str:
    """The newest revision this code knows."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    head = script.get_current_head()
    assert head is not None, "migrations/versions is empty"
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None for an empty database."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def check_schema(engine: Engine) -> str:
    """Raise :class:`SchemaOutOfDate` unless the database is at the head revision."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaOutOfDate(
            f"database schema is at revision {current or 'none (empty database)'} but this "
            f"curvecast needs {head}: run `curvecast migrate` (with the same "
            "--database-url / CURVECAST_DATABASE_URL) and start again"
        )
    return head
