"""Training quality at a fair horizon: ScheduleFreePlus's defaults vs tuned AdamW schedules.

Run from the repository root (trains in the background on CPU: 13 runs of 7-10 minutes each, so
about an hour with two jobs on two cores; finished runs are kept under
``bench/data/train_quality_3k`` and reused, so an interrupted bench resumes)::

    python -m bench run train_quality --jobs 2   # train what is missing, write BENCHMARKS.md
    python -m bench run train_quality --fresh    # re-train every run
    python -m bench run train_quality --quick    # smoke run (tiny model, 60 steps; writes nothing)

A character-level transformer (``examples.charlm``, 1.03M parameters: d_model 144, 4 layers)
learns the Python standard library's own source (nothing is downloaded; every tenth file is held
out) for 3,000 steps of 16 x 64 characters. Every run starts from the same initial weights and
sees the same batches, with one torch thread:

* ``sfplus``: ``ScheduleFreePlus(model.parameters())`` -- every setting at its default. The
  headline row.
* diagnostic ScheduleFree+ rows, each labelled with what it sets: the warmup (100 steps), the
  Schedule-Free beta (0.9, the old default, with warmups of 500, 100 and 0 steps), and with
  ``sf_beta=0.9`` and a 100-step warmup, the AdamC decay (``weight_decay`` 20, the other end of
  the paper's range) and the averaging weights (``r=1``); and the old defaults (``sf_beta`` 0.9,
  no warmup, no decay). The order of the search that chose the defaults: decay and warmup at
  ``sf_beta`` 0.9 first, then ``sf_beta`` 0.8 once the 0.9 runs showed the averaging hump;
* ``adamw_linear_*``: ``AdamW(lr, betas=(0.9, 0.95), weight_decay=0.1)``, 100 warmup steps then
  linear decay to 0 at the last step, at four learning rates;
* ``adamw_wsd_3e-03``: the same AdamW, warmup-stable-decay: constant after warmup, linear decay
  to 0 over the last 20% of the run.

The validation loss (16 fixed held-out batches, ScheduleFreePlus at its averaged point ``x``) is
measured every 50 steps; the 25/50/75% marks fall on evaluations. The goals: ScheduleFreePlus's
final loss within 1% of the best AdamW's, and below the best linear-decay run's loss at 25, 50 and
75% of the run (the anytime property). Curves go to ``bench/data/train_quality_3k/<run>.csv.gz``
(``split,step,loss``; ``train`` every step at ``y``, ``val`` every 50 steps).
"""

from __future__ import annotations

import csv
import gzip
import inspect
import io
import math
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from bench._cli import parser, publish
from bench._paths import DATA

DATA_DIR = DATA / "train_quality_3k"
ADAMW_LRS = (3e-4, 1e-3, 3e-3, 1e-2)
WSD_LR = 3e-3
WSD_DECAY_FRACTION = 0.2
MARKS = (0.25, 0.5, 0.75)


@dataclass(frozen=True)
class Setup:
    steps: int = 3000
    warmup: int = 100  # AdamW's warmup (ScheduleFreePlus rows use their own)
    eval_every: int = 50
    eval_batches: int = 16
    batch_size: int = 16
    block_size: int = 64
    d_model: int = 144
    n_layers: int = 4
    n_heads: int = 4
    seed: int = 0
    max_chars: int = 4_000_000


QUICK = Setup(steps=60, warmup=10, eval_every=10, eval_batches=2, d_model=32, n_layers=1,
              max_chars=200_000)


@dataclass(frozen=True)
class Spec:
    """One run: ``kind`` is ``sfplus``, ``adamw_linear`` or ``adamw_wsd``; ``options`` are the
    ScheduleFreePlus keyword arguments (empty = the defaults) or ``{"lr": ...}`` for AdamW."""

    name: str
    kind: str
    label: str
    options: tuple[tuple[str, float], ...] = ()
    diagnostic: bool = False


def sfplus_defaults() -> dict[str, Any]:
    """The optimizer's own defaults (the headline row's settings), with the effective c_warmup."""
    from curvecast.sfplus import ScheduleFreePlus
    from curvecast.sfplus.functional import resolve_c_warmup

    params = inspect.signature(ScheduleFreePlus).parameters
    out = {k: params[k].default for k in ("lr", "weight_decay", "warmup_steps", "sf_beta")}
    out["c_warmup"] = resolve_c_warmup(params["c_warmup"].default, out["warmup_steps"])
    return out


