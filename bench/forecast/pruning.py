"""Pruning a sweep: CurvecastPruner against Optuna's pruners, replaying recorded sweeps.

The sweeps (:mod:`bench.forecast._sweeps` says how each group was formed): the ScheduleFree+
corpus's runs grouped by model size and steps, the two char-LM sweeps (``python -m bench run
charlm_sweeps``), and the public constant-LR and schedule-free groups (MultiPowerLaw, Schaipp et
al.'s 124M lr sweep, AlgoPerf's schedule-free AdamW per workload). Each sweep is replayed in
``ORDERS`` random trial orders; each order is a real Optuna study (in-memory storage) whose
trials report the run's loss at every logged step and ask ``should_prune()``, with each pruner:

* ``curvecast``: :class:`~curvecast.integrations.optuna.CurvecastPruner` (its defaults:
  5% threshold, no pruning before 10% of the run), the run's config as the hook logs it
  (``lr_schedule`` named for the decaying AdamW runs, which the fit then calls ``off_model``);
  ``curvecast 1%``, ``curvecast 20%``: thresholds beside the default, for the trade-off;
* Optuna's: ``median`` at its defaults and with ``n_startup_trials=2``, ``percentile 25``
  (``PercentilePruner(25)``), ``successive halving``, ``hyperband``
  (``HyperbandPruner(max_resource=total_steps)``), ``patient median``
  (``PatientPruner(MedianPruner(), patience=PATIENCE)``: the median's verdict only after
  ``PATIENCE`` reports without improvement);
* ``none``: ``NopPruner``, the baseline;
* ``curvecast, margin 0.5%``: the opt-in ``CurvecastPruner(margin=0.005)`` prunes a trial
  unlikely to end at least 0.5% below the best (one that can at best tie is stopped);
* ``curvecast, sweep-corrected``: the opt-in ``CurvecastPruner(sweep_correction=True)`` sets
  the trial's forecast against the best completed trial's forecast from the same fraction of
  its run, its band scaled to how alike the completed trials' forecasts erred
  (:mod:`curvecast.service.forecast.sweep_correction`); also with the margin;
* a candidate tried and not shipped: ``curvecast, paired`` moves the value to beat by half the
  best completed trial's own forecast error at the same fraction of its run (a control
  variate: the forecast errors of one sweep's runs correlate);
* ``oracle``: not a pruner anyone can run: it knows each trial's final loss and prunes, at the
  first report from 10% of the run on (the default ``min_progress``), every trial that will
  not end below the best completed one. Any pruner that waits that long trains at least as
  much: the floor of this protocol, where the trials that end best so far must finish.

Measured per study: the steps trained (a pruned trial's up to its last report) as a fraction of
the baseline's (the sweep's full compute); whether a run within 0.5% of the sweep's best final
loss finished (the "best kept"; a run that close is as good a pick); the regret (the study's best
value less the sweep's best final loss, in % of the latter). Reported, per pruner over all
sweeps and per sweep: the mean compute fraction, its inverse (the speed-up against no pruning,
beside LC-PFN's published 2-6x), how often the best was kept, the median and p90 regret. A
sweep's "top-2 gap" (the second-best final loss over the best) says when its runs end within
noise of each other.

Usage: ``python -m bench run pruning [--quick] [--orders N] [--no-write]``; the public curves
are read from ``../shared/curves`` or ``$CURVECAST_CURVES_DIR``.
"""

from __future__ import annotations

import functools
import random
import statistics
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import optuna

from bench._cli import parser, publish
from bench._report import anchor, markdown_table
from bench.forecast._sweeps import SweepRun, all_sweeps
from curvecast.integrations.optuna import (
    DEFAULT_MIN_PROGRESS,
    CurvecastPruner,
    PruneDecision,
    _frozen,
    _outlook,
    decide,
)

