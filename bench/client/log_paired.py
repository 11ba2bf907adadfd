"""``Monitor.log()`` of this checkout against a git revision's, step by step in one training loop.

``client_overhead`` measures the whole hook run against run, and runs on this shared
machine differ by more than a microsecond or two of ``log()``. Here both versions run in the
same process, on the same training loop (the bench's MLP, ScheduleFree+, ``watch()`` on), in
alternating pairs of steps (AABB...), each call timed by the thread's CPU clock right after the
training step: the cold caches a real loop gives ``log()`` and the machine's load at that moment
are the same for both.

Both versions are treated alike: ``log`` and ``_check_names`` are read from
``client/_monitor.py`` (at the revision, and in the working tree), compiled the same way and
bound each to a monitor of its own (so each keeps its own names state); the second monitor
shares the first's sink, so both see the wall time of the one ``watch()`` hook, and the two
versions swap monitors from round to round. (Binding only the revision's code, beside the
class's own method, made an A/A run of the same code read 0.94-0.97.) Both run with this
checkout's module globals, so a revision whose ``log()`` needs a name the module no longer has
fails with a ``NameError``. Both monitors point at a closed port: their records are spooled,
not sent. Every round is followed by an A/A round, this checkout against itself the same way:
the spread of ratios the bench reads when nothing changed, in the same run.

Usage: ``python -m bench run log_paired --base REV [--steps N] [--rounds R] [--no-write]``
"""

from __future__ import annotations

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

from bench._cli import base_revision, publish_paired, revision_parser
from bench._report import markdown_table, phase
from bench.client._loop import make_loop, monitor, other_metrics
from curvecast.client import Monitor
from curvecast.client import _monitor as monitor_module

#: Steps before the timing starts (the run created, first calls made, tensor types seen).
WARMUP = 100


def methods_at(rev: str | None, names: tuple[str, ...]) -> dict[str, Callable[..., Any]]:
    """Functions ``names`` of ``Monitor`` as they were at ``rev`` (None: as the working tree has
    them), with this checkout's module globals."""
    if rev is None:
        source = Path(monitor_module.__file__).read_text()
    else:
        source = subprocess.run(["git", "show", f"{rev}:client/_monitor.py"],
                                capture_output=True, text=True, check=True).stdout
    namespace = dict(vars(monitor_module))
    for name in names:
        start = source.index(f"    def {name}(")
        end = source.index("\n    def ", start + 1)
        exec(textwrap.dedent(source[start:end]), namespace)  # noqa: S102 - our own history
    return {name: namespace[name] for name in names}


def paired_round(versions: tuple[dict[str, Callable[..., Any]], ...], steps: int,
                 swap: bool) -> tuple[list[int], ...]:
    """Thread-CPU ns of each ``log()`` call of each version (the revision's, this checkout's);
    ``swap`` hosts the revision's on the second monitor instead of the first."""
    model, opt, x, y = make_loop()
    closed = "http://127.0.0.1:9"  # nothing listens: the records are spooled
    monitors: list[Monitor] = [monitor(closed, Path(tempfile.mkdtemp())) for _ in versions]
    monitors[0].watch(opt)
    monitors[1]._sink = monitors[0]._sink  # the same watch() hook's wall time for both
    if swap:
        monitors.reverse()
    calls = []
    for mon, methods in zip(monitors, versions, strict=True):
        mon._check_names = types.MethodType(methods["_check_names"], mon)  # type: ignore[method-assign]
        calls.append(types.MethodType(methods["log"], mon))
    clock = time.thread_time_ns
    times: tuple[list[int], ...] = tuple([] for _ in versions)
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
    for mon in monitors:
        mon.finish(timeout=0.5)
    return times


def main(argv: list[str] | None = None) -> int:
    cli = revision_parser(__doc__, rounds=4)
    cli.add_argument("--steps", type=int, default=3000, help="training steps a round")
    args = cli.parse_args(argv)
    base_rev = base_revision(cli, args)
    try:
        versions = (methods_at(args.base, ("log", "_check_names")),
                    methods_at(None, ("log", "_check_names")))
    except (subprocess.CalledProcessError, ValueError):
        cli.error(f"{args.base} has no Monitor.log and Monitor._check_names in "
                     "client/_monitor.py to compare with")
    # Each round compares the revision with this checkout; after it, an A/A round compares this
    # checkout with itself, the same way: the ratio the bench reads when nothing changed.
    this = versions[1]
    rows: list[list[object]] = []
    ratios: dict[str, list[float]] = {"revision": [], "A/A": []}
    for r in range(args.rounds):
        for label, pair in (("revision", versions), ("A/A", (this, this))):
            with phase("log_paired", f"round, {label}", r + 1, args.rounds):
                base_ns, new_ns = paired_round(pair, args.steps, swap=r % 2 == 1)
            b, n = statistics.median(base_ns) / 1e3, statistics.median(new_ns) / 1e3
            ratios[label].append(n / b)
            first = "baseline" if label == "revision" else "this checkout (A/A)"
            rows.append([r + 1, first, len(base_ns), f"{b:.2f}", f"{n:.2f}", f"{n / b:.3f}"])
            print(f"round {r + 1} {label}: {b:.2f} us against {n:.2f} us, ratio {n / b:.3f}",
                  flush=True)
    method = (
        f"Baseline: `{base_rev.split()[0]}`. Each round: {args.steps:,} steps of "
        "`client_overhead`'s loop (MLP, ScheduleFree+, `watch()`), `log()` of 8 metrics (the "
        "loss a CPU tensor) after each step, the two versions alternating in pairs of steps, "
        "each on a monitor of its own (swapped every round); the median thread CPU of a call, "
        "timer included in both. "
        f"{args.rounds} rounds, each followed by an A/A round (this checkout against itself).")
    table = markdown_table(["round", "first version", "calls each", "first µs",
                            "this checkout µs", "ratio"], rows)
    return publish_paired(args, "log_paired", "`Monitor.log()` against a revision, paired by step",
                          method, table, ratios, "`log()`'s CPU")
