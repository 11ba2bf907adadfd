"""W&B: a run's history as W&B's ``history()`` DataFrame exports it (CSV) and as
``scan_history()`` rows dumped to JSON lines, with gaps (metrics logged at some steps only),
a media column and W&B's own columns; imported and compared point by point."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from curvecast.service.importers.wandb_history import history_file, read_curves
from tests.imports.conftest import Points, run_import, stored

T0 = 1_700_000_000.0


def history_rows(n: int) -> list[dict[str, object]]:
    """The rows W&B records: every step has _step/_runtime/_timestamp; train/loss every
    step, eval/loss every 10th, an image every 25th, a flag (not a metric) on some."""
    rows: list[dict[str, object]] = []
    for step in range(n):
        row: dict[str, object] = {"_step": step, "_runtime": step * 0.25,
                                  "_timestamp": T0 + step * 0.25,
                                  "train/loss": 3.0 / math.sqrt(step + 1) + 1.0}
        if step % 10 == 0:
            row["eval/loss"] = 2.5 / math.sqrt(step + 1) + 1.0
            row["lr"] = 0.001
        if step % 25 == 0:
            row["samples"] = {"_type": "image-file", "path": f"media/{step}.png"}
            row["converged"] = False
        rows.append(row)
    return rows


def expected_points(rows: list[dict[str, object]]) -> Points:
    out: Points = {}
    for row in rows:
        for key in ("train/loss", "eval/loss", "lr"):
            if key in row:
                out.setdefault(key, []).append((int(row["_step"]), float(row[key]),  # type: ignore[arg-type]
                                                float(row["_timestamp"])))  # type: ignore[arg-type]
    return out


def write(rows: list[dict[str, object]], path: Path) -> Path:
    if path.suffix == ".csv":
        # What run.history() gives and .to_csv() writes: NaN (empty) where a metric was not
        # logged, and the frame's index as a first, unnamed column.
        pd.DataFrame(rows).to_csv(path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_wandb_round_trip(suffix: str, database_url: str, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    rows = history_rows(500)
    path = write(rows, tmp_path / f"history{suffix}")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"_wandb": {"value": {"cli_version": "0.19"}},
                                  "total_steps": {"desc": None, "value": 1000},
                                  "optimizer": {"desc": None, "value": "adamw"}}))
    assert run_import("wandb", str(path), "--run-path", "team/proj/abc123", "--config",
                      str(config), "--batch-points", "160", "--database-url", database_url) == 0
    assert "loss: eval/loss" in capsys.readouterr().out
    history = history_file(path, run_path="team/proj/abc123")
    run, points = stored(database_url, history.run.run_id)
    assert points == expected_points(rows)
    assert run.name == "abc123" and run.status == "finished"
    assert run.config == {"total_steps": 1000, "optimizer": "adamw"}
    assert run.source == {**run.source, "kind": "wandb", "run_path": "team/proj/abc123",
                          "path": str(path.resolve())}

    assert run_import("wandb", str(path), "--run-path", "team/proj/abc123",
                      "--database-url", database_url) == 0
    assert "0 points new" in capsys.readouterr().out
    assert stored(database_url, history.run.run_id)[0].n_points == run.n_points


def test_history_without_a_step_column_says_which_to_name(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    path = tmp_path / "h.csv"
    pd.DataFrame({"global_step": [0, 1, 2], "loss": [3.0, 2.0, 1.5]}).to_csv(path, index=False)
    db = f"sqlite:///{tmp_path / 'x.db'}"
    assert run_import("wandb", str(path), "--database-url", db) == 2
    assert "no '_step' column" in capsys.readouterr().err
    assert read_curves(path, step_column="global_step")["loss"] == ([0.0, 1.0, 2.0],
                                                                   [3.0, 2.0, 1.5])
