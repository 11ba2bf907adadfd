"""CurvecastPruner in real Optuna studies (in-memory storage) whose objectives replay the
ScheduleFree+ corpus's recorded runs, and its pure decision on those curves."""

from __future__ import annotations

import importlib
import math
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests import REPO
from tests.conftest import require

optuna = require("optuna")

from bench._corpus import load  # noqa: E402
from bench.forecast._sweeps import SweepRun, charlm, corpus_sweeps, sweep_run  # noqa: E402
from bench.forecast.pruning import replay  # noqa: E402
from curvecast.integrations.optuna import (  # noqa: E402
    _CORRECTED_NOTE,
    CurvecastPruner,
    Finished,
    PruneDecision,
    decide,
)
from curvecast.service.forecast.chances import RunInput, outlook  # noqa: E402
from curvecast.service.forecast.solver import fit_curve  # noqa: E402

GROUP = "corpus 64x2, 3,000 steps"


@pytest.fixture(scope="module")
def group() -> list[SweepRun]:
    return corpus_sweeps()[GROUP]


def corpus(name: str) -> SweepRun:
    made = sweep_run(load(name))
    assert made is not None
    return made


def study_of(runs: list[SweepRun], pruner: CurvecastPruner) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", pruner=pruner)
    for run in runs:
        study.optimize(lambda t, r=run: replay(t, r), n_trials=1)
    return study


def states(study: optuna.Study, runs: list[SweepRun]) -> dict[str, str]:
    return {runs[t.number].name: t.state.name for t in study.trials}


@pytest.mark.parametrize("sweep_correction", [False, True])
def test_the_best_run_of_a_sweep_is_never_pruned(group: list[SweepRun],
                                                 sweep_correction: bool) -> None:
    best = min(group, key=lambda r: r.final)
    pruned_any = False
    for seed in range(4):
        order = group[:]
        random.Random(seed).shuffle(order)
        pruner = CurvecastPruner(sweep_correction=sweep_correction)
        study = study_of(order, pruner)
        got = states(study, order)
        assert got[best.name] == "COMPLETE", (seed, pruner.decisions)
        assert study.best_value == pytest.approx(best.final)
        pruned_any = pruned_any or "PRUNED" in got.values()
        # Every prune was a decision with a chance under the threshold, from a calibrated band.
        for t in study.trials:
            if t.state.name == "PRUNED":
                d = pruner.decisions[t.number]
                assert d.prune and d.fit_status in ("ok", "no_asymptote")
                assert d.chance is not None and d.chance < 0.05
                assert d.step == t.last_step < 3000 and d.steps_saved == 3000 - d.step
    assert pruned_any


def test_a_clearly_bad_run_is_pruned_before_its_end() -> None:
    good, bad = corpus("d-s-b128-3k"), corpus("s-wd0")  # final eval loss 1.40 against 2.96
    pruner = CurvecastPruner()
    study = study_of([good, bad], pruner)
    trial = study.trials[1]
    assert trial.state.name == "PRUNED"
    assert trial.last_step is not None and trial.last_step <= 1500
    decision = pruner.decisions[1]
    assert decision.prune and decision.steps_saved >= 1500
    assert "chance" in decision.reason and decision.best == pytest.approx(good.final)


def test_decaying_schedules_are_off_model_and_kept() -> None:
    """A linear-decay AdamW run the fit calls off_model is never pruned, however far behind."""
    good, decay = corpus("d-s-b128-3k"), corpus("s-adamw-linear-3e-3")
    assert decay.config["lr_schedule"] == "linear"
    pruner = CurvecastPruner()
    study = study_of([good, decay], pruner)
    assert study.trials[1].state.name == "COMPLETE"
    seen = {d.fit_status for d in [pruner.decisions[1]]}
    assert seen == {None}  # its last decision: it reached its planned end
    for k in range(30, len(decay.steps), 10):
        d = decide(decay.steps[:k], decay.values[:k], best=1.0, total_steps=3000,
                   config=decay.config)
        assert not d.prune and d.chance is None and d.fit_status == "off_model"
        assert "learning-rate decay" in d.reason or "shape" in d.reason


def test_no_prune_before_min_progress_nor_without_something_to_beat() -> None:
    bad = corpus("s-wd0")
    cfg = bad.config
    early = decide(bad.steps[:9], bad.values[:9], best=1.0, total_steps=3000, config=cfg)
    assert not early.prune and early.fit_status is None and "too early" in early.reason
    late = decide(bad.steps[:25], bad.values[:25], best=1.0, total_steps=3000, config=cfg)
    assert late.prune and late.fit_status == "ok"
    warm = decide(bad.steps[:25], bad.values[:25], best=1.0, total_steps=3000, config=cfg,
                  n_warmup_steps=2000)
    assert not warm.prune and "n_warmup_steps" in warm.reason
    nothing = decide(bad.steps[:50], bad.values[:50], best=None, total_steps=3000)
    assert not nothing.prune and "no completed trial" in nothing.reason
    no_end = decide(bad.steps[:50], bad.values[:50], best=1.0, total_steps=None)
    assert not no_end.prune and "total_steps" in no_end.reason


