"""The ScheduleFree+ corpus: trains the runs the forecast and drift benches read.

Real training runs of the bundled optimizer (and AdamW references), for the forecaster's
backtest and the drift alerts' study.

Run from the repository root (trains in the background on CPU; a run is one to ten minutes on one
core; runs already on disk are skipped, so an interrupted build resumes)::

    python -m bench run sfplus_corpus --list          # the planned runs and which exist
    python -m bench run sfplus_corpus                 # train every missing run (1 process)
    python -m bench run sfplus_corpus --jobs 2        # two runs at a time (1 torch thread each)
    python -m bench run sfplus_corpus --only s-wd20   # one run (re-trains it)
    python -m bench run sfplus_corpus --report        # list the runs: README.md + BENCHMARKS.md

Every run trains :class:`examples.charlm.CharTransformer` on the Python standard library's own
source (nothing is downloaded) with one torch thread, a fixed seed and fixed data order, and writes

* ``bench/data/sfplus_corpus/<name>.csv.gz``: long format ``key,step,value`` -- the same columns
  as the service's ``metrics.csv`` export minus ``wall_time``, so ``curvecast forecast`` reads it;
* ``bench/data/sfplus_corpus/<name>.json``: the run config in the service's ``RunConfig`` keys
  (``total_steps``, ``warmup_steps``, ``c_warmup``, ``weight_decay``, ...), the model and batch,
  the final eval loss and the training time.

Series (ScheduleFree+ runs; the AdamW runs log ``loss``, ``eval_loss``, ``opt/grad_l1``, the
norms and, every step, ``opt/lr``, the learning rate as ``Monitor.watch()`` logs it):

* every step: ``loss`` (training loss at ``y``), ``opt/grad_l1``, ``opt/eta``, ``opt/alpha``,
  ``opt/numerator``;
* every 10 steps: ``opt/denom_ema``, ``opt/inner``, ``opt/c``, ``opt/sf_beta``, ``opt/warmup``,
  ``opt/gamma_max`` and the norms ``opt/x_l2``, ``opt/y_l2``, ``opt/z_l2``, ``opt/grad_l2``;
* every 1% of the run (and at the last step): ``eval_loss``, the held-out loss at ``x`` on fixed
  batches.

Values are written with 6 significant digits.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench._cli import parser, publish, writes
from bench._paths import DATA
from curvecast.contract import telemetry_key

DATA_DIR = DATA / "sfplus_corpus"
EVERY_STEP = ("grad_l1", "eta", "alpha", "numerator")
EVERY_TENTH = ("denom_ema", "inner", "c", "sf_beta", "warmup", "gamma_max")
NORM_EVERY = 10


@dataclass(frozen=True)
class Spec:
    """One planned run. ``optimizer`` is ``sfplus``, ``sf_adamw`` (schedule-free AdamW),
    ``adamw_const``, ``adamw_linear`` or ``adamw_cosine`` (warmup then decay to 0)."""

    name: str
    steps: int = 3000
    d_model: int = 64
    n_layers: int = 2
    batch_size: int = 32
    optimizer: str = "sfplus"
    weight_decay: float = 20.0
    warmup_steps: int = 50
    c_warmup: int | None = None
    anneal: bool = False
    r: float = 0.0
    lr: float = 1.0
    # The runs before the optimizer's defaults changed were trained with sf_beta 0.9 (the default
    # then); the "defaults" family uses today's 0.8. Stated so that every run can be retrained.
    sf_beta: float = 0.9
    seed: int = 0
    purpose: str = "forecast"

    @property
    def is_sfplus(self) -> bool:
        return self.optimizer == "sfplus"


OTHER = "other"
#: AdamW's usual decoupled decay for the AdamW reference runs.
ADAMW: dict[str, Any] = {"weight_decay": 0.1, "purpose": OTHER}


def planned() -> list[Spec]:
    """The corpus: a lambda sweep on two sizes (drift study), variants of batch, warmups,
    annealing and r, wider/deeper/longer runs, and non-ScheduleFree+ references."""
    specs: list[Spec] = []
    for size, d_model in (("s", 64), ("m", 128)):
        for wd in (0.0, 0.5, 2.0, 5.0, 20.0, 50.0):
            specs.append(
                Spec(f"{size}-wd{wd:g}", d_model=d_model, weight_decay=wd, purpose="sweep")
            )
    for batch in (16, 128):
        for wd in (0.0, 20.0):
            specs.append(
                Spec(f"s-b{batch}-wd{wd:g}", batch_size=batch, weight_decay=wd, purpose="sweep")
            )
    for wd in (0.0, 20.0):
        specs.append(Spec(f"s-anneal-wd{wd:g}", anneal=True, weight_decay=wd, purpose="sweep"))
    specs += [
        Spec("s-wd10-r1", weight_decay=10.0, r=1.0),
        Spec("s-wd10-warm0", weight_decay=10.0, warmup_steps=0, c_warmup=0),
        Spec("s-wd10-warm300", weight_decay=10.0, warmup_steps=300),
        Spec("s-wd10-cw1000", weight_decay=10.0, c_warmup=1000),
        Spec("s-wd5-10k", steps=10_000, batch_size=16, weight_decay=5.0, anneal=True, r=1.0),
        Spec("s-wd20-6k-seed1", steps=6000, weight_decay=20.0, seed=1),
        Spec("m4-wd5", steps=2000, d_model=128, n_layers=4, weight_decay=5.0),
        Spec("l-wd10", steps=2000, d_model=256, weight_decay=10.0, anneal=True),
        Spec("s-b64-wd50-anneal-r1", batch_size=64, weight_decay=50.0, anneal=True, r=1.0),
    ]
    # The defaults family (forecast v2): the optimizer as users run it today -- sf_beta 0.8 and
    # long warmups (the default 500, c_warmup twice that), so that the first 20-30% of a run is
    # the warmup, the plateau and the averaging transient the forecast has to cope with.
    specs += [
        Spec("d-s-5k", steps=5000, weight_decay=5.0, warmup_steps=500, sf_beta=0.8),
        Spec("d-m-5k", steps=5000, d_model=128, weight_decay=5.0, warmup_steps=500, sf_beta=0.8),
        Spec("d-s-wd20-4k", steps=4000, weight_decay=20.0, warmup_steps=200, sf_beta=0.8),
        Spec("d-s-b64-wd50-4k", steps=4000, batch_size=64, weight_decay=50.0, warmup_steps=300,
             sf_beta=0.8),
        Spec("d-m-b16-wd10-anneal-6k", steps=6000, d_model=128, batch_size=16,
             weight_decay=10.0, warmup_steps=500, anneal=True, sf_beta=0.8),
        Spec("d-s-r1-anneal-8k", steps=8000, weight_decay=5.0, warmup_steps=500, anneal=True,
             r=1.0, sf_beta=0.8),
        Spec("d-m4-3k", steps=3000, d_model=128, n_layers=4, weight_decay=5.0, warmup_steps=300,
             sf_beta=0.8),
        Spec("d-l-wd10-3k", steps=3000, d_model=256, weight_decay=10.0, warmup_steps=250,
             sf_beta=0.8),
        Spec("d-s-cw1000-5k", steps=5000, weight_decay=5.0, warmup_steps=200, c_warmup=1000,
             sf_beta=0.8),
        Spec("d-s-b128-3k", steps=3000, batch_size=128, weight_decay=5.0, warmup_steps=300,
             sf_beta=0.8),
        Spec("d-s-seed1-6k", steps=6000, weight_decay=5.0, warmup_steps=500, sf_beta=0.8,
             seed=1),
        Spec("d-s-warm100-3k", steps=3000, weight_decay=5.0, warmup_steps=100, sf_beta=0.8),
    ]
    specs += [
        # Not ScheduleFree+: anytime references and decaying schedules (the off_model negatives).
        Spec("s-sfadamw-lr3e-3", optimizer="sf_adamw", lr=3e-3, weight_decay=0.0, purpose=OTHER),
        Spec("s-sfadamw-lr1e-2", optimizer="sf_adamw", lr=1e-2, weight_decay=0.0, purpose=OTHER),
        Spec("s-adamw-const-1e-3", optimizer="adamw_const", lr=1e-3, **ADAMW),
        Spec("s-adamw-const-3e-3", optimizer="adamw_const", lr=3e-3, **ADAMW),
        Spec("s-adamw-linear-3e-3", optimizer="adamw_linear", lr=3e-3, **ADAMW),
        Spec("s-adamw-cosine-3e-3", optimizer="adamw_cosine", lr=3e-3, **ADAMW),
        Spec("m-adamw-cosine-1e-3", optimizer="adamw_cosine", lr=1e-3, d_model=128, **ADAMW),
        Spec("m-adamw-linear-1e-3", optimizer="adamw_linear", lr=1e-3, d_model=128, **ADAMW),
    ]
    return specs


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------


class _Recorder:
    """Collects ``(key, step, value)`` rows and writes them as gzip CSV."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, float]] = []

    def add(self, key: str, step: int, value: float) -> None:
        self.rows.append((key, step, float(value)))

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        with gzip.open(tmp, "wt", encoding="ascii", compresslevel=9, newline="") as out:
            out.write("key,step,value\n")
            for key, step, value in self.rows:
                text = "nan" if math.isnan(value) else f"{value:.6g}"
                out.write(f"{key},{step},{text}\n")
        os.replace(tmp, path)


