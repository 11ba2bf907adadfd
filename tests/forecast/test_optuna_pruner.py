"""CurvecastPruner in real Optuna studies (in-memory storage) whose objectives replay the
ScheduleFree+ corpus's recorded runs, and its pure decision on those curves."""

from __future__ import annotations

import importlib
import random

import pytest

from tests.conftest import IN_CI

if IN_CI:  # the dev extra installs optuna: missing there is a failure
    optuna = importlib.import_module("optuna")
else:
    optuna = pytest.importorskip("optuna")

from bench._corpus import load  # noqa: E402
from bench.forecast.pruning import SweepRun, replay, sweep_run, sweeps  # noqa: E402
from curvecast.service.integrations.optuna import CurvecastPruner, decide  # noqa: E402

GROUP = "64x2, 3,000 steps"


@pytest.fixture(scope="module")
def group() -> list[SweepRun]:
    return sweeps()[GROUP]


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


def test_the_best_run_of_a_sweep_is_never_pruned(group: list[SweepRun]) -> None:
    best = min(group, key=lambda r: r.final)
    pruned_any = False
    for seed in range(4):
        order = group[:]
        random.Random(seed).shuffle(order)
        pruner = CurvecastPruner()
        study = study_of(order, pruner)
        got = states(study, order)
        assert got[best.name] == "COMPLETE", (seed, pruner.decisions)
        assert study.best_value == pytest.approx(best.final)
        pruned_any = pruned_any or "PRUNED" in got.values()
        # Every prune was a decision with a chance under the threshold, from an ok fit.
        for t in study.trials:
            if t.state.name == "PRUNED":
                d = pruner.decisions[t.number]
                assert d.prune and d.fit_status == "ok"
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
        if d.fit_status != "ok":
            assert not d.prune and d.chance is None and d.reason
    assert statuses - {"ok", None}


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
    """One order per sweep through the bench's own loop: every candidate gets a study of each
    sweep, the baseline trains everything, and the pruner keeps each sweep's best run."""
    from bench.forecast.pruning import run_all, table

    outcomes, sizes = run_all(1)
    assert set(sizes) == {GROUP, "128x2, 3,000 steps"}
    assert {len(got) for got in outcomes.values()} == {len(sizes)}
    assert all(o.steps == o.baseline_steps and o.regret == 0
               for o in outcomes["none (baseline)"])
    ours = outcomes["curvecast (5%, the default)"]
    assert all(o.best_survived and o.steps < o.baseline_steps for o in ours)
    assert "| hyperband |" in table(outcomes)