def test_flat_and_too_early_fits_keep_the_trial() -> None:
    steps = list(range(100, 3001, 100))
    flat = decide(steps[:20], [2.0 + 0.001 * (i % 3) for i in range(20)], best=1.0,
                  total_steps=3000)
    assert not flat.prune and flat.chance is None and flat.fit_status == "flat"
    run = corpus("d-s-b128-3k")  # c_warmup 600: the transient lasts well past 10%
    statuses = set()
    for k in range(10, 40):
        d = decide(run.steps[:k], run.values[:k], best=0.5, total_steps=3000,
                   config=run.config)
        statuses.add(d.fit_status)
        if d.fit_status not in ("ok", "no_asymptote"):
            assert not d.prune and d.chance is None and d.reason
    assert statuses - {"ok", "no_asymptote", None}


def test_a_run_whose_fit_finds_no_floor_is_judged_by_its_level_carried_on() -> None:
    """no_asymptote: the band that extends the current level prunes a run far above the best,
    and keeps the sweep's best, whose fit also finds no floor for a while."""
    sweep = {r.name: r for r in charlm()["charlm b, 1,000 steps"]}
    best, hopeless = sweep["b-sfp-d96-b64"], sweep["b-sfp-d96-lr2"]  # final 1.53 against 2.56
    assert best.final == min(r.final for r in sweep.values())
    seen = set()
    for k in range(5, len(best.steps)):
        d = decide(best.steps[:k], best.values[:k], best=best.final, total_steps=1000,
                   config=best.config)
        seen.add(d.fit_status)
        assert not d.prune, d
    assert "no_asymptote" in seen
    cut = hopeless.steps.index(400) + 1
    d = decide(hopeless.steps[:cut], hopeless.values[:cut], best=best.final, total_steps=1000,
               config=hopeless.config)
    assert d.fit_status == "no_asymptote" and d.prune and d.chance is not None
    assert "level carried on" in d.reason and d.steps_saved == 600
    # The service's ranking still gives such a run no chance: it cannot say where it ends.
    run = RunInput(run_id=uuid.uuid4(), name="x", status="running", total_steps=1000,
                   last_step=400, fit=fit_curve(list(hopeless.steps[:cut]),
                                                list(hopeless.values[:cut]),
                                                config={**hopeless.config, "total_steps": 1000}))
    assert outlook(run, 1000).chance_below(best.final) is None
    assert outlook(run, 1000, level_extending=True).chance_below(best.final) == d.chance


def test_a_target_replaces_the_best_and_the_threshold_is_honoured() -> None:
    bad = corpus("s-wd0")
    pruner = CurvecastPruner(target=2.5, threshold=0.2)
    study = study_of([bad], pruner)  # no completed trial: the target is what it must beat
    assert study.trials[0].state.name == "PRUNED"
    assert pruner.decisions[0].best == 2.5
    with pytest.raises(ValueError, match="threshold"):
        CurvecastPruner(threshold=0.0)


def test_a_maximizing_study_is_refused() -> None:
    study = optuna.create_study(direction="maximize", pruner=CurvecastPruner(total_steps=10))

    def objective(trial: optuna.Trial) -> float:
        trial.report(1.0, 1)
        trial.should_prune()
        return 1.0

    with pytest.raises(ValueError, match="minimize"):
        study.optimize(objective, n_trials=1)


def test_the_bench_replays_every_candidate_on_the_same_orders() -> None:
    """One order per corpus sweep through the bench's own loop: every candidate gets a study of
    each sweep, the baseline trains everything, and the pruner keeps each sweep's best run."""
    from bench.forecast.pruning import (
        BASELINE,
        DEFAULT,
        MARGIN,
        ORACLE,
        PAIRED,
        overall,
        per_sweep,
        run_all,
    )

    groups = corpus_sweeps()
    outcomes = run_all(groups, 1)
    assert set(outcomes) == {GROUP, "corpus 128x2, 3,000 steps"}
    pooled = overall(outcomes)
    assert {len(got) for got in pooled.values()} == {len(groups)}
    assert all(o.steps == o.baseline_steps and o.regret == 0 for o in pooled[BASELINE])
    ours = pooled[DEFAULT]
    assert all(o.best_survived and o.best_kept and o.steps < o.baseline_steps for o in ours)
    assert "| hyperband |" not in per_sweep(groups, outcomes, [DEFAULT])
    assert "percentile 25" in pooled and "patient median (3)" in pooled
    # The opt-in margin and the paired candidate run on the same orders and keep the best too.
    assert all(o.best_kept for o in pooled[MARGIN] + pooled[PAIRED])
    # The oracle keeps the best and, pruning every loser at 10% of its run, trains no more.
    floor = pooled[ORACLE]
    assert all(o.best_survived and o.regret == 0 for o in floor)
    assert all(f.steps <= o.steps for f, o in zip(floor, ours, strict=True))


