"""``curvecast worker``: the background worker in a process of its own, beside serve processes
started with ``CURVECAST_WORKER_ENABLED=false`` (docs/deployment.md)."""

from __future__ import annotations

import contextlib
import math
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import psutil

from curvecast.service.migrate import upgrade
from tests import REPO
from tests.support import start_server_process, wait_for


def _store_a_run(client: httpx.Client) -> uuid.UUID:
    """A run with 2,000 steps of a clean ``a / sqrt(t + b) + c`` loss, stored through the API."""
    run_id = uuid.uuid4()
    client.put(f"/api/v1/runs/{run_id}", json={"project": "p"}).raise_for_status()
    steps = list(range(1, 2001))
    loss = [4.0 / math.sqrt(s + 50) + 1.5 for s in steps]
    client.post(f"/api/v1/runs/{run_id}/metrics",
                json={"steps": steps, "values": {"loss": loss}}).raise_for_status()
    return run_id


def _a_fit(client: httpx.Client, run_id: uuid.UUID, what: str) -> dict[str, object]:
    """The run's forecast once a fit exists (waits up to a minute)."""

    def fitted() -> dict[str, object] | None:
        body: dict[str, object] = client.get(f"/api/v1/runs/{run_id}/forecast").json()
        return body if body["status"] != "pending" else None

    answer: dict[str, object] = wait_for(fitted, 60, what, every=0.2)
    assert answer["key"] == "loss"
    return answer


def test_a_separate_worker_fits_what_a_worker_less_server_stores(
    fresh_pg_url: str, tmp_path: Path
) -> None:
    upgrade(fresh_pg_url)
    server = start_server_process(fresh_pg_url, tmp_path,
                                  env={"CURVECAST_WORKER_ENABLED": "false"})
    worker: subprocess.Popen[str] | None = None
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            run_id = _store_a_run(client)
            worker = subprocess.Popen(
                [sys.executable, "-m", "curvecast.service.cli", "worker",
                 "--database-url", fresh_pg_url],
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            # The server fits nothing itself: a fit can only come from the worker process.
            answer = _a_fit(client, run_id, "a fit made by the separate worker")
            assert answer["status"] in {"ok", "no_asymptote", "too_early"}, answer
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=30)
        assert worker.returncode == 0, out
        assert "curvecast worker running" in out and "curvecast worker stopped" in out, out
        assert "Traceback" not in out, out
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        server.stop()


def _worker_children(server_pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(server_pid).children(recursive=True)
            if "--parent-pid" in p.cmdline()]


def test_serve_with_several_processes_runs_one_worker_process(
    fresh_pg_url: str, tmp_path: Path
) -> None:
    """``serve --workers 2``: its two serve processes only serve; one worker process, started,
    watched and stopped by the serving parent, makes the fits. Killed outright, the parent
    leaves no worker behind."""
    upgrade(fresh_pg_url)
    server = start_server_process(fresh_pg_url, tmp_path, extra_args=["--workers", "2"])
    tree: list[psutil.Process] = []
    try:
        [worker] = wait_for(lambda: _worker_children(server.proc.pid), 60, "the worker process")
        assert worker.cmdline()[-1] == str(server.proc.pid)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            _a_fit(client, _store_a_run(client), "a fit made by the worker process")
        assert _worker_children(server.proc.pid) == [worker]  # still the one
        assert "background worker in its own process" in server.log()
        tree = psutil.Process(server.proc.pid).children(recursive=True)
        server.kill()  # SIGKILL: no chance to stop its children
        worker.wait(timeout=30)  # the worker notices its parent is gone
    finally:
        server.stop()
        for proc in tree:  # what a SIGKILLed parent leaves: uvicorn's serve processes
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
