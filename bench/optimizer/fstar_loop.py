"""Closing the loop: the forecast's f* fed into ScheduleFree+'s Polyak step, against f* = 0.

ScheduleFree+'s step size is ``max(0, F + I - f_star) / e_hat`` with ``f_star = 0`` by default
(the paper's choice). The service estimates f* for a live run: the asymptote ``c`` of
``a / sqrt(t + b) + c`` with a calibrated interval. :class:`FStarLoop` feeds that estimate back
during training, conservatively:

* every ``REFIT_FRACTION`` of the run it fits the training loss seen so far with the service's
  own fit (:func:`~curvecast.service.forecast.solver.fit_curve`, no server);
* only an ``ok`` fit moves its target: ``SAFETY`` x the lower end of the f* interval, never
  above ``SAFETY`` x the lowest smoothed training loss seen, never below 0; another status
  keeps the last target;
* ``f_star`` ramps linearly to a new target over the next refit interval (the step size never
  jumps), and the optimizer re-validates it every step.

The study: ``examples/charlm.py`` on CPU, three model widths x two run lengths x ``SEEDS`` seeds,
ScheduleFree+ at its defaults but a warmup of 5% of the run, each (size, length, seed) trained
twice from the same initial weights on the same batches (the seed fixes both): ``f_star = 0``
and the loop. Recorded per run:
the eval loss at 25/50/75/100% (at the averaged weights), the mean Polyak step ``eta`` per
quarter, the ``f_star`` trace, and whether the loss went non-finite. Raw results go to
``bench/data/fstar_loop.json`` as each run ends (a rerun trains only the missing ones).

Reported per cell: the paired difference loop - baseline in final and anytime eval loss, with
its spread over seeds (a difference smaller than the seed spread is noise), and a verdict.

Usage: ``python -m bench run fstar_loop [--jobs 2] [--report] [--no-write]``
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bench._cli import parser, publish
from bench._paths import REPO
from bench._report import markdown_table
from curvecast.contract import ForecastStatus

DATA = REPO / "bench" / "data" / "fstar_loop.json"
#: (name, d_model, n_layers) of the three model sizes.
SIZES = (("d32", 32, 2), ("d64", 64, 2), ("d96", 96, 2))
LENGTHS = (300, 900)
SEEDS = (0, 1, 2, 3)
ARMS = ("zero", "loop")
BATCH = 32
EVAL_POINTS = 40
#: The loop refits every this fraction of the run.
REFIT_FRACTION = 0.05
#: The target is this fraction of the f* interval's lower end and of the lowest loss seen.
SAFETY = 0.9
#: The smoothing of the training loss whose minimum caps the target (an EMA's weight).
SMOOTHING = 0.05
QUARTERS = (0.25, 0.5, 0.75, 1.0)
#: Warmup is 1/WARMUP_DIVISOR of the run (the default 500 steps would outlast these runs).
WARMUP_DIVISOR = 20


@dataclass
class FStarLoop:
    """The controller: training losses in, the ``f_star`` to use for the next step out (pure).

    Args:
        total_steps: the run's planned length (the fit's horizon and the refit period's base).
        refit_every: steps between fits (``REFIT_FRACTION`` of the run by default).
    """

    total_steps: int
    refit_every: int = 0
    f_star: float = 0.0
    target: float = 0.0
    fits: list[tuple[int, str, float]] = field(default_factory=list)
    _steps: list[int] = field(default_factory=list)
    _losses: list[float] = field(default_factory=list)
    _smooth: float = math.nan
    _lowest: float = math.inf
    _ramp: float = 0.0

    def __post_init__(self) -> None:
        if self.refit_every <= 0:
            self.refit_every = max(1, round(self.total_steps * REFIT_FRACTION))

    def observe(self, step: int, loss: float) -> float:
        """Record the step's training loss; return the ``f_star`` for the next step."""
        if math.isfinite(loss):
            self._steps.append(step)
            self._losses.append(loss)
            self._smooth = loss if math.isnan(self._smooth) else (
                (1 - SMOOTHING) * self._smooth + SMOOTHING * loss)
            if len(self._losses) * SMOOTHING >= 1:  # past the EMA's start-up
                self._lowest = min(self._lowest, self._smooth)
        if step % self.refit_every == 0:
            self._refit(step)
        gap = self.target - self.f_star
        self.f_star = self.target if abs(gap) <= self._ramp else self.f_star + math.copysign(
            self._ramp, gap)
        return self.f_star

    def _refit(self, step: int) -> None:
        from curvecast.service.forecast.solver import fit_curve

        fit = fit_curve(self._steps, self._losses,
                        config={"total_steps": self.total_steps, "optimizer": "sfplus"})
        interval = fit.f_star()
        self.fits.append((step, str(fit.status), interval.lo))
        if fit.status != ForecastStatus.OK or not math.isfinite(interval.lo):
            return  # a forecast that does not know moves nothing
        cap = SAFETY * self._lowest if math.isfinite(self._lowest) else 0.0
        self.target = max(0.0, min(SAFETY * interval.lo, cap))
        self._ramp = abs(self.target - self.f_star) / self.refit_every


