"""How far the pruner's signals go: the least compute any threshold on them keeps the best at.

The pruning bench (``python -m bench run pruning``) has CurvecastPruner train well above the
goal of 0.55x the steps of no pruning while it keeps a run within 0.5% of the best. This bench
asks whether a better rule over the same information would reach the goal, or whether the
information falls short. Each rule runs at a range of thresholds on the same sweeps and trial
orders as the pruning bench (:mod:`bench.forecast._sweeps`, its seed and order count), and its
frontier is read off: the least compute at which it still keeps the best (a run within 0.5% of
the sweep's best final loss finishes) in at least 95% of the orders.

The rules:

* ``curvecast``: the shipped pruner's chance that the trial ends below the best finished trial
  (:func:`~curvecast.integrations.optuna.decide`); at 5% it is the default pruner,
  whose row matches the pruning bench's; ``curvecast, margin 0.5%``: its chance of ending at
  least 0.5% below (the opt-in ``margin=0.005``).
* ``curvecast, 2 reports in a row``: the shipped chance, pruning only when it is under the
  threshold at two reports in a row (a forecast that dips once, with a noisy stretch of the
  loss, prunes nothing).
* ``curvecast, sweep-corrected``: the pruner with ``sweep_correction=True`` (and with the
  margin): the trial's forecast set against the best finished trial's forecast from the same
  fraction of its run, its band scaled to how alike the finished trials' forecasts erred
  (:mod:`curvecast.service.forecast.sweep_correction`).
* ``stack``: a logistic regression over everything a pruner knows when a trial reports: that
  chance (of ending 0.5% below the best), whether the forecast knows, its median's gap to the
  best, the progress, the trial's loss over the best finished trial's at the same fraction of
  their runs, that gap over the spread of the finished trials' losses there, and the spread.
  Its target: the trial ends more than 0.5% below the best. Fitted to every sweep
  (``in-sample``: tuned to the very sweeps it is judged on, an optimistic bound) and leaving
  one sweep out (``held-out``: each sweep judged by the fit to the other sweeps, what a user's
  new sweep would get). The fit weighs each sweep equally; its rows come from
  ``TRAIN_ORDERS`` other random orders, every trial finishing.
* ``oracle``: the pruning bench's floor (knows the final losses); ``oracle where the forecast
  knows``: the same, but deciding only at reports where the pruner's forecast knows (its fit is
  ``ok``; from then on a perfect forecast would decide), with and without the 0.5% margin. What
  separates it from the oracle is the forecast's gate (``too_early``); what separates the rules
  from it is the forecast's precision.

The replay is the pruning bench's protocol without Optuna (a test holds the two equal): the
trials of an order run one after another, reporting their loss at every logged step; from 10%
of its run on, a trial stops at the first report whose chance is under the threshold; the best
is the lowest final loss of the trials that finished.

Usage: ``python -m bench run pruning_frontier [--quick] [--no-write]``.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit

from bench._cli import parser, publish
from bench._report import markdown_table
from bench.forecast import pruning
from bench.forecast._sweeps import SweepRun, all_sweeps
from curvecast.integrations.optuna import (
    DEFAULT_MIN_PROGRESS,
    SWEEP_PEERS,
    _frozen,
    _outlook,
)
from curvecast.service.forecast.chances import Outlook
from curvecast.service.forecast.sweep_correction import Peer, corrected

QUICK_ORDERS = 3
TRAIN_ORDERS = 10
TRAIN_SEED = 11
#: The stack's L2 penalty on its weights (not the intercept), against sweep-weighted log loss.
L2 = 1e-2
KEEP_GOAL = 0.95
COMPUTE_GOAL = 0.55
#: Reports in a row the patient rule asks to be under the threshold.
PATIENCE = 2
KNOWN = "oracle where the forecast knows"
TITLE = "How far the pruner's signals go: the least compute at 95% best kept"
CURVECAST_THRESHOLDS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3)
STACK_THRESHOLDS = (0.002, 0.003, 0.005, 0.007, 0.01, 0.02, 0.05)

#: A rule's chance that a trial is worth finishing: ``(sweep, trial, report index, the finished
#: trials, the best of them)`` to a probability, or None when it does not know (never pruned).
Chance = Callable[[str, SweepRun, int, Sequence[SweepRun], SweepRun], float | None]


def replay(runs: Sequence[SweepRun], order: Sequence[SweepRun], chance: Chance, label: str,
           threshold: float, min_progress: float = DEFAULT_MIN_PROGRESS) -> pruning.Outcome:
    """One study of ``order`` (a shuffle of ``runs``) under ``chance`` at ``threshold``."""
    finished: list[SweepRun] = []
    spent = 0
    for trial in order:
        stopped_at = None
        if finished:
            best = min(finished, key=lambda r: r.final)
            for i, step in enumerate(trial.steps):
                if step < min_progress * trial.total_steps or step >= trial.total_steps:
                    continue
                p = chance(label, trial, i, finished, best)
                if p is not None and p < threshold:
                    stopped_at = step
                    break
        if stopped_at is None:
            spent += trial.total_steps
            finished.append(trial)
        else:
            spent += stopped_at
    truth = min(r.final for r in runs)
    got = min(r.final for r in finished)
    return pruning.Outcome(spent, sum(r.total_steps for r in runs),
                           any(r.final == truth for r in finished),
                           got <= truth * (1 + pruning.KEPT_WITHIN),
                           100 * (got - truth) / abs(truth))


#: Each trial's outlook at each report, kept for the whole run: the pruner's own cache holds
#: fewer entries than the sweeps have reports, and every rule and threshold asks again.
_LOOKS: dict[tuple[int, int], tuple[SweepRun, Outlook]] = {}


def trial_outlook(trial: SweepRun, i: int) -> Outlook:
    """The pruner's outlook of ``trial``'s loss at its planned end from its first ``i + 1``
    reports (what :func:`~curvecast.integrations.optuna.decide` judges from)."""
    key = (id(trial), i)
    if key not in _LOOKS:  # the trial is kept beside its outlook, so its id is not reused
        pairs = tuple((int(s), float(v)) for s, v in zip(trial.steps[:i + 1],
                                                         trial.values[:i + 1], strict=True))
        _LOOKS[key] = trial, _outlook(pairs, trial.total_steps, _frozen(trial.config))[0]
    return _LOOKS[key][1]


def curvecast_chance(label: str, trial: SweepRun, i: int, finished: Sequence[SweepRun],
                     best: SweepRun) -> float | None:
    """The shipped pruner's chance past its ``min_progress`` (its decision at a threshold is
    ``chance < threshold``; a test holds the replay equal to the pruner's)."""
    return trial_outlook(trial, i).chance_below(best.final)


