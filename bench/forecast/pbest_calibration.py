"""Is P(best) calibrated? A reliability table on the recorded sweeps, cut part way through.

Each sweep of recorded runs (the groups ``bench.forecast.pruning`` replays, formed as
:mod:`bench.forecast._sweeps` says: the corpus's runs by model size and length, the two char-LM
sweeps, the public constant-LR and schedule-free groups) is cut at 25%, 50% and 75% of its
runs' length.
Each run's eval loss up to the cut is fitted as the service fits it (its own config: burn-in,
schedule), and :func:`curvecast.service.forecast.chances.chances_best` gives every run its
chance of ending best at the planned end (each band widened to its peers' median width, as the
product does; the bands as they are beside it). Many random subsets of each sweep (2 to 8
runs, as a compare page or a small sweep holds) make the comparisons; the truth is the run
whose recorded final eval loss is the lowest in its subset. Runs whose fit cannot tell (not
``ok``) get no chance, as in the product; a subset with fewer than two known runs is skipped.

Baseline, in the same run: the same subsets judged by the loss reached at the cut (the lowest
is given 1, the others 0), what a person reading the curves at that moment would pick.
Goal: in every bin of P(best), the fraction that were best within 10 points of the mean chance.
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
from curvecast.service.forecast.chances import Outlook, RunInput, chances_best, outlook
from curvecast.service.forecast.solver import fit_curve

CUTS = (0.25, 0.5, 0.75)
SUBSETS = 750
QUICK_SUBSETS = 10
#: The subsets are also read as this many independent draws (every fifth subset), for the
#: spread of the largest gap: a few sweeps weigh on a bin, so it moves with the draw.
DRAWS_OF_SUBSETS = 5
SEED = 11
#: The temperatures the candidate recalibration chooses from (:func:`held_out_temperature`).
TEMPERATURES = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.7, 2.0)
#: Bins of P(best): [lo, hi).
BINS = ((0.0, 0.05), (0.05, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 0.95), (0.95, 1.01))
GOAL_POINTS = 10.0


@dataclass(frozen=True)
class Judged:
    """One run of one subset: its chance (by the forecast), the naive pick, the truth."""

    chance: float
    naive: float
    best: bool
    sweep: str = ""
    #: Which comparison (random subset at a cut) it belongs to: its chances sum to 1.
    subset: int = 0
    #: Its chance from each run's own band, without
    #: :func:`~curvecast.service.forecast.chances.pooled_widths`.
    unpooled: float = float("nan")


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
                    chances = chances_best(ids)
                    own = chances_best(ids, pool_widths=False)
                    made += 1
                    truth = min(known, key=lambda r: r.final)
                    leader = min(known, key=lambda r: looks[r.name][1])
                    for r, p, q in zip(known, chances, own, strict=True):
                        if p is not None and q is not None:
                            out.append(Judged(p, 1.0 if r is leader else 0.0, r is truth,
                                              name, made, q))
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


def tempered(judged: Sequence[Judged], temperature: float) -> list[Judged]:
    """The candidate recalibration: each comparison's chances raised to ``1 / temperature``
    and renormalised (above 1, less extreme; the order of the runs is kept)."""
    by_subset: dict[int, list[Judged]] = {}
    for j in judged:
        by_subset.setdefault(j.subset, []).append(j)
    out = []
    for group in by_subset.values():
        q = np.clip([j.chance for j in group], 1e-4, 1.0) ** (1.0 / temperature)
        out.extend(replace(j, chance=float(c)) for j, c in zip(group, q / q.sum(), strict=True))
    return out


def held_out_temperature(judged: Sequence[Judged]) -> tuple[list[Judged], list[float]]:
    """Each sweep's chances tempered by the temperature (of :data:`TEMPERATURES`) with the
    lowest Brier score on the other sweeps: the candidate, cross-validated by sweep."""
    out: list[Judged] = []
    chosen = []
    for sweep in dict.fromkeys(j.sweep for j in judged):
        others = [j for j in judged if j.sweep != sweep]
        best = min(TEMPERATURES, key=lambda t: _brier([(j.chance, j.best)
                                                        for j in tempered(others, t)]))
        chosen.append(best)
        out.extend(tempered([j for j in judged if j.sweep == sweep], best))
    return out, chosen


def gap_spread(judged: Sequence[Judged]) -> str:
    """The largest gap in each of the :data:`DRAWS_OF_SUBSETS` draws of subsets: "lo–hi"."""
    gaps = [reliability([j for j in judged if j.subset % DRAWS_OF_SUBSETS == k]).worst
            for k in range(DRAWS_OF_SUBSETS)]
    return f"{min(gaps):.1f}–{max(gaps):.1f}"


def candidates(judged: Sequence[Judged]) -> str:
    """The shipped chances beside the bands before pooling and the recalibration that was
    tried and not shipped: the largest gap, its spread over draws of subsets, the Brier
    score, and on how many sweeps each lowers or raises the Brier score against the shipped."""
    own = [replace(j, chance=j.unpooled) for j in judged]
    held, chosen = held_out_temperature(judged)
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

    rows = [row("pooled band widths (shipped)", judged, against=False),
            row("each run's own band (before pooling)", own),
            row(f"shipped, tempered: T chosen on the other sweeps ({min(chosen):g}–"
                f"{max(chosen):g}; not shipped)", held)]
    return markdown_table(["P(best)", "largest gap (points)",
                           f"over {DRAWS_OF_SUBSETS} draws of subsets", "Brier score",
                           "sweeps where its Brier score is below / above the shipped's"],
                          rows)


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
    verdict = "met" if worst <= GOAL_POINTS else "NOT met"
    sizes = "; ".join(f"{k} ({len(v)} runs)" for k, v in groups.items())
    body = (f"Sweeps: {sizes}; cut at {', '.join(f'{c:.0%}' for c in CUTS)} of the run; "
            f"{subsets} random subsets of 2–8 runs per sweep and cut; {len(judged):,} chances "
            "(runs whose fit was not `ok` at the cut get none). Truth: the lowest recorded "
            "final eval loss of the subset.\n\n"
            + markdown_table(["P(best)", "chances", "mean P(best)", "fraction best",
                              "gap (points)"], rows)
            + f"\n\nBrier score {brier:.3f} against {naive:.3f} for picking the run with the "
            "lowest loss at the cut (the baseline, same subsets): "
            f"{brier / naive:.2f}x. Goal: every bin within {GOAL_POINTS:g} points: {verdict} "
            f"(largest gap {worst:.1f}).\n\nPer sweep, where the largest gap comes from:\n\n"
            + per_sweep(judged, groups, worst_bin)
            + "\n\nThe random subsets reuse each sweep's fits at each cut, so a few sweeps "
            f"weigh on a bin: read as {DRAWS_OF_SUBSETS} draws of {subsets // DRAWS_OF_SUBSETS}"
            f" subsets, the largest gap is {gap_spread(judged)}.\n\n"
            "The chances as shipped, beside each run's own band (drawn as it is, before "
            "pooling widths) and a recalibration that was tried and not shipped: temperature "
            "scaling of each comparison's chances (raised to 1/T and renormalised), T chosen "
            "for each sweep by the Brier score on the other sweeps, so every sweep is scored "
            "out of sample:\n\n"
            + candidates(judged)
            + "\n\nPooling widths has no parameter fitted to these sweeps. Tempering closes "
            "more of the gap by softening every sweep's chances to suit the few near-tie "
            "sweeps, and loses sharpness on the others.")
    result = (f"P(best) within {worst:.1f} points of the fraction best in every bin (goal "
              f"≤ {GOAL_POINTS:g}: {verdict}); Brier score {brier / naive:.2f}x picking the "
              "leader at the cut")
    return publish(args, "pbest_calibration", "P(best) calibration on the recorded sweeps",
                   body, result)
