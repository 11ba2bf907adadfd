"""The `curvecast` entry point on a training machine: only the standard-library client is
installed there, and `curvecast sync` must still work."""

from __future__ import annotations

import subprocess
import sys

from tests import REPO

# Block the [server] extra's packages, as on a client-only install.
_CLIENT_ONLY = (
    "import sys\n"
    "for name in ('pydantic', 'pydantic_settings', 'uvicorn', 'fastapi', 'sqlalchemy',"
    " 'numpy', 'scipy', 'psycopg'):\n"
    "    sys.modules[name] = None\n"
)


def _client_only(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _CLIENT_ONLY + code], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_cli_parses_without_the_server_dependencies() -> None:
    proc = _client_only(
        "from curvecast.service.cli import build_parser\n"
        "parser = build_parser()\n"
        "args = parser.parse_args(['sync', '/nonexistent', '--url', 'http://127.0.0.1:9'])\n"
        "print(args.command)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "sync"


def test_server_commands_say_which_extra_to_install() -> None:
    for argv in (["serve"], ["forecast", "loss.csv", "--upto", "0.5"], ["token", "list"]):
        proc = _client_only(f"from curvecast.service.cli import main\nsys.exit(main({argv!r}))\n")
        assert proc.returncode == 2, (argv, proc.stderr)
        assert "pip install 'curvecast[server]'" in proc.stderr, proc.stderr
        assert "fastapi" in proc.stderr and "Traceback" not in proc.stderr
