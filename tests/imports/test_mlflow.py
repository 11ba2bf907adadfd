"""MLflow: runs logged with mlflow.log_metric to a local store (a ``mlruns`` directory, and
MLflow's default ``sqlite:///`` store), imported and compared point by point, timestamps
included; params become the run's config."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from curvecast.service.importers.mlflow_runs import find_runs
from tests.imports.conftest import run_import, stored

LOGGER = r"""
import math, sys
import mlflow
mlflow.set_tracking_uri(sys.argv[1])
mlflow.set_experiment("lm sweep")
with mlflow.start_run(run_name="run-a") as run:
    mlflow.log_params({"total_steps": 400, "c_warmup": "20", "lr": 0.01, "model": "gpt"})
    for step in range(0, int(sys.argv[2]), 3):
        mlflow.log_metric("val_loss", 2.0 / math.sqrt(step + 1) + 1.0, step=step)
        if step % 30 == 0:
            mlflow.log_metric("grad norm", 1.0 + step / 100, step=step)
    for i in range(4):
        mlflow.log_metric("epoch_time", 10.0 + i)      # no step: every point at step 0
print(run.info.run_id)
"""


def log_with_mlflow(tracking_uri: str, steps: int) -> str:
    """Log a run in a child process (MLflow's fluent API keeps global state); its run id."""
    env = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"}
    out = subprocess.run([sys.executable, "-c", LOGGER, tracking_uri, str(steps)], env=env,
                         capture_output=True, text=True, check=True, timeout=600)
    return out.stdout.strip().splitlines()[-1]


def mlflow_points(tracking_uri: str, run_id: str) -> dict[str, list[tuple[int, float, float]]]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    out = {}
    for name in client.get_run(run_id).data.metrics:
        history = client.get_metric_history(run_id, name)
        out[name] = [(m.step, m.value, m.timestamp / 1000) for m in history]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("store", ["mlruns", "sqlite"])
def test_mlflow_round_trip(store: str, database_url: str, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    mlruns = tmp_path / "mlruns"
    uri = mlruns.resolve().as_uri() if store == "mlruns" else f"sqlite:///{tmp_path / 'ml.db'}"
    # The sqlite store commits each log_metric: fewer points there.
    mlflow_run = log_with_mlflow(uri, 300 if store == "mlruns" else 60)
    source = str(mlruns) if store == "mlruns" else uri
    assert run_import("mlflow", source, "--database-url", database_url) == 0
    out = capsys.readouterr().out
    assert "loss: val_loss" in out

    (found,) = find_runs(source)
    run, points = stored(database_url, found.run.run_id)
    expected = mlflow_points(uri, mlflow_run)
    assert set(points) == {"val_loss", "grad_norm", "epoch_time"}
    assert points["val_loss"] == sorted(expected["val_loss"])
    assert points["grad_norm"] == sorted(expected["grad norm"])
    # Logged without steps: numbered in time order, every value kept.
    assert [s for s, _, _ in points["epoch_time"]] == [0, 1, 2, 3]
    assert [v for _, v, _ in points["epoch_time"]] == [10.0, 11.0, 12.0, 13.0]
    assert run.project == "lm_sweep" and run.name == "run-a" and run.status == "finished"
    assert run.config == {"total_steps": 400, "c_warmup": 20, "lr": 0.01, "model": "gpt"}
    assert run.source["run_id"] == mlflow_run and run.source["experiment"] == "lm sweep"
    assert all(math.isfinite(w) for _, _, w in points["val_loss"])

    # Again: the same run, nothing twice.
    assert run_import("mlflow", source, "--database-url", database_url,
                      "--run-id", mlflow_run) == 0
    assert "0 points new" in capsys.readouterr().out
    assert stored(database_url, found.run.run_id)[0].n_points == run.n_points


def test_an_unknown_experiment_is_named(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    mlruns = tmp_path / "mlruns"
    log_with_mlflow(mlruns.resolve().as_uri(), 6)
    assert run_import("mlflow", str(mlruns), "--experiment", "nope", "--database-url",
                      f"sqlite:///{tmp_path / 'x.db'}") == 2
    assert "MLflow has no experiment named or numbered 'nope'" in capsys.readouterr().err