def margin_chance(label: str, trial: SweepRun, i: int, finished: Sequence[SweepRun],
                  best: SweepRun) -> float | None:
    """The pruner's chance with ``margin=0.005``: of ending at least 0.5% below the best."""
    return trial_outlook(trial, i).chance_below(best.final * (1 - pruning.KEPT_WITHIN))


def patient_chance(label: str, trial: SweepRun, i: int, finished: Sequence[SweepRun],
                   best: SweepRun) -> float | None:
    """The highest of the pruner's chances at this report and the ``PATIENCE - 1`` before it: a
    trial is pruned only when ``PATIENCE`` reports in a row say so (one dip prunes none)."""
    if i + 1 < PATIENCE:
        return None
    chances = [curvecast_chance(label, trial, j, finished, best)
               for j in range(i + 1 - PATIENCE, i + 1)]
    return None if None in chances else max(c for c in chances if c is not None)


def sweep_corrected_chance(margin: float = 0.0) -> Chance:
    """The pruner's chance with ``sweep_correction=True`` (and ``margin``): the trial's
    forecast corrected by the finished trials' forecasts from the same fraction of their runs
    (:func:`~curvecast.service.forecast.sweep_correction.corrected`, the pruner's peers: the
    ``SWEEP_PEERS`` that ended lowest), from this bench's cache of outlooks."""
    def chance(label: str, trial: SweepRun, i: int, finished: Sequence[SweepRun],
               best: SweepRun) -> float | None:
        look = trial_outlook(trial, i)
        fraction = trial.steps[i] / trial.total_steps
        peers: list[Peer] = []
        for done in sorted(finished, key=lambda r: r.final)[:SWEEP_PEERS]:
            j = int(np.searchsorted(np.asarray(done.steps) / done.total_steps,
                                    fraction + 1e-12)) - 1
            if j < 0:
                if not peers:  # the best has no report that early
                    break
                continue
            peers.append(Peer(trial_outlook(done, j), done.values[j], done.final))
        fixed = corrected(look, trial.values[i], peers, peers[0]) if peers else None
        return (fixed or look).chance_below(best.final * (1 - margin))
    return chance


