"""The pruning-frontier bench: its replay without Optuna is the pruning bench's study with
Optuna (same steps trained, same trials finished), and its frontier picks the least compute
that still keeps the best often enough."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from tests.conftest import require

optuna = require("optuna")

from bench.forecast import pruning  # noqa: E402
from bench.forecast._sweeps import SweepRun, corpus_sweeps  # noqa: E402
from bench.forecast.pruning_frontier import (  # noqa: E402
    Row,
    Rows,
    curvecast_chance,
    fit_stack,
    frontier,
    known_oracle_chance,
    oracle_chance,
    patient_chance,
    replay,
    sweep_corrected_chance,
)
from curvecast.integrations.optuna import CurvecastPruner  # noqa: E402


def _sweep_corrected_pruner() -> CurvecastPruner:
    return CurvecastPruner(sweep_correction=True)


def test_the_replay_trains_what_an_optuna_study_with_the_pruner_trains() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    runs = corpus_sweeps()["corpus 64x2, 3,000 steps"][:8]
    pruned_any = False
    for seed in range(2):
        order = runs[:]
        random.Random(seed).shuffle(order)
        for chance, make in ((curvecast_chance, CurvecastPruner),
                             (sweep_corrected_chance(), _sweep_corrected_pruner),
                             (oracle_chance, pruning.OraclePruner)):
            fast = replay(runs, order, chance, "corpus", threshold=0.05)
            real = pruning.study(order, make())
            assert (fast.steps, fast.best_kept, fast.best_survived) == (
                real.steps, real.best_kept, real.best_survived), (seed, make)
            assert fast.regret == pytest.approx(real.regret)
            pruned_any = pruned_any or fast.fraction < 1.0
    assert pruned_any  # the comparison covered pruned trials, not only finished ones


def _outcomes(fraction: float, kept: float, n: int = 20) -> list[pruning.Outcome]:
    keep = round(kept * n)
    return [pruning.Outcome(round(100 * fraction), 100, i < keep, i < keep, 0.0)
            for i in range(n)]


def test_the_frontier_is_the_least_compute_that_keeps_the_best_in_95_percent() -> None:
    rows = [Row("rule", 0.01, {"a": _outcomes(0.8, 1.0), "b": _outcomes(0.8, 1.0)}),
            Row("rule", 0.05, {"a": _outcomes(0.6, 1.0), "b": _outcomes(0.6, 0.9)}),  # 95%
            Row("rule", 0.2, {"a": _outcomes(0.4, 0.9), "b": _outcomes(0.4, 0.9)}),  # 90%
            Row("never", 0.5, {"a": _outcomes(0.3, 0.5)})]
    best = frontier(rows)
    assert best["never"] is None
    chosen = best["rule"]
    assert chosen is not None and chosen.threshold == 0.05
    assert chosen.compute == pytest.approx(0.6) and chosen.kept == pytest.approx(0.95)
    label, kept = chosen.worst_sweep()
    assert label == "b" and kept == pytest.approx(0.9)


def test_the_stack_learns_which_way_a_signal_points_with_each_sweep_weighed_the_same() -> None:
    # Two sweeps: in one a high second signal means "ends best" (400 rows), in the other, a
    # tenth of the size, it means nothing. The fit follows the signal, and the small sweep
    # still moves it (weighed as much as the large one).
    rng = np.random.default_rng(0)

    def rows(n: int, informative: bool) -> Rows:
        x = np.column_stack([np.ones(n), rng.normal(size=n)])
        y = (x[:, 1] > 0) if informative else rng.random(n) < 0.5
        return Rows(x, y.astype(float))

    big, small = rows(400, True), rows(40, False)
    alone = fit_stack([big])
    both = fit_stack([big, small])
    assert alone[1] > 1.0 and 0.0 < both[1] < alone[1]


def test_the_oracle_where_the_forecast_knows_waits_for_an_ok_fit() -> None:
    # Early reports of a run are too_early (the oracle already decides there, this one does
    # not); later ones get the oracle's verdict, with the margin moving the bar.
    runs = corpus_sweeps()["corpus 64x2, 3,000 steps"]
    trial, best = sorted(runs, key=lambda r: r.final)[1:3]  # trial ends below best
    waiting = known_oracle_chance(0.0)
    verdicts = [waiting("corpus", trial, i, [best], best) for i in range(len(trial.steps))]
    assert verdicts[0] is None and oracle_chance("corpus", trial, 0, [best], best) == 1.0
    known = [i for i, v in enumerate(verdicts) if v is not None]
    assert known and all(verdicts[i] == 1.0 for i in known)
    # With a margin wider than the gap between the two, the trial can at best tie: pruned.
    gap = 1 - trial.final / best.final
    tie = known_oracle_chance(gap + 0.01)
    assert tie("corpus", trial, known[0], [best], best) == 0.0


def test_the_patient_rule_needs_two_reports_in_a_row() -> None:
    runs = corpus_sweeps()["corpus 64x2, 3,000 steps"]
    trial, best = sorted(runs, key=lambda r: r.final)[1:3]
    assert patient_chance("corpus", trial, 0, [best], best) is None  # no report before it
    judged = 0
    for i in range(1, len(trial.steps)):
        pair = [curvecast_chance("corpus", trial, j, [best], best) for j in (i - 1, i)]
        got = patient_chance("corpus", trial, i, [best], best)
        if None in pair:
            assert got is None
        else:
            assert got == max(p for p in pair if p is not None)
            judged += 1
    assert judged > 0


def _final_times(run: SweepRun, factor: float) -> SweepRun:
    """``run`` ending ``factor`` times lower or higher: its forecasts before the end unchanged."""
    return replace(run, values=(*run.values[:-1], run.values[-1] * factor))


def test_the_sweep_corrected_chance_compares_forecasts_made_at_the_same_point() -> None:
    # Corrected by the best finished trial's error, the trial's chance compares its forecast
    # with the best's forecast from the same fraction of its run: where every finished trial
    # ends 3% lower (their errors' spread unchanged) the shipped chance moves, this one not.
    runs = sorted(corpus_sweeps()["corpus 64x2, 3,000 steps"], key=lambda r: r.final)
    trial, finished = runs[1], runs[2:7]
    lower = [_final_times(r, 0.97) for r in finished]
    corrected, judged = sweep_corrected_chance(), 0
    for i in range(len(trial.steps) - 1):  # the replay judges no trial at its planned end
        got = corrected("corpus", trial, i, finished, finished[0])
        plain = curvecast_chance("corpus", trial, i, finished, finished[0])
        moved = corrected("corpus", trial, i, lower, lower[0])
        if got is None:
            assert plain is None
        elif got != plain:  # corrected at this report
            judged += 1
            assert moved == pytest.approx(got, abs=1e-9)
            assert curvecast_chance("corpus", trial, i, lower, lower[0]) != plain
    assert judged > 0
    # One finished trial has no spread of errors to scale by: the shipped chance.
    alone = [corrected("corpus", trial, i, finished[:1], finished[0])
             for i in range(len(trial.steps))]
    assert alone == [curvecast_chance("corpus", trial, i, finished[:1], finished[0])
                     for i in range(len(trial.steps))]
