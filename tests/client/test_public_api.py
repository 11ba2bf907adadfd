"""The public surface is small and pinned; importing the client imports nothing heavy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from curvecast import client


def test_all_is_pinned() -> None:
    assert client.__all__ == ["HTTPTransport", "Monitor", "Response", "Transport", "TransportError"]
    for name in client.__all__:
        assert getattr(client, name).__module__.startswith("curvecast.client.")


def test_import_is_standard_library_only(tmp_path: Path) -> None:
    code = (
        "import sys, curvecast, curvecast.client, curvecast.client.sync\n"
        "heavy = {'torch', 'httpx', 'requests', 'numpy', 'pydantic', 'fastapi'}\n"
        "heavy &= set(sys.modules)\n"
        "print(sorted(heavy))\n"
    )
    # Outside the checkout: the installed package is imported, not a folder of the cwd.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    assert out.stdout.strip() == "[]"


def test_http_transport_is_a_transport() -> None:
    assert isinstance(client.HTTPTransport("http://127.0.0.1:1"), client.Transport)
