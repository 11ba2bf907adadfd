"""Tokens on both backends: stored hashed, the token CLI, auth off refused off loopback.

The matrix (every route × no token, malformed, revoked, another project's, wrong scope, the
right scope), enumerated from the app so new endpoints are covered, is
``tests/reliability/test_auth_matrix.py``."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import create_engine, text

from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.store import tokens
from tests._servers import REPO, thread_server


@dataclass
class World:
    url: str
    database_url: str
    run_id: uuid.UUID
    read: str
    ingest: str
    admin: str
    other_project_admin: str
    revoked: str


def _token(database_url: str, project: str, scope: str) -> tuple[int, str]:
    settings = Settings(database_url=database_url)
    engine = make_engine(settings)
    with session_scope(make_sessionmaker(engine)) as session:
        created = tokens.create_token(session, project=project, scope=scope, name="t")  # type: ignore[arg-type]
    engine.dispose()
    return created.id, created.token


@pytest.fixture(scope="module")
def world(database_url: str) -> Iterator[World]:
    project = f"auth-{uuid.uuid4().hex[:8]}"
    read = _token(database_url, project, "read")[1]
    ingest = _token(database_url, project, "ingest")[1]
    admin = _token(database_url, project, "admin")[1]
    other = _token(database_url, project + "-other", "admin")[1]
    revoked_id, revoked = _token(database_url, project, "admin")
    engine = make_engine(Settings(database_url=database_url))
    with session_scope(make_sessionmaker(engine)) as session:
        tokens.revoke_token(session, token_id=revoked_id)
    engine.dispose()
    settings = Settings(database_url=database_url, auth_enabled=True, worker_enabled=False)
    with thread_server(settings) as url:
        run_id = uuid.uuid4()
        resp = httpx.put(
            f"{url}/api/v1/runs/{run_id}",
            json={"project": project, "name": "secret-run"},
            headers={"Authorization": f"Bearer {ingest}"},
        )
        assert resp.status_code == 201
        httpx.post(
            f"{url}/api/v1/runs/{run_id}/metrics",
            json={"steps": [1], "values": {"loss": [1.0]}},
            headers={"Authorization": f"Bearer {ingest}"},
        ).raise_for_status()
        yield World(url, database_url, run_id, read, ingest, admin, other, revoked)


def test_tokens_are_stored_hashed(world: World) -> None:
    engine = create_engine(Settings(database_url=world.database_url).database_url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT prefix, token_hash FROM api_tokens")).all()
    engine.dispose()
    stored = {h for _, h in rows}
    assert hashlib.sha256(world.admin.encode()).hexdigest() in stored
    assert all(world.admin not in (p + h) for p, h in rows)


def test_token_cli_prints_once_and_revokes(world: World) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "curvecast.service.cli",
                "token",
                *args,
                "--database-url",
                world.database_url,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )

    created = cli("create", "--project", "cli-proj", "--scope", "read")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token.startswith("cc_") and "shown only now" in created.stderr
    ok = httpx.get(f"{world.url}/api/v1/runs", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200
    listed = cli("list", "--project", "cli-proj")
    assert token not in listed.stdout and "read" in listed.stdout
    token_id = listed.stdout.split()[0]
    assert (
        subprocess.run(
            [
                sys.executable,
                "-m",
                "curvecast.service.cli",
                "token",
                "revoke",
                token_id,
                "--database-url",
                world.database_url,
            ],
            cwd=REPO,
            capture_output=True,
            timeout=60,
        ).returncode
        == 0
    )
    gone = httpx.get(f"{world.url}/api/v1/runs", headers={"Authorization": f"Bearer {token}"})
    assert gone.status_code == 401


def test_auth_off_is_refused_on_non_loopback_bind(tmp_path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "curvecast.service.cli",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "1",
            "--database-url",
            str(tmp_path / "x.db"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "CURVECAST_AUTH_ENABLED": "false"},
    )
    assert proc.returncode == 2
    assert "curvecast token create" in proc.stderr
    assert not (tmp_path / "x.db").exists()
