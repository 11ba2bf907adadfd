"""CurvecastPruner(url=...): each trial of a real Optuna study streamed to a real service as a
run, ended as the trial ended, with the pruner's decisions unchanged."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.conftest import require

optuna = require("optuna")

from bench._corpus import load  # noqa: E402
from bench.forecast._sweeps import SweepRun, sweep_run  # noqa: E402
from bench.forecast.pruning import replay  # noqa: E402
from curvecast.integrations._optuna_runs import study_project  # noqa: E402
from curvecast.integrations.optuna import CurvecastPruner  # noqa: E402


def corpus(name: str) -> SweepRun:
    made = sweep_run(load(name))
    assert made is not None
    return made


def sweep(pruner: CurvecastPruner, runs: list[SweepRun], name: str) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, direction="minimize", pruner=pruner)
    for run in runs:
        study.optimize(lambda t, r=run: replay(t, r), n_trials=1, callbacks=[pruner])
    return study


def test_each_trial_is_a_run_that_ends_as_the_trial_did(server: str) -> None:
    good, bad = corpus("d-s-b128-3k"), corpus("s-wd0")  # final eval loss 1.40 against 2.96
    project = f"sweep-{uuid.uuid4().hex[:8]}"
    pruner = CurvecastPruner(url=server, project=project)
    study = sweep(pruner, [good, bad], "lr sweep")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED"]
    # The same decisions as a pruner that streams nothing.
    local = CurvecastPruner()
    sweep(local, [good, bad], "lr sweep")
    assert pruner.decisions == local.decisions

    with httpx.Client(base_url=server, timeout=30) as client:
        runs = {r["name"]: r for r in client.get(
            "/api/v1/runs", params={"project": project}).json()["runs"]}
        assert set(runs) == {"trial 0", "trial 1"}
        done, pruned = runs["trial 0"], runs["trial 1"]
        assert done["status"] == "finished" and done["status_reason"] is None
        assert pruned["status"] == "finished"
        reason = pruned["status_reason"]
        assert reason.startswith("pruned: ") and "chance" in reason
        assert pruned["config"]["total_steps"] == bad.total_steps
        assert pruned["config"]["optuna"] == {"study": "lr sweep", "trial": 1, "params": {}}
        for run, trial in ((done, study.trials[0]), (pruned, study.trials[1])):
            got = client.get(f"/api/v1/runs/{run['id']}/metrics",
                             params={"keys": "eval_loss"}).json()["series"][0]
            reported = sorted(trial.intermediate_values.items())
            assert got["steps"] == [s for s, _ in reported]
            assert got["values"] == pytest.approx([v for _, v in reported])
        # The pruned trial's run stops where the trial did, well before its planned end.
        assert got["steps"][-1] == study.trials[1].last_step < bad.total_steps


def test_a_study_name_that_is_no_project_name_is_made_one() -> None:
    study = optuna.create_study(study_name="lr sweep: width 64/128")
    assert study_project(study) == "lr_sweep_width_64_128"