def oracle_chance(label: str, trial: SweepRun, i: int, finished: Sequence[SweepRun],
                  best: SweepRun) -> float:
    """1 for a trial that will end below the best, else 0 (the pruning bench's oracle)."""
    return 1.0 if trial.final < best.final else 0.0


def known_oracle_chance(margin: float) -> Chance:
    """The oracle's verdict (the trial ends more than ``margin`` below the best), given only
    at reports where the pruner's forecast knows: the floor of any rule that waits for it."""
    def chance(label: str, trial: SweepRun, i: int, finished: Sequence[SweepRun],
               best: SweepRun) -> float | None:
        if curvecast_chance(label, trial, i, finished, best) is None:
            return None
        return 1.0 if trial.final < best.final * (1 - margin) else 0.0
    return chance


def _log_loss_at(run: SweepRun, fraction: float) -> float | None:
    """The log of ``run``'s loss at ``fraction`` of its run (linear between its reports; None
    before its first)."""
    fractions = np.asarray(run.steps, dtype=np.float64) / run.total_steps
    if fraction < fractions[0]:
        return None
    return float(np.interp(fraction, fractions, np.log(np.asarray(run.values))))


def signals(trial: SweepRun, i: int, finished: Sequence[SweepRun], best: SweepRun
            ) -> list[float] | None:
    """What the stack reads at report ``i`` (module docstring), intercept first; None when the
    best finished trial has no loss at the trial's fraction yet."""
    progress = trial.steps[i] / trial.total_steps
    best_there = _log_loss_at(best, progress)
    if best_there is None:
        return None
    own = math.log(trial.values[i])
    gap = own - best_there
    levels = [x for r in finished if (x := _log_loss_at(r, progress)) is not None] + [own]
    spread = float(np.std(levels)) + 1e-3
    look = trial_outlook(trial, i)
    chance = look.chance_below(best.final * (1 - pruning.KEPT_WITHIN))
    known = chance is not None
    held = min(max(chance if chance is not None else 0.5, 1e-3), 1 - 1e-3)
    median_gap = (math.log(look.value / best.final)
                  if known and look.value is not None and look.value > 0 else 0.0)
    return [1.0, progress, gap / spread, gap, math.log(held / (1 - held)) if known else 0.0,
            float(known), median_gap, math.log(spread)]


@dataclass(frozen=True)
class Rows:
    """The stack's training rows of one sweep: signals and whether the trial ended more than
    0.5% below the best finished trial."""

    x: np.ndarray
    y: np.ndarray


def training_rows(groups: dict[str, list[SweepRun]], orders: int = TRAIN_ORDERS
                  ) -> dict[str, Rows]:
    """Every sweep's rows, from ``orders`` random orders in which every trial finishes."""
    rng = random.Random(TRAIN_SEED)
    out = {}
    for label, runs in groups.items():
        xs, ys = [], []
        for _ in range(orders):
            order = runs[:]
            rng.shuffle(order)
            for j, trial in enumerate(order[1:], 1):
                best = min(order[:j], key=lambda r: r.final)
                for i, step in enumerate(trial.steps):
                    if (step < DEFAULT_MIN_PROGRESS * trial.total_steps
                            or step >= trial.total_steps):
                        continue
                    if (x := signals(trial, i, order[:j], best)) is not None:
                        xs.append(x)
                        ys.append(float(trial.final < best.final * (1 - pruning.KEPT_WITHIN)))
        out[label] = Rows(np.asarray(xs), np.asarray(ys))
    return out


