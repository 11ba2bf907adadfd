"""Faults, each ending with exact point counts read from the database:

* the service SIGKILLed three times during a 5,000-step streamed run (PostgreSQL);
* PostgreSQL stopped for 30 s in the middle of a run (a private cluster);
* a training process SIGKILLed with points in its spool, uploaded by ``curvecast sync``.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from curvecast.client import Monitor
from curvecast.client._api import Backoff
from curvecast.client._batcher import plain_body
from curvecast.service.migrate import upgrade
from tests import REPO
from tests.reliability._helpers import get_json, wait_for
from tests.support import free_port, start_server_process
from tests.support.pgcluster import PrivateCluster
from tests.support.tables import KeyCount, db_counts, db_points, db_run_totals

pytestmark = pytest.mark.slow

FAST_RETRY = Backoff(base=0.05, cap=0.5)
#: The worker polls often and refits any run with new points after 1 s (defaults: 1 s, 30 s).
#: A run a killed process was fitting or evaluating waits for its lease to expire before
#: another process takes it over: 10 s here (defaults 120 s and 60 s), so that recovery is
#: measured in seconds; the recovery time is the lease (docs/reliability.md).
FAST_WORKER = {
    "CURVECAST_WORKER_INTERVAL_S": "0.1",
    "CURVECAST_REFIT_MAX_AGE_S": "1",
    "CURVECAST_REFIT_LEASE_S": "10",
    "CURVECAST_ALERT_EVAL_LEASE_S": "10",
}


def loss_at(step: int) -> float:
    """The paper's curve with a little deterministic noise."""
    noise = random.Random(step).gauss(0.0, 0.01)
    return 20.0 / math.sqrt(step + 300.0) + 2.0 + noise


def fitted_upto(run_url: str, step: int) -> dict[str, Any] | None:
    """The run's forecast if its fit saw the data up to ``step``, else None.

    Waiting for a ``fitted_at`` later than the last flush is not enough: ``fitted_at`` is
    when the worker stored the fit, and a round that read its points just before the flush
    stores a fit of fewer steps just after it.
    """
    forecast = get_json(f"{run_url}/forecast")
    upto = forecast.get("fitted_upto_step")
    return dict(forecast) if upto is not None and upto >= step else None


def assert_no_server_error(log: str) -> None:
    """No request failed with a 500: uvicorn logs unhandled exceptions, the error handlers
    log unexpected database errors. (The worker may log a database outage: it retries.)"""
    for marker in ("Exception in ASGI application", "database error\n"):
        assert marker not in log, log[log.index(marker) - 200:][:5000]


def assert_every_point_once(
    database_url: str, run_id: str, steps: range, keys: list[str]
) -> None:
    """Exactly one row per (key, step) for ``steps``, nothing else, and counters that agree."""
    counts = db_counts(database_url, run_id)
    expected = KeyCount(len(steps), len(steps), steps[0], steps[-1])
    assert counts == dict.fromkeys(keys, expected), counts
    n_points, rollup_points = db_run_totals(database_url, run_id)
    assert n_points == rollup_points == len(steps) * len(keys)


# --------------------------------------------------------------------------------------------
# The service SIGKILLed three times
# --------------------------------------------------------------------------------------------


