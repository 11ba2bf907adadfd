"""Nothing logged is lost, nothing is stored twice: against real servers that are down, killed,
restarted, stalled or asking to retry later."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch

from curvecast.client import Monitor
from curvecast.client._api import Backoff
from curvecast.client._transport import Response
from curvecast.service.config import Settings
from tests import REPO
from tests.client._helpers import (
    RecordingTransport,
    get_run,
    point_counts,
    series,
    stalled_listener,
    thread_server_on,
    wait_for,
    wait_for_points,
)
from tests.support import free_port, start_server_process, thread_server

FAST_RETRY = Backoff(base=0.05, cap=0.3)


def test_values_config_and_status_arrive(sqlite_server: str, spool_dir: Path) -> None:
    mon = Monitor(url=sqlite_server, project="client-e2e", run_name="e2e", spool_dir=spool_dir,
                  config={"lr": 0.001, "model": {"layers": 2}}, total_steps=100)
    mon.log(1, loss=2.5, acc=np.float32(0.25), count=3, t=torch.tensor(0.125),
            bf=torch.tensor(1.5, dtype=torch.bfloat16), nan=math.nan, inf=math.inf)
    mon.log(2, {"eval/loss": 1.75}, loss=torch.tensor(2.0, requires_grad=True) * 1)
    assert mon.finish(timeout=30)
    stored = series(sqlite_server, mon.run_id)
    values = {k: s["values"] for k, s in stored.items()}
    assert values == {"loss": [2.5, 2.0], "acc": [0.25], "count": [3.0], "t": [0.125],
                      "bf": [1.5], "nan": ["NaN"], "inf": ["Infinity"], "eval/loss": [1.75]}
    assert stored["loss"]["steps"] == [1, 2]
    run = get_run(sqlite_server, mon.run_id)
    assert run["status"] == "finished" and run["name"] == "e2e" and run["project"] == "client-e2e"
    assert run["config"] == {"lr": 0.001, "model": {"layers": 2}, "total_steps": 100}
    assert not mon.spool_path.exists()
    stats = mon.stats()
    assert stats["points_sent"] == 9 and stats["points_spooled"] == 0
    assert stats["rtt_ms_median"] < 1000  # milliseconds, not Nagle's ~45 ms per request


def test_a_step_going_backwards_is_still_sent(sqlite_server: str, spool_dir: Path) -> None:
    mon = Monitor(url=sqlite_server, project="client-e2e", spool_dir=spool_dir)
    mon.log(5, a=1.0)
    with pytest.warns(RuntimeWarning, match="'a' logged at step 3 after step 5"):
        mon.log(3, a=2.0)
    mon.log(5, a=9.0)  # a repeat: the server keeps the first value
    assert mon.finish(timeout=30)
    stored = series(sqlite_server, mon.run_id)["a"]
    assert stored["steps"] == [3, 5] and stored["values"] == [2.0, 1.0]


def test_points_logged_while_the_server_is_down_arrive_after_it_starts(
    sqlite_url: str, spool_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    mon = Monitor(url=f"http://127.0.0.1:{port}", project="client-e2e", spool_dir=spool_dir,
                  flush_interval=0.05, backoff=FAST_RETRY)
    for step in range(500):
        mon.log(step, loss=1.0 / (step + 1), lr=0.1)
    wait_for(lambda: mon.stats()["points_spooled"] == 1000, 10, "points spooled")
    assert (mon.spool_path / "run.json").exists()
    server = start_server_process(sqlite_url, tmp_path, port=port)
    try:
        stored = wait_for_points(server.url, mon.run_id, {"loss": 500, "lr": 500})
        assert stored["loss"]["values"][:2] == [1.0, 0.5]
        assert mon.finish(timeout=30)
        assert get_run(server.url, mon.run_id)["status"] == "finished"
        assert not mon.spool_path.exists()
    finally:
        server.stop()


def test_server_killed_mid_stream_and_restarted_stores_every_point_once(
    database_url: str, spool_dir: Path, tmp_path: Path
) -> None:
    server = start_server_process(database_url, tmp_path)
    mon = Monitor(url=server.url, project="client-e2e", spool_dir=spool_dir,
                  flush_interval=0.05, backoff=FAST_RETRY)
    killed, down_phase_logged, restarted = threading.Event(), threading.Event(), threading.Event()
    steps = [0]

    def log_some(n: int) -> None:
        for _ in range(n):
            mon.log(steps[0], loss=steps[0] * 0.5, gnorm=float(steps[0]))
            steps[0] += 1
            if steps[0] % 50 == 0:
                time.sleep(0.002)  # pace like a training loop (not synchronisation)

    def train() -> None:
        while not killed.is_set() or steps[0] < 2000:  # streaming until (and while) killed
            log_some(50)
        log_some(2000)  # logged while the server is dead
        down_phase_logged.set()
        if restarted.wait(60):
            log_some(2000)

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        wait_for(lambda: point_counts(server.url, mon.run_id).get("loss", 0) >= 300, 30,
                 "some points stored")
        server.kill()  # SIGKILL while batches are flowing, possibly mid-request
        killed.set()
        assert down_phase_logged.wait(60)
        wait_for(lambda: not mon.stats()["online"], 30, "the client to notice")
        server = start_server_process(database_url, tmp_path, port=server.port)
        restarted.set()
        trainer.join(timeout=60)
        n = steps[0]
        assert mon.flush(60), mon.stats()
        stored = series(server.url, mon.run_id)
        assert stored["loss"]["total_points"] == n and stored["gnorm"]["total_points"] == n
        assert stored["loss"]["steps"] == list(range(n))
        assert stored["loss"]["values"] == [s * 0.5 for s in range(n)]
        assert get_run(server.url, mon.run_id)["n_points"] == 2 * n
        assert mon.stats()["points_spooled"] > 0
        assert mon.finish(timeout=30)
    finally:
        killed.set()
        restarted.set()
        trainer.join(timeout=60)
        server.stop()


EXIT_SCRIPT = """
import sys
from curvecast.client import Monitor
mon = Monitor(url=sys.argv[1], project="client-exit", run_name="exit", flush_timeout=1.0,
              config={"total_steps": 1000})
