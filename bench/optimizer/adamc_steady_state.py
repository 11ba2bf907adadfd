"""Whether the AdamC steady state ``||u|| / ||z|| = sqrt(2 lambda)`` holds on our runs.

Run from the repository root (about 5 minutes on one busy CPU core)::

    python -m bench run adamc_steady_state            # writes BENCHMARKS.md
    python -m bench run adamc_steady_state --no-write

The paper balances the fully decoupled decay ``z -= alpha^2 lambda y`` against the update
``z -= alpha u``: with ``<z, u> ~ 0`` (scale-invariant weights) ``||z||^2`` is steady when
``2 alpha^2 lambda ||z||^2 = alpha^2 ||u||^2``, i.e. ``||u|| / ||z|| = sqrt(2 lambda)``,
whatever the step size. ``u`` is the Adam direction ``m_hat / (sqrt(v_hat) + eps)``, not the
raw gradient (whose ratio to ``||z||`` is in other units).

For lambda in {2, 5, 20} the script trains ``examples.charlm``'s transformer (d_model 64, 2
layers, batch 32, one torch thread) with :class:`ScheduleFreePlus` for 1,500 steps and, every 10
steps over the last 30% of the run, computes ``u`` from the optimizer's own state (``exp_avg``,
``exp_avg_sq``, their bias corrections) and ``z = y + (z - y)``: over all parameters, and over
the matrices inside the transformer blocks only (each followed by a LayerNorm, the closest to
scale-invariant). It reports the median ratio against ``sqrt(2 lambda)`` and the raw
``||g|| / ||z||`` beside it.
"""

from __future__ import annotations

import math
import statistics

import torch

from bench._cli import parser, publish
from bench._report import markdown_table, progress
from curvecast.sfplus import ScheduleFreePlus
from examples.charlm import CharDataset, CharTransformer, load_stdlib_text

LAMBDAS = (2.0, 5.0, 20.0)
STEPS = 1500


def _norms(opt: ScheduleFreePlus, params: list[torch.nn.Parameter], only: set[int]
           ) -> tuple[float, float, float]:
    """(||u||, ||z||, ||g||) over ``params`` whose index is in ``only``."""
    beta1, beta2 = opt.param_groups[0]["betas"]
    eps = opt.param_groups[0]["eps"]
    u2 = z2 = g2 = 0.0
    for i, p in enumerate(params):
        if i not in only or p.grad is None:
            continue
        st = opt.state[p]
        t = int(st["step"])
        m_hat = st["exp_avg"] / (1 - beta1**t)
        v_hat = st["exp_avg_sq"] / (1 - beta2**t)
        u = m_hat / (v_hat.sqrt() + eps)
        z = p.detach() + st["z_minus_y"]
        u2 += float(u.pow(2).sum())
        z2 += float(z.pow(2).sum())
        g2 += float(p.grad.pow(2).sum())
    return math.sqrt(u2), math.sqrt(z2), math.sqrt(g2)


def run(weight_decay: float, dataset: CharDataset, steps: int = STEPS) -> dict[str, float]:
    torch.manual_seed(0)
    model = CharTransformer(dataset.vocab_size, d_model=64, n_layers=2)
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    every = set(range(len(params)))
    blocks = {i for i, n in enumerate(names) if n.startswith("blocks.") and n.endswith("weight")
              and params[i].dim() == 2}
    opt = ScheduleFreePlus(params, weight_decay=weight_decay, warmup_steps=50)
    gen = torch.Generator().manual_seed(0)
    ratios: dict[str, list[float]] = {"all": [], "blocks": [], "raw": []}
    for t in range(1, steps + 1):
        x, y = dataset.get_batch("train", 32, model.block_size, gen)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step(loss=loss)
        if t > 0.7 * steps and t % 10 == 0:
            u, z, g = _norms(opt, params, every)
            ub, zb, _ = _norms(opt, params, blocks)
            ratios["all"].append(u / z)
            ratios["blocks"].append(ub / zb)
            ratios["raw"].append(g / z)
        if t % 300 == 0:
            progress("adamc", f"lambda {weight_decay:g}: step {t}/{steps}")
    return {k: statistics.median(v) for k, v in ratios.items()}


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, quick="150 steps a run").parse_args(argv)
    steps = 150 if args.quick else STEPS
    torch.set_num_threads(1)
    dataset = CharDataset(load_stdlib_text(2_000_000))
    rows = []
    for wd in LAMBDAS:
        r = run(wd, dataset, steps)
        target = math.sqrt(2 * wd)
        rows.append([f"{wd:g}", f"{target:.2f}", f"{r['all']:.2f}", f"{r['all'] / target:.2f}x",
                     f"{r['blocks']:.2f}", f"{r['blocks'] / target:.2f}x", f"{r['raw']:.4f}",
                     f"{target / r['raw']:.0f}x"])
    body = (
        f"`examples.charlm` transformer, d_model 64, 2 layers, batch 32, {steps} steps, "
        "ScheduleFreePlus(weight_decay=lambda, warmup_steps=50), one torch thread; medians over "
        "the last 30% of the run (every 10 steps). `u` = the Adam direction "
        "`m_hat / (sqrt(v_hat) + eps)` from the optimizer's state, `z = y + (z - y)`.\n\n"
        + markdown_table(
            ["lambda", "sqrt(2 lambda)", "‖u‖/‖z‖ (all)", "vs sqrt(2 lambda)",
             "‖u‖/‖z‖ (block matrices)", "vs sqrt(2 lambda)", "raw ‖g‖/‖z‖",
             "sqrt(2 lambda) / raw"],
            rows,
        )
    )
    spread = [float(row[3].rstrip("x")) for row in rows]
    result = (f"‖u‖/‖z‖ is {min(spread):.2f}–{max(spread):.2f}× sqrt(2 lambda) at lambda "
              f"{', '.join(f'{wd:g}' for wd in LAMBDAS)}: the steady state does not hold")
    return publish(args, "adamc", "The AdamC steady state on real runs", body, result)