def test_a_margin_stops_a_trial_that_can_at_best_tie() -> None:
    # The same run again, 80% of the way: it will end where it did, so beating its own final
    # loss is a coin toss, beating it by 5% is not on the cards.
    run = corpus("d-s-b128-3k")
    cut = next(i for i, s in enumerate(run.steps) if s >= 0.8 * run.total_steps)
    args = (run.steps[:cut], run.values[:cut])
    kw = {"best": run.final, "total_steps": run.total_steps, "config": run.config}
    tie = decide(*args, **kw)
    assert not tie.prune and tie.chance is not None and tie.chance > 0.2
    stopped = decide(*args, **kw, margin=0.05)
    assert stopped.prune and stopped.best == pytest.approx(0.95 * run.final)
    assert f"(5.0% below {run.final:.4g})" in stopped.reason
    with pytest.raises(ValueError, match="margin"):
        decide(*args, **kw, margin=1.0)
    with pytest.raises(ValueError, match="margin"):
        CurvecastPruner(margin=-0.01)


def test_the_pruner_passes_its_margin_to_the_decision() -> None:
    good = corpus("d-s-b128-3k")
    pruner = CurvecastPruner(margin=0.05)
    study = study_of([good, good], pruner)  # the second trial can at best tie the first
    assert study.trials[1].state.name == "PRUNED"
    assert pruner.decisions[1].best == pytest.approx(0.95 * good.final)


class Recording(CurvecastPruner):
    """The pruner, keeping every decision (``decisions`` keeps each trial's latest)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[int, PruneDecision]] = []

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        pruned = super().prune(study, trial)
        self.seen.append((trial.number, self.decisions[trial.number]))
        return pruned


def test_the_sweep_correction_sets_a_trial_against_the_completed_ones(
        group: list[SweepRun]) -> None:
    # Five ScheduleFree+ runs of one model complete; the sixth ends best of them all. With
    # the correction its reports are judged against how the five's forecasts erred, and it
    # still completes; with a target, or off, nothing is corrected.
    ranked = sorted(group, key=lambda r: r.final)
    order = [*ranked[2:7], ranked[1]]
    on = Recording(sweep_correction=True)
    assert states(study_of(order, on), order)[ranked[1].name] == "COMPLETE"
    last = [d for n, d in on.seen if n == len(order) - 1 and d.chance is not None]
    assert any(_CORRECTED_NOTE in d.reason for d in last)
    off = Recording()
    study_of(order, off)
    plain = [d for n, d in off.seen if n == len(order) - 1 and d.chance is not None]
    assert not any(_CORRECTED_NOTE in d.reason for d in plain)
    assert [d.chance for d in last] != [d.chance for d in plain]
    target = Recording(sweep_correction=True, target=ranked[2].final)
    study_of(order, target)
    assert not any(_CORRECTED_NOTE in d.reason for _, d in target.seen)


def test_the_decision_reads_the_completed_trials_it_is_given(group: list[SweepRun]) -> None:
    ranked = sorted(group, key=lambda r: r.final)
    trial, done = ranked[1], ranked[2:7]
    finished = [Finished(r.steps, r.values, r.total_steps, r.final, r.config) for r in done]
    cut = next(i for i, s in enumerate(trial.steps) if s >= 0.6 * trial.total_steps)
    kw = {"best": done[0].final, "total_steps": trial.total_steps, "config": trial.config}
    plain = decide(trial.steps[:cut], trial.values[:cut], **kw)
    fixed = decide(trial.steps[:cut], trial.values[:cut], **kw, finished=finished)
    assert fixed.chance != plain.chance and _CORRECTED_NOTE in fixed.reason
    # One completed trial is no spread of errors: its decision is the plain one.
    assert decide(trial.steps[:cut], trial.values[:cut], **kw, finished=finished[:1]) == plain


# --- RDB storage: several workers on one study ------------------------------------------------

_SECOND_WORKER = """
import sys
import optuna
from bench._corpus import load
from bench.forecast._sweeps import sweep_run
from bench.forecast.pruning import replay
from curvecast.integrations.optuna import CurvecastPruner

