"""``curvecast forecast`` on other trackers' runs, with no server: a TensorBoard run directory,
a W&B history and an MLflow run give the forecast the same points give as the service's own
``metrics.csv`` export."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

from curvecast.service.forecast.cli import main


def _points(n: int = 400) -> tuple[list[int], list[float]]:
    rng = np.random.default_rng(3)
    steps = list(range(0, n * 25, 25))
    values = [float(np.float32(20.3 / math.sqrt(s + 377) + 2.07 + rng.normal(0, 0.002)))
              for s in steps]
    return steps, values


def _forecast(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _export(tmp_path: Path, key: str, steps: list[int], values: list[float]) -> Path:
    path = tmp_path / "metrics.csv"
    path.write_text("key,step,value,wall_time\n" + "".join(
        f"{key},{s},{v!r},\n" for s, v in zip(steps, values, strict=True)))
    return path


def test_a_tensorboard_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps, values = _points()
    logdir = tmp_path / "runs" / "exp1"
    with SummaryWriter(str(logdir)) as writer:
        for step, value in zip(steps, values, strict=True):
            writer.add_scalar("Loss/val", value, step)
            writer.add_scalar("grad_norm", 1.0, step)
    from_export = _forecast(capsys, str(_export(tmp_path, "Loss/val", steps, values)), "--key",
                            "Loss/val")
    assert _forecast(capsys, str(logdir), "--key", "Loss/val") == from_export
    (event_file,) = logdir.iterdir()
    assert _forecast(capsys, str(event_file), "--key", "Loss/val") == from_export
    # No loss-like tag and no --key: the error names the series there are.
    assert main([str(logdir)]) == 2
    assert "no loss series among Loss/val, grad_norm" in capsys.readouterr().err


def test_a_wandb_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps, values = _points()
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps({"_step": s, "_timestamp": 1e9 + s, "val_loss": v})
                               + "\n" for s, v in zip(steps, values, strict=True)))
    from_export = _forecast(capsys, str(_export(tmp_path, "val_loss", steps, values)))
    assert _forecast(capsys, str(history)) == from_export


def test_an_mlflow_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps, values = _points(120)
    mlruns = tmp_path / "mlruns"
    code = ("import sys, json, mlflow\n"
            "from mlflow.entities import Metric\n"
            "mlflow.set_tracking_uri(sys.argv[1])\n"
            "steps, values = json.load(sys.stdin)\n"
            "with mlflow.start_run() as run:\n"
            "    for s, v in zip(steps, values): mlflow.log_metric('eval_loss', v, step=s)\n"
            "print(run.info.run_id)\n")
    out = subprocess.run([sys.executable, "-c", code, mlruns.resolve().as_uri()],
                         input=json.dumps([steps, values]), capture_output=True, text=True,
                         check=True, env={**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"},
                         timeout=600)
    run_id = out.stdout.strip().splitlines()[-1]
    from_export = _forecast(capsys, str(_export(tmp_path, "eval_loss", steps, values)))
    assert _forecast(capsys, str(mlruns), "--mlflow-run", run_id) == from_export
