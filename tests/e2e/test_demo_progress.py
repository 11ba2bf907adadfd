"""The demo's progress rows: the time left comes from the recent pace ("estimating..." until
there is one), never from the average since the start (at step 1 it said "~423m29s left");
the ETA's target is picked once and kept (it changed six times during one run); a second demo
while one runs keeps its files in a directory of its own."""

from __future__ import annotations

import math
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
from filelock import FileLock

from curvecast.service.config import Settings
from curvecast.service.demo_progress import DemoApi, Pace, Progress, pick_target
from curvecast.service.migrate import upgrade
from curvecast.service.schemas.forecast import (
    EtaOut,
    ForecastOut,
    IntervalOut,
    PredictionOut,
    TargetAnswer,
    TargetOut,
)
from tests.e2e.test_demo import _demo_cmd, _env, _runs
from tests.support import thread_server


class Clock:
    """Monotonic seconds that move when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_time_left_is_estimated_from_the_recent_pace(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'pace.db'}"
    upgrade(db)
    clock = Clock()
    with thread_server(Settings(database_url=db, worker_enabled=False)) as url:
        run_id = str(uuid.uuid4())
        base = f"{url}/api/v1/runs/{run_id}"
        httpx.put(base, json={"project": "demo", "config": {"total_steps": 2000}}
                  ).raise_for_status()
        progress = Progress(DemoApi(url), run_id, 2000, None, rows=None, clock=clock)

        def at(seconds: float, upto: int) -> str:
            clock.now = seconds
            steps = list(range(1, upto + 1))
            httpx.post(f"{base}/metrics", json={"steps": steps, "values": {
                "loss": [3.0 - s / 1000 for s in steps]}}).raise_for_status()
            parts = progress.parts()
            assert parts is not None
            return parts[0]

        # A minute of start-up (imports, data), then the first step: no pace yet.
        first = at(60.0, 1)
        assert "1m00s elapsed, estimating... |" in first, first
        assert "1m02s elapsed, estimating... |" in at(62.0, 21)  # two seconds: too little yet
        # Ten steps a second since the first: 1,939 steps left take 3m13s (the average since
        # the start, start-up included, said 34m58s).
        for second in range(63, 67):
            row = at(float(second), 1 + 10 * (second - 60))
        assert "1m06s elapsed, ~3m13s left |" in row, row
        # Training slows to 2 steps a second: within the window, the estimate follows.
        for second in range(67, 100):
            row = at(float(second), 61 + 2 * (second - 66))
        left = re.search(r"~(\d+)m(\d+)s left", row)
        assert left and abs(60 * int(left[1]) + int(left[2]) - (2000 - 127) / 2) < 2, row
        # At the last step the row says done: not "~0s left", nor, for a run too short to
        # show a pace, "estimating...".
        assert "1m41s elapsed, done |" in at(101.0, 2000)


def test_the_pace_ignores_start_up_and_old_samples() -> None:
    clock = Clock()
    pace = Pace(window_s=20, min_span_s=5, min_steps=5, clock=clock)
    for second, step in ((0, 0), (30, 0), (60, 1)):
        clock.now = second
        pace.add(step)
    assert pace.steps_per_second() is None and pace.seconds_left(1, 100) is None
    for second in range(61, 100):
        clock.now = second
        pace.add(1 + 3 * (second - 60))
    assert pace.steps_per_second() == 3.0
    # A slow run: about one step every 3 s, 6 or 7 steps in a 20 s window. The samples reach
    # back far enough for 5 steps, so the estimate never drops back to "estimating...".
    slow = Pace(window_s=20, min_span_s=5, min_steps=5, clock=clock)
    rates = []
    for second in range(0, 300):
        clock.now = 1000 + second
        slow.add(1 + second // 3)
        rates.append(slow.steps_per_second())
    assert all(r is not None and abs(r - 1 / 3) < 0.05 for r in rates[30:]), rates[30:]
    # A stall lowers the estimate as it goes on.
    clock.now += 60
    slow.add(100)
    stalled = slow.steps_per_second()
    assert stalled is not None and stalled < 0.2


class RecordedAnswers:
    """The REST answers a run gave, one poll after another, built from the service's schemas
    (steering real fits into forecasts that move by a chosen amount is not possible)."""

    def __init__(self) -> None:
        self.forecast: dict[str, Any] = {}
        self.step = 0
        self.loss = 2.0
        self.targets: list[float] = []

    def get(self, path: str, **params: Any) -> dict[str, Any] | None:
        if path.endswith("/forecast/target"):
            self.targets.append(float(params["loss"]))
            target = TargetOut(loss=params["loss"], step=self.step + 100, lo=self.step + 50,
                               hi=self.step + 150, reachable=True)
            eta = EtaOut(steps_per_second=10.0, seconds=10.0, at=None)
            return TargetAnswer(status="ok", key="eval_loss", target=target, eta=eta
                                ).model_dump(mode="json")
        if path.endswith("/forecast"):
            return self.forecast
        if path.endswith("/metrics"):
            return {"series": [{"key": params["keys"], "steps": [self.step],
                                "values": [self.loss]}]}
        return {"last_step": self.step, "ended_at": None}

    def poll(self, progress: Progress, step: int, loss: float, status: str,
             final: float) -> str:
        self.step, self.loss = step, loss
        self.forecast = ForecastOut(
            status=status, n_points=step, fitted_upto_step=step, a=1.0, b=0.0, c=final - 0.1,
            f_star=IntervalOut(value=final - 0.1, lo=None, hi=None), key="eval_loss",
            prediction=PredictionOut(step=2000, value=final, lo=final - 0.1, hi=final + 0.1),
            target=None).model_dump(mode="json")
        parts = progress.parts()
        assert parts is not None
        return parts[1]


def test_the_eta_target_is_picked_once_at_the_first_ok_forecast() -> None:
    answers = RecordedAnswers()
    progress = Progress(answers, "r", 2000, None, rows=None)  # type: ignore[arg-type]
    early = answers.poll(progress, 300, 2.2, "too_early", 1.9)
    assert "ETA" not in early and answers.targets == []
    # The first ok forecast: halfway between the loss now (1.9) and the final one (1.6).
    first = answers.poll(progress, 800, 1.9, "ok", 1.6)
    assert first.endswith("| ETA to 1.75: about 10s, between 5s and 15s"), first
    # Later fits forecast 1.5 and 1.4: the target stays.
    for step, now, final in ((1200, 1.8, 1.5), (1600, 1.72, 1.4)):
        assert "ETA to 1.75:" in answers.poll(progress, step, now, "ok", final)
    assert answers.targets == [1.75, 1.75, 1.75]
    # A target given with --target is used from the start.
    given = RecordedAnswers()
    fixed = Progress(given, "r", 2000, 1.3, rows=None)  # type: ignore[arg-type]
    given.poll(fixed, 300, 2.2, "too_early", 1.9)
    assert given.targets == [1.3]


def test_pick_target_is_a_round_loss_between_now_and_the_final_one() -> None:
    assert pick_target(1.9, 1.6) == 1.75
    assert pick_target(1.38, 1.36) == 1.37  # 1.35 is below the final loss: 0.01 steps
    assert pick_target(1.3405, 1.3401) is None  # nothing round between
    assert pick_target(None, 1.6) is None and pick_target(1.5, math.nan) is None
    assert pick_target(1.5, 1.6) is None  # the forecast is above the loss now


def test_a_demo_finds_its_directory_held_and_takes_another(tmp_path: Path) -> None:
    """Another demo holds ``demo/`` (its lock, taken here as a demo takes it): this one keeps
    its database and log in ``demo-2/``, and nothing of it lands in ``demo/``."""
    held = tmp_path / "demo"
    held.mkdir()
    lock = FileLock(held / ".demo.lock")
    lock.acquire(timeout=0)
    try:
        proc = subprocess.run(
            [*_demo_cmd("--steps", "8", "--port", "0", "--dir", str(held))],
            cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    finally:
        lock.release()
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    other = tmp_path / "demo-2"
    assert f"{held} is in use by another demo; this demo keeps its database and log in " \
           f"{other}" in out, out
    run = re.search(r"/runs/([0-9a-f-]{36})", out)
    assert run, out
    assert _runs(other / "curvecast.db") == {run.group(1).replace("-", ""): ("finished", 8)}
    assert not (held / "curvecast.db").exists()
    assert (other / f"train-{run.group(1)[:8]}.log").stat().st_size > 0