def fit_stack(rows: Sequence[Rows]) -> np.ndarray:
    """Logistic regression weights over ``rows``, each sweep weighing the same."""
    x = np.vstack([r.x for r in rows])
    y = np.concatenate([r.y for r in rows])
    w = np.concatenate([np.full(len(r.y), 1.0 / len(r.y)) for r in rows])

    def loss(b: np.ndarray) -> tuple[float, np.ndarray]:
        z = x @ b
        grad = x.T @ (w * (expit(z) - y))
        grad[1:] += 2 * L2 * b[1:]
        return float((w * (np.logaddexp(0.0, z) - y * z)).sum() + L2 * b[1:] @ b[1:]), grad

    return np.asarray(minimize(loss, np.zeros(x.shape[1]), jac=True, method="L-BFGS-B").x)


def stack_chance(weights: dict[str, np.ndarray]) -> Chance:
    """The stack's chance, with ``weights[sweep]`` the fit that judges that sweep."""
    def chance(label: str, trial: SweepRun, i: int, finished: Sequence[SweepRun],
               best: SweepRun) -> float | None:
        x = signals(trial, i, finished, best)
        return None if x is None else float(expit(np.asarray(x) @ weights[label]))
    return chance


@dataclass(frozen=True)
class Row:
    """One rule at one threshold over every sweep."""

    rule: str
    threshold: float | None
    by_sweep: dict[str, list[pruning.Outcome]]

    @property
    def all(self) -> list[pruning.Outcome]:
        return [o for got in self.by_sweep.values() for o in got]

    @property
    def compute(self) -> float:
        return statistics.mean(o.fraction for o in self.all)

    @property
    def kept(self) -> float:
        return sum(o.best_kept for o in self.all) / len(self.all)

    def worst_sweep(self) -> tuple[str, float]:
        return min(((label, sum(o.best_kept for o in got) / len(got))
                    for label, got in self.by_sweep.items()), key=lambda t: t[1])


def run_rule(groups: dict[str, list[SweepRun]], orders: int, rule: str, chance: Chance,
             threshold: float | None) -> Row:
    """``chance`` at ``threshold`` (None: the oracle's 0/1) in the pruning bench's orders."""
    cut = 0.5 if threshold is None else threshold
    by_sweep = {label: [replay(groups[label], order, chance, label, cut) for order in shuffled]
                for label, shuffled in pruning.trial_orders(groups, orders)}
    made = Row(rule, threshold, by_sweep)
    print(f"{rule} at {'-' if threshold is None else f'{threshold:.1%}'}: compute "
          f"{made.compute:.2f}, best kept {made.kept:.1%}", file=sys.stderr, flush=True)
    return made


def frontier(rows: Sequence[Row]) -> dict[str, Row | None]:
    """Per rule, its row of least compute that keeps the best in ``KEEP_GOAL`` of the orders."""
    out: dict[str, Row | None] = {}
    for row in rows:
        out.setdefault(row.rule, None)
        if row.kept >= KEEP_GOAL and ((now := out[row.rule]) is None
                                      or row.compute < now.compute):
            out[row.rule] = row
    return out