print(mon.run_id, flush=True)
for step in range(1000):
    mon.log(step, loss=1000.0 - step, lr=0.01)
if sys.argv[2] == "crash":
    raise RuntimeError("the training script crashed")
"""


def run_script(url: str, mode: str, spool_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CURVECAST_SPOOL_DIR": str(spool_dir), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", EXIT_SCRIPT, url, mode], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_exit_with_the_server_up_flushes_everything(sqlite_server: str, spool_dir: Path) -> None:
    proc = run_script(sqlite_server, "ok", spool_dir)
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    assert point_counts(sqlite_server, run_id) == {"loss": 1000, "lr": 1000}
    assert get_run(sqlite_server, run_id)["status"] == "finished"
    assert not (spool_dir / run_id).exists()


def test_exit_with_the_server_down_spools_and_sync_uploads(
    sqlite_server: str, spool_dir: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    proc = run_script(dead, "crash", spool_dir)
    assert time.monotonic() - started < 30
    assert proc.returncode == 1 and "the training script crashed" in proc.stderr
    run_id = proc.stdout.strip()
    run_dir = spool_dir / run_id
    assert f"curvecast sync {run_dir}" in proc.stderr, proc.stderr
    assert "2000 points of run" in proc.stderr
    segment = sorted(run_dir.glob("*.jsonl"))[0]
    with segment.open("ab") as f:
        f.write(b'{"steps": [5], "values": {"loss": [tru\n')  # damage: skipped and reported

    sync = [sys.executable, "-m", "curvecast.service.cli", "sync", str(spool_dir),
            "--url", sqlite_server]
    out = subprocess.run(sync, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "2,000 points uploaded" in out.stderr and "status failed" in out.stderr
    assert "1 corrupted lines skipped" in out.stderr
    # Progress off a terminal: what is uploaded where, then the run's summary, numbered.
    assert f"run 1/1 {run_id[:8]}: uploading " in out.stderr, out.stderr
    assert f"of spooled points to {sqlite_server}" in out.stderr
    assert point_counts(sqlite_server, run_id) == {"loss": 1000, "lr": 1000}
    run = get_run(sqlite_server, run_id)
    assert run["status"] == "failed" and run["config"] == {"total_steps": 1000}
    assert not run_dir.exists()
    again = subprocess.run(sync, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert again.returncode == 0 and "nothing to upload" in again.stderr
    assert point_counts(sqlite_server, run_id) == {"loss": 1000, "lr": 1000}


def test_retry_after_is_honoured_by_the_real_client(spool_dir: Path) -> None:
    dead_db = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    settings = Settings(database_url=dead_db, worker_enabled=False, retry_after_s=1)
    with thread_server(settings) as url:
        transport = RecordingTransport(url)
        mon = Monitor(url=url, project="client-e2e", transport=transport, spool_dir=spool_dir,
                      backoff=Backoff(base=0.01, cap=0.02))  # only Retry-After explains a wait
        mon.log(1, loss=1.0)
        wait_for(lambda: len(transport.log) >= 3, 15, "three attempts")
        times = [t for t, _, _, status in transport.log[:3]]
        assert all(status == 503 for _, _, _, status in transport.log[:3])
        gaps = np.diff(times)
        assert (gaps >= 0.95).all(), gaps
        assert not mon.finish(timeout=0.2)
    assert (mon.spool_path / "run.json").exists()


class _BodyRecorder(RecordingTransport):
    """The real transport, keeping each POST body; ``older`` hides the run answer's
    base64-columns header, as a service from before that encoding would answer."""

    def __init__(self, url: str, *, older: bool) -> None:
        super().__init__(url)
        self.older = older
        self.bodies: list[dict[str, Any]] = []

    def request(self, method: str, path: str, **kwargs: Any) -> Response:
        resp = super().request(method, path, **kwargs)
        if method == "POST":
            self.bodies.append(json.loads(kwargs["body"]))
        if self.older and method == "PUT":
            headers = {k: v for k, v in resp.headers.items() if k != "curvecast-ingest-encodings"}
            return Response(resp.status, headers, resp.body)
        return resp


@pytest.mark.parametrize("older", [False, True], ids=["base64-columns", "older-service"])
def test_columns_travel_as_base64_only_to_a_service_that_reads_them(
    sqlite_server: str, spool_dir: Path, older: bool
) -> None:
    transport = _BodyRecorder(sqlite_server, older=older)
    mon = Monitor(url=sqlite_server, project="client-e2e", transport=transport,
                  spool_dir=spool_dir)
    for step in range(1, 101):
        mon.log(step, loss=1 / step, tokens=64 * step, t=torch.tensor(step / 3))
        if step % 10 == 0:
            mon.log(step, {"eval/loss": 2 / step})
    assert mon.finish(timeout=30)
    kinds = {type(body["steps"]) for body in transport.bodies}
    assert kinds == ({list} if older else {str})
    dense = {type(body["values"]["loss"]) for body in transport.bodies}
    assert dense == ({list} if older else {str})
    stored = series(sqlite_server, mon.run_id)
    assert stored["loss"]["values"] == [1 / s for s in range(1, 101)]
    assert stored["t"]["values"] == [float(torch.tensor(s / 3)) for s in range(1, 101)]
    assert stored["eval/loss"]["steps"] == list(range(10, 101, 10))
    assert mon.stats()["points_sent"] == 310


def test_memory_is_bounded_under_a_stalled_server(sqlite_url: str, spool_dir: Path) -> None:
    n = 100_000
    with stalled_listener() as port:
        mon = Monitor(url=f"http://127.0.0.1:{port}", project="client-e2e", spool_dir=spool_dir,
                      timeout=3.0, max_buffer=5000, max_pending_bytes=256 << 10,
                      max_batch_points=10_000, flush_interval=0.05, backoff=FAST_RETRY)
        proc = psutil.Process()
        rss0 = proc.memory_info().rss
        worst = {"buffered": 0, "pending_bytes": 0}
        for step in range(n):
            mon.log(step, loss=float(step), lr=0.5)
            if step % 5000 == 0:
                stats = mon.stats()
                for key in worst:
                    worst[key] = max(worst[key], stats[key])
        wait_for(lambda: mon.stats()["buffered"] == 0, 30, "buffer drained")
        growth = (proc.memory_info().rss - rss0) / 2**20
        stats = mon.stats()
        assert worst["buffered"] <= 5000 and worst["pending_bytes"] <= 256 << 10, worst
        assert stats["points_spooled"] > 0 and stats["points_dropped"] == 0
        # Held in memory, these 100k records would take about 32 MiB; bounded, about 5 MiB.
        assert growth < 20, f"RSS grew by {growth:.0f} MiB"
    with thread_server_on(Settings(database_url=sqlite_url, worker_enabled=False), port) as url:
        assert mon.flush(90), mon.stats()
        assert point_counts(url, mon.run_id) == {"loss": n, "lr": n}
        assert mon.finish(timeout=30)


def test_alerts_are_empty_without_the_endpoint_and_never_raise(
    sqlite_server: str, spool_dir: Path
) -> None:
    calls = []
    mon = Monitor(url=sqlite_server, project="client-e2e", spool_dir=spool_dir,
                  on_alert=calls.append, alert_interval=0.1)
    mon.log(1, loss=1.0)
    assert mon.flush(30)
    assert mon.alerts() == []
    mon.finish(timeout=30)
    down = Monitor(url=f"http://127.0.0.1:{free_port()}", project="p", spool_dir=spool_dir)
    assert down.alerts() == []
    down.finish(timeout=0.1)
    assert calls == []


def test_watch_logs_sfplus_telemetry_and_config(sqlite_server: str, spool_dir: Path) -> None:
    from curvecast import sfplus
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = sfplus.ScheduleFreePlus(model.parameters(), warmup_steps=2, weight_decay=10.0)
    mon = Monitor(url=sqlite_server, project="client-e2e", spool_dir=spool_dir, norms_every=5,
                  config={"warmup_steps": 3})
    mon.watch(opt)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    for step in range(1, 11):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad()
        mon.log(step, loss=loss)
    assert mon.finish(timeout=30)
    counts = point_counts(sqlite_server, mon.run_id)
    for key in ("eta", "alpha", "loss", "inner", "numerator", "grad_l1", "denom_ema",
                "gamma_max", "c", "sf_beta", "warmup"):
        assert counts[f"opt/{key}"] == 10, key
    for key in ("x_l2", "y_l2", "z_l2", "grad_l2"):
        assert counts[f"opt/{key}"] == 2, key
    stored = series(sqlite_server, mon.run_id)
    assert stored["opt/x_l2"]["steps"] == [5, 10]
    assert stored["opt/loss"]["values"] == stored["loss"]["values"]
    config = get_run(sqlite_server, mon.run_id)["config"]
    assert config["weight_decay"] == 10.0 and config["c_warmup"] == 4
    assert config["warmup_steps"] == 3  # the user's value wins
    # The same shape as any other optimizer's (the AdamW test below): {"name": ..., ...}.
    assert config["optimizer"]["name"] == "ScheduleFreePlus"
    assert config["optimizer"]["weight_decay"] == 10.0 and "optimizer" not in config["optimizer"]


def test_watch_logs_the_learning_rates_of_a_plain_optimizer(
    sqlite_server: str, spool_dir: Path
) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW([{"params": [model.weight]}, {"params": [model.bias], "lr": 0.5}],
                            lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    mon = Monitor(url=sqlite_server, project="client-e2e", spool_dir=spool_dir)
    handle = mon.watch(opt)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        sched.step()
    handle.remove()
    opt.step()
    assert mon.finish(timeout=30)
    stored = series(sqlite_server, mon.run_id)
    assert stored["opt/lr/0"]["steps"] == [1, 2, 3]
    assert stored["opt/lr/0"]["values"] == [0.1, 0.05, 0.025]
    assert stored["opt/lr/1"]["values"] == [0.5, 0.25, 0.125]
    assert get_run(sqlite_server, mon.run_id)["config"]["optimizer"]["name"] == "AdamW"


@pytest.mark.parametrize(("left", "said"), [
    (1, "1 point of run r and its final status could not be sent to http://x within the flush "
        "timeout; they are kept in /spool/r. Upload them with:"),
    (0, "the final status of run r could not be sent to http://x within the flush timeout; it "
        "is kept in /spool/r. Upload it with:"),
])
def test_the_exit_message_counts_what_is_left_in_words(
        left: int, said: str, caplog: pytest.LogCaptureFixture) -> None:
    """It said "1 points ... they are kept", and "the final status ... they are kept"."""
    from curvecast.client._sender import Counters, report_leftovers

    report_leftovers(Counters(points_encoded=left), Path("/spool/r"), run_id="r",
                     url="http://x", done=False)
    (message,) = [r.getMessage() for r in caplog.records if "flush timeout" in r.getMessage()]
    assert message.startswith(f"curvecast: {said}")