def planned() -> list[Spec]:
    """The headline rows first, so that a short session still gets them."""
    defaults = sfplus_defaults()
    shown = ", ".join(f"{k}={defaults[k]:g}" for k in ("lr", "weight_decay", "warmup_steps",
                                                      "sf_beta"))
    return [
        Spec("sfplus", "sfplus", f"defaults ({shown})"),
        *(
            Spec(f"adamw_linear_{lr:.0e}", "adamw_linear", f"linear decay, lr {lr:g}",
                 (("lr", lr),))
            for lr in ADAMW_LRS
        ),
        Spec(f"adamw_wsd_{WSD_LR:.0e}", "adamw_wsd",
             f"WSD (last {WSD_DECAY_FRACTION:.0%} decays), lr {WSD_LR:g}", (("lr", WSD_LR),)),
        Spec("sfplus_warm100", "sfplus", "warmup_steps=100", (("warmup_steps", 100),), True),
        Spec("sfplus_beta0.9", "sfplus", "sf_beta=0.9", (("sf_beta", 0.9),), True),
        Spec("sfplus_beta0.9_warm100", "sfplus", "sf_beta=0.9, warmup_steps=100",
             (("sf_beta", 0.9), ("warmup_steps", 100)), True),
        Spec("sfplus_beta0.9_warm0", "sfplus", "sf_beta=0.9, warmup_steps=0",
             (("sf_beta", 0.9), ("warmup_steps", 0)), True),
        Spec("sfplus_wd20", "sfplus", "sf_beta=0.9, warmup_steps=100, weight_decay=20",
             (("sf_beta", 0.9), ("warmup_steps", 100), ("weight_decay", 20.0)), True),
        Spec("sfplus_r1", "sfplus", "sf_beta=0.9, warmup_steps=100, r=1 (weights t^r)",
             (("sf_beta", 0.9), ("warmup_steps", 100), ("r", 1.0)), True),
        Spec("sfplus_old_defaults", "sfplus",
             "sf_beta=0.9, warmup_steps=0, weight_decay=0 (the old defaults)",
             (("sf_beta", 0.9), ("warmup_steps", 0), ("weight_decay", 0.0)), True),
    ]


@dataclass
class Run:
    spec: Spec
    train: list[tuple[int, float]] = field(default_factory=list)
    val: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def final(self) -> float:
        return self.val[-1][1]

    def val_at(self, step: int) -> float:
        """The validation loss at the last evaluation at or before ``step``."""
        return max((s, v) for s, v in self.val if s <= step)[1]


def _adamw_factor(spec: Spec, setup: Setup) -> Callable[[int], float]:
    """Multiplier on AdamW's lr after ``t`` completed steps: warmup, then the spec's decay."""
    decay_start = (
        setup.warmup if spec.kind == "adamw_linear"
        else int(setup.steps * (1 - WSD_DECAY_FRACTION))
    )

    def factor(t: int) -> float:
        if t < setup.warmup:
            return (t + 1) / setup.warmup
        if t < decay_start:
            return 1.0
        return max(0.0, (setup.steps - t) / max(1, setup.steps - decay_start))

    return factor


def train(spec: Spec, setup: Setup) -> Run:
    """Train one run (in a worker process; one torch thread)."""
    import torch

    from curvecast.sfplus import ScheduleFreePlus
    from examples.charlm import CharDataset, CharTransformer, evaluate, load_stdlib_text

    torch.set_num_threads(1)
    data = CharDataset(load_stdlib_text(setup.max_chars))
    torch.manual_seed(setup.seed)
    model = CharTransformer(data.vocab_size, d_model=setup.d_model, n_layers=setup.n_layers,
                            n_heads=setup.n_heads, block_size=setup.block_size)
    options = dict(spec.options)
    sched: Any = None
    if spec.kind == "sfplus":
        opt: Any = ScheduleFreePlus(model.parameters(), **options)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=options["lr"], betas=(0.9, 0.95),
                                weight_decay=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _adamw_factor(spec, setup))
    sf = spec.kind == "sfplus"
    gen = torch.Generator().manual_seed(setup.seed + 1)  # the same batches for every run
    run = Run(spec)

    def validate(step: int) -> None:
        kwargs = {"batches": setup.eval_batches, "batch_size": setup.batch_size,
                  "block_size": setup.block_size}
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
        opt.step(loss=loss) if sf else opt.step()
        opt.zero_grad(set_to_none=True)
        if sched is not None:
            sched.step()
        run.train.append((step, loss.item()))
        if step % setup.eval_every == 0 or step == setup.steps:
            validate(step)
        if step % (setup.steps // 10) == 0:
            print(f"  {spec.name}: step {step}/{setup.steps}, val {run.val[-1][1]:.4f}",
                  flush=True)
    run.seconds = time.perf_counter() - t0
    return run


def save(run: Run) -> None:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["split", "step", "loss"])
    writer.writerows(("train", s, f"{v:.6g}") for s, v in run.train)
    writer.writerows(("val", s, f"{v:.6g}") for s, v in run.val)
    writer.writerow(["seconds", 0, f"{run.seconds:.1f}"])
    tmp = DATA_DIR / f".{run.spec.name}.tmp"
    tmp.write_bytes(gzip.compress(out.getvalue().encode(), mtime=0))
    tmp.replace(DATA_DIR / f"{run.spec.name}.csv.gz")  # complete file or none