def test_service_sigkilled_three_times_during_a_streamed_run(
    pg_url: str, project: str, tmp_path: Path
) -> None:
    n, nan_step = 5000, 4900
    keys = ["loss", "grad_l1", "lr"]
    server = start_server_process(pg_url, tmp_path, env=FAST_WORKER)
    mon = Monitor(url=server.url, project=project, run_name="sigkill-x3", total_steps=n,
                  config={"c_warmup": 100}, spool_dir=tmp_path / "spool", flush_interval=0.05,
                  backoff=FAST_RETRY)
    restarted = threading.Event()
    logged = threading.Event()

    def train() -> None:  # a training loop: ~350 steps/s, logging every step
        for step in range(1, n + 1):
            if step == nan_step:
                restarted.wait(120)  # the divergence happens after the last restart
            loss = math.nan if step == nan_step else loss_at(step)
            mon.log(step, loss=loss, grad_l1=100.0 + step % 7, lr=1e-3)
            if step % 10 == 0:
                time.sleep(0.03)
        logged.set()

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    kills: list[int] = []
    logs: list[str] = []
    try:
        for threshold in (1000, 2000, 3000):

            def reached(t: int = threshold) -> bool:
                return db_counts(pg_url, mon.run_id).get("loss", KeyCount(0, 0, 0, 0)).rows >= t

            wait_for(reached, 120, f"{threshold} points stored")
            server.kill()  # SIGKILL: no shutdown handlers, requests cut mid-flight
            kills.append(db_counts(pg_url, mon.run_id)["loss"].rows)
            logs.append(server.log())
            server = start_server_process(pg_url, tmp_path, port=server.port, env=FAST_WORKER)
        restarted.set()
        assert logged.wait(180), "the training loop did not finish"
        assert mon.flush(120), mon.stats()
        assert mon.finish(timeout=30)

        assert_every_point_once(pg_url, mon.run_id, range(1, n + 1), keys)
        stored = db_points(pg_url, mon.run_id)
        assert all(stored["loss"][s] == loss_at(s) for s in range(1, n + 1) if s != nan_step)
        assert stored["loss"][nan_step] is None  # NaN is stored as NULL
        assert kills[0] < 3000, kills  # the kills really happened mid-stream
        assert mon.stats()["points_dropped"] == 0

        run = f"{server.url}/api/v1/runs/{mon.run_id}"
        # The forecast recovers: the worker of the last process fits the complete run.
        forecast = wait_for(lambda: fitted_upto(run, n), 60, f"a fit of the loss up to step {n}")
        assert forecast["status"] == "ok" and forecast["key"] == "loss"
        assert forecast["prediction"]["step"] == n
        # Alert evaluation resumed: the NaN logged after the last restart raised its alert.
        alerts = wait_for(
            lambda: [a for a in get_json(f"{run}/alerts")["alerts"] if a["rule"] == "non_finite"],
            60, "the non_finite alert",
        )
        assert len(alerts) == 1, alerts  # one alert, not one per restart
        assert alerts[0]["since_step"] == nan_step and alerts[0]["key"] == "loss"
        assert get_json(run)["status"] == "finished"
        for log in [*logs, server.log()]:
            assert_no_server_error(log)
    finally:
        restarted.set()
        server.stop()


# --------------------------------------------------------------------------------------------
# PostgreSQL stopped for 30 seconds
# --------------------------------------------------------------------------------------------

OUTAGE_S = 30.0


def test_postgres_stopped_for_30s_mid_run(private_pg: PrivateCluster, tmp_path: Path) -> None:
    database_url = private_pg.create_database("outage")
    upgrade(database_url)
    server = start_server_process(
        database_url, tmp_path, env={**FAST_WORKER, "CURVECAST_RETRY_AFTER_S": "2"}
    )
    mon = Monitor(url=server.url, project="outage", run_name="pg-down", total_steps=100_000,
                  spool_dir=tmp_path / "spool", flush_interval=0.05, backoff=FAST_RETRY)
    stop_training = threading.Event()
    last_step = [0]

    def train() -> None:  # ~200 steps/s until told to stop
        step = 0
        while not stop_training.is_set():
            step += 1
            mon.log(step, loss=loss_at(step), grad_l1=float(step))
            last_step[0] = step
            if step % 10 == 0:
                time.sleep(0.05)

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        wait_for(lambda: db_counts(database_url, mon.run_id).get("loss", KeyCount(0, 0, 0, 0))
                 .rows >= 300, 60, "points stored before the outage")
        wait_for(lambda: get_json(f"{server.url}/api/v1/runs/{mon.run_id}/forecast")["status"]
                 != "pending", 60, "a first forecast")

        private_pg.stop("fast")
        down_at = time.monotonic()
        probe_run = uuid.uuid4()
        latencies = []

        def timed(method: str, path: str, **kwargs: object) -> httpx.Response:
            started = time.monotonic()
            resp = httpx.request(method, server.url + path, timeout=30, **kwargs)  # type: ignore[arg-type]
            latencies.append(time.monotonic() - started)
            return resp

        ingest = timed("POST", f"/api/v1/runs/{probe_run}/metrics",
                       json={"steps": [1], "values": {"loss": [1.0]}})
        assert ingest.status_code == 503 and ingest.headers["retry-after"] == "2", ingest.text
        assert ingest.json()["error_code"] == "unavailable"
        read = timed("GET", f"/api/v1/runs/{mon.run_id}/metrics")
        assert read.status_code == 503 and "retry-after" in read.headers
        assert timed("GET", "/healthz").status_code == 200
        # The client notices and spools; the training loop keeps going.
        wait_for(lambda: not mon.stats()["online"] and mon.stats()["points_spooled"] > 0, 20,
                 "the client to spool")
        step_when_spooling = last_step[0]
        while time.monotonic() - down_at < OUTAGE_S:  # the outage lasts 30 s; keep probing
            ready = timed("GET", "/readyz")
            assert ready.status_code == 503 and ready.headers["retry-after"] == "2"
            assert ready.json()["status"] == "unavailable"
            time.sleep(0.5)
        assert max(latencies) < 5.0, f"a request hung: {max(latencies):.1f}s"
        assert last_step[0] > step_when_spooling + 1000, "the training loop stalled"
        spooled_during_outage = mon.stats()["points_spooled"]

        private_pg.start()
        wait_for(lambda: httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200, 30,
                 "/readyz to recover")
        time.sleep(1.0)  # a little more training with the database back
        stop_training.set()
        trainer.join(timeout=30)
        assert mon.flush(120), mon.stats()
        assert mon.finish(timeout=30)

        n = last_step[0]
        assert_every_point_once(database_url, mon.run_id, range(1, n + 1), ["loss", "grad_l1"])
        assert spooled_during_outage > 0 and mon.stats()["points_dropped"] == 0
        assert not mon.spool_path.exists()
        assert_no_server_error(server.log())
        # The worker recovers with the database: it fits the complete run.
        wait_for(lambda: fitted_upto(f"{server.url}/api/v1/runs/{mon.run_id}", n), 60,
                 f"a fit of the loss up to step {n}")
    finally:
        stop_training.set()
        if not private_pg.running():
            private_pg.start()
        server.stop()