ORDERS = 40
MIN_ORDERS = 20
QUICK_ORDERS = 2
SEED = 7
#: A finished run this close to the sweep's best final loss counts as the best kept.
KEPT_WITHIN = 0.005
PATIENCE = 3
DEFAULT = "curvecast (5%, the default)"
MARGIN = "curvecast, margin 0.5% (opt-in)"
SWEPT = "curvecast, sweep-corrected (opt-in)"
SWEPT_MARGIN = "curvecast, sweep-corrected, margin 0.5% (opt-in)"
PAIRED = "curvecast, paired (not shipped)"
#: The share of the best trial's forecast error the paired candidate corrects for.
PAIRED_BETA = 0.5
BASELINE = "none (NopPruner)"
ORACLE = "oracle (knows the final losses; the floor)"
#: LC-PFN's published speed-up of its pruning against no pruning (Adriaensen et al., 2023).
LCPFN = "2-6x"


def replay(trial: optuna.Trial, run: SweepRun) -> float:
    """The objective of a replayed run: report every logged loss, stop when pruned."""
    trial.set_user_attr("total_steps", run.total_steps)
    trial.set_user_attr("curvecast_config", run.config)
    trial.set_user_attr("run", run.name)
    trial.set_user_attr("final", run.final)
    for step, value in zip(run.steps, run.values, strict=True):
        trial.report(value, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return run.final


@dataclass(frozen=True)
class Outcome:
    """One study: steps trained, whether the best (or a run within 0.5% of it) finished, the
    regret in % of the best final loss."""

    steps: int
    baseline_steps: int
    best_survived: bool
    best_kept: bool
    regret: float
    #: CurvecastPruner only: the fit statuses (not ``ok``) of trials whose last decision was a
    #: fit that could not tell, so the trial ran on.
    unknown: tuple[str, ...] = ()

    @property
    def fraction(self) -> float:
        return self.steps / self.baseline_steps


def study(runs: list[SweepRun], pruner: optuna.pruners.BasePruner) -> Outcome:
    """Replay ``runs`` in this order through one study with ``pruner``."""
    made = optuna.create_study(direction="minimize", pruner=pruner,
                               sampler=optuna.samplers.RandomSampler(seed=0))
    for run in runs:
        made.optimize(functools.partial(replay, run=run), n_trials=1)
    spent = 0
    finished: list[SweepRun] = []
    for t in made.trials:
        run = runs[t.number]
        if t.state == optuna.trial.TrialState.COMPLETE:
            spent += run.total_steps
            finished.append(run)
        else:
            spent += t.last_step or 0
    best = min(runs, key=lambda r: r.final)
    statuses = [str(getattr(d.fit_status, "value", d.fit_status))
                for d in getattr(pruner, "decisions", {}).values()
                if d.chance is None and d.fit_status is not None]
    unknown = tuple(st for st in statuses if st != "ok")
    return Outcome(spent, sum(r.total_steps for r in runs),
                   any(r.name == best.name for r in finished),
                   any(r.final <= best.final * (1 + KEPT_WITHIN) for r in finished),
                   100 * (made.best_value - best.final) / abs(best.final), unknown)


class OraclePruner(optuna.pruners.BasePruner):
    """The floor (module docstring): prunes, from ``min_progress`` of the run on, every trial
    whose final loss (the user attribute ``final`` :func:`replay` sets) is not below the best
    completed trial's."""

    def __init__(self, min_progress: float = DEFAULT_MIN_PROGRESS) -> None:
        self.min_progress = min_progress

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step, total = trial.last_step, trial.user_attrs["total_steps"]
        if step is None or step < self.min_progress * total:
            return False
        done = [t.value for t in study.get_trials(
            deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)) if t.value is not None]
        return bool(done) and trial.user_attrs["final"] >= min(done)


