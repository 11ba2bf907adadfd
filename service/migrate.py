"""Schema management through Alembic: upgrade, downgrade, and the start-up schema check."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import Script, ScriptDirectory
from sqlalchemy import Engine, create_engine, pool

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


def pending_revisions(database_url: str, revision: str = "head") -> list[Script]:
    """The revisions an upgrade of the database to ``revision`` would apply, oldest first."""
    from curvecast.service.config import normalise_database_url

    engine = create_engine(normalise_database_url(database_url), poolclass=pool.NullPool)
    try:
        current = current_revision(engine)
    finally:
        engine.dispose()
    script = ScriptDirectory.from_config(alembic_config(database_url))
    return list(reversed(list(script.iterate_revisions(revision, current or "base"))))


def _title(doc: str, width: int = 72) -> str:
    """A revision's docstring cut to its first clause, on one short line."""
    first = doc.strip().split(": ")[0].split(". ")[0]
    return first if len(first) <= width else first[: width - 1] + "…"


def upgrade(
    database_url: str,
    revision: str = "head",
    progress: Callable[[str], None] | None = None,
) -> None:
    """Upgrade the schema to ``revision`` (default: the newest).

    Args:
        database_url: the database.
        revision: the target revision.
        progress: when given, the revisions are applied one at a time (each in its own
            transaction, as Alembic does anyway) and this is called with a line before and after
            each, so that a long migration of a large database says where it is.
    """
    cfg = alembic_config(database_url)
    if progress is None:
        command.upgrade(cfg, revision)
        return
    steps = pending_revisions(database_url, revision)
    if not steps:
        progress(f"already at revision {revision}: nothing to apply")
    for number, script in enumerate(steps, start=1):
        title = _title(script.doc or "")
        progress(f"[{number}/{len(steps)}] applying revision {script.revision}: {title}")
        started = time.monotonic()
        command.upgrade(cfg, script.revision)
        progress(
            f"[{number}/{len(steps)}] revision {script.revision} applied in "
            f"{time.monotonic() - started:.1f}s"
        )


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
