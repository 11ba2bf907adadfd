"""Pruning a sweep: CurvecastPruner against Optuna's pruners, replaying our recorded runs.

The sweeps: the ScheduleFree+ corpus's runs (``bench/data/sfplus_corpus``) grouped by model size
and planned steps (the same model trained with different hyper-parameters and optimizers, as a
sweep would), groups of five runs or more, runs whose loss diverged left out. Each group is
replayed in ``ORDERS`` random trial orders; each order is a real Optuna study (in-memory
storage) whose trials report the run's eval loss at every logged step and ask
``should_prune()``, with each pruner:

* ``curvecast``: :class:`~curvecast.service.integrations.optuna.CurvecastPruner` (its defaults:
  5% threshold, no pruning before 10% of the run), the run's config as the hook logs it
  (``lr_schedule`` named for the decaying AdamW runs, which the fit then calls ``off_model``);
* ``curvecast 1%``, ``curvecast 20%``: thresholds beside the default, for the trade-off;
* ``median``, ``successive halving``, ``hyperband``: Optuna's, at their defaults
  (``HyperbandPruner(max_resource=total_steps)``);
* ``none``: no pruning, the baseline.

Measured per study: the steps trained (a pruned trial's up to its last report), as a fraction of
the baseline's; whether the group's best run (lowest final eval loss) finished; the regret (the
study's best value less the group's best final loss). Reported: the mean step fraction, how
often the best survived, the median and worst regret over every study.

Usage: ``python -m bench run pruning [--quick] [--no-write]``
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna

from bench._cli import parser, publish
from bench._corpus import CorpusRun, load, names
from bench._report import markdown_table
from curvecast.service.integrations.optuna import CurvecastPruner

ORDERS = 40
QUICK_ORDERS = 2
MIN_GROUP = 5
SEED = 7
KEY = "eval_loss"
#: The schedule the hook would log for the corpus's decaying AdamW runs.
SCHEDULES = {"adamw_linear": "linear", "adamw_cosine": "cosine"}


@dataclass(frozen=True)
class SweepRun:
    """One recorded run as a trial replays it."""

    name: str
    steps: tuple[int, ...]
    values: tuple[float, ...]
    total_steps: int
    config: dict[str, Any]

    @property
    def final(self) -> float:
        return self.values[-1]


def sweep_run(run: CorpusRun) -> SweepRun | None:
    """The run as a trial, or None when its eval loss has non-finite values (diverged)."""
    if KEY not in run.series:
        return None
    steps, values = run.series[KEY]
    if not all(math.isfinite(v) for v in values):
        return None
    config = dict(run.config)
    if (schedule := SCHEDULES.get(str(config.get("optimizer")))) is not None:
        config["lr_schedule"] = schedule
    return SweepRun(run.name, tuple(int(s) for s in steps), tuple(float(v) for v in values),
                    run.total_steps, config)


def sweeps(min_group: int = MIN_GROUP) -> dict[str, list[SweepRun]]:
    """The corpus's runs by ``d_model x n_layers, steps``, groups of ``min_group`` or more."""
    groups: dict[str, list[SweepRun]] = {}
    for name in names():
        run = load(name)
        made = sweep_run(run)
        if made is None:
            continue
        c = run.meta["config"]
        groups.setdefault(f"{c['d_model']}x{c['n_layers']}, {made.total_steps:,} steps",
                          []).append(made)
    return {k: v for k, v in groups.items() if len(v) >= min_group}


