"""The `curvecast` entry point on a training machine: only the standard-library client is
installed there, and `curvecast sync` must still work."""

from __future__ import annotations

import subprocess
import sys

from tests._servers import REPO


def test_cli_parses_without_the_server_dependencies() -> None:
    # Block the [server] extra's packages, as on a client-only install.
    code = (
        "import sys\n"
        "for name in ('pydantic', 'pydantic_settings', 'uvicorn', 'fastapi', 'sqlalchemy',"
        " 'numpy', 'scipy', 'psycopg'):\n"
        "    sys.modules[name] = None\n"
        "from service.cli import build_parser\n"
        "parser = build_parser()\n"
        "args = parser.parse_args(['sync', '/nonexistent', '--url', 'http://127.0.0.1:9'])\n"
        "print(args.command)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "sync"
