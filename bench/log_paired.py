"""``Monitor.log()`` of this checkout against a git revision's, step by step in one training loop.

``bench.client_overhead`` measures the whole hook run against run, and runs on this shared
machine differ by more than a microsecond or two of ``log()``. Here both versions run in the
same process, on the same training loop (the bench's MLP, ScheduleFree+, ``watch()`` on), in
alternating pairs of steps (AABB...), each call timed by the thread's CPU clock right after the
training step: the cold caches a real loop gives ``log()`` and the machine's load at that moment
are the same for both.

The revision's ``log`` and ``_check_names`` are read from ``client/_monitor.py`` at that
revision and bound to a second monitor (so each keeps its own names state) whose sink is the
first's: both see the wall time of the one ``watch()`` hook. They run with this checkout's
module globals, so a revision whose ``log()`` needs a name the module no longer has fails with
a ``NameError``. Both monitors point at a closed port: their records are spooled, not sent.

Usage: ``python -m bench.log_paired --base REV [--steps N] [--rounds R] [--no-write]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import textwrap
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.nn.functional as F

from bench._report import markdown_table, phase, write_section
from bench.client_overhead import make_loop, monitor, other_metrics
from curvecast.client import Monitor
from curvecast.client import _monitor as monitor_module

#: Steps before the timing starts (the run created, first calls made, tensor types seen).
WARMUP = 100


def methods_at(rev: str, names: tuple[str, ...]) -> dict[str, Callable[..., Any]]:
    """Functions ``names`` of ``Monitor`` as they were at ``rev``, with this module's globals."""
    source = subprocess.run(["git", "show", f"{rev}:client/_monitor.py"], capture_output=True,
                            text=True, check=True).stdout
    namespace = dict(vars(monitor_module))
    for name in names:
        start = source.index(f"    def {name}(")
        end = source.index("\n    def ", start + 1)
        exec(textwrap.dedent(source[start:end]), namespace)  # noqa: S102 - our own history
    return {name: namespace[name] for name in names}


def paired_round(base: dict[str, Callable[..., Any]], steps: int) -> tuple[list[int], list[int]]:
    """Thread-CPU ns of each ``log()`` call: the revision's, and this checkout's."""
    model, opt, x, y = make_loop()
    closed = "http://127.0.0.1:9"  # nothing listens: the records are spooled
    mon = monitor(closed, Path(tempfile.mkdtemp()))
    mon.watch(opt)
    mon_base: Monitor = monitor(closed, Path(tempfile.mkdtemp()))
    mon_base._sink = mon._sink  # the same watch() hook's wall time for both
    mon_base._check_names = types.MethodType(base["_check_names"], mon_base)  # type: ignore[method-assign]
    calls = (types.MethodType(base["log"], mon_base), mon.log)
    clock = time.thread_time_ns
    times: tuple[list[int], list[int]] = ([], [])
    for step in range(1, WARMUP + steps + 1):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad(set_to_none=True)
        others = other_metrics(step)
        which = (step // 2) % 2
        clock()  # a cold reading, outside the timing
        start = clock()
        calls[which](step, loss=loss, **others)
        end = clock()
        if step > WARMUP:
            times[which].append(end - start)
    mon_base.finish(timeout=0.5)
    mon.finish(timeout=0.5)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="the revision to compare with (HEAD)")
    parser.add_argument("--steps", type=int, default=3000, help="training steps a round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, each a new process state")
    parser.add_argument("--no-write", action="store_true", help="print, don't touch BENCHMARKS.md")
    args = parser.parse_args(argv)
    base_rev = subprocess.run(["git", "log", "-1", "--format=%h %s", args.base],
                              capture_output=True, text=True, check=True).stdout.strip()[:90]
    base = methods_at(args.base, ("log", "_check_names"))
    rows: list[list[object]] = []
    ratios = []
    for r in range(args.rounds):
        with phase("log_paired", "round", r + 1, args.rounds):
            base_ns, new_ns = paired_round(base, args.steps)
        b, n = statistics.median(base_ns) / 1e3, statistics.median(new_ns) / 1e3
        ratios.append(n / b)
        rows.append([r + 1, len(base_ns), f"{b:.2f}", f"{n:.2f}", f"{n / b:.3f}"])
        print(f"round {r + 1}: base {b:.2f} us, this checkout {n:.2f} us, ratio {n / b:.3f}",
              flush=True)
    body = (
        f"Baseline: `{base_rev}`. Each round: {args.steps:,} steps of `bench.client_overhead`'s "
        "loop (MLP, ScheduleFree+, `watch()`), `log()` of 8 metrics (the loss a CPU tensor) "
        "after each step, the two versions alternating in pairs of steps; median thread CPU "
        "of a call, timer included in both.\n\n"
        + markdown_table(["round", "calls each", "baseline µs", "this checkout µs", "ratio"], rows)
        + f"\n\nMedian ratio over the rounds: **{statistics.median(ratios):.3f}**."
    )
    print(body)
    if not args.no_write:
        write_section("log_paired", "`Monitor.log()` against a revision, paired by step", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
