"""Two small hyper-parameter sweeps of the char-level transformer, for the pruning benches.

Each sweep trains :class:`examples.charlm.CharTransformer` on the Python standard library's source
(nothing downloaded), every config the same model family, data, seed and number of steps, so that
"which run ends best" is a meaningful question -- what a pruner and P(best) have to answer:

* ``a``: width 64 x 2 layers, 1,200 steps: ScheduleFree+ with its lr scale, lambda
  (``weight_decay``), warmup, ``c_warmup`` and batch varied, two schedule-free AdamW and two
  constant-LR AdamW runs;
* ``b``: 1,000 steps, width 48 or 96 x 2 layers: ScheduleFree+ varied the same way plus width,
  two schedule-free AdamW and two constant-LR AdamW runs.

The training is the corpus's (:func:`bench.optimizer.sfplus_corpus.train`: one torch thread, seed
0, fixed batches, sf_beta 0.8 as the optimizer's default), without its per-step telemetry: each
run writes ``bench/data/charlm_sweeps/<name>.csv.gz`` (``key,step,value``: ``eval_loss`` on 8
fixed held-out batches every 2.5% of the run and at the last step, ``loss`` every 10 steps) and
``<name>.json`` (its config in the service's ``RunConfig`` keys, final eval loss, seconds).

Run from the repository root (runs on disk are skipped, so an interrupted build resumes)::

    python -m bench run charlm_sweeps --list      # the planned runs and which exist
    python -m bench run charlm_sweeps --jobs 2    # train the missing runs, two at a time
"""

from __future__ import annotations

import sys
import time
from functools import partial
from typing import Any

from bench._cli import parser
from bench._paths import DATA
from bench.optimizer.sfplus_corpus import Spec, train, train_each

DATA_DIR = DATA / "charlm_sweeps"
EVAL_POINTS = 40
#: The sweeps' planned steps, by the run name's prefix.
STEPS = {"a": 1200, "b": 1000}
_SF: dict[str, Any] = {"sf_beta": 0.8, "purpose": "sweep"}
_ADAMW: dict[str, Any] = {"optimizer": "adamw_const", "weight_decay": 0.1, "purpose": "sweep"}
_SFADAMW: dict[str, Any] = {"optimizer": "sf_adamw", "weight_decay": 0.0, "purpose": "sweep"}


def planned() -> list[Spec]:
    """Both sweeps' configs (the run name starts with its sweep: ``a-`` or ``b-``)."""
    a: dict[str, Any] = {"steps": STEPS["a"], "d_model": 64, "warmup_steps": 100}
    b: dict[str, Any] = {"steps": STEPS["b"], "warmup_steps": 100}
    return [
        Spec("a-sfp-lr1-wd5", lr=1.0, weight_decay=5.0, **a, **_SF),
        Spec("a-sfp-lr0.5-wd5", lr=0.5, weight_decay=5.0, **a, **_SF),
        Spec("a-sfp-lr2-wd5", lr=2.0, weight_decay=5.0, **a, **_SF),
        Spec("a-sfp-lr1-wd0", lr=1.0, weight_decay=0.0, **a, **_SF),
        Spec("a-sfp-lr1-wd20", lr=1.0, weight_decay=20.0, **a, **_SF),
        Spec("a-sfp-lr1-wd50", lr=1.0, weight_decay=50.0, **a, **_SF),
        Spec("a-sfp-warm20", weight_decay=5.0, **{**a, "warmup_steps": 20}, **_SF),
        Spec("a-sfp-warm300", weight_decay=5.0, **{**a, "warmup_steps": 300}, **_SF),
        Spec("a-sfp-cw600", weight_decay=5.0, c_warmup=600, **a, **_SF),
        Spec("a-sfp-b16", weight_decay=5.0, batch_size=16, **a, **_SF),
        Spec("a-sfp-b64", weight_decay=5.0, batch_size=64, **a, **_SF),
        Spec("a-sfadamw-3e-3", lr=3e-3, **a, **_SFADAMW),
        Spec("a-sfadamw-1e-2", lr=1e-2, **a, **_SFADAMW),
        Spec("a-adamw-const-1e-3", lr=1e-3, **a, **_ADAMW),
        Spec("a-adamw-const-3e-3", lr=3e-3, **a, **_ADAMW),
        Spec("b-sfp-d48-wd5", d_model=48, weight_decay=5.0, **b, **_SF),
        Spec("b-sfp-d48-wd20", d_model=48, weight_decay=20.0, **b, **_SF),
        Spec("b-sfp-d96-wd5", d_model=96, weight_decay=5.0, **b, **_SF),
        Spec("b-sfp-d96-wd20", d_model=96, weight_decay=20.0, **b, **_SF),
        Spec("b-sfp-d96-wd0", d_model=96, weight_decay=0.0, **b, **_SF),
        Spec("b-sfp-d96-lr0.5", d_model=96, lr=0.5, weight_decay=5.0, **b, **_SF),
        Spec("b-sfp-d96-lr2", d_model=96, lr=2.0, weight_decay=5.0, **b, **_SF),
        Spec("b-sfp-d96-warm50", d_model=96, weight_decay=5.0, **{**b, "warmup_steps": 50},
             **_SF),
        Spec("b-sfp-d96-warm200", d_model=96, weight_decay=5.0, **{**b, "warmup_steps": 200},
             **_SF),
        Spec("b-sfp-d96-b64", d_model=96, weight_decay=5.0, batch_size=64, **b, **_SF),
        Spec("b-sfadamw-d96-3e-3", d_model=96, lr=3e-3, **b, **_SFADAMW),
        Spec("b-sfadamw-d48-1e-2", d_model=48, lr=1e-2, **b, **_SFADAMW),
        Spec("b-adamw-const-d96-1e-3", d_model=96, lr=1e-3, **b, **_ADAMW),
        Spec("b-adamw-const-d48-3e-3", d_model=48, lr=3e-3, **b, **_ADAMW),
    ]


def _done(spec: Spec) -> bool:
    return (DATA_DIR / f"{spec.name}.json").exists() and (DATA_DIR / f"{spec.name}.csv.gz").exists()


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, writes_to="BENCHMARKS.md (never written: this builds data)")
    cli.add_argument("--list", action="store_true", help="list the planned runs and stop")
    cli.add_argument("--jobs", type=int, default=1, help="runs trained at once")
    args = cli.parse_args(argv)
    specs = planned()
    if args.list:
        for s in specs:
            print(f"{'done ' if _done(s) else 'todo '} {s.name:26s} {s.optimizer:12s} "
                  f"steps={s.steps} d={s.d_model}x{s.n_layers} b={s.batch_size} lr={s.lr:g} "
                  f"wd={s.weight_decay:g} warmup={s.warmup_steps}")
        return 0
    todo = [s for s in specs if not _done(s)]
    # The longest first, so that two workers finish together.
    todo.sort(key=lambda s: -s.steps * s.batch_size * s.d_model)
    print(f"[charlm_sweeps] {len(todo)} run(s), {args.jobs} at a time -> {DATA_DIR}", flush=True)
    started = time.perf_counter()
    train_each(todo, partial(train, out_dir=DATA_DIR, eval_points=EVAL_POINTS, telemetry=False),
               jobs=args.jobs, label="charlm_sweeps")
    print(f"[charlm_sweeps] done in {time.perf_counter() - started:.0f} s wall", file=sys.stderr,
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