def load(spec: Spec) -> Run | None:
    path = DATA_DIR / f"{spec.name}.csv.gz"
    if not path.exists():
        return None
    run = Run(spec)
    for split, step, value in list(csv.reader(io.StringIO(gzip.decompress(
            path.read_bytes()).decode())))[1:]:
        if split == "seconds":
            run.seconds = float(value)
        else:
            (run.train if split == "train" else run.val).append((int(step), float(value)))
    return run


def _fmt(value: float) -> str:
    return "NaN" if math.isnan(value) else f"{value:.4f}"


def report(runs: list[Run], setup: Setup, n_params: int) -> tuple[str, str]:
    """The section's body and its one-line result."""
    from bench._report import markdown_table

    by_name = {r.spec.name: r for r in runs}
    sf = by_name["sfplus"]
    adamw = [r for r in runs if r.spec.kind != "sfplus"]
    linear = [r for r in adamw if r.spec.kind == "adamw_linear"]
    best = min(adamw, key=lambda r: r.final)
    best_linear = min(linear, key=lambda r: r.final)
    gap = sf.final / best.final - 1
    marks = [int(setup.steps * m) for m in MARKS]
    anytime = [(m, sf.val_at(m), best_linear.val_at(m)) for m in marks]
    anytime_met = all(s < b for _, s, b in anytime)
    tail = setup.steps // 10
    header = ["run", "optimizer", "final val loss", "vs best AdamW", "best val loss",
              *(f"val @ {m:.0%}" for m in MARKS), f"train loss (last {tail} steps)", "wall s"]
    rows = []
    for r in runs:
        rows.append([
            r.spec.name + (" (diagnostic)" if r.spec.diagnostic else ""),
            ("ScheduleFreePlus " if r.spec.kind == "sfplus" else "AdamW ") + r.spec.label,
            _fmt(r.final), f"{r.final / best.final - 1:+.1%}",
            _fmt(min(v for _, v in r.val)),
            *(_fmt(r.val_at(m)) for m in marks),
            _fmt(statistics.fmean(v for _, v in r.train[-tail:])), f"{r.seconds:.0f}",
        ])
    body = "\n\n".join([
        f"Character-level transformer ({n_params / 1e6:.2f}M parameters: d_model "
        f"{setup.d_model}, {setup.n_layers} layers, context {setup.block_size}), "
        f"{setup.steps:,} steps of {setup.batch_size} sequences of the Python standard "
        "library's source, every run from the same weights on the same batches, one torch "
        f"thread (two runs at a time: `wall s`). Validation loss on {setup.eval_batches} fixed "
        f"held-out batches every {setup.eval_every} steps, ScheduleFreePlus at x. AdamW: betas "
        f"(0.9, 0.95), weight decay 0.1, {setup.warmup} warmup steps. Goals: the final loss "
        "within 1% of the best AdamW's; below the best linear-decay run at 25/50/75% of the run "
        f"({best_linear.spec.name}: "
        + ", ".join(f"step {m} {s:.4f} vs {b:.4f}" for m, s, b in anytime) + ").",
        markdown_table(header, rows),
    ])
    result = (f"ScheduleFreePlus's defaults end {gap:+.1%} against the best AdamW "
              f"({best.spec.name}): {'met' if gap <= 0.01 else 'missed'} (goal ≤ +1%); "
              f"anytime, below the best linear decay at 25/50/75%: "
              f"{'met' if anytime_met else 'missed'}")
    return body, result


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, quick="a tiny model for 60 steps, nothing saved")
    cli.add_argument("--jobs", type=int, default=2, help="runs trained at once")
    cli.add_argument("--fresh", action="store_true", help="re-train runs found on disk")
    args = cli.parse_args(argv)
    setup = QUICK if args.quick else Setup()
    specs = planned()
    t0 = time.time()
    runs: dict[str, Run] = {}
    todo = []
    for spec in specs:
        found = None if (args.fresh or args.quick) else load(spec)
        if found is None:
            todo.append(spec)
        else:
            runs[spec.name] = found
    print(f"{len(runs)} run(s) on disk, {len(todo)} to train with {args.jobs} job(s)", flush=True)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(train, spec, setup): spec for spec in todo}
        for done, future in enumerate(as_completed(futures), start=1):
            run = future.result()
            runs[run.spec.name] = run
            if not args.quick:
                save(run)
            print(f"[{done}/{len(todo)}] {run.spec.name}: final val {_fmt(run.final)} "
                  f"({run.seconds:.0f} s)", flush=True)
    from examples.charlm import VOCAB, CharTransformer

    n_params = sum(p.numel() for p in CharTransformer(
        len(VOCAB), d_model=setup.d_model, n_layers=setup.n_layers, n_heads=setup.n_heads,
        block_size=setup.block_size).parameters())
    body, result = report([runs[s.name] for s in specs], setup, n_params)
    print(f"{time.time() - t0:.0f} s (runs found on disk are not re-trained)", flush=True)
    return publish(args, "train_quality",
                   "Training quality at a fair horizon: ScheduleFreePlus against AdamW", body,
                   result)
