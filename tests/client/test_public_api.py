"""The public surface is small and pinned; importing the client imports nothing heavy, and
importing the rest of the package does not import the client."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import curvecast
from curvecast import client


def test_all_is_pinned() -> None:
    assert client.__all__ == ["HTTPTransport", "Monitor", "Response", "Transport", "TransportError"]
    for name in client.__all__:
        assert getattr(client, name).__module__.startswith("curvecast.client.")


def test_the_package_names_are_pinned_and_resolve() -> None:
    assert curvecast.__all__ == ["Monitor", "ScheduleFreePlus", "SummaryWriter", "__version__"]
    assert curvecast.Monitor is client.Monitor
    from curvecast import Monitor, ScheduleFreePlus  # through the module's __getattr__
    from curvecast.sfplus import ScheduleFreePlus as optimizer

    assert (Monitor, ScheduleFreePlus) == (client.Monitor, optimizer)


def test_the_contract_and_the_service_do_not_load_the_client(tmp_path: Path) -> None:
    code = (
        "import sys, curvecast.contract\n"
        "print(sorted(m for m in sys.modules if m.startswith('curvecast.client')))\n"
        "import curvecast.service.app\n"
        "print(sorted(m for m in sys.modules if m.startswith('curvecast.client')))\n"
        "from curvecast import Monitor\n"
        "print(Monitor.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    assert out.stdout.split("\n")[:3] == ["[]", "[]", "curvecast.client._monitor"]


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
