"""Train a small character-level transformer on the Python standard library's own source with
ScheduleFree+, streaming every step to curvecast.

This is the script `curvecast demo` runs, and the example to copy: the curvecast part is the
five lines marked ``# curvecast``. Nothing is downloaded: the text is the ``.py`` files of the
interpreter running this script (found with ``sysconfig``).

    python examples/train_charlm.py --url http://127.0.0.1:8000 --steps 2000
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from charlm import CharDataset, CharTransformer, evaluate, load_stdlib_text  # beside this file

from curvecast import Monitor, ScheduleFreePlus


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    # The docstring's first paragraph (its first line alone stopped mid-sentence).
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    default = " (default: %(default)s)"  # argparse fills it in
    p.add_argument("--url", default="http://127.0.0.1:8000", help="curvecast service" + default)
    p.add_argument("--project", default="demo", help="the run's project" + default)
    p.add_argument("--run-name", default="charlm-stdlib", help="the run's name" + default)
    p.add_argument("--run-id", default=None, help="resume this run id after a restart")
    p.add_argument("--steps", type=int, default=2000, help="training steps" + default)
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step" + default)
    p.add_argument("--block-size", type=int, default=64, help="characters per sequence" + default)
    p.add_argument("--d-model", type=int, default=128, help="transformer width" + default)
    p.add_argument("--layers", type=int, default=2, help="transformer layers" + default)
    p.add_argument("--eval-every", type=int, default=20,
                   help="steps between evaluations of the averaged weights (eval_loss; default: "
                   "%(default)s)")
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=None,
        help="ScheduleFreePlus warmup (default: a quarter of the run; the optimizer's own default, "
        "500 steps, is meant for runs of a few thousand steps and more)",
    )
    p.add_argument(
        "--c-warmup",
        type=int,
        default=None,
        help="steps before averaging starts (default: 1.5x the warmup, so that the forecast, "
        "which needs as long again after it, is useful from 75%% of the run; the optimizer's "
        "own default, twice the warmup, would leave it too_early to the end)",
    )
    p.add_argument("--print-every", type=int, default=None,
                   help="steps between progress lines on stdout (default: 5%% of the run)")
    p.add_argument("--seed", type=int, default=0, help="torch's random seed" + default)
    p.add_argument("--threads", type=int, default=0, help="torch threads (default 0: torch's own)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train, streaming to curvecast; returns the process exit code."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data = CharDataset(load_stdlib_text(max_chars=2_000_000))
    model = CharTransformer(
        data.vocab_size,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=4,
        block_size=args.block_size,
    )
    # The optimizer's defaults (AdamC decay 5, sf_beta 0.8), with a warmup sized to this short run
    # and averaging from 1.5x the warmup: with the optimizer's 2x it would start at half of the run
    # and the forecast would stay too_early until twice that, the end. The eval loss at x humps
    # after averaging starts, by about its sampling noise at 1.5x and more at 1.625x and 1.75x
    # (BENCHMARKS.md, "demo_run").
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, args.steps // 4)
    c_warmup = args.c_warmup if args.c_warmup is not None else (3 * warmup) // 2
    opt = ScheduleFreePlus(model.parameters(), warmup_steps=warmup, c_warmup=c_warmup)
    batches = torch.Generator().manual_seed(args.seed)

    mon = Monitor(
        url=args.url,
        project=args.project,
        run_name=args.run_name,  # curvecast
        # watch() below adds the optimizer's hyper-parameters ("optimizer": {"name": ...},
        # weight_decay, c_warmup, warmup_steps): the config here describes the rest.
        config={
            "model": "CharTransformer",
            "d_model": args.d_model,
            "layers": args.layers,
            "batch_size": args.batch_size,
        },
        total_steps=args.steps,
        run_id=args.run_id,
    )
    mon.watch(opt)  # curvecast
    every = args.print_every or max(1, args.steps // 20)
    print(f"run {mon.run_id}: {args.steps} steps, d_model {args.d_model}, {args.layers} layers, "
          f"warmup {warmup}, averaging from step {c_warmup}", flush=True)
    started, eval_loss = time.monotonic(), float("nan")
    # Ctrl-C or an error ends the run "failed" with the exception named (the monitor's exit
    # hook); the end of the loop, "finished".
    for step in range(1, args.steps + 1):
        x, y = data.get_batch("train", args.batch_size, args.block_size, batches)
        loss = model(x, y)
        loss.backward()
        opt.step(loss=loss)  # the Polyak step size needs the loss at y
        opt.zero_grad(set_to_none=True)
        mon.log(step, loss=loss)  # curvecast
        if step % args.eval_every == 0 or step == args.steps:
            with opt.averaged(model):  # evaluate the averaged weights x
                eval_loss = evaluate(model, data, batches=4)
            mon.log(step, eval_loss=eval_loss)  # curvecast
        if step % every == 0 or step == args.steps:
            pace = step / (time.monotonic() - started)
            print(f"step {step}/{args.steps} loss {loss.item():.4f} eval_loss {eval_loss:.4f} "
                  f"({pace:.1f} steps/s)", flush=True)
    mon.finish()  # curvecast
    print(f"finished: {mon.stats()['points_sent']} points sent", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