@dataclass(frozen=True)
class Cell:
    size: str
    d_model: int
    n_layers: int
    steps: int
    seed: int
    arm: str

    @property
    def name(self) -> str:
        return f"{self.size}-{self.steps}-s{self.seed}-{self.arm}"


def cells() -> list[Cell]:
    return [Cell(size, d, n, steps, seed, arm) for size, d, n in SIZES for steps in LENGTHS
            for seed in SEEDS for arm in ARMS]


def train(cell: Cell) -> dict[str, Any]:
    """Train one run; its eval losses at the quarters, step sizes, f_star trace, divergence."""
    import torch

    from curvecast.sfplus import ScheduleFreePlus
    from examples.charlm import CharDataset, CharTransformer, evaluate, load_stdlib_text

    torch.set_num_threads(1)
    torch.manual_seed(cell.seed)
    dataset = CharDataset(load_stdlib_text(2_000_000))
    model = CharTransformer(dataset.vocab_size, d_model=cell.d_model, n_layers=cell.n_layers)
    # The defaults but the warmup, which is sized for long runs (500 steps): 5% of the run,
    # averaging from twice that (the default ratio), as the README's short loop does.
    opt = ScheduleFreePlus(model.parameters(), warmup_steps=cell.steps // WARMUP_DIVISOR)
    loop = FStarLoop(cell.steps) if cell.arm == "loop" else None
    gen = torch.Generator().manual_seed(cell.seed)
    eval_every = max(1, cell.steps // EVAL_POINTS)
    evals: dict[int, float] = {}
    etas: list[float] = []
    f_stars: list[tuple[int, float]] = []
    first_loss, diverged = math.nan, False
    started = time.perf_counter()
    for t in range(1, cell.steps + 1):
        x, y = dataset.get_batch("train", BATCH, model.block_size, gen)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step(loss=loss)
        value = float(loss.detach())
        first_loss = value if t == 1 else first_loss
        etas.append(float(opt.stats()["eta"]))
        if not math.isfinite(value):
            diverged = True
            break
        if loop is not None:
            f_star = loop.observe(t, value)
            for group in opt.param_groups:
                group["f_star"] = f_star
            if t % eval_every == 0:
                f_stars.append((t, f_star))
        if t % eval_every == 0 or t == cell.steps:
            with opt.averaged(model):
                evals[t] = evaluate(model, dataset, batches=8)
    quarters = {q: _at(evals, q * cell.steps) for q in QUARTERS}
    eta_quarters = [float(np.mean(part)) for part in np.array_split(np.array(etas), 4)]
    return {"cell": asdict(cell), "name": cell.name, "first_loss": first_loss,
            "diverged": diverged, "eval": {str(q): v for q, v in quarters.items()},
            "eta_quarters": eta_quarters, "f_star_trace": f_stars,
            "fits": loop.fits if loop is not None else [],
            "seconds": round(time.perf_counter() - started, 1)}


def _at(evals: dict[int, float], step: float) -> float:
    """The eval loss at the last eval step at or before ``step`` (NaN: none, or diverged)."""
    done = [s for s in evals if s <= step + 1e-9]
    return evals[max(done)] if done else math.nan


# --- the study's data and report ---------------------------------------------------------------


def load() -> dict[str, dict[str, Any]]:
    return json.loads(DATA.read_text()) if DATA.exists() else {}


def save(results: dict[str, dict[str, Any]]) -> None:
    DATA.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def _verdict(diffs: Sequence[float]) -> str:
    """Helps / hurts only when every seed's paired difference has that sign (with four seeds,
    the strongest statement a sign test allows: p = 1/16 one-sided); else within noise."""
    if all(d < 0 for d in diffs):
        return "helps (every seed)"
    if all(d > 0 for d in diffs):
        return "hurts (every seed)"
    return "within noise"


def report(results: dict[str, dict[str, Any]]) -> tuple[str, str]:
    rows, verdicts = [], []
    for size, _d, _n in SIZES:
        for steps in LENGTHS:
            pairs = []
            for seed in SEEDS:
                a = results.get(Cell(size, _d, _n, steps, seed, "zero").name)
                b = results.get(Cell(size, _d, _n, steps, seed, "loop").name)
                if a and b:
                    pairs.append((a, b))
            if not pairs:
                continue
            base = [p[0]["eval"]["1.0"] for p in pairs]
            diffs = {q: [p[1]["eval"][str(q)] - p[0]["eval"][str(q)] for p in pairs]
                     for q in QUARTERS}
            final = diffs[1.0]
            verdict = _verdict(final)
            verdicts.append(verdict)
            spread = max(base) - min(base)
            eta0 = statistics.mean(p[0]["eta_quarters"][-1] for p in pairs)
            eta1 = statistics.mean(p[1]["eta_quarters"][-1] for p in pairs)
            f_end = statistics.mean(p[1]["f_star_trace"][-1][1] if p[1]["f_star_trace"] else 0.0
                                    for p in pairs)
            div = sum(p[0]["diverged"] for p in pairs), sum(p[1]["diverged"] for p in pairs)
            rows.append([
                f"{size}, {steps} steps", len(pairs), f"{statistics.mean(base):.4f}",
                f"{spread:.4f}",
                *(f"{statistics.mean(diffs[q]):+.4f}" for q in QUARTERS),
                f"{min(final):+.4f} … {max(final):+.4f}",
                f"{f_end:.2f}", f"{eta1 / eta0:.2f}x", f"{div[0]} / {div[1]}", verdict])
    table = markdown_table(
        ["cell", "seeds", "final eval loss, f* = 0", "its seed spread",
         "Δ at 25%", "Δ at 50%", "Δ at 75%", "Δ final", "Δ final, min … max",
         "f* reached", "last-quarter η, loop / f* = 0", "diverged (f* = 0 / loop)", "verdict"],
        rows)
    helps = sum(v.startswith("helps") for v in verdicts)
    hurts = sum(v.startswith("hurts") for v in verdicts)
    result = (f"feeding the forecast's f* into the Polyak step: helps in {helps}, hurts in "
              f"{hurts}, within noise in {len(verdicts) - helps - hurts} of {len(verdicts)} "
              "cells (every seed agreeing)")
    body = (
        f"{table}\n\n"
        "Δ: loop − baseline eval loss (at the averaged weights), the mean over seeds (negative: "
        "the loop is better). Each pair starts from the same initial weights and sees the same "
        "batches (the first training losses agree). A cell's verdict is *helps*/*hurts* only "
        "when every seed's final difference has that sign. η: the mean Polyak step over the "
        "last quarter of the run.\n\n"
        f"Method: `examples/charlm.py` on CPU (one thread), batch {BATCH}, ScheduleFree+ at its "
        f"defaults but `warmup_steps` = 1/{WARMUP_DIVISOR} of the run (the default 500 would "
        f"outlast these runs; averaging from twice that); {len(SEEDS)} seeds per cell. The "
        f"loop refits the training loss every {REFIT_FRACTION:.0%} of the run with the "
        f"service's fit; from an `ok` fit its target is {SAFETY} × the lower end of the f* "
        f"interval, at most {SAFETY} × the lowest smoothed training loss, ramped in linearly "
        "until the next refit. Raw runs: "
        "`bench/data/fstar_loop.json`.")
    return body, result


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--jobs", type=int, default=2, help="runs trained at once")
    cli.add_argument("--report", action="store_true", help="report the recorded runs only")
    args = cli.parse_args(argv)
    results = load()
    if not args.report:
        todo = [c for c in cells() if c.name not in results]
        todo.sort(key=lambda c: -c.steps * c.d_model)  # the longest first
        print(f"[fstar_loop] {len(todo)} run(s), {args.jobs} at a time", flush=True)
        started = time.perf_counter()
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {pool.submit(train, c): c for c in todo}
            for i, fut in enumerate(as_completed(futures), 1):
                out = fut.result()
                results[out["name"]] = out
                save(results)
                print(f"[fstar_loop] {i}/{len(todo)} {out['name']}: final eval "
                      f"{out['eval']['1.0']:.4f} in {out['seconds']:.0f} s "
                      f"({time.perf_counter() - started:.0f} s wall)", flush=True)
    pairs = [(results.get(c.name), results.get(Cell(c.size, c.d_model, c.n_layers, c.steps,
                                                     c.seed, "loop").name))
             for c in cells() if c.arm == "zero"]
    for a, b in pairs:
        if a and b and a["first_loss"] != b["first_loss"]:
            print(f"[fstar_loop] {a['name']}: the arms did not start alike", file=sys.stderr)
            return 1
    body, result = report(results)
    return publish(args, "fstar_loop",
                   "Closing the loop: the forecast's f* in ScheduleFree+'s Polyak step", body,
                   result)


if __name__ == "__main__":
    raise SystemExit(main())
