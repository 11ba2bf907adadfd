"""Training quality: ScheduleFreePlus (defaults, no LR tuning) vs AdamW + warmup + linear decay.

Run from the repository root::

    python -m bench.train_quality            # full run (~7 minutes on 2 busy CPU cores)
    python -m bench.train_quality --quick    # smoke run (a few steps; writes nothing)

A character-level transformer (``examples.charlm``) learns the Python standard library's own
source (found with ``sysconfig``; nothing is downloaded; every tenth file is held out for
validation). Every run starts from the same initial weights and sees the same batches:

* ``sfplus``: ``ScheduleFreePlus(params, warmup_steps=W)`` -- every other setting at its default
  (``lr=1``, i.e. the raw Polyak step; ``c_warmup = 2W``; no weight decay). The headline row.
* two diagnostic rows, labelled as such: ``sfplus_wd5`` adds the paper's fully decoupled AdamC
  decay (``weight_decay=5``, "necessary when using the Polyak step size"); ``sfplus_lr0.1`` scales
  the Polyak step by 0.1 -- that *is* learning-rate tuning, shown to locate the problem;
* ``adamw_lr*``: ``AdamW(lr, betas=(0.9, 0.95), weight_decay=0.1)`` with ``W`` steps of linear
  warmup then linear decay to 0 at the last step, at four learning rates.

Validation loss is measured on the same fixed held-out batches for every run, for ScheduleFreePlus
at the averaged point ``x`` (``with opt.averaged(model)``). The per-step training loss (at ``y``
for ScheduleFreePlus) and the validation curves are saved as ``step,loss`` CSV files under
``bench/data/train_quality/`` for the forecaster's test corpus.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench._report import markdown_table, write_section
from curvecast.sfplus import ScheduleFreePlus
from examples.charlm import CharDataset, CharTransformer, evaluate, load_stdlib_text

DATA_DIR = Path(__file__).resolve().parent / "data" / "train_quality"
ADAMW_LRS = (3e-4, 1e-3, 3e-3, 1e-2)


@dataclass(frozen=True)
class Setup:
    steps: int
    warmup: int
    eval_every: int
    eval_batches: int
    batch_size: int = 32
    block_size: int = 64
    d_model: int = 96
    n_layers: int = 3
    n_heads: int = 4
    seed: int = 0


@dataclass
class Run:
    name: str
    lr: str
    train: list[tuple[int, float]] = field(default_factory=list)
    val: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0
    last_stats: dict[str, float] = field(default_factory=dict)


def make_model(setup: Setup, vocab_size: int) -> CharTransformer:
    torch.manual_seed(setup.seed)
    return CharTransformer(
        vocab_size,
        d_model=setup.d_model,
        n_layers=setup.n_layers,
        n_heads=setup.n_heads,
        block_size=setup.block_size,
    )


def train_run(
    name: str,
    lr_label: str,
    setup: Setup,
    data: CharDataset,
    make_opt: Callable[[CharTransformer], tuple[Any, Callable[[], None] | None]],
) -> Run:
    """Train one configuration. ``make_opt`` returns the optimizer and an optional per-step hook
    (the LR schedule's ``step``)."""
    model = make_model(setup, data.vocab_size)
    opt, after_step = make_opt(model)
    sf = isinstance(opt, ScheduleFreePlus)
    gen = torch.Generator().manual_seed(setup.seed + 1)  # identical batch sequence for every run
    run = Run(name, lr_label)

    def validate(step: int) -> None:
        kwargs = {
            "batches": setup.eval_batches,
            "batch_size": setup.batch_size,
            "block_size": setup.block_size,
        }
        if sf:
            with opt.averaged(model):
                run.val.append((step, evaluate(model, data, "val", **kwargs)))
        else:
            run.val.append((step, evaluate(model, data, "val", **kwargs)))

    t0 = time.perf_counter()
    validate(0)
    model.train()
    for step in range(1, setup.steps + 1):
        x, y = data.get_batch("train", setup.batch_size, setup.block_size, gen)
        loss = model(x, y)
        loss.backward()
        if sf:
            opt.step(loss=loss)
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if after_step is not None:
            after_step()
        run.train.append((step, loss.item()))
        if step % setup.eval_every == 0 or step == setup.steps:
            validate(step)
    run.seconds = time.perf_counter() - t0
    if sf:
        run.last_stats = opt.stats(norms=False)
    print(f"{name:>14}: final val {run.val[-1][1]:.4f}  ({run.seconds:.0f} s)", flush=True)
    return run


def sfplus_opt(setup: Setup, **overrides: Any) -> Callable[[CharTransformer], tuple[Any, None]]:
    def make(model: CharTransformer) -> tuple[Any, None]:
        return ScheduleFreePlus(model.parameters(), warmup_steps=setup.warmup, **overrides), None

    return make


def adamw_opt(
    setup: Setup, lr: float
) -> Callable[[CharTransformer], tuple[torch.optim.Optimizer, Callable[[], None]]]:
    def make(model: CharTransformer) -> tuple[torch.optim.Optimizer, Callable[[], None]]:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)

        def factor(step: int) -> float:  # step = number of completed steps
            if step < setup.warmup:
                return (step + 1) / setup.warmup
            return max(0.0, (setup.steps - step) / max(1, setup.steps - setup.warmup))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return opt, sched.step

    return make


