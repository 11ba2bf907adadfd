"""How a run ends and how the service knows its client is alive: SIGTERM finishes the run
``failed`` with every point stored, an idle client sends heartbeats, and ``stats()`` counts
points when they are logged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from curvecast.client import Monitor
from curvecast.client._api import Backoff
from curvecast.client._sender import HEARTBEAT_INTERVAL
from tests import REPO
from tests.client._helpers import (
    FakeClock,
    FakeTransport,
    get_run,
    point_counts,
    series,
    wait_for,
)
from tests.client.test_retry import RUN, batch, make, script
from tests.support import free_port

SIGTERM_SCRIPT = """
import json, sys
from pathlib import Path
import torch
from curvecast.client import Monitor

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon = Monitor(url=sys.argv[1], project="client-sigterm", run_name="sigterm",
              config={"total_steps": 10**9})
mon.watch(opt)
print(mon.run_id, flush=True)
x, y = torch.randn(64, 8), torch.randn(64, 1)
logged = 0
try:
    while True:  # until SIGTERM
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(logged + 1, loss=loss)
        logged += 1
finally:  # runs after the monitor's handler finished the run, before the process exits
    Path(sys.argv[2]).write_text(json.dumps({"logged": logged, **mon.stats()}))
"""


def test_a_sigtermed_training_script_ends_failed_with_its_points_stored(
    sqlite_server: str, spool_dir: Path, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    env = {**os.environ, "CURVECAST_SPOOL_DIR": str(spool_dir), "PYTHONPATH": str(REPO)}
    with (tmp_path / "stderr.txt").open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", SIGTERM_SCRIPT, sqlite_server, str(report)],
            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )
        try:
            assert proc.stdout is not None
            run_id = proc.stdout.readline().strip()
            assert uuid.UUID(run_id), (tmp_path / "stderr.txt").read_text()
            # Signal it mid-run, once a good part of the run is already stored.
            wait_for(lambda: point_counts(sqlite_server, run_id).get("loss", 0) >= 250, 60,
                     "points stored before the signal")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = (tmp_path / "stderr.txt").read_text()
    stats = json.loads(report.read_text())
    run = get_run(sqlite_server, run_id)
    assert (run["status"], run["status_reason"]) == ("failed", "SIGTERM"), logs
    assert run["ended_at"] is not None
    # Every point logged before the signal is stored: each step of the loss, and every
    # learning rate the optimizer hook logged (it may be one step ahead of the loss).
    logged = stats["logged"]
    stored = series(sqlite_server, run_id)
    assert stored["loss"]["steps"] == list(range(1, logged + 1))
    assert stored["opt/lr"]["total_points"] in (logged, logged + 1)
    assert run["n_points"] == stats["points_logged"] == stats["points_sent"], stats
    assert stats["points_dropped"] == stats["points_rejected"] == 0
    assert "SIGTERM: finishing run" in logs
    assert not (spool_dir / run_id).exists()  # everything reached the service


@pytest.fixture
def sigterm_restored() -> Any:
    """Whatever a test does to the SIGTERM handler is undone."""
    before = signal.getsignal(signal.SIGTERM)
    yield before
    signal.signal(signal.SIGTERM, before)


def _status_patches(transport: FakeTransport) -> list[dict[str, Any]]:
    bodies = [json.loads(b or b"{}") for m, _, b in transport.requests if m == "PATCH"]
    return [b for b in bodies if "status" in b]


def test_sigterm_chains_to_a_previous_python_handler(spool_dir: Path, sigterm_restored) -> None:
    received = threading.Event()

    def previous(signum: int, frame: Any) -> None:
        received.set()

    signal.signal(signal.SIGTERM, previous)
    transport = FakeTransport()
    mon = Monitor(project="p", transport=transport, spool_dir=spool_dir)
    assert signal.getsignal(signal.SIGTERM) != previous  # ours, chaining to `previous`
    mon.log(1, loss=1.0)
    os.kill(os.getpid(), signal.SIGTERM)
    wait_for(received.is_set, 30, "the previous handler called")  # no SystemExit: it decides
    assert mon.finished
    assert _status_patches(transport) == [{"status": "failed", "status_reason": "SIGTERM"}]
    assert signal.getsignal(signal.SIGTERM) == previous  # restored


def test_finish_restores_the_handler_and_ignored_sigterm_is_left_alone(
    spool_dir: Path, sigterm_restored
) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    mon = Monitor(project="p", transport=FakeTransport(), spool_dir=spool_dir)
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
    assert mon.finish(timeout=10)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    mon = Monitor(project="p", transport=FakeTransport(), spool_dir=spool_dir)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    mon.finish(timeout=10)

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    mon = Monitor(project="p", transport=FakeTransport(), spool_dir=spool_dir,
                  handle_sigterm=False)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    mon.finish(timeout=10)


def test_a_monitor_created_in_another_thread_installs_no_handler(
    spool_dir: Path, sigterm_restored
) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    made: list[Monitor] = []
    thread = threading.Thread(target=lambda: made.append(
        Monitor(project="p", transport=FakeTransport(), spool_dir=spool_dir)))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert made[0].finish(timeout=10)


def test_finish_sends_its_reason(spool_dir: Path) -> None:
    transport = FakeTransport()
    mon = Monitor(project="p", transport=transport, spool_dir=spool_dir)
    with pytest.raises(ValueError, match="reason must be a string of at most 200"):
        mon.finish("failed", reason="x" * 201)
    assert mon.finish("crashed", reason="CUDA error: out of memory", timeout=10)
    assert _status_patches(transport) == [
        {"status": "crashed", "status_reason": "CUDA error: out of memory"}
    ]


def test_stats_counts_points_when_logged(spool_dir: Path) -> None:
    # The batcher only wakes every minute here: the points stay buffered, and still count.
    transport = FakeTransport()
    mon = Monitor(project="p", transport=transport, spool_dir=spool_dir, flush_interval=60)
    for step in range(300):
        mon.log(step, loss=1.0, lr=0.1)
    stats = mon.stats()
    assert stats["points_logged"] == 600
    assert stats["buffered"] + stats["points_encoded"] // 2 == 300
    assert mon.flush(timeout=10)
    stats = mon.stats()
    assert stats["points_logged"] == stats["points_encoded"] == stats["points_sent"] == 600
    assert mon.finish(timeout=10)


# -- heartbeats (the sender's state machine, tick by tick, with a fake clock) ---------------


def _heartbeats(transport: FakeTransport) -> int:
    return sum(1 for m, _, b in transport.requests if m == "PATCH" and json.loads(b or b"{}") == {})


def test_an_idle_client_sends_a_heartbeat_every_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    sender, transport = make(tmp_path, script(), clock, heartbeat_interval=60)
    sender.tick()  # PUT: the service heard from us
    clock.advance(59)
    assert 0 < sender.tick() <= 1  # idle, and it knows when the heartbeat is due
    assert _heartbeats(transport) == 0
    clock.advance(1)
    sender.tick()
    assert _heartbeats(transport) == 1
    assert transport.paths("PATCH") == [f"/api/v1/runs/{RUN}"]
    clock.advance(30)
    sender.tick()
    assert _heartbeats(transport) == 1
    clock.advance(30)
    sender.tick()
    assert _heartbeats(transport) == 2


def test_points_make_heartbeats_unnecessary(tmp_path: Path) -> None:
    clock = FakeClock()
    sender, transport = make(tmp_path, script(), clock, heartbeat_interval=60)
    sender.tick()
    for step in range(5):
        clock.advance(40)
        sender.outbox.offer(batch(step))
        sender.tick()  # the batch
        sender.tick()  # idle
    assert _heartbeats(transport) == 0 and len(transport.paths("POST")) == 5
    assert HEARTBEAT_INTERVAL == 60.0


def test_a_refused_heartbeat_stops_heartbeats_and_a_refused_reason_keeps_the_status(
    tmp_path: Path,
) -> None:
    # A service that knows neither heartbeats nor status reasons (422 on both).
    def handler(method: str, path: str, body: bytes | None) -> Any:
        from curvecast.client import Response
        payload = json.loads(body or b"{}") if method == "PATCH" else {}
        if method == "PATCH" and (payload == {} or "status_reason" in payload):
            return Response(422, {}, b'{"error_code": "invalid_input", "message": "extra"}')
        return Response(200, {}, b"{}")

    clock = FakeClock()
    sender, transport = make(tmp_path, handler, clock, heartbeat_interval=60)
    sender.tick()
    clock.advance(60)
    sender.tick()
    clock.advance(600)
    sender.tick()
    assert _heartbeats(transport) == 1  # tried once, then never again
    sender.begin_finish("failed", "SIGTERM")
    while not sender.done:
        sender.tick()
    assert [json.loads(b or b"{}") for m, _, b in transport.requests if m == "PATCH"][-2:] == [
        {"status": "failed", "status_reason": "SIGTERM"}, {"status": "failed"}]


def test_a_reason_the_service_did_not_get_travels_with_the_spool(
    sqlite_server: str, spool_dir: Path
) -> None:
    # SIGTERM while the service is down: `curvecast sync` later sets status and reason.
    dead = f"http://127.0.0.1:{free_port()}"
    mon = Monitor(url=dead, project="client-sigterm", spool_dir=spool_dir, handle_sigterm=False,
                  backoff=Backoff(base=0.05, cap=0.2))
    mon.log(1, loss=1.0)
    assert not mon.finish("failed", reason="SIGTERM", timeout=1.0)
    meta = json.loads((spool_dir / mon.run_id / "run.json").read_text())
    assert (meta["status"], meta["status_reason"]) == ("failed", "SIGTERM")
    sync = [sys.executable, "-m", "curvecast.service.cli", "sync", str(spool_dir),
            "--url", sqlite_server]
    out = subprocess.run(sync, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    run = get_run(sqlite_server, mon.run_id)
    assert (run["status"], run["status_reason"], run["n_points"]) == ("failed", "SIGTERM", 1)
