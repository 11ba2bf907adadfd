"""Is P(best) calibrated? A reliability table on the recorded sweeps, cut part way through.

Each sweep of recorded runs (the groups ``bench.forecast.pruning`` replays, formed as
:mod:`bench.forecast._sweeps` says: the corpus's runs by model size and length, the two char-LM
sweeps, the public constant-LR and schedule-free groups) is cut at 25%, 50% and 75% of its
runs' length.
Each run's eval loss up to the cut is fitted as the service fits it (its own config: burn-in,
schedule), and :func:`curvecast.service.forecast.chances.chances_best` gives every run its
chance of ending best at the planned end (each band widened to a high quantile of its peers'
widths, as the product does; other quantiles and the bands as they are beside it). Many random
subsets of each sweep (2 to 8
runs, as a compare page or a small sweep holds) make the comparisons; the truth is the run
whose recorded final eval loss is the lowest in its subset. Runs whose fit cannot tell (not
``ok``) get no chance, as in the product; a subset with fewer than two known runs is skipped.

Baseline, in the same run: the same subsets judged by the loss reached at the cut (the lowest
is given 1, the others 0), what a person reading the curves at that moment would pick.
Goal: in every bin of P(best), the fraction that were best within 10 points of the mean chance.

The quantile the product pools widths at was chosen on these sweeps, so the goal is also judged
out of sample: each sweep's chances at the quantile with the lowest Brier score on the other
sweeps (:func:`held_out_choice`).
"""

from __future__ import annotations

import argparse
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from bench._cli import parser, publish
from bench._report import markdown_table, phase
from bench.forecast._sweeps import SweepRun, all_sweeps
from curvecast.service.forecast.chances import (
    PEER_WIDTH_QUANTILE,
    Outlook,
    RunInput,
    chances_best,
    outlook,
)
from curvecast.service.forecast.solver import fit_curve