def _row_cells(row: Row) -> list[object]:
    label, worst = row.worst_sweep()
    regrets = [o.regret for o in row.all]
    return [row.rule, "-" if row.threshold is None else f"{row.threshold:.1%}",
            f"{row.compute:.2f}", f"{row.kept:.1%}",
            "100% (every sweep)" if worst == 1.0 else f"{worst:.0%} ({label})",
            f"{float(np.percentile(regrets, 90)):.2f}%"]


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, quick=f"{QUICK_ORDERS} orders per sweep")
    args = cli.parse_args(argv)
    orders = QUICK_ORDERS if args.quick else pruning.ORDERS
    groups = all_sweeps()
    train_orders = 2 if args.quick else TRAIN_ORDERS
    train = training_rows(groups, train_orders)
    everything = fit_stack(list(train.values()))
    in_sample = dict.fromkeys(groups, everything)
    held_out = {label: fit_stack([r for k, r in train.items() if k != label])
                for label in groups}
    rows = [run_rule(groups, orders, "curvecast", curvecast_chance, t)
            for t in CURVECAST_THRESHOLDS]
    rows += [run_rule(groups, orders, "curvecast, margin 0.5%", margin_chance, t)
             for t in CURVECAST_THRESHOLDS]
    rows += [run_rule(groups, orders, f"curvecast, {PATIENCE} reports in a row", patient_chance,
                      t) for t in CURVECAST_THRESHOLDS]
    rows += [run_rule(groups, orders, "curvecast, sweep-corrected", sweep_corrected_chance(), t)
             for t in CURVECAST_THRESHOLDS]
    rows += [run_rule(groups, orders, "curvecast, sweep-corrected, margin 0.5%",
                      sweep_corrected_chance(pruning.KEPT_WITHIN), t)
             for t in CURVECAST_THRESHOLDS]
    rows += [run_rule(groups, orders, "stack, in-sample", stack_chance(in_sample), t)
             for t in STACK_THRESHOLDS]
    rows += [run_rule(groups, orders, "stack, held-out", stack_chance(held_out), t)
             for t in STACK_THRESHOLDS]
    floors = [run_rule(groups, orders, "oracle", oracle_chance, None),
              run_rule(groups, orders, KNOWN, known_oracle_chance(0.0), None),
              run_rule(groups, orders, f"{KNOWN}, margin 0.5%",
                       known_oracle_chance(pruning.KEPT_WITHIN), None)]
    rows += floors
    best = frontier(rows)
    table = markdown_table(["rule", "threshold", "compute (x none)", "best kept (0.5%)",
                            "worst sweep: best kept", "p90 regret"],
                           [_row_cells(r) for r in rows])
    frontier_cells: list[list[object]] = [[rule, "none keeps the best in 95%" if row is None else
                       f"{row.compute:.2f} (threshold {row.threshold or 0:.1%}, best kept "
                       f"{row.kept:.1%}, worst sweep {row.worst_sweep()[1]:.0%})"]
                      for rule, row in best.items() if not rule.startswith("oracle")]
    reached = [rule for rule, row in best.items() if not rule.startswith("oracle")
               and row is not None and row.compute <= COMPUTE_GOAL]
    verdict = (f"reached by {', '.join(reached)}" if reached else
               "reached neither by the shipped chances at any of these thresholds, nor with "
               "their forecast corrected by the sweep's finished trials, nor by a logistic "
               "stack of the signals, even one fitted to these very sweeps")
    body = ("Least compute keeping the best in at least 95% of the orders:\n\n"
            + markdown_table(["rule", "least compute at >= 95% kept"], frontier_cells)
            + f"\n\nEvery rule and threshold:\n\n{table}\n\n"
            f"{len(groups)} sweeps, {orders} orders each (the pruning bench's); the stack's "
            f"weights fitted to {train_orders} other orders per sweep in which every trial "
            "finishes. Compute: steps trained against no pruning (mean over studies); best "
            "kept: a run within 0.5% of the sweep's best final loss finished; worst sweep: the "
            "sweep where the rule keeps the best least often: what a rule saves past the "
            "shipped 5% it saves by losing some sweep's best in many of its orders. "
            f"Deciding perfectly, but only at the reports where the forecast knows (its fit is "
            f"`ok`), trains {floors[1].compute:.2f}x ({floors[2].compute:.2f}x pruning the "
            f"trials that can at best tie) against the oracle's {floors[0].compute:.2f}x: the "
            "forecast's gate costs little; what keeps the rules above the goal is how precise "
            "the forecast is at those reports, even narrowed by the sweep's finished trials. "
            "The goal (compute <= "
            f"{COMPUTE_GOAL:.2f}x with the best kept in >= 95%): {verdict}.")
    parts = [f"{rule} {row.compute:.2f}x" for rule, row in best.items()
             if not rule.startswith("oracle") and row is not None]
    result = (f"least compute keeping the best in >= 95% of orders: {'; '.join(parts)} "
              f"(oracle {floors[0].compute:.2f}x; deciding only where the forecast knows "
              f"{floors[1].compute:.2f}x, {floors[2].compute:.2f}x with the margin; goal "
              f"{COMPUTE_GOAL:.2f}x: {verdict})")
    return publish(args, "pruning_frontier", TITLE, body, result)


if __name__ == "__main__":
    raise SystemExit(main())
