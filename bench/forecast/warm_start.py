"""Warm-started refits against fits of the points alone, as the service's worker refits a run.

The worker refits a run each time its series grew by ``refit_growth`` (5%), fitting the points
alone, as the backtests (``forecast_backtest``, ``forecast_sfplus``) and ``curvecast forecast``
do. The alternative is to start each refit from the previous fit
(``fit_curve(warm_start=previous.params)``: the previous burn-in kept, a narrow scan of
``log(t0 + b)`` around the previous one). This bench replays that refit sequence on every run
and curve and scores, at
20/30/50% of each, the warm-started fit and a fit of the same points alone: the error of the
forecast of the final loss, whether the 90% interval holds it, how often the two disagree on
the status or the burn-in, and the fitting CPU.

Runs: our ScheduleFree+ corpus and training-quality runs (eval loss, with the run's config, as
the service fits them; growth 5%), and the public curves (``../shared/curves``; no config: the
burn-in comes from the data; the whole series from the first logged step, as the service sees
it; growth 25%, to keep the replay to minutes). Intervals are the shipped ones
(``Fit.predict``) for both: the comparison is between the two ways of refitting, not a
held-out calibration score (those are the backtests').

Usage: ``python -m bench run warm_start [--no-write]``
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench._cli import parser, publish
from bench._corpus import load_runs
from bench._report import markdown_table
from bench.forecast.forecast_calibrate import load_corpus
from curvecast.contract import RunConfig
from curvecast.service.forecast.fit import Fit
from curvecast.service.forecast.solver import fit_curve

CUTS = (0.2, 0.3, 0.5)
#: What the table decided (the replay is deterministic: the same numbers on every run).
MODES = ("warm", "alone")


@dataclass(frozen=True)
class Series:
    """One series as the worker would refit it."""

    group: str
    name: str
    steps: np.ndarray
    values: np.ndarray
    config: RunConfig
    growth: float

    @property
    def final(self) -> float:
        return float(self.values[-1])

    @property
    def total(self) -> float:
        return float(self.steps[-1])


def series() -> Iterator[Series]:
    for run in load_runs():
        group = {"sfplus": "ours: ScheduleFree+", "decay": "ours: decaying LR"}.get(
            run.kind, "ours: other anytime")
        yield Series(group, run.name, run.eval_steps, run.eval_values,
                     RunConfig.read(run.config), 0.05)
    for curve in load_corpus():
        if curve.source == "train_quality":
            continue  # the same runs as ours above
        ok = np.isfinite(curve.losses)
        if ok.sum() < 8 or not ok[-1]:
            continue
        group = "public: anytime" if curve.anytime else "public: decaying LR"
        yield Series(group, curve.name, curve.steps[ok], curve.losses[ok], RunConfig(), 0.25)


def replay(s: Series) -> tuple[list[dict[str, object]], dict[str, float]]:
    """The worker's refit sequence over ``s``, both ways; a row per (cut, mode)."""
    rows: list[dict[str, object]] = []
    cpu = dict.fromkeys(MODES, 0.0)
    for mode in MODES:
        prev: Fit | None = None
        fitted = 0
        todo = list(CUTS)
        n_total = s.steps.size
        for n in range(4, n_total + 1):
            if n >= fitted * (1 + s.growth) and n > fitted:
                start = time.process_time()
                warm = prev.params if (prev is not None and mode == "warm") else None
                prev = fit_curve(s.steps[:n], s.values[:n], config=s.config, warm_start=warm)
                cpu[mode] += time.process_time() - start
                fitted = n
            # The fit the service holds when the run reaches each cut.
            while todo and (n == n_total or s.steps[n] > todo[0] * s.total):
                k = todo.pop(0)
                if prev is None:
                    continue
                p = prev.predict(s.total)
                rows.append({
                    "group": s.group, "name": s.name, "k": k, "mode": mode,
                    "status": prev.status, "burn_in": prev.burn_in,
                    "err": abs(p.value - s.final) / abs(s.final) if math.isfinite(p.value)
                    else math.inf,
                    "covered": bool(p.lo <= s.final <= p.hi),
                })
            if not todo:
                break
    return rows, cpu


def _pct(x: float) -> str:
    return "—" if not math.isfinite(x) else f"{100 * x:.1f}%"


def report(df: pd.DataFrame, cpu: dict[str, float], n_series: dict[str, int]
           ) -> tuple[str, str]:
    """The section's body and its one-line result."""
    table = []
    for group in sorted(df["group"].unique()):
        g = df[df["group"] == group]
        for k in CUTS:
            gk = g[g["k"] == k]
            warm = gk[gk["mode"] == "warm"].set_index("name")
            alone = gk[gk["mode"] == "alone"].set_index("name")
            both = warm.index.intersection(alone.index)
            if not len(both):
                continue
            w, a = warm.loc[both], alone.loc[both]
            same_burn = (w["burn_in"].fillna(-1) == a["burn_in"].fillna(-1)).mean()
            table.append([
                group, f"{k:.0%}", len(both),
                _pct(float(w["err"].median())), _pct(float(a["err"].median())),
                _pct(float(w["covered"].mean())), _pct(float(a["covered"].mean())),
                _pct(float((w["status"] == a["status"]).mean())), _pct(float(same_burn)),
            ])
    body = markdown_table(
        ["series", "cut", "cuts", "median error, warm-started", "median error, points alone",
         "90% covers, warm-started", "90% covers, points alone", "same status",
         "same burn-in"], table)
    ratio = cpu["alone"] / cpu["warm"] if cpu["warm"] > 0 else math.nan
    counts = ", ".join(f"{g}: {n}" for g, n in sorted(n_series.items()))
    body = (
        "Each run's and curve's refits replayed as the worker makes them (growth 5% on our "
        "runs, with their config; 25% on the public curves, burn-in from the data), scored at "
        "20/30/50% of the run: a fit warm-started from the previous one against a fit of the "
        "same points alone (the worker's); the shipped intervals for both (not a held-out "
        f"calibration score). Series replayed: {counts}.\n\n{body}\n\nFitting CPU over the "
        f"whole replay: warm-started {cpu['warm']:.1f} s, points alone {cpu['alone']:.1f} s.")
    lower = sum(float(str(r[4]).rstrip("%")) <= float(str(r[3]).rstrip("%")) for r in table
                if "—" not in (r[3], r[4]))
    result = (f"refits of the points alone (the worker's) cost {ratio:.2f}× the CPU of "
              f"warm-started ones; their median error is as low or lower in {lower} of "
              f"{len(table)} series and cuts")
    return body, result


def main(argv: Sequence[str] | None = None) -> int:
    args = parser(__doc__).parse_args(argv)
    warnings.filterwarnings("ignore")
    rows: list[dict[str, object]] = []
    cpu = dict.fromkeys(MODES, 0.0)
    n_series: dict[str, int] = {}
    all_series = list(series())
    for i, s in enumerate(all_series, 1):
        got, used = replay(s)
        rows += got
        for mode in MODES:
            cpu[mode] += used[mode]
        n_series[s.group] = n_series.get(s.group, 0) + 1
        if i % 50 == 0 or i == len(all_series):
            print(f"[warm_start] {i}/{len(all_series)} series replayed", flush=True)
    body, result = report(pd.DataFrame(rows), cpu, n_series)
    return publish(args, "warm_start", "Warm-started refits against fits of the points alone",
                   body, result)