CUTS = (0.25, 0.5, 0.75)
SUBSETS = 750
QUICK_SUBSETS = 10
#: The subsets are also read as this many independent draws (every fifth subset), for the
#: spread of the largest gap: a few sweeps weigh on a bin, so it moves with the draw.
DRAWS_OF_SUBSETS = 5
SEED = 11
#: The quantiles of the peers' widths a band is pooled to, side by side (None: each run's own
#: band); the shipped :data:`PEER_WIDTH_QUANTILE` is one of them.
QUANTILES: tuple[float | None, ...] = (None, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
#: Bins of P(best): [lo, hi).
BINS = ((0.0, 0.05), (0.05, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 0.95), (0.95, 1.01))
GOAL_POINTS = 10.0


@dataclass(frozen=True)
class Judged:
    """One run of one subset: its chance (by the forecast, as shipped), the naive pick, the
    truth."""

    chance: float
    naive: float
    best: bool
    sweep: str = ""
    #: Which comparison (random subset at a cut) it belongs to: its chances sum to 1.
    subset: int = 0
    #: Its chance with the bands pooled at each of :data:`QUANTILES`, in that order.
    variants: tuple[float, ...] = ()

    def at(self, quantile: float | None) -> Judged:
        """This run with its chance pooled at ``quantile`` (one of :data:`QUANTILES`)."""
        return replace(self, chance=self.variants[QUANTILES.index(quantile)])


def _outlook_at_cut(run: SweepRun, cut: float) -> tuple[Outlook, float]:
    """The run's outlook at its planned end from its points up to ``cut``, and its last loss
    there."""
    upto = cut * run.total_steps
    pairs = [(s, v) for s, v in zip(run.steps, run.values, strict=True) if s <= upto]
    steps, values = [s for s, _ in pairs], [v for _, v in pairs]
    fit = fit_curve(steps, values, config={**run.config, "total_steps": run.total_steps})
    run_input = RunInput(run_id=uuid.uuid5(uuid.NAMESPACE_OID, run.name), name=run.name,
                         status="running", fit=fit, total_steps=run.total_steps,
                         last_step=steps[-1] if steps else None)
    # A fit that is not ``ok`` gives an unknown outlook (its reason), as in the product.
    return outlook(run_input, run.total_steps), values[-1] if values else float("inf")


def judge(groups: dict[str, list[SweepRun]], subsets: int) -> list[Judged]:
    """Every run of every random subset at every cut, with a known chance."""
    rng = random.Random(SEED)
    out: list[Judged] = []
    made = 0
    for name, runs in groups.items():
        for cut in CUTS:
            with phase("pbest_calibration", f"{name} at {cut:.0%}"):
                looks = {r.name: _outlook_at_cut(r, cut) for r in runs}
                for _ in range(subsets):
                    pick = rng.sample(runs, rng.randint(2, min(8, len(runs))))
                    known = [r for r in pick if looks[r.name][0].known]
                    if len(known) < 2:
                        continue
                    ids = [(uuid.uuid5(uuid.NAMESPACE_OID, r.name), looks[r.name][0])
                           for r in known]
                    chances = [chances_best(ids, width_quantile=q) for q in QUANTILES]
                    made += 1
                    truth = min(known, key=lambda r: r.final)
                    leader = min(known, key=lambda r: looks[r.name][1])
                    for r, *ps in zip(known, *chances, strict=True):
                        variants = tuple(float(p) for p in ps if p is not None)
                        if len(variants) == len(QUANTILES):
                            shipped = variants[QUANTILES.index(PEER_WIDTH_QUANTILE)]
                            out.append(Judged(shipped, 1.0 if r is leader else 0.0,
                                              r is truth, name, made, variants))
    return out


class Reliability(NamedTuple):
    """The reliability table, its largest gap (points) between a bin's mean chance and its
    fraction best, and the bin ``(lo, hi)`` where that gap is."""

    rows: list[list[object]]
    worst: float
    worst_bin: tuple[float, float]


def reliability(judged: Sequence[Judged]) -> Reliability:
    """Bin the chances and compare each bin's mean chance with the fraction that were best."""
    rows: list[list[object]] = []
    worst, worst_bin = 0.0, BINS[0]
    for lo, hi in BINS:
        inside = [j for j in judged if lo <= j.chance < hi]
        if not inside:
            rows.append([f"{lo:.0%}–{min(hi, 1.0):.0%}", 0, "-", "-", "-"])
            continue
        mean = float(np.mean([j.chance for j in inside]))
        frac = float(np.mean([j.best for j in inside]))
        gap = abs(mean - frac) * 100
        if gap > worst:
            worst, worst_bin = gap, (lo, hi)
        rows.append([f"{lo:.0%}–{min(hi, 1.0):.0%}", len(inside), f"{mean:.1%}", f"{frac:.1%}",
                     f"{gap:.1f}"])
    return Reliability(rows, worst, worst_bin)


def _brier(values: Sequence[tuple[float, bool]]) -> float:
    return float(np.mean([(p - float(b)) ** 2 for p, b in values]))


def held_out_choice(judged: Sequence[Judged]) -> tuple[list[Judged], list[float | None]]:
    """Each sweep's chances pooled at the quantile (of :data:`QUANTILES`) with the lowest Brier
    score on the other sweeps: the choice of quantile, cross-validated by sweep."""
    # Each sweep's squared errors at every quantile, summed once: a sweep's choice adds up the
    # other sweeps' sums.
    sweeps = list(dict.fromkeys(j.sweep for j in judged))
    errors = {s: np.zeros(len(QUANTILES)) for s in sweeps}
    counts = dict.fromkeys(sweeps, 0)
    for j in judged:
        errors[j.sweep] += (np.asarray(j.variants) - float(j.best)) ** 2
        counts[j.sweep] += 1
    out: list[Judged] = []
    chosen = []
    for sweep in sweeps:
        others = [s for s in sweeps if s != sweep]
        brier = sum(errors[s] for s in others) / sum(counts[s] for s in others)
        best = QUANTILES[int(np.argmin(brier))]
        chosen.append(best)
        out.extend(j.at(best) for j in judged if j.sweep == sweep)
    return out, chosen


def gap_spread(judged: Sequence[Judged]) -> str:
    """The largest gap in each of the :data:`DRAWS_OF_SUBSETS` draws of subsets: "lo–hi"."""
    gaps = [reliability([j for j in judged if j.subset % DRAWS_OF_SUBSETS == k]).worst
            for k in range(DRAWS_OF_SUBSETS)]
    return f"{min(gaps):.1f}–{max(gaps):.1f}"


def _label(quantile: float | None) -> str:
    if quantile is None:
        return "each run's own band (no pooling)"
    name = "median" if quantile == 0.5 else "maximum" if quantile == 1.0 else f"{quantile:.0%}"
    return f"pooled to the peers' {name} width" + (
        " (shipped)" if quantile == PEER_WIDTH_QUANTILE else "")


def candidates(judged: Sequence[Judged]) -> tuple[str, float]:
    """The shipped pooling beside the other quantiles, the bands as they are and the quantile
    chosen out of sample: the largest gap, its spread over draws of subsets, the Brier score,
    and on how many sweeps each lowers or raises the Brier score against the shipped. Also
    the out-of-sample largest gap."""
    held, chosen = held_out_choice(judged)
    sweeps = list(dict.fromkeys(j.sweep for j in judged))

    def brier_of(items: Sequence[Judged], sweep: str | None = None) -> float:
        return _brier([(j.chance, j.best) for j in items if sweep in (None, j.sweep)])

    shipped = {s: brier_of(judged, s) for s in sweeps}

    def row(label: str, items: Sequence[Judged], against: bool = True) -> list[object]:
        mine = {s: brier_of(items, s) for s in sweeps}
        lower = sum(mine[s] < shipped[s] for s in sweeps)
        higher = sum(mine[s] > shipped[s] for s in sweeps)
        return [label, f"{reliability(items).worst:.1f}", gap_spread(items),
                f"{brier_of(items):.4f}", f"{lower} / {higher}" if against else "-"]

    picks = sorted({"none" if q is None else f"{q:g}" for q in chosen})
    rows = [row(_label(PEER_WIDTH_QUANTILE), judged, against=False),
            row(f"the quantile chosen on the other sweeps ({', '.join(picks)}): out of sample",
                held)]
    rows += [row(_label(q), [j.at(q) for j in judged])
             for q in QUANTILES if q != PEER_WIDTH_QUANTILE]
    table = markdown_table(["P(best)", "largest gap (points)",
                            f"over {DRAWS_OF_SUBSETS} draws of subsets", "Brier score",
                            "sweeps where its Brier score is below / above the shipped's"],
                           rows)
    return table, reliability(held).worst


def per_sweep(judged: Sequence[Judged], groups: dict[str, list[SweepRun]],
              worst_bin: tuple[float, float]) -> str:
    """Per sweep: how close its runs end, its Brier score against the baseline's, and its
    chances in the worst bin (mean P(best) against the fraction best): where a gap comes from."""
    lo, hi = worst_bin
    rows = []
    for name, runs in groups.items():
        mine = [j for j in judged if j.sweep == name]
        if not mine:
            continue
        finals = sorted(r.final for r in runs)
        close = sum(f <= finals[0] * 1.005 for f in finals)
        inside = [j for j in mine if lo <= j.chance < hi]
        cell = (f"{len(inside)}: {np.mean([j.chance for j in inside]):.0%} / "
                f"{np.mean([j.best for j in inside]):.0%}" if inside else "-")
        rows.append([name, len(runs), f"{close} of {len(runs)}",
                     f"{_brier([(j.chance, j.best) for j in mine]):.3f}",
                     f"{_brier([(j.naive, j.best) for j in mine]):.3f}", cell])
    bin_name = f"{lo:.0%}–{min(hi, 1.0):.0%}"
    return markdown_table(["sweep", "runs", "runs ending within 0.5% of its best", "Brier",
                           "Brier, leader at the cut",
                           f"chances in the {bin_name} bin: mean P(best) / fraction best"],
                          rows)


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, quick=f"{QUICK_SUBSETS} subsets per sweep and cut")
    args: argparse.Namespace = cli.parse_args(argv)
    groups = all_sweeps()
    subsets = QUICK_SUBSETS if args.quick else SUBSETS
    judged = judge(groups, subsets)
    rows, worst, worst_bin = reliability(judged)
    brier = _brier([(j.chance, j.best) for j in judged])
    naive = _brier([(j.naive, j.best) for j in judged])
    table, held_worst = candidates(judged)
    verdict = "met" if max(worst, held_worst) <= GOAL_POINTS else "NOT met"
    sizes = "; ".join(f"{k} ({len(v)} runs)" for k, v in groups.items())
    body = (f"Sweeps: {sizes}; cut at {', '.join(f'{c:.0%}' for c in CUTS)} of the run; "
            f"{subsets} random subsets of 2–8 runs per sweep and cut; {len(judged):,} chances "
            "(runs whose fit was not `ok` at the cut get none). Truth: the lowest recorded "
            "final eval loss of the subset. Each band is widened to the "
            f"{PEER_WIDTH_QUANTILE:.0%} quantile of its peers' widths, as shipped.\n\n"
            + markdown_table(["P(best)", "chances", "mean P(best)", "fraction best",
                              "gap (points)"], rows)
            + f"\n\nBrier score {brier:.3f} against {naive:.3f} for picking the run with the "
            "lowest loss at the cut (the baseline, same subsets): "
            f"{brier / naive:.2f}x. Goal: every bin within {GOAL_POINTS:g} points, as shipped "
            f"and out of sample: {verdict} (largest gap {worst:.1f} as shipped, "
            f"{held_worst:.1f} out of sample).\n\nPer sweep, where the largest gap comes "
            "from:\n\n"
            + per_sweep(judged, groups, worst_bin)
            + "\n\nThe random subsets reuse each sweep's fits at each cut, so a few sweeps "
            f"weigh on a bin: read as {DRAWS_OF_SUBSETS} draws of {subsets // DRAWS_OF_SUBSETS}"
            f" subsets, the largest gap is {gap_spread(judged)}.\n\n"
            "The quantile of the peers' widths a band is pooled to, side by side. The shipped "
            "one was chosen on these sweeps, so the second row judges the choice out of "
            "sample: each sweep gets the quantile with the lowest Brier score on the other "
            "sweeps.\n\n"
            + table
            + "\n\nA high quantile softens the near-tie sweeps' chances (runs that end within "
            "noise of each other) and costs a little sharpness where one run clearly wins. "
            "The maximum scores about as well on these comparisons of 2–8 runs; the shipped "
            "quantile stops one odd band from setting every band of a large leaderboard.")
    result = (f"P(best) within {worst:.1f} points of the fraction best in every bin, "
              f"{held_worst:.1f} out of sample (goal ≤ {GOAL_POINTS:g}: {verdict}); Brier score "
              f"{brier / naive:.2f}x picking the leader at the cut")
    return publish(args, "pbest_calibration", "P(best) calibration on the recorded sweeps",
                   body, result)
