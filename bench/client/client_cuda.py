"""The client hook in a CUDA training loop: what it adds to a step, and that it never waits.

What ``Monitor.log()`` and ``watch()`` add to a step, and that neither waits for the GPU. The
repository's machine has no GPU, so this runs on a lent GPU machine (``--device cpu`` runs the
same loop on the CPU, as a smoke test), and the section is written here from its results::

    python -m bench run client_cuda --out client_cuda.json      # on the GPU machine
    python -m bench run client_cuda --report client_cuda.json   # here: the BENCHMARKS.md section

Loop: ``examples.charlm``'s CharTransformer at ``optimizer``'s "1M" and "10M" sizes on
random tokens (batch 32 x 64), ScheduleFree+ with its defaults; with the hook on, ``watch()``
(norms every 100 steps) and ``log()`` of the loss (a CUDA tensor) with the seven other metrics of
``client_overhead``. The service is down (an unused port), so the client spools, as in an
outage, and no server shares the machine. Hook off and on alternate in blocks of 100 steps.

Measured, per step:

* **host reads in the training thread** (``optimizer.HostReads``; torch function modes
  are per thread, so the client's background threads are not counted): the optimizer's own one,
  and what the hook adds. A read of a CUDA tensor waits for the GPU, so the hook must add none
  except on a norms step (one: the norms' sums);
* **wall time**, hook off and on (median of the blocks, and the median of the paired
  differences), the GPU synchronised at the end of each block;
* **CPU**: of the training thread's ``log()`` calls and ``watch()`` hook (thread clock, around
  each), and of the client's background threads;
* **values**: every step's loss in the spool, equal to the loss tensor read afterwards.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from bench._cli import parser, publish
from bench._report import markdown_table
from bench.client._loop import other_metrics, thread_cpu_ns
from bench.optimizer.optimizer import SIZES, HostReads
from curvecast.client import Monitor
from curvecast.client._batcher import plain_body
from curvecast.sfplus import ScheduleFreePlus
from examples.charlm import CharTransformer

BLOCK = 100  #: steps per block; norms_every too, so each hook-on block has one norms step
BATCH, SEQ, VOCAB = 32, 64, 100


def spooled_losses(spool: Path) -> dict[int, float]:
    """The ``loss`` column of every batch in the spool, by step."""
    out: dict[int, float] = {}
    for segment in sorted(spool.rglob("*.jsonl")):
        for line in segment.read_bytes().splitlines():
            batch = json.loads(plain_body(line))
            for step, value in zip(batch["steps"], batch["values"].get("loss", ()), strict=False):
                if value is not None:
                    out.setdefault(step, value)
    return out


def run_size(size: str, device: torch.device, blocks: int) -> dict[str, Any]:
    d_model, n_layers, n_heads = SIZES[size]
    torch.manual_seed(0)
    model = CharTransformer(VOCAB, d_model=d_model, n_layers=n_layers, n_heads=n_heads).to(device)
    opt = ScheduleFreePlus(model.parameters())
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), device=device, generator=gen)
    y = torch.randint(0, VOCAB, (BATCH, SEQ), device=device, generator=gen)
    spool = Path(tempfile.mkdtemp(prefix="client-cuda-"))
    mon = Monitor(url="http://127.0.0.1:9", run_name=f"client_cuda {size}", spool_dir=spool,
                  norms_every=BLOCK, handle_sigterm=False, flush_timeout=0.0)
    clock = time.thread_time_ns
    hook_ns = [0, 0]  # [start, total]

    def before(*_: Any) -> None:
        hook_ns[0] = clock()

    def after(*_: Any) -> None:
        hook_ns[1] += clock() - hook_ns[0]

    losses: dict[int, torch.Tensor] = {}
    step = 0
    hooks: list[Any] = []

    def hook_on() -> None:
        # The watch() hook between two timing hooks, registered in that order.
        hooks.append(opt.register_step_post_hook(before))
        hooks.append(mon.watch(opt, log_config=not losses))
        hooks.append(opt.register_step_post_hook(after))

    def hook_off() -> None:
        while hooks:
            hooks.pop().remove()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def block(on: bool, count_reads: bool = False) -> tuple[float, int, int]:
        """Wall seconds, host reads (when counted) and log() CPU ns of one block of BLOCK
        steps. Reads are counted in blocks of their own: the mode that counts them wraps every
        torch call in a Python frame, which would swamp the timings."""
        nonlocal step
        reads, log_ns = HostReads(), 0
        hook_off()
        if on:
            hook_on()
        sync()
        start = time.perf_counter()
        with reads if count_reads else contextlib.nullcontext():
            for _ in range(BLOCK):
                step += 1
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                loss.backward()
                opt.step(loss=loss)
                opt.zero_grad(set_to_none=True)
                if on:
                    others = other_metrics(step)
                    t0 = clock()
                    mon.log(step, loss=loss, **others)
                    log_ns += clock() - t0
                    losses[step] = loss.detach()
        sync()
        return time.perf_counter() - start, reads.count, log_ns

    for _ in range(3):  # warm-up: kernels, allocator, the optimizer's first steps
        block(False)
    block(True)  # and the hook's first calls
    off_reads = block(False, count_reads=True)[1]
    on_reads = block(True, count_reads=True)[1]
    hook_ns[1] = 0
    pipe = mon._pipe
    bg_start = sum(thread_cpu_ns(t) for t in (pipe.batcher, pipe.sender_thread))
    off_s: list[float] = []
    on_s: list[float] = []
    log_total = 0
    for i in range(2 * blocks):
        on = i % 2 == 1
        seconds, _, log_ns = block(on)
        (on_s if on else off_s).append(seconds)
        log_total += log_ns
    hook_off()
    pipe.wake_batcher()
    pipe.wait_for(pipe.idle_batcher, time.monotonic() + 60)
    bg_ns = sum(thread_cpu_ns(t) for t in (pipe.batcher, pipe.sender_thread)) - bg_start
    mon.finish(timeout=0)
    steps_on = blocks * BLOCK
    spooled = spooled_losses(spool)
    exact = sum(spooled.get(s) == float(t.item()) for s, t in losses.items())
    return {
        "size": size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "ms_per_step_off": statistics.median(off_s) * 1e3 / BLOCK,
        "ms_per_step_on": statistics.median(on_s) * 1e3 / BLOCK,
        "slowdown_pct": 100 * statistics.median(b / a - 1 for a, b in zip(off_s, on_s,
                                                                         strict=True)),
        "host_reads_per_step_off": off_reads / BLOCK,
        "host_reads_per_step_on": on_reads / BLOCK,
        "log_us": log_total / 1e3 / steps_on,
        "watch_us": hook_ns[1] / 1e3 / steps_on,
        "background_us": bg_ns / 1e3 / steps_on,
        "losses_logged": len(losses),
        "losses_spooled_exact": exact,
        "blocks": blocks,
        "block_steps": BLOCK,
    }


def report(results: dict[str, Any], kept_in: Path) -> tuple[str, str]:
    """The section's body from a results file (``kept_in``: where it is kept), and its result."""
    rows = [[f"CharTransformer ~{r['size']} ({r['parameters']:,} parameters)",
             f"{r['ms_per_step_off']:.2f}", f"{r['ms_per_step_on']:.2f}",
             f"{r['slowdown_pct']:+.1f}%", f"{r['host_reads_per_step_off']:.2f}",
             f"{r['host_reads_per_step_on']:.2f}", f"{r['log_us']:.1f}", f"{r['watch_us']:.1f}",
             f"{r['background_us']:.1f}",
             f"{r['losses_spooled_exact']:,} of {r['losses_logged']:,}"]
            for r in results["runs"]]
    first = results["runs"][0]
    body = (
        f"Measured on {results['device']} with torch {results['torch']} by `python -m bench run "
        f"client_cuda --out client_cuda.json` (results kept in `{kept_in.as_posix()}`); the "
        "machine line is where this report was written. `client_overhead`'s loop on the GPU: "
        "`examples.charlm`'s CharTransformer on random tokens (batch 32 × 64), ScheduleFree+ "
        "with its defaults; hook on: `watch()` (norms every 100 steps) and `log()` of the loss, "
        "a CUDA tensor, with seven other metrics; the service down (the client spools). Hook "
        f"off and on alternate in blocks of {first['block_steps']} steps, the GPU synchronised "
        f"at the end of each; {first['blocks']} pairs. Host reads (in the training thread "
        "only) would make the loop wait for the GPU; CPU: the training thread's `log()` and "
        "`watch()` hook, and the client's background threads, per step.\n\n"
        + markdown_table(["model", "ms/step off", "ms/step on", "slowdown (median of pairs)",
                          "host reads per step, off", "on", "`log()` µs CPU",
                          "`watch()` µs CPU", "background µs CPU", "losses spooled exactly"],
                         rows))
    added = max(r["host_reads_per_step_on"] - r["host_reads_per_step_off"]
                for r in results["runs"])
    exact = all(r["losses_spooled_exact"] == r["losses_logged"] for r in results["runs"])
    result = (f"the hook adds {added:.2f} host reads a step (the norms' one, every 100 steps); "
              "slowdown " + ", ".join(f"{r['slowdown_pct']:+.1f}%" for r in results["runs"])
              + f" (median of {first['blocks']} pairs); every loss spooled exactly: "
              + ("yes" if exact else "NO"))
    return body, result


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--device", default="cuda")
    cli.add_argument("--sizes", default="1M,10M")
    cli.add_argument("--blocks", type=int, default=20, help="pairs of off/on blocks")
    cli.add_argument("--out", type=Path, help="write the results as JSON")
    cli.add_argument("--report", type=Path, help="write the section from a results file")
    args = cli.parse_args(argv)
    if args.report:
        body, result = report(json.loads(args.report.read_text()), args.report)
        return publish(args, "client_cuda", "The client hook in a CUDA training loop", body,
                       result)
    device = torch.device(args.device)
    torch.set_num_threads(1 if device.type == "cpu" else torch.get_num_threads())
    results = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "runs": [run_size(size, device, args.blocks) for size in args.sizes.split(",")],
    }
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0