optuna.logging.set_verbosity(optuna.logging.WARNING)
pruner = CurvecastPruner()
study = optuna.load_study(study_name="sweep", storage=sys.argv[1], pruner=pruner)
run = sweep_run(load(sys.argv[2]))
study.optimize(lambda t: replay(t, run), n_trials=1)
trial = study.trials[-1]
print(trial.state.name, trial.last_step, pruner.decisions[trial.number].reason)
"""


def test_a_second_worker_on_rdb_storage_prunes_against_the_first_ones_best(
        tmp_path: Path) -> None:
    """Optuna's RDB storage (SQLite) shared by two processes, the way a study scales past one
    machine: the second worker's hopeless trial is pruned against the best trial the first
    worker completed, read back from the database (intermediate values included)."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    first = optuna.create_study(study_name="sweep", storage=storage, direction="minimize",
                                pruner=CurvecastPruner())
    good = corpus("d-s-b128-3k")
    first.optimize(lambda t: replay(t, good), n_trials=1)
    assert first.trials[0].state.name == "COMPLETE"
    worker = subprocess.run([sys.executable, "-c", _SECOND_WORKER, storage, "s-wd0"],
                            capture_output=True, text=True, timeout=240, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert worker.returncode == 0, worker.stderr
    state, last_step, reason = worker.stdout.strip().split(" ", 2)
    assert state == "PRUNED" and int(last_step) <= 1500, worker.stdout
    assert "chance" in reason
    # What the second worker stored is what this process reads: one study, two trials.
    again = optuna.load_study(study_name="sweep", storage=storage)
    assert [t.state.name for t in again.trials] == ["COMPLETE", "PRUNED"]
    assert again.best_value == pytest.approx(good.final)


def test_a_tiny_torch_model_trains_under_the_pruner() -> None:
    """A real objective: a small regression net trained with ScheduleFree+, its eval loss
    (at the averaged weights) reported every 20 steps. The first trial has nothing to beat and
    completes; a second, whose optimizer barely moves (lr scaled down 1,000x), is pruned."""
    torch = require("torch")
    from curvecast import ScheduleFreePlus

    steps = 600
    teacher = torch.nn.Linear(8, 1)
    gen = torch.Generator().manual_seed(0)
    x_val = torch.randn(512, 8, generator=gen)
    y_val = teacher(x_val).detach()

    def objective(trial: optuna.Trial) -> float:
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 1))
        opt = ScheduleFreePlus(model.parameters(), lr=trial.suggest_float("lr", 1e-3, 1.0),
                               warmup_steps=30, c_warmup=45)
        trial.set_user_attr("total_steps", steps)
        trial.set_user_attr("curvecast_config", {"warmup_steps": 30, "c_warmup": 45})
        loss_fn = torch.nn.functional.mse_loss
        data = torch.Generator().manual_seed(2)
        value = math.inf
        for step in range(1, steps + 1):
            x = torch.randn(64, 8, generator=data)
            loss = loss_fn(model(x), teacher(x).detach() + 0.05 * torch.randn(64, 1,
                                                                               generator=data))
            loss.backward()
            opt.step(loss=loss)
            opt.zero_grad()
            if step % 20 == 0:
                with opt.averaged(model), torch.no_grad():
                    value = float(loss_fn(model(x_val), y_val))
                trial.report(value, step)
                if trial.should_prune():
                    raise optuna.TrialPruned()
        return value

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = CurvecastPruner()
    study = optuna.create_study(direction="minimize", pruner=pruner)
    study.enqueue_trial({"lr": 1.0})
    study.enqueue_trial({"lr": 1e-3})
    study.optimize(objective, n_trials=2)
    first, second = study.trials
    assert first.state.name == "COMPLETE"
    assert all(d.prune is False for n, d in pruner.decisions.items() if n == 0)
    assert second.state.name == "PRUNED", pruner.decisions.get(1)
    assert second.last_step is not None and second.last_step < steps


def test_the_old_import_path_still_works_and_says_where_the_pruner_moved() -> None:
    # curvecast.service.integrations.optuna was the 0.2.0 path: the same objects, with a
    # DeprecationWarning naming the new one (a fresh interpreter, so the module is imported
    # afresh and warns).
    code = ("import warnings\nwarnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    import curvecast.service.integrations.optuna\n"
            "except DeprecationWarning as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO, timeout=120)
    assert "moved to curvecast.integrations.optuna" in out.stdout
    with pytest.warns(DeprecationWarning):
        old = importlib.reload(importlib.import_module("curvecast.service.integrations.optuna"))
    assert old.CurvecastPruner is CurvecastPruner and old.decide is decide