def _schedule(spec: Spec) -> Callable[[int], float]:
    """AdamW's learning-rate multiplier at step ``t`` (1-based): linear warmup, then flat,
    linear or cosine decay to 0 at the last step."""

    def factor(t: int) -> float:
        if spec.warmup_steps and t <= spec.warmup_steps:
            return t / spec.warmup_steps
        if spec.optimizer in ("adamw_const", "sf_adamw"):
            return 1.0
        frac = (t - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
        if spec.optimizer == "adamw_linear":
            return max(0.0, 1.0 - frac)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))

    return factor


def _norms(tensors: Iterable[Any]) -> float:
    return math.sqrt(sum(float(t.detach().pow(2).sum()) for t in tensors))


def train(spec: Spec, out_dir: Path = DATA_DIR, eval_points: int = 100,
          telemetry: bool = True) -> dict[str, Any]:
    """Train one run and write its two files. Returns the run's summary (also in its JSON).

    Args:
        out_dir: where the two files go (the corpus's folder by default).
        eval_points: how many eval-loss points over the run (and one at the last step).
        telemetry: record the optimizer's series and the training loss every step; without it
            only ``loss`` every 10 steps and ``eval_loss`` (small files, for sweeps).
    """
    import torch

    from bench.optimizer._sf_adamw import ScheduleFreeAdamW
    from curvecast.sfplus import ScheduleFreePlus
    from examples.charlm import CharDataset, CharTransformer, evaluate, load_stdlib_text

    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)
    dataset = CharDataset(load_stdlib_text(2_000_000))
    model = CharTransformer(dataset.vocab_size, d_model=spec.d_model, n_layers=spec.n_layers)
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(spec.seed)
    rec = _Recorder()
    c_warmup = 2 * spec.warmup_steps if spec.c_warmup is None else spec.c_warmup
    opt: Any
    if spec.is_sfplus:
        opt = ScheduleFreePlus(
            params,
            lr=spec.lr,
            weight_decay=spec.weight_decay,
            warmup_steps=spec.warmup_steps,
            c_warmup=c_warmup,
            anneal_steps=spec.steps if spec.anneal else 0,
            r=spec.r,
            sf_beta=spec.sf_beta,
        )
    elif spec.optimizer == "sf_adamw":
        opt = ScheduleFreeAdamW(params, lr=spec.lr, warmup_steps=spec.warmup_steps)
    else:
        opt = torch.optim.AdamW(
            params, lr=spec.lr, betas=(0.9, 0.95), weight_decay=spec.weight_decay
        )
    factor = _schedule(spec)
    eval_every = max(1, spec.steps // eval_points)
    averaged = getattr(opt, "averaged", None)

    def eval_loss() -> float:
        if averaged is not None:
            with averaged(model):
                return evaluate(model, dataset, batches=8)
        return evaluate(model, dataset, batches=8)

    started = time.perf_counter()
    last_report = started
    for t in range(1, spec.steps + 1):
        x, y = dataset.get_batch("train", spec.batch_size, model.block_size, gen)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if spec.is_sfplus and not telemetry:
            opt.step(loss=loss)
        elif spec.is_sfplus:
            opt.step(loss=loss)
            stats = opt.stats(norms=t % NORM_EVERY == 0)
            for key in EVERY_STEP:
                rec.add(telemetry_key(key), t, stats[key])
            if t % NORM_EVERY == 0:
                for key in EVERY_TENTH + ("x_l2", "y_l2", "z_l2", "grad_l2"):
                    rec.add(telemetry_key(key), t, stats[key])
        elif not telemetry:
            for group in opt.param_groups:
                group["lr"] = spec.lr * factor(t)
            opt.step()
        else:
            grads = [p.grad for p in params if p.grad is not None]
            rec.add(telemetry_key("grad_l1"), t, sum(float(g.abs().sum()) for g in grads))
            if t % NORM_EVERY == 0:
                rec.add(telemetry_key("grad_l2"), t, _norms(grads))
            for group in opt.param_groups:
                group["lr"] = spec.lr * factor(t)
            opt.step()
            # What Monitor.watch() logs for an optimizer that is not ScheduleFree+: its first
            # group's lr (schedule-free AdamW keeps its base rate there; warmup is inside).
            lr = opt.param_groups[0]["lr"] if opt.param_groups else spec.lr
            rec.add(telemetry_key("lr"), t, lr)
            if t % NORM_EVERY == 0:
                rec.add(telemetry_key("y_l2"), t, _norms(params))
                if averaged is not None:
                    with averaged():
                        rec.add(telemetry_key("x_l2"), t, _norms(params))
        if telemetry or t % NORM_EVERY == 0:
            rec.add("loss", t, float(loss.detach()))
        if t % eval_every == 0 or t == spec.steps:
            rec.add("eval_loss", t, eval_loss())
        now = time.perf_counter()
        if now - last_report > 30:
            last_report = now
            print(f"[{spec.name}] step {t}/{spec.steps} loss {float(loss):.3f}", flush=True)
    seconds = time.perf_counter() - started
    final = [v for k, _, v in rec.rows if k == "eval_loss"][-1]
    summary: dict[str, Any] = {
        "name": spec.name,
        "spec": asdict(spec),
        # The service's RunConfig keys, as a hook would log them (forecast horizon, burn-in).
        "config": {
            "total_steps": spec.steps,
            "optimizer": spec.optimizer,
            "warmup_steps": spec.warmup_steps,
            "c_warmup": c_warmup if spec.is_sfplus else None,
            "weight_decay": spec.weight_decay,
            "anneal_steps": spec.steps if spec.anneal else 0,
            "r": spec.r,
            "sf_beta": spec.sf_beta if spec.is_sfplus else None,
            "lr": spec.lr,
            "batch_size": spec.batch_size,
            "d_model": spec.d_model,
            "n_layers": spec.n_layers,
        },
        "final_eval_loss": final,
        "train_seconds": round(seconds, 1),
        "torch": torch.__version__,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    rec.write(out_dir / f"{spec.name}.csv.gz")
    (out_dir / f"{spec.name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def report() -> tuple[str, str, str]:
    """The corpus as it is on disk: its run table (``bench/data/sfplus_corpus/README.md``), the
    section's body (how it was made) and its one-line result."""
    from bench._report import markdown_table

    rows = []
    total_s = 0.0
    for s in planned():
        path = DATA_DIR / f"{s.name}.json"
        if not path.exists():
            rows.append([s.name, s.optimizer, *["-"] * 9, "not trained"])
            continue
        meta = json.loads(path.read_text())
        total_s += float(meta["train_seconds"])
        cfg = meta["config"]
        final = meta["final_eval_loss"]
        rows.append([
            s.name, s.optimizer, f"{s.d_model}x{s.n_layers}", s.batch_size, s.steps,
            f"{s.lr:g}", f"{s.weight_decay:g}", s.warmup_steps,
            cfg["c_warmup"] if cfg["c_warmup"] is not None else "-",
            f"{s.sf_beta:g}" if s.is_sfplus else "-",
            f"{'anneal' if s.anneal else '-'} / r={s.r:g}",
            "diverged (NaN)" if final != final else f"{final:.3f}",
        ])
    size = sum(f.stat().st_size for f in DATA_DIR.glob("*.csv.gz"))
    method = (
        "Each run trains `examples.charlm.CharTransformer` (block 64, 4 heads) on the Python "
        "standard library's source with one torch thread, seed 0 unless named, the same batches "
        "for the same seed; eval loss at x on 8 fixed held-out batches every 1% of the run "
        "(the module's docstring lists the series). ScheduleFree+ runs use `ScheduleFreePlus(lr, "
        "weight_decay=lambda, warmup_steps, c_warmup, anneal_steps=steps if annealed, r, "
        "sf_beta)`: the runs named `d-*` the optimizer's current defaults (sf_beta 0.8, long "
        "warmups), the others sf_beta 0.9; `sf_adamw` is schedule-free AdamW "
        "(`bench/optimizer/_sf_adamw.py`); `adamw_*` is `torch.optim.AdamW(betas=(0.9, 0.95), "
        "weight_decay=0.1)` with linear warmup then a constant, linear-to-0 or cosine-to-0 "
        "learning rate."
    )
    table = markdown_table(
        ["run", "optimizer", "d_model x layers", "batch", "steps", "lr", "lambda", "warmup",
         "c_warmup", "sf_beta", "beta anneal / r", "final eval loss"], rows)
    trained = sum(1 for r in rows if r[-1] != "not trained")
    diverged = sum(1 for r in rows if r[-1] == "diverged (NaN)")
    readme = ("# The ScheduleFree+ corpus\n\nWritten by `python -m bench run sfplus_corpus "
              f"--report`.\n\n{method}\n\n{table}\n")
    result = (f"{trained} runs ({diverged} diverged), {size / 2**20:.1f} MiB of gzip CSV, "
              f"{total_s / 3600:.1f} CPU-hours of training")
    body = (f"{method}\n\nThe runs, one row each: "
            "[`bench/data/sfplus_corpus/README.md`](bench/data/sfplus_corpus/README.md).")
    return readme, body, result


def _done(spec: Spec) -> bool:
    return (DATA_DIR / f"{spec.name}.json").exists() and (DATA_DIR / f"{spec.name}.csv.gz").exists()


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--list", action="store_true", help="list the planned runs and stop")
    cli.add_argument("--only", nargs="*", default=None, help="train these runs (again)")
    cli.add_argument("--jobs", type=int, default=1, help="runs trained at once")
    cli.add_argument("--report", action="store_true",
                     help="only list the runs (bench/data/sfplus_corpus/README.md) and write "
                          "the section")
    args = cli.parse_args(argv)
    specs = planned()
    if args.report:
        readme, body, result = report()
        if writes(args):
            (DATA_DIR / "README.md").write_text(readme)
        return publish(args, "sfplus_corpus", "The ScheduleFree+ corpus", body, result)
    if args.list:
        for s in specs:
            print(
                f"{'done ' if _done(s) else 'todo '} {s.name:28s} {s.optimizer:12s} "
                f"steps={s.steps} d={s.d_model}x{s.n_layers} b={s.batch_size} wd={s.weight_decay:g}"
            )
        return 0
    if args.only is not None:
        names = set(args.only)
        unknown = names - {s.name for s in specs}
        if unknown:
            print(f"unknown run(s): {', '.join(sorted(unknown))} (see --list)", file=sys.stderr)
            return 2
        todo = [s for s in specs if s.name in names]
    else:
        todo = [s for s in specs if not _done(s)]
    print(f"[corpus] {len(todo)} run(s) to train, {args.jobs} at a time -> {DATA_DIR}", flush=True)
    train_each(todo, train, jobs=args.jobs, label="corpus")
    return 0


def train_each(todo: Sequence[Spec], work: Callable[[Spec], dict[str, Any]], *, jobs: int,
               label: str) -> None:
    """Train ``todo`` with ``work``, ``jobs`` at a time, printing each run's end; a run that
    fails is reported and the others go on."""
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(work, s): s for s in todo}
        for i, fut in enumerate(as_completed(futures), 1):
            s = futures[fut]
            try:
                out = fut.result()
            except Exception as exc:  # noqa: BLE001 - report and go on with the other runs
                print(f"[{label}] {i}/{len(todo)} {s.name}: FAILED: {exc!r}", flush=True)
                continue
            print(f"[{label}] {i}/{len(todo)} {s.name}: final eval loss "
                  f"{out['final_eval_loss']:.4f} in {out['train_seconds']:.0f} s "
                  f"({time.perf_counter() - started:.0f} s wall so far)", flush=True)