# --------------------------------------------------------------------------------------------
# A training process SIGKILLed
# --------------------------------------------------------------------------------------------

KILLED_CLIENT = """
import sys, time
from curvecast.client import Monitor
from curvecast.client._api import Backoff
mon = Monitor(url=sys.argv[1], project="killed-client", run_name="sigkill",
              config={"total_steps": 10**6}, flush_interval=0.02,
              backoff=Backoff(base=0.05, cap=0.2))
print(mon.run_id, flush=True)
step = 0
while True:  # trains until killed
    step += 1
    mon.log(step, loss=1.0 / step, lr=0.5)
    if step % 50 == 0:
        time.sleep(0.002)
"""


def _spooled_points(run_dir: Path) -> tuple[dict[str, dict[int, float]], int]:
    """Points in a run's spool segments (first value of a (key, step) wins, like the
    service), and the number of torn lines."""
    points: dict[str, dict[int, float]] = {}
    torn = 0
    for segment in sorted(run_dir.glob("*.jsonl")):
        for line in segment.read_bytes().splitlines():
            try:
                batch = json.loads(plain_body(line))
            except ValueError:
                torn += 1
                continue
            for key, column in batch["values"].items():
                for step, value in zip(batch["steps"], column, strict=True):
                    if value is not None:
                        points.setdefault(key, {}).setdefault(step, value)
    return points, torn


def test_killed_training_process_spool_is_uploaded_by_sync(
    server: str, database_url: str, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    env = {**os.environ, "CURVECAST_SPOOL_DIR": str(spool), "PYTHONPATH": str(REPO)}
    dead = f"http://127.0.0.1:{free_port()}"  # the service is down while it trains
    proc = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, dead], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        run_id = proc.stdout.readline().strip()
        run_dir = spool / run_id

        def spooled_lines() -> int:
            return sum(s.read_bytes().count(b"\n") for s in run_dir.glob("*.jsonl"))

        wait_for(lambda: spooled_lines() >= 100, 60, "the client to spool 100 batches")
    finally:
        proc.send_signal(signal.SIGKILL)  # mid-append, possibly mid-line
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    expected, torn = _spooled_points(run_dir)
    total = sum(len(v) for v in expected.values())
    assert set(expected) == {"loss", "lr"} and total > 1000 and torn <= 1

    sync = [sys.executable, "-m", "curvecast.service.cli", "sync", str(spool), "--url", server]
    out = subprocess.run(sync, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{total:,} points uploaded" in out.stderr, out.stderr
    stored = db_points(database_url, run_id)
    assert stored == expected
    assert db_run_totals(database_url, run_id) == (total, total)
    assert not run_dir.exists()
    again = subprocess.run(sync, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert again.returncode == 0 and "nothing to upload" in again.stderr
    assert db_run_totals(database_url, run_id) == (total, total)
