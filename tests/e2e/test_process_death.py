"""A training process that dies: closed terminal (SIGHUP), Ctrl-C (SIGINT) and SIGKILL, each on a
real training script streaming to a real server.

SIGHUP and Ctrl-C end the run ``failed`` with the signal or exception as its reason. A process
killed by SIGKILL says nothing: the service marks its run ``lost`` once its client has been
silent for ``client_gone_after_s`` (the check takes its ``now`` as an argument, or the worker
runs with a short setting: nothing waits out the real five minutes), and from then on the run
is neither compared nor forecast as live; if its client speaks again it is ``running`` again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest

from curvecast.contract import RUN_STATUSES
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker
from curvecast.service.migrate import upgrade
from curvecast.service.schemas import RunStatus
from curvecast.service.store._common import utcnow
from curvecast.service.worker import mark_silent_runs
from tests import REPO
from tests.support import thread_server, wait_for

#: A real training loop (a small regression net, plain SGD) with the client hook. It prints its
#: run id, then trains until it is signalled or killed. ``argv``: url, total steps, how it
#: ends ("loop": nothing catches anything; "with": the monitor as a context manager).
TRAIN = """
import sys, torch
from curvecast.client import Monitor

torch.manual_seed(0)
url, total, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
x = torch.randn(256, 8)
y = x @ torch.randn(8, 1) + 0.3 * torch.randn(256, 1)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.02)
mon = Monitor(url=url, project="death", run_name="victim", total_steps=total,
              flush_interval=0.05)
print(mon.run_id, flush=True)

def train():
    step = 0
    while True:  # until a signal ends it
        step += 1
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(min(step, total), loss=loss)
        if step >= total:
            torch.randn(64, 64) @ torch.randn(64, 64)  # keep busy, logging nothing new

if how == "with":
    with mon:
        train()
else:
    train()
