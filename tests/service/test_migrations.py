"""Migrations own the schema: upgrade/downgrade on both backends, models agree with them, and a
server database with a stale schema is refused at start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

import curvecast.service.models  # noqa: E402,F401  (registers every table on Base.metadata)
from curvecast.service.config import Settings
from curvecast.service.db import Base
from curvecast.service.migrate import downgrade, head_revision, upgrade
from tests._servers import REPO

# Every table the models describe; the migrations must create exactly these.
TABLES = set(Base.metadata.tables)


@pytest.fixture(params=["sqlite", "postgres"])
def empty_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'm.db'}"
    return str(request.getfixturevalue("fresh_pg_url"))


def _tables(url: str) -> set[str]:
    engine = create_engine(Settings(database_url=url).database_url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(empty_db: str) -> None:
    upgrade(empty_db)
    assert _tables(empty_db) == TABLES
    downgrade(empty_db, "base")
    assert _tables(empty_db) == set()
    upgrade(empty_db)
    assert _tables(empty_db) == TABLES


def test_models_match_migrations(empty_db: str) -> None:

    upgrade(empty_db)
    engine = create_engine(Settings(database_url=empty_db).database_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_stale_postgres_schema_is_refused(fresh_pg_url: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "curvecast.service.cli",
            "serve",
            "--port",
            "1",
            "--database-url",
            fresh_pg_url,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "curvecast migrate" in proc.stderr and head_revision() in proc.stderr
    migrated = subprocess.run(
        [sys.executable, "-m", "curvecast.service.cli", "migrate", "--database-url", fresh_pg_url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert migrated.returncode == 0, migrated.stderr
    assert _tables(fresh_pg_url) == TABLES


def test_sqlite_default_upgrades_itself(tmp_path: Path) -> None:
    from curvecast.service.app import prepare_database

    url = f"sqlite:///{tmp_path / 'auto.db'}"
    prepare_database(Settings(database_url=url))
    assert _tables(url) == TABLES


def test_upgrade_from_0001_backfills_rollups_and_work(empty_db: str) -> None:
    """Data stored under revision 0001 gets its rollups and work rows when upgraded."""
    import uuid

    from sqlalchemy import text

    upgrade(empty_db, "0001")
    engine = create_engine(Settings(database_url=empty_db).database_url)
    run_id = uuid.uuid4()
    rid = str(run_id) if engine.dialect.name == "postgresql" else run_id.hex
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (name, created_at) VALUES ('p', '2026-01-01')"))
        conn.execute(
            text(
                "INSERT INTO runs (id, project_id, name, config, status, created_at, updated_at,"
                " n_points) VALUES (:id, 1, 'r', '{}', 'running', '2026-01-01', '2026-01-01', 40)"
            ),
            {"id": rid},
        )
        conn.execute(text("INSERT INTO series (run_id, key) VALUES (:id, 'loss')"), {"id": rid})
        conn.execute(
            text("INSERT INTO metric_points (series_id, step, value) VALUES (1, :s, :v)"),
            [{"s": s, "v": float(s)} for s in range(40)],
        )
    upgrade(empty_db)
    with engine.connect() as conn:
        level0 = conn.execute(
            text(
                "SELECT block, n, vmin, vmax, last_step, last_value, vsum, nsum FROM metric_rollups"
                " WHERE level = 0 ORDER BY block"
            )
        ).all()
        work = conn.execute(text("SELECT count(*) FROM run_work")).scalar_one()
    engine.dispose()
    assert [tuple(r) for r in level0] == [
        (0, 16, 0.0, 15.0, 15, 15.0, float(sum(range(16))), 16),
        (1, 16, 16.0, 31.0, 31, 31.0, float(sum(range(16, 32))), 16),
        (2, 8, 32.0, 39.0, 39, 39.0, float(sum(range(32, 40))), 8),
    ]
    assert work == 1


def test_runs_marked_silent_under_0008_become_lost_and_back(empty_db: str) -> None:
    """Before 0009 the service marked a silent client's run ``crashed`` with a reason starting
    "silent:"; such runs are ``lost`` after the upgrade (what ingest revives), a run its client
    set ``crashed`` stays so, and the downgrade gives the old form back."""
    import uuid

    from sqlalchemy import text

    upgrade(empty_db, "0008")
    engine = create_engine(Settings(database_url=empty_db).database_url)
    pg = engine.dialect.name == "postgresql"
    ids = {name: uuid.uuid4() for name in ("silent", "client")}
    reasons = {"silent": "silent: no points and no request from the client for 30 min",
               "client": "OOM"}
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (name, created_at) VALUES ('p', '2026-01-01')"))
        for name, run_id in ids.items():
            conn.execute(
                text("INSERT INTO runs (id, project_id, name, config, status, status_reason,"
                     " created_at, updated_at, n_points) VALUES (:id, 1, :n, '{}', 'crashed',"
                     " :why, '2026-01-01', '2026-01-01', 0)"),
                {"id": str(run_id) if pg else run_id.hex, "n": name, "why": reasons[name]},
            )

    def statuses() -> dict[str, tuple[str, str]]:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT name, status, status_reason FROM runs")).all()
        return {r[0]: (r[1], r[2]) for r in rows}

    try:
        upgrade(empty_db)
        assert statuses() == {"silent": ("lost", reasons["silent"]),
                              "client": ("crashed", "OOM")}
        downgrade(empty_db, "0008")
        assert statuses() == {"silent": ("crashed", reasons["silent"]),
                              "client": ("crashed", "OOM")}
    finally:
        engine.dispose()