class PairedPruner(CurvecastPruner):
    """A candidate: the value to beat divided by ``(final / forecast) ** beta`` of the best
    completed trial, its forecast made from its reports up to the same fraction of its run as
    the trial's: where that forecast was optimistic, the trial's likely is too."""

    def __init__(self, beta: float = PAIRED_BETA) -> None:
        super().__init__()
        self.beta = beta

    def decide(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> PruneDecision:
        attrs, reported = trial.user_attrs, trial.intermediate_values
        best = self.best(study)
        if best is not None and trial.last_step is not None:
            top = min((t for t in study.get_trials(deepcopy=False,
                                                   states=(optuna.trial.TrialState.COMPLETE,))
                       if t.value is not None), key=lambda t: t.value or 0.0)
            total = top.user_attrs["total_steps"]
            upto = trial.last_step / attrs["total_steps"] * total
            pairs = tuple(sorted((s, v) for s, v in top.intermediate_values.items() if s <= upto))
            if pairs:  # the pruner's own cached fit and outlook of those reports
                look, status = _outlook(pairs, total,
                                        _frozen(top.user_attrs["curvecast_config"]))
                if status == "ok" and look.value is not None and look.value > 0 and best > 0:
                    best /= (best / look.value) ** self.beta
        return decide(list(reported), list(reported.values()), best=best,
                      total_steps=attrs["total_steps"], config=attrs["curvecast_config"])


def pruners(total_steps: int) -> dict[str, Callable[[], optuna.pruners.BasePruner]]:
    """The candidates, each a fresh pruner per study."""
    p = optuna.pruners
    return {
        DEFAULT: lambda: CurvecastPruner(),
        "curvecast 1%": lambda: CurvecastPruner(threshold=0.01),
        "curvecast 20%": lambda: CurvecastPruner(threshold=0.2),
        MARGIN: lambda: CurvecastPruner(margin=KEPT_WITHIN),
        SWEPT: lambda: CurvecastPruner(sweep_correction=True),
        SWEPT_MARGIN: lambda: CurvecastPruner(sweep_correction=True, margin=KEPT_WITHIN),
        PAIRED: PairedPruner,
        "median": lambda: p.MedianPruner(),
        "median, 2 startup trials": lambda: p.MedianPruner(n_startup_trials=2),
        "percentile 25": lambda: p.PercentilePruner(25.0),
        "successive halving": lambda: p.SuccessiveHalvingPruner(),
        "hyperband": lambda: p.HyperbandPruner(max_resource=total_steps),
        f"patient median ({PATIENCE})": _patient_median,
        BASELINE: lambda: p.NopPruner(),
        ORACLE: OraclePruner,
    }


def _patient_median() -> optuna.pruners.BasePruner:
    """``PatientPruner(MedianPruner(), patience=PATIENCE)``: Optuna marks it experimental and
    warns each time one is made, once per study here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.pruners.PatientPruner(optuna.pruners.MedianPruner(), patience=PATIENCE)


Outcomes = dict[str, dict[str, list[Outcome]]]  # sweep -> pruner -> one per order


def trial_orders(groups: dict[str, list[SweepRun]], orders: int
                 ) -> Iterator[tuple[str, list[list[SweepRun]]]]:
    """Each sweep with its ``orders`` random trial orders, drawn from :data:`SEED`: every
    pruner here, and every rule of the pruning-frontier bench, replays these same orders."""
    rng = random.Random(SEED)
    for label, group in groups.items():
        shuffled = []
        for _ in range(orders):
            order = group[:]
            rng.shuffle(order)
            shuffled.append(order)
        yield label, shuffled


def run_all(groups: dict[str, list[SweepRun]], orders: int) -> Outcomes:
    """Every candidate on every sweep in ``orders`` random orders (the same orders for each)."""
    out: Outcomes = {}
    for label, shuffled in trial_orders(groups, orders):
        got = out.setdefault(label, {})
        for order in shuffled:
            for name, make in pruners(order[0].total_steps).items():
                got.setdefault(name, []).append(study(order, make()))
        print(f"{label}: {len(groups[label])} runs, {orders} orders", file=sys.stderr,
              flush=True)
    return out


def _p90(values: Sequence[float]) -> float:
    return float(np.percentile(values, 90))


def summary_row(got: Sequence[Outcome]) -> list[object]:
    """Compute, speed-up, best kept, best itself kept, median and p90 regret."""
    fraction = statistics.mean(o.fraction for o in got)
    regrets = [o.regret for o in got]
    return [f"{fraction:.2f}", f"{1 / fraction:.2f}x",
            f"{sum(o.best_kept for o in got) / len(got):.0%}",
            f"{sum(o.best_survived for o in got) / len(got):.0%}",
            f"{statistics.median(regrets):.2f}%", f"{_p90(regrets):.2f}%"]


SUMMARY_HEAD = ["compute (x none)", "speed-up", "best kept (0.5%)", "the best itself finished",
                "median regret", "p90 regret"]


def overall(outcomes: Outcomes) -> dict[str, list[Outcome]]:
    """Every study of every sweep, by pruner."""
    pooled: dict[str, list[Outcome]] = {}
    for by_pruner in outcomes.values():
        for name, got in by_pruner.items():
            pooled.setdefault(name, []).extend(got)
    return pooled


def top2_gap(runs: Sequence[SweepRun]) -> float:
    """The second-best final loss over the best, in %."""
    finals = sorted(r.final for r in runs)
    return 100 * (finals[1] - finals[0]) / abs(finals[0])


def why_short(runs: Sequence[SweepRun], got: Sequence[Outcome]) -> str:
    """In words, where the default curvecast pruner falls short on a sweep (loses the best in
    more than 5% of the orders, or saves under 10% of the compute), and the sweep's shape that
    explains it; "" otherwise."""
    kept = sum(o.best_kept for o in got) / len(got)
    finals = sorted(r.final for r in runs)
    close = sum(f <= finals[0] * (1 + KEPT_WITHIN) for f in finals)
    gap = top2_gap(runs)
    fraction = statistics.mean(o.fraction for o in got)
    if kept >= 0.95 and fraction < 0.9:
        return ""
    if kept >= 0.95:
        what = f"saves {1 - fraction:.0%} of the compute"
        if close >= len(runs) / 2:
            return (f"{what}: {close} of {len(runs)} runs end within 0.5% of the best "
                    "(within noise): nothing to prune")
        statuses = sorted({s for o in got for s in o.unknown})
        if statuses:
            unknown = statistics.mean(len(o.unknown) for o in got)
            return (f"{what}: {unknown:.1f} trials per study run on because their fit cannot "
                    f"tell ({', '.join(statuses)}), though they end well above the best")
        return f"{what}: its losers stay within reach of the best until late"
    what = f"best kept {kept:.0%}"
    if close >= 3:
        return f"{what}: {close} runs end within 0.5% of the best (within noise)"
    if gap < 1.0:
        return f"{what}: the top two end {gap:.2f}% apart"
    return f"{what}: the best run's curve is not ahead before it ends (top-2 gap {gap:.1f}%)"


def per_sweep(groups: dict[str, list[SweepRun]], outcomes: Outcomes,
              shown: Sequence[str]) -> str:
    """One row per sweep: its size, top-2 gap, and compute / best kept of ``shown`` pruners."""
    rows = []
    for label, by_pruner in outcomes.items():
        runs = groups[label]
        cells = [f"{statistics.mean(o.fraction for o in by_pruner[n]):.2f} / "
                 f"{sum(o.best_kept for o in by_pruner[n]) / len(by_pruner[n]):.0%}"
                 for n in shown]
        rows.append([label, len(runs), f"{top2_gap(runs):.2f}%", *cells,
                     why_short(runs, by_pruner[DEFAULT]) or "-"])
    return markdown_table(["sweep", "runs", "top-2 gap", *shown, "where curvecast falls short"],
                          rows)


def full_per_sweep(outcomes: Outcomes) -> str:
    """Every pruner on every sweep (printed, not written)."""
    rows = [[label, name, *summary_row(got)]
            for label, by_pruner in outcomes.items() for name, got in by_pruner.items()]
    return markdown_table(["sweep", "pruner", *SUMMARY_HEAD], rows)


def candidates_note(pooled: dict[str, list[Outcome]]) -> str:
    """What the opt-in margin and the candidate not shipped bought, against the default, in
    words."""
    from bench.forecast import pruning_frontier as frontier  # it imports this module

    def compute(name: str) -> float:
        return statistics.mean(o.fraction for o in pooled[name])

    def finished(name: str) -> str:
        return f"{sum(o.best_survived for o in pooled[name]) / len(pooled[name]):.0%}"

    def kept(name: str) -> str:
        return f"{sum(o.best_kept for o in pooled[name]) / len(pooled[name]):.0%}"

    return (f"The opt-in sweep correction trains {compute(SWEPT):.2f}x, "
            f"{compute(SWEPT_MARGIN):.2f}x with the 0.5% margin (best kept {kept(SWEPT)}, "
            f"{kept(SWEPT_MARGIN)}), the margin alone {compute(MARGIN):.2f}x and the paired "
            f"candidate (half the best's error, no width) {compute(PAIRED):.2f}x, against the "
            f"default's {compute(DEFAULT):.2f}x; the best run itself finishes in "
            f"{finished(SWEPT)}, {finished(SWEPT_MARGIN)}, {finished(MARGIN)} and "
            f"{finished(PAIRED)} of the studies against {finished(DEFAULT)}. None comes near "
            "the floor: the distance to it is the forecast's width at the reports where it "
            "knows (bands too wide to tell runs apart), not how long it stays `too_early`; "
            "the sweep's finished trials narrow it where they erred alike (AlgoPerf's seed "
            "repeats), little elsewhere. Whether any threshold, or a rule fitted to these "
            f"sweeps, gets closer: [{frontier.TITLE}](#{anchor(frontier.TITLE)}).")


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, quick=f"{QUICK_ORDERS} orders per sweep")
    cli.add_argument("--orders", type=int, default=ORDERS,
                     help=f"random trial orders per sweep ({ORDERS}; at least {MIN_ORDERS} to "
                          "write BENCHMARKS.md)")
    args = cli.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    orders = QUICK_ORDERS if args.quick else args.orders
    if orders < MIN_ORDERS:
        args.no_write = True
    groups = all_sweeps()
    outcomes = run_all(groups, orders)
    pooled = overall(outcomes)
    summary = markdown_table(["pruner", *SUMMARY_HEAD],
                             [[name, *summary_row(got)] for name, got in pooled.items()])
    shown = [DEFAULT, SWEPT_MARGIN, "median", "percentile 25", "hyperband",
             f"patient median ({PATIENCE})", ORACLE]
    sweeps_table = per_sweep(groups, outcomes, shown)
    n_studies = len(pooled[DEFAULT])
    body = (f"{summary}\n\nPer sweep (compute x none / best kept within 0.5%):\n\n{sweeps_table}"
            f"\n\n{len(groups)} sweeps ({sum(len(v) for v in groups.values())} runs; "
            "`bench/forecast/_sweeps.py` says how each was grouped), each replayed in "
            f"{orders} random trial orders through real Optuna studies ({n_studies} studies per "
            "pruner); a trial reports its loss at every logged point (every 1-2.5% of the run). "
            "Compute: steps trained against no pruning, the mean over studies; speed-up is its "
            f"inverse (LC-PFN publishes {LCPFN}). Best kept: a run within 0.5% of the sweep's "
            "best final loss finished. Regret: the study's best final loss less the sweep's "
            "best, in % of it. Top-2 gap: the sweep's second-best final loss over its best. "
            "The oracle is the floor of this protocol: the trials that end best so far must "
            "finish, and it prunes every other one at 10% of its run. The losing candidates "
            "stay in the tables. The forecast's calibration tables were measured on curves "
            "that include the public sweeps' and the corpus's runs (in-sample for them; the "
            "char-LM sweeps are out of sample). " + candidates_note(pooled))
    ours = pooled[DEFAULT]
    fraction = statistics.mean(o.fraction for o in ours)
    kept = sum(o.best_kept for o in ours) / len(ours)
    swept = pooled[SWEPT_MARGIN]
    result = (f"CurvecastPruner trains {fraction:.2f}x the steps of no pruning "
              f"({1 / fraction:.1f}x speed-up; LC-PFN {LCPFN}); a run within 0.5% of the best "
              f"finished in {kept:.0%} of {len(ours)} studies over {len(groups)} sweeps; with "
              f"the opt-in sweep correction and margin "
              f"{statistics.mean(o.fraction for o in swept):.2f}x, best kept in "
              f"{sum(o.best_kept for o in swept) / len(swept):.0%}; the "
              f"floor (an oracle that knows the final losses) trains "
              f"{statistics.mean(o.fraction for o in pooled[ORACLE]):.2f}x")
    return publish(args, "pruning", "Pruning a sweep: CurvecastPruner against Optuna's pruners",
                   body, result, details=full_per_sweep(outcomes))


if __name__ == "__main__":
    raise SystemExit(main())
