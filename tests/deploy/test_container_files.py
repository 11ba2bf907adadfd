"""The Dockerfile and compose file, validated without a Docker engine: compose's own parser,
and a read of the Dockerfile checking that what it copies exists and what it runs is real.
(What the image installs, the wheel, is checked in ``tests/packaging``.)"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from curvecast.service.app import create_app
from curvecast.service.cli import build_parser
from curvecast.service.config import Settings
from curvecast.service.http_guard import HeadLimits
from tests import REPO
from tests.conftest import IN_CI


def _compose_command() -> list[str]:
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if IN_CI:
        pytest.fail("docker compose (or docker-compose) is required under CI=true", pytrace=False)
    pytest.skip("no docker compose / docker-compose here")


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) pairs with line continuations joined."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_compose_config_is_valid_and_wired(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*_compose_command(), "--env-file", ".env.example", "config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    services = config["services"]
    assert set(services) == {"postgres", "migrate", "api", "worker"}
    assert "pgdata" in config["volumes"]
    assert any("pgdata:" in v for v in services["postgres"]["volumes"])
    assert "healthcheck" in services["postgres"]
    assert services["migrate"]["entrypoint"] == ["curvecast", "migrate"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    api = services["api"]
    assert api["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    env = api["environment"]
    assert env["CURVECAST_AUTH_ENABLED"] == "true"  # a container binds 0.0.0.0: auth must be on
    assert env["CURVECAST_DATABASE_URL"].startswith("postgresql://")
    # The background work runs in the worker service, with the same database and secrets.
    assert env["CURVECAST_WORKER_ENABLED"] == "false"
    worker = services["worker"]
    assert worker["entrypoint"] == ["curvecast", "worker"]
    assert build_parser().parse_args(worker["entrypoint"][1:] + (worker.get("command") or [])
                                     ).command == "worker"
    assert worker["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    # The image's check probes the API's port: off (compose v1 renders it as test: [NONE]).
    check = worker["healthcheck"]
    assert check.get("disable") is True or check.get("test") == ["NONE"], check
    for name in ("CURVECAST_DATABASE_URL", "CURVECAST_SECRET_KEY", "CURVECAST_PUBLIC_URL",
                 "CURVECAST_WEBHOOK_ALLOW_PRIVATE"):
        assert worker["environment"][name] == env[name], name
    assert "CURVECAST_WORKER_ENABLED" not in worker["environment"]
    # The API enforces the request-head and connection limits (curvecast serve serves through
    # service/http_guard), with the defaults, and may open more files than connections.
    limits = HeadLimits.from_settings(Settings(**{
        name.removeprefix("CURVECAST_").lower(): value for name, value in env.items()
        if name.startswith("CURVECAST_") and name != "CURVECAST_SECRET_KEY"}))
    assert limits == HeadLimits.from_settings(Settings(database_url=env["CURVECAST_DATABASE_URL"],
                                                       auth_enabled=True))
    for name in ("MAX_HEADER_BYTES", "MAX_HEADER_FIELDS", "HEADER_TIMEOUT_S", "MAX_CONNECTIONS"):
        assert f"CURVECAST_{name}" in env, name
    nofile = api["ulimits"]["nofile"]
    assert min(nofile["soft"], nofile["hard"]) > limits.max_connections + 100
    assert "entrypoint" not in api  # the image's: curvecast serve
    # Without a password compose refuses to render, rather than starting an open database.
    empty_env = tmp_path / "empty.env"
    empty_env.write_text("")
    missing = subprocess.run(
        [*_compose_command(), "--env-file", str(empty_env), "config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin:/usr/local/bin"},
    )
    assert missing.returncode != 0 and "POSTGRES_PASSWORD" in missing.stderr


def test_dockerfile_is_multistage_slim_nonroot_and_real() -> None:
    instructions = _dockerfile()
    froms = [args for word, args in instructions if word == "FROM"]
    assert len(froms) == 2 and all("-slim" in f for f in froms)
    assert froms[0].endswith("AS build") and froms[1].endswith("AS runtime")
    runtime = instructions[[w for w, _ in instructions].index("FROM", 1) :]
    users = [args for word, args in runtime if word == "USER"]
    assert users and users[-1] not in {"root", "0"}
    # Every path the build copies from the context exists.
    for word, args in instructions:
        if word == "COPY" and "--from" not in args:
            for src in shlex.split(args)[:-1]:
                assert (REPO / src).exists(), f"Dockerfile copies missing path {src}"
    # The entrypoint is `curvecast serve`, and its CMD arguments parse.
    entry = next(args for word, args in runtime if word == "ENTRYPOINT")
    cmd = next(args for word, args in runtime if word == "CMD")
    argv = yaml.safe_load(entry)[1:] + yaml.safe_load(cmd)
    assert yaml.safe_load(entry)[0] == "curvecast" and argv[0] == "serve"
    parsed = build_parser().parse_args(argv)
    assert parsed.host == "0.0.0.0" and parsed.port == 8000
    # The healthcheck probes a route the app really serves.
    health = next(args for word, args in runtime if word == "HEALTHCHECK")
    assert "/healthz" in health
    assert "/healthz" in create_app(Settings(database_url="sqlite://")).openapi()["paths"]