"""


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'death.db'}"
    upgrade(url)
    return url


@contextmanager
def training(url: str, tmp_path: Path, *, total: int = 100_000, how: str = "loop"
             ) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """The training script running against ``url``, in a session of its own (a terminal's
    signals reach only it); yields the process and its run id."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CURVECAST_SPOOL_DIR": str(tmp_path / "spool")}
    stderr = (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen([sys.executable, "-c", TRAIN, url, str(total), how], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        run_id = proc.stdout.readline().strip()
        assert run_id, (tmp_path / "stderr.txt").read_text()
        yield proc, run_id
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        stderr.close()


def _get(url: str, path: str, **params: Any) -> Any:
    resp = httpx.get(f"{url}{path}", params=params, timeout=10)
    resp.raise_for_status()
    return resp.json()


def _run(url: str, run_id: str) -> dict[str, Any]:
    return dict(_get(url, f"/api/v1/runs/{run_id}"))


def _stored_steps(url: str, run_id: str) -> int:
    try:
        run = _run(url, run_id)
    except httpx.HTTPStatusError:
        return 0
    return int(run["last_step"] or 0)


def test_the_schema_lists_the_contract_s_run_statuses() -> None:
    assert get_args(RunStatus) == RUN_STATUSES


@pytest.mark.parametrize(("signum", "how", "reason", "code"), [
    (signal.SIGHUP, "loop", "SIGHUP", 128 + signal.SIGHUP),
    # An uncaught KeyboardInterrupt ends Python by SIGINT itself, as a shell expects.
    (signal.SIGINT, "loop", "KeyboardInterrupt", -signal.SIGINT),
    (signal.SIGINT, "with", "KeyboardInterrupt", -signal.SIGINT),
], ids=["sighup", "ctrl-c", "ctrl-c-with"])
def test_a_closed_terminal_or_ctrl_c_ends_the_run_failed_with_a_reason(
    db_url: str, tmp_path: Path, signum: int, how: str, reason: str, code: int
) -> None:
    """Closing the terminal left the run ``running`` for good; Ctrl-C ended it ``failed``
    with no reason. Both end it ``failed``, saying why, with every point stored."""
    with thread_server(Settings(database_url=db_url, worker_enabled=False)) as url:
        with training(url, tmp_path, how=how) as (proc, run_id):
            wait_for(lambda: _stored_steps(url, run_id) >= 50, 60, "points stored")
            proc.send_signal(signum)
            assert proc.wait(timeout=60) == code, (tmp_path / "stderr.txt").read_text()
        run = _run(url, run_id)
        logs = (tmp_path / "stderr.txt").read_text()
        assert (run["status"], run["status_reason"]) == ("failed", reason), logs
        assert run["ended_at"] is not None
        assert not (tmp_path / "spool" / run_id).exists(), logs  # all of it reached the service


def _eta(url: str, run_id: str, loss: float) -> Any:
    return _get(url, f"/api/v1/runs/{run_id}/forecast/target", loss=loss)


def test_a_killed_run_is_lost_within_the_window_and_no_longer_forecast_as_live(
    db_url: str, tmp_path: Path
) -> None:
    """kill -9: no handler runs. Marked ``lost`` once its client has been silent for
    client_gone_after_s (not a second before); its target then has no ETA, the compare page
    names it among the runs that ended, and the runs list shows the status."""
    settings = Settings(database_url=db_url, worker_interval_s=0.05, refit_min_interval_s=0.2)
    gone = timedelta(seconds=settings.client_gone_after_s)
    factory = make_sessionmaker(make_engine(settings))
    with thread_server(settings) as url:
        with training(url, tmp_path, total=20_000) as (proc, run_id):
            # A loss the fit puts well inside the planned run (at a quarter of it).
            fit = wait_for(
                lambda: _stored_steps(url, run_id) >= 600 and (
                    f := _get(url, f"/api/v1/runs/{run_id}/forecast", horizon=5_000)
                )["prediction"]["value"] and f, 120, "a forecast")
            target = float(fit["prediction"]["value"])
            live = _eta(url, run_id, target)
            assert live["eta"] is not None, live  # a live run gets an ETA
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        killed_at = utcnow()
        run = _run(url, run_id)
        assert run["status"] == "running"  # nothing said it ended
        assert mark_silent_runs(factory, settings, now=killed_at + gone - timedelta(seconds=5)
                                ) == 0
        assert _run(url, run_id)["status"] == "running"
        assert mark_silent_runs(factory, settings, now=killed_at + gone) == 1
        run = _run(url, run_id)
        assert run["status"] == "lost" and run["status_reason"].startswith(
            "nothing from its client for 4 min"), run

        dead = _eta(url, run_id, target)
        assert dead["eta"] is None and "ended" in dead["target"]["reason"], dead

        # A finished run beside it, at the lost run's planned end: the lost one is not ranked
        # as if it would get there.
        other = str(uuid.uuid4())
        httpx.put(f"{url}/api/v1/runs/{other}", json={
            "project": "death", "name": "done", "config": {"total_steps": 20_000}})
        steps = list(range(1, 20_001, 50))
        httpx.post(f"{url}/api/v1/runs/{other}/metrics", json={
            "steps": steps, "values": {"loss": [0.3 + 2 / (s + 10) ** 0.5 for s in steps]}})
        httpx.patch(f"{url}/api/v1/runs/{other}", json={"status": "finished"})
        compare = _get(url, "/dashboards/api/compare", runs=f"{run_id},{other}",
                       horizon=20_000)
        verdict = compare["verdict"]["message"]
        assert "victim" in verdict and "lost, its client went silent" in verdict, verdict
        assert "Runner-up" not in verdict, verdict
        runs_page = httpx.get(f"{url}/", params={"project": "death"})
        assert 'class="badge status-lost">lost<' in runs_page.text


def test_the_worker_marks_a_killed_run_lost_and_it_comes_back_when_it_speaks(
    db_url: str, tmp_path: Path
) -> None:
    """The real worker, with the window shortened so the test waits on a condition, not five
    minutes; a request of the run's client (here its heartbeat) makes it ``running`` again."""
    settings = Settings(database_url=db_url, worker_interval_s=0.05, client_gone_after_s=1.0)
    with thread_server(settings) as url:
        with training(url, tmp_path) as (proc, run_id):
            wait_for(lambda: _stored_steps(url, run_id) >= 50, 60, "points stored")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        run = wait_for(lambda: (r := _run(url, run_id))["status"] == "lost" and r, 30,
                       "the killed run marked lost")
        assert run["ended_at"] is not None
        beat = httpx.patch(f"{url}/api/v1/runs/{run_id}", json={})
        assert beat.json()["status"] == "running" and beat.json()["ended_at"] is None
