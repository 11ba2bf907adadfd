"""The built wheel, installed into a fresh virtualenv: one top-level package, everything the
service needs inside it, and a client-only install that imports nothing heavy.

The wheel is built from a copy of exactly what the Dockerfile copies into its build stage, so a
path the image would miss fails here too (and a stale ``build/`` of the checkout cannot leak in).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from curvecast.service.cli import SERVER_MODULES, SERVER_SPEEDUPS
from tests import REPO

#: What the Dockerfile's build stage copies: all the wheel is built from.
BUILD_INPUTS = (
    "pyproject.toml",
    "README.md",
    "curvecast",
    "client",
    "service",
    "sfplus",
    "dashboards",
    "migrations",
)
#: The version pyproject.toml gives the distribution.
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
#: The server's and the optimizer's dependencies: a client-only install imports none of them.
HEAVY = ("fastapi", "sqlalchemy", "scipy", "torch", "numpy", "pydantic", "httpx", "uvicorn")


def _run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{argv}: {proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built offline from a copy of the build inputs (symlinks kept as symlinks)."""
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "--disable-pip-version-check", "-w", out, src)
    return next(out.glob("curvecast-*.whl"))


@pytest.fixture(scope="module")
def client_only_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a fresh virtualenv with only the wheel installed (no dependencies:
    ``pip install curvecast`` on a training machine)."""
    venv = tmp_path_factory.mktemp("venv")
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
         "--no-index", "--no-compile", "--disable-pip-version-check", wheel)
    return python


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"curvecast", f"curvecast-{VERSION}.dist-info"}
    for needed in (
        "curvecast/contract.py",
        "curvecast/py.typed",
        "curvecast/integrations/optuna.py",
        "curvecast/client/sync.py",
        "curvecast/service/app.py",
        "curvecast/dashboards/static/dashboards.js",
        "curvecast/dashboards/static/vendor/plotly-basic.min.js",
        "curvecast/dashboards/static/vendor/LICENSE.plotly.js.txt",
        "curvecast/dashboards/templates/base.html",
        "curvecast/migrations/versions/0001_initial.py",
    ):
        assert needed in names, f"{needed} missing from the wheel"
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]


def test_package_ships_what_the_image_needs(wheel: Path) -> None:
    """The image installs the package non-editable: migrations and templates must be inside."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "curvecast/migrations/env.py",
        "curvecast/migrations/script.py.mako",
        "curvecast/migrations/versions/0001_initial.py",
        "curvecast/service/app.py",
        "curvecast/client/__init__.py",
        "curvecast/sfplus/__init__.py",
    ):
        assert needed in names, f"{needed} missing from the wheel"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "curvecast = curvecast.service.cli:main" in zipfile.ZipFile(wheel).read(
        entry_points
    ).decode()


def test_the_dockerfile_copies_the_build_inputs() -> None:
    copied = set()
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            copied.update(Path(src).name for src in shlex.split(line)[1:-1])
    assert copied == set(BUILD_INPUTS)


def test_client_only_install_imports_nothing_heavy(client_only_python: Path) -> None:
    code = (
        "import sys, curvecast, curvecast.client, curvecast.client.sync, curvecast.contract\n"
        "from curvecast import Monitor\n"
        f"print(sorted(set({HEAVY!r}) & set(sys.modules)))\n"
    )
    # Run outside the checkout, so only the installed package can be found.
    out = _run(client_only_python, "-c", code, cwd=client_only_python.parent)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", ["client", "service", "dashboards", "migrations", "sfplus"])
def test_no_generic_top_level_module_is_installed(client_only_python: Path, name: str) -> None:
    proc = subprocess.run([client_only_python, "-c", f"import {name}"], capture_output=True,
                          text=True, cwd=client_only_python.parent, timeout=60)
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr


def test_client_only_install_syncs_and_explains_server_commands(
    client_only_python: Path, tmp_path: Path
) -> None:
    script = client_only_python.parent / "curvecast"
    synced = _run(script, "sync", tmp_path, cwd=tmp_path)
    assert "nothing to upload" in synced.stderr
    serve = subprocess.run([script, "serve"], capture_output=True, text=True, cwd=tmp_path,
                           timeout=60)
    assert serve.returncode == 2
    assert "pip install 'curvecast[server]'" in serve.stderr and "Traceback" not in serve.stderr
    optimizer = subprocess.run(
        [client_only_python, "-c", "from curvecast import ScheduleFreePlus"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )
    assert "pip install 'curvecast[torch]'" in optimizer.stderr


def test_the_package_reports_the_distribution_version() -> None:
    """``curvecast.__version__`` and the service's (its OpenAPI ``info.version``) are
    pyproject's: a release bumps all three."""
    import curvecast
    from curvecast import service

    assert curvecast.__version__ == service.__version__ == VERSION


def test_the_cli_knows_the_server_extra() -> None:
    """``curvecast`` names the missing packages of the ``[server]`` extra: the same list."""
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["server"]
    modules = {re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].replace("-", "_").lower()
               for req in extra}
    assert modules == set(SERVER_MODULES) | set(SERVER_SPEEDUPS)