def replay(trial: optuna.Trial, run: SweepRun) -> float:
    """The objective of a replayed run: report every logged eval loss, stop when pruned."""
    trial.set_user_attr("total_steps", run.total_steps)
    trial.set_user_attr("curvecast_config", run.config)
    trial.set_user_attr("run", run.name)
    for step, value in zip(run.steps, run.values, strict=True):
        trial.report(value, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return run.final


@dataclass(frozen=True)
class Outcome:
    """One study: steps trained, whether the best run finished, the regret."""

    steps: int
    baseline_steps: int
    best_survived: bool
    regret: float


def study(runs: list[SweepRun], pruner: optuna.pruners.BasePruner) -> Outcome:
    """Replay ``runs`` in this order through one study with ``pruner``."""
    made = optuna.create_study(direction="minimize", pruner=pruner,
                               sampler=optuna.samplers.RandomSampler(seed=0))
    for run in runs:
        made.optimize(lambda t, r=run: replay(t, r), n_trials=1)
    spent = 0
    for t in made.trials:
        run = runs[t.number]
        spent += run.total_steps if t.state == optuna.trial.TrialState.COMPLETE else (
            t.last_step or 0)
    best = min(runs, key=lambda r: r.final)
    finished = {runs[t.number].name for t in made.trials
                if t.state == optuna.trial.TrialState.COMPLETE}
    return Outcome(spent, sum(r.total_steps for r in runs), best.name in finished,
                   made.best_value - best.final)


def pruners(total_steps: int) -> dict[str, Callable[[], optuna.pruners.BasePruner]]:
    """The candidates, each a fresh pruner per study."""
    return {
        "curvecast (5%, the default)": lambda: CurvecastPruner(),
        "curvecast 1%": lambda: CurvecastPruner(threshold=0.01),
        "curvecast 20%": lambda: CurvecastPruner(threshold=0.2),
        "median": lambda: optuna.pruners.MedianPruner(),
        "successive halving": lambda: optuna.pruners.SuccessiveHalvingPruner(),
        "hyperband": lambda: optuna.pruners.HyperbandPruner(max_resource=total_steps),
        "none (baseline)": lambda: optuna.pruners.NopPruner(),
    }


def run_all(orders: int) -> tuple[dict[str, list[Outcome]], dict[str, int]]:
    """Every candidate on every group in ``orders`` random orders (the same orders for each)."""
    outcomes: dict[str, list[Outcome]] = {}
    sizes: dict[str, int] = {}
    rng = random.Random(SEED)
    for label, group in sweeps().items():
        sizes[label] = len(group)
        for _ in range(orders):
            order = group[:]
            rng.shuffle(order)
            for name, make in pruners(order[0].total_steps).items():
                outcomes.setdefault(name, []).append(study(order, make()))
        print(f"{label}: {len(group)} runs, {orders} orders", file=sys.stderr, flush=True)
    return outcomes, sizes


def table(outcomes: dict[str, list[Outcome]]) -> str:
    rows = []
    for name, got in outcomes.items():
        fraction = statistics.mean(o.steps / o.baseline_steps for o in got)
        survived = sum(o.best_survived for o in got) / len(got)
        regrets = [o.regret for o in got]
        rows.append([name, f"{fraction:.2f}", f"{survived:.0%}",
                     f"{statistics.median(regrets):.3f}", f"{max(regrets):.3f}"])
    return markdown_table(["pruner", "steps (x none)", "best run finished", "median regret",
                           "worst regret"], rows)


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, quick=f"{QUICK_ORDERS} orders per group").parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    orders = QUICK_ORDERS if args.quick else ORDERS
    outcomes, sizes = run_all(orders)
    groups = "; ".join(f"{k} ({n} runs)" for k, n in sizes.items())
    body = (f"{table(outcomes)}\n\nThe corpus's sweeps ({groups}), each replayed in {orders} "
            "random trial orders through real Optuna studies; a trial reports its eval loss "
            "every 1% of the run. Steps: trained, against no pruning. Regret: the study's best "
            "final eval loss less the sweep's best. The losing candidates stay in the table.")
    ours = outcomes["curvecast (5%, the default)"]
    base = statistics.mean(o.steps / o.baseline_steps for o in ours)
    survived = sum(o.best_survived for o in ours) / len(ours)
    result = (f"CurvecastPruner trains {base:.2f}x the steps of no pruning; the best run "
              f"finished in {survived:.0%} of {len(ours)} studies")
    return publish(args, "pruning", "Pruning a sweep: CurvecastPruner against Optuna's pruners",
                   body, result)


if __name__ == "__main__":
    raise SystemExit(main())
