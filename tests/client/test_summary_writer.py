"""``curvecast.SummaryWriter``: the same training code, once with torch's SummaryWriter (read
back from its event files by the importer) and once with curvecast's (read back from a real
server), stores the same series, steps, values and wall times."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from torch.utils.tensorboard import SummaryWriter as TorchWriter

import curvecast
from curvecast.service.importers import KeyMap
from curvecast.service.importers.events import find_runs

WALL0 = 1_750_000_000.0


def train(writer_class: Any, log_dir: str, **kwargs: Any) -> Any:
    """Code written for TensorBoard: only the class changes."""
    writer = writer_class(log_dir, **kwargs)
    weights = torch.zeros(3)
    for step in range(60):
        loss = torch.tensor(3.0 / math.sqrt(step + 1) + 1.0)
        writer.add_scalar("Loss/train", loss, global_step=step, walltime=WALL0 + step)
        writer.add_scalar("learning rate", 0.01, step, walltime=WALL0 + step)
        if step % 10 == 0:
            writer.add_scalars("Loss", {"val": 2.0 / math.sqrt(step + 1) + 1.0,
                                        "test": np.float64(1.5)}, step, walltime=WALL0 + step)
            writer.add_histogram("weights", weights, step)
    writer.close()
    return writer


def event_points(log_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    out: dict[str, list[tuple[int, float, float]]] = {}
    for run in find_runs(log_dir):
        for checkpoint in run.checkpoints(KeyMap(), 10_000):
            for chunk in checkpoint.chunks:
                # add_scalars writes each tag to a run of its own (Loss_val/...) under the tag
                # "Loss": name it as curvecast does, main_tag/tag.
                key = chunk.key if run.run.name == log_dir.name else \
                    f"{chunk.key}/{run.run.name.split('_', 1)[1]}"
                assert chunk.wall_times is not None
                out.setdefault(key, []).extend(zip(chunk.steps.tolist(), chunk.values.tolist(),
                                                   chunk.wall_times.tolist(), strict=True))
    return {key: sorted(points) for key, points in out.items()}


def server_points(url: str, run_id: str) -> dict[str, list[tuple[int, float, float]]]:
    series = httpx.get(f"{url}/api/v1/runs/{run_id}/metrics").raise_for_status().json()["series"]
    # torch stores a scalar as float32: compare at that precision.
    return {s["key"]: [(step, float(np.float32(v)), w) for step, v, w in
                       zip(s["steps"], s["values"], s["wall_time"], strict=True)]
            for s in series}


def test_switching_the_import_line_keeps_every_point(sqlite_server: str, tmp_path: Path,
                                                     spool_dir: Path) -> None:
    train(TorchWriter, str(tmp_path / "exp1"))
    with pytest.warns(RuntimeWarning, match="add_histogram\\(\\) does nothing"):
        writer = train(curvecast.SummaryWriter, "runs/exp1", url=sqlite_server,
                       project="tb", spool_dir=spool_dir)
    expected = event_points(tmp_path / "exp1")
    assert set(expected) == {"Loss/train", "learning_rate", "Loss/val", "Loss/test"}
    assert server_points(sqlite_server, writer.run_id) == expected
    run = httpx.get(f"{sqlite_server}/api/v1/runs/{writer.run_id}").json()
    assert (run["name"], run["project"], run["status"]) == ("runs/exp1", "tb", "finished")


def test_steps_without_global_step_and_hparams(sqlite_server: str, spool_dir: Path) -> None:
    with curvecast.SummaryWriter(url=sqlite_server, spool_dir=spool_dir,
                                 config={"fit_key": "val_loss"}) as writer:
        for value in (3.0, 2.0, 1.5):
            writer.add_scalar("val loss", value)          # steps 0, 1, 2
        writer.add_scalar("val loss", 1.2, global_step=10)
        writer.add_scalar("val loss", 1.1)                # step 11
        writer.add_hparams({"lr": 0.1, "layers": 4}, {"hparam/score": 0.9})
        writer.flush()
        points = server_points(sqlite_server, writer.run_id)
        assert writer.get_logdir().startswith("runs")
    assert [(s, v) for s, v, _ in points["val_loss"]] == [
        (0, 3.0), (1, 2.0), (2, 1.5), (10, float(np.float32(1.2))), (11, float(np.float32(1.1)))]
    assert [v for _, v, _ in points["hparam/score"]] == [float(np.float32(0.9))]
    run = httpx.get(f"{sqlite_server}/api/v1/runs/{writer.run_id}").json()
    assert run["config"] == {"fit_key": "val_loss", "lr": 0.1, "layers": 4}


def test_import_curvecast_stays_light(tmp_path: Path) -> None:
    code = ("import sys, curvecast\n"
            "assert 'curvecast.client.summary_writer' not in sys.modules\n"
            "w = curvecast.SummaryWriter\n"
            "print(sorted({'torch', 'numpy', 'tensorboard'} & set(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    assert out.stdout.strip() == "[]"
