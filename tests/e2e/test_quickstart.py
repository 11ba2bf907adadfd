"""The README's training example (``examples/quickstart.py``: a 500-step loop with
``total_steps=500``) gets a useful forecast: run as a script against a real server, its last
fit is ``ok`` and its forecast of the final loss holds the loss reached. With ScheduleFree+'s
defaults (averaging from step 1,000) it stayed ``too_early`` to the end ("a useful forecast is
expected from step 2000"); such a run's message now says it will get none, and why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np

from curvecast.service.config import Settings
from curvecast.service.forecast.solver import fit_curve
from curvecast.service.migrate import upgrade
from tests import REPO
from tests.support import thread_server, wait_for

EXAMPLE = REPO / "examples" / "quickstart.py"


def test_the_readme_example_gets_a_useful_forecast(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'quickstart.db'}"
    upgrade(db)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CURVECAST_SPOOL_DIR": str(tmp_path / "spool"),
           "OMP_NUM_THREADS": "1"}  # one thread: the same float sums, so the same run each time
    with thread_server(Settings(database_url=db, worker_interval_s=0.05,
                                refit_min_interval_s=0)) as url:
        proc = subprocess.run([sys.executable, str(EXAMPLE), url], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        run_id = proc.stdout.split()[1].rstrip(":")
        base = f"{url}/api/v1/runs/{run_id}"
        forecast = wait_for(
            lambda: (f := httpx.get(f"{base}/forecast").json()).get("fitted_upto_step") == 500
            and f, 60, "the fit of the whole run")
        run = httpx.get(base).json()
    assert run["status"] == "finished" and run["config"]["total_steps"] == 500
    assert forecast["key"] == "eval_loss"
    assert forecast["status"] == "ok", forecast
    assert forecast["useful_from_step"] is None and "too_early" not in forecast["message"]
    prediction = forecast["prediction"]
    assert prediction["step"] == 500 and prediction["reached"] is not None
    assert prediction["lo"] <= prediction["reached"] <= prediction["hi"], prediction


def test_a_run_too_short_for_its_averaging_start_says_it_will_get_no_useful_forecast() -> None:
    steps = np.arange(1, 501, dtype=float)
    loss = 2.0 + 3.0 / np.sqrt(steps + 20)
    # What Monitor.watch() sends for ScheduleFreePlus's defaults: averaging from step 1,000.
    config = {"total_steps": 500, "warmup_steps": 500, "c_warmup": 1000,
              "optimizer": {"name": "ScheduleFreePlus"}}
    fit = fit_curve(steps, loss, config=config)
    assert fit.status == "too_early"
    assert ("a useful forecast is expected from step 2000, after this run's planned 500 steps, "
            "so it will get none: averaging starts at step 1000") in fit.message
    assert "pass warmup_steps of a tenth to a quarter of it" in fit.message
    # A run that will get there is only told when.
    longer = fit_curve(steps, loss, config={**config, "total_steps": 20_000})
    assert longer.status == "too_early" and "will get none" not in longer.message
