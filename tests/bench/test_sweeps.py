"""The sweeps the pruning and P(best) benches replay: the char-LM sweeps as recorded, and the
public-curve groups formed from a small curves file written here in the public file's format."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

from bench.forecast._sweeps import MAX_REPORTS, charlm, public_sweeps, thin


def test_the_charlm_sweeps_hold_at_least_twelve_runs_of_one_length_each() -> None:
    groups = charlm()
    assert set(groups) == {"charlm a, 1,200 steps", "charlm b, 1,000 steps"}
    for label, runs in groups.items():
        assert len(runs) >= 12, label
        assert len({r.total_steps for r in runs}) == 1
        assert all(r.steps[-1] == r.total_steps and math.isfinite(r.final) for r in runs)
        optimizers = {r.config["optimizer"] for r in runs}
        assert {"sfplus", "sf_adamw", "adamw_const"} <= optimizers
        assert all("lr_schedule" not in r.config for r in runs)  # constant or schedule-free


def test_thin_keeps_evenly_spaced_points_and_the_last() -> None:
    steps, values = list(range(1, 301)), [1.0 / s for s in range(1, 301)]
    kept_s, kept_v = thin(steps, values)
    assert len(kept_s) == MAX_REPORTS and kept_s[0] == 1 and kept_s[-1] == 300
    assert kept_v[-1] == values[-1]
    assert thin([1, 2], [3.0, 2.0]) == ((1, 2), (3.0, 2.0))


def _write_curves(folder: Path, curves: dict[str, list[tuple[int, float]]]) -> None:
    with gzip.open(folder / "all_curves_long.csv.gz", "wt", encoding="utf-8") as out:
        out.write("curve,schedule,step,loss\n")
        for name, points in curves.items():
            for step, loss in points:
                out.write(f"{name},schedule-free,{float(step)},{loss}\n")


def test_public_groups_are_one_task_each_cut_at_the_shortest_run(tmp_path: Path) -> None:
    def curve(end: int, c: float) -> list[tuple[int, float]]:
        return [(s, c + 1.0 / math.sqrt(s)) for s in range(100, end + 1, 100)]

    base = "algoperf_sf/v05_schedule_free_adamw_wmt_pytorch_study_{}_trial_1:validation/loss"
    _write_curves(tmp_path, {
        base.format(0): curve(5000, 1.60),
        base.format(1): curve(4000, 1.59),
        "algoperf_sf/v06_schedule_free_adamw_v2_wmt_pytorch_study_0_trial_1:validation/loss":
            curve(4500, 1.58),
        base.format(2): [(100, 2.0), (200, float("nan"))],  # diverged: left out
        base.format(0).replace("validation", "train"): curve(5000, 1.0),  # not validation
        "algoperf_sf/v05_schedule_free_adamw_wmt_glu_tanh_pytorch_study_0_trial_1:"
        "validation/loss": curve(5000, 1.5),  # another model
        "mpl/25M_constant_24000": curve(3000, 3.3),
        "mpl/100M_constant_24000": curve(3000, 3.0),
        "mpl/400M_constant_24000": curve(3000, 2.8),
        "mpl/400M_constant_72000": curve(9000, 2.7),
    })
    groups = public_sweeps(tmp_path)
    assert set(groups) == {"algoperf SF wmt", "mpl constant-LR, 24k steps"}
    wmt = groups["algoperf SF wmt"]
    assert len(wmt) == 3
    assert {r.total_steps for r in wmt} == {4000}
    assert all(r.steps[-1] == 4000 and len(r.steps) <= MAX_REPORTS for r in wmt)
    assert min(wmt, key=lambda r: r.final).name.startswith("v06_")
    assert all(r.config == {"total_steps": 4000} for r in wmt)
    assert len(groups["mpl constant-LR, 24k steps"]) == 3


def test_no_public_curves_means_no_public_groups(tmp_path: Path) -> None:
    assert public_sweeps(tmp_path) == {}