def peak_train_loss(run: Run, setup: Setup, window: int = 25) -> tuple[int, float]:
    """Highest ``window``-step mean training loss after warmup: shows instabilities."""
    values = [v for _, v in run.train]
    window = min(window, len(values))
    best = (0, -math.inf)
    for end in range(max(window, min(setup.warmup, len(values))), len(values) + 1):
        mean = statistics.fmean(values[end - window : end])
        if mean > best[1]:
            best = (end, mean)
    return best


def save_csv(run: Run) -> list[Path]:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, points in (("train", run.train), ("val", run.val)):
        path = DATA_DIR / f"{run.name}_{split}.csv"
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["step", "loss"])
            writer.writerows((s, f"{v:.6f}") for s, v in points)
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; writes nothing")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads (1 is fastest on a shared 2-core machine)",
    )
    parser.add_argument("--max-chars", type=int, default=4_000_000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steps = 20 if args.quick else args.steps
    setup = Setup(
        steps=steps,
        warmup=max(1, steps // 10),
        eval_every=5 if args.quick else 25,
        eval_batches=2 if args.quick else 8,
    )
    text = load_stdlib_text(200_000 if args.quick else args.max_chars)
    data = CharDataset(text)
    print(
        f"stdlib text: {len(text.train):,} train + {len(text.val):,} val characters "
        f"from {text.n_files} files under {text.root}",
        flush=True,
    )
    load_before = os.getloadavg()
    t0 = time.time()

    sf_runs = [
        train_run("sfplus", "Polyak, lr=1 (default)", setup, data, sfplus_opt(setup)),
        train_run(
            "sfplus_wd5",
            "Polyak, lr=1, weight_decay=5 (diagnostic)",
            setup,
            data,
            sfplus_opt(setup, weight_decay=5.0),
        ),
        train_run(
            "sfplus_lr0.1",
            "Polyak x 0.1 (diagnostic: tuned)",
            setup,
            data,
            sfplus_opt(setup, lr=0.1),
        ),
    ]
    lrs = ADAMW_LRS[1:3] if args.quick else ADAMW_LRS
    adamw_runs = [
        train_run(f"adamw_lr{lr:.0e}", f"{lr:g}", setup, data, adamw_opt(setup, lr)) for lr in lrs
    ]
    runs = sf_runs + adamw_runs

    tail = max(1, steps // 10)
    rows: list[list[object]] = []
    for run in runs:
        final_val = run.val[-1][1]
        best_val = min(v for _, v in run.val)
        last_train = statistics.fmean(v for _, v in run.train[-tail:])
        peak_step, peak = peak_train_loss(run, setup)
        rows.append(
            [
                run.name,
                run.lr,
                f"{final_val:.4f}",
                f"{best_val:.4f}",
                f"{last_train:.4f}",
                f"{peak:.3f} @ {peak_step}",
                f"{run.seconds:.0f}",
            ]
        )
    best_adamw = min(adamw_runs, key=lambda r: r.val[-1][1])
    sf = runs[0]
    diff = sf.val[-1][1] - best_adamw.val[-1][1]
    n_params = sum(p.numel() for p in make_model(setup, data.vocab_size).parameters())
    load_after = os.getloadavg()
    verdict = (
        f"ScheduleFreePlus with no learning-rate tuning ends at validation loss "
        f"**{sf.val[-1][1]:.4f}** (at x); the best of the {len(lrs)} AdamW learning rates "
        f"({best_adamw.lr}) ends at **{best_adamw.val[-1][1]:.4f}**: a difference of "
        f"{diff:+.4f} nats/char ({'better' if diff < 0 else 'worse'} for ScheduleFreePlus). "
        f"Worst AdamW: {max(r.val[-1][1] for r in adamw_runs):.4f}. Diagnostic rows: "
        + ", ".join(f"{r.name} {r.val[-1][1]:.4f}" for r in sf_runs[1:])
        + "."
    )
    peak_step, peak = peak_train_loss(sf, setup)
    warm_loss = statistics.fmean(
        v for _, v in sf.train[max(0, setup.warmup - 5) : setup.warmup + 5]
    )
    best_diag = min(sf_runs[1:], key=lambda r: r.val[-1][1])
    gap = best_diag.val[-1][1] - best_adamw.val[-1][1]
    conclusion = (
        f"At this scale the default's training loss climbs from {warm_loss:.2f} (end of "
        f"warmup) to a 25-step mean of {peak:.2f} (step {peak_step}); the best diagnostic row "
        f"({best_diag.name}) ends {gap:+.2f} nats/char from the best AdamW."
        if peak > warm_loss
        else f"The best diagnostic row ({best_diag.name}) ends {gap:+.2f} nats/char from the "
        "best AdamW."
    )
    if all(r.last_stats for r in sf_runs):
        finals = "; ".join(
            f"{r.name}: alpha {r.last_stats['alpha']:.3g}, ||g||_1 {r.last_stats['grad_l1']:.3g}"
            for r in sf_runs
        )
        verdict += (
            "\n\nWhy (the runs' own telemetry at the last step -- " + finals + "; the AdamW rows "
            "use 1e-3..1e-2): without AdamC decay the weight norms grow, the gradients of the "
            "LayerNorm-scale-invariant weights shrink, ||g||_1 falls and the Polyak step "
            "F / (1.25 ||g||_1) grows -- the feedback loop of the paper's \"Learning Rate "
            'Adaptation Breaks Weight Decay" section, visible here as the training-loss peak '
            "of the default run. The paper pairs the Polyak step with decay 5 in every "
            "experiment and trains 120M-2B-parameter models on 0.5M-4M-token batches; this "
            "model has 0.35M parameters and 2K-token batches, so ||g||_1 sums far fewer "
            "coordinates and the raw Polyak step is much larger per coordinate. " + conclusion
        )
    body = (
        f"Character-level transformer ({n_params / 1e6:.2f}M parameters: d_model "
        f"{setup.d_model}, {setup.n_layers} layers, {setup.n_heads} heads, context "
        f"{setup.block_size}) trained for {setup.steps} steps of {setup.batch_size} sequences on "
        f"the Python {'.'.join(map(str, __import__('sys').version_info[:3]))} standard library "
        f"source ({len(text.train):,} train / {len(text.val):,} validation characters; every "
        f"tenth file held out). All runs: same initial weights, same batches, "
        f"{setup.warmup} warmup steps, {args.threads} CPU thread(s). ScheduleFreePlus: "
        f"`ScheduleFreePlus(params, warmup_steps={setup.warmup})`, everything else default "
        f"(lr=1, no tuning). AdamW: betas (0.9, 0.95), weight decay 0.1, linear warmup then "
        f"linear decay to 0. Validation: mean loss over the same {setup.eval_batches} held-out "
        f"batches, every {setup.eval_every} steps; ScheduleFreePlus evaluated at x.\n\n"
        f"{verdict}\n\n"
        + markdown_table(
            [
                "run",
                "lr",
                "final val loss",
                "best val loss",
                f"train loss (last {tail} steps)",
                "peak train loss (25-step mean) @ step",
                "wall s",
            ],
            rows,
        )
        + f"\n\nCurves (`step,loss`): `bench/data/train_quality/<run>_train.csv` (every step; "
        f"ScheduleFreePlus's at y) and `<run>_val.csv` (every {setup.eval_every} steps). "
        f"Load average before/after: {load_before[0]:.1f}/{load_after[0]:.1f}. "
        f"Total wall time {time.time() - t0:.0f} s.\n"
    )
    print(body)
    if not args.quick:
        for run in runs:
            save_csv(run)
        write_section("train_quality", "Training quality (sfplus vs AdamW)", body)
    if any(math.isnan(v) for r in runs for _, v in r.val):
        print("warning: a run produced NaN losses")


if __name__ == "__main__":
    main()
