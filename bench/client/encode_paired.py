"""The batcher's ``encode_records`` of this checkout against a git revision's, on the same records.

The batcher thread's CPU is mostly ``encode_records``: records of a second of training turned
into columnar request bodies. Runs of ``client_overhead`` differ from each other by more
than a change to it makes, so here both versions encode the same records in one process, in
turns, each call on the thread's CPU clock: the load of the moment is the same for both.

Records: those of a real training loop (``client_overhead``'s MLP, ScheduleFree+), one
batch's worth (:data:`STEPS` steps): ``watch()``'s hook itself appends its records (norms every
100 steps) to a buffer of this bench's, and each step adds the record ``Monitor.log()`` makes of
the bench's 8 metrics (the loss a CPU tensor, which ``log()`` reads at once: a float). In the
real batcher the records were made a moment ago on the other core, so before each call the
caches are flushed (a write over :data:`FLUSH_BYTES`); ``--warm`` leaves them.

The revision's ``client/_batcher.py`` is loaded as a module of its own from ``git show``; this
checkout's is loaded the same way from the working tree, so both pay the same for being fresh
modules. Every round is followed by an A/A round (this checkout against itself): the spread of
ratios the bench reads when nothing changed.

Usage: ``python -m bench run encode_paired --base REV [--rounds R] [--warm] [--no-write]``
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import types
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.nn.functional as F

from bench._cli import base_revision, publish_paired, revision_parser
from bench._report import markdown_table, phase
from bench.client._loop import make_loop, other_metrics
from curvecast.client import _batcher
from curvecast.client._watch import Sink, watch_optimizer
from curvecast.contract import TELEMETRY_PREFIX

#: Steps of records per call: about what the batcher takes at once at the bench's step rate.
STEPS = 600
#: Bytes written between calls to push the records out of the CPU caches.
FLUSH_BYTES = 64 << 20
#: Calls of each version per round (their median is the round's figure).
CALLS = 15


def module_at(rev: str | None) -> types.ModuleType:
    """``client/_batcher.py`` as it was at ``rev`` (None: the working tree), a fresh module."""
    if rev is None:
        source = Path(_batcher.__file__).read_text()
    else:
        source = subprocess.run(["git", "show", f"{rev}:client/_batcher.py"],
                                capture_output=True, text=True, check=True).stdout
    module = types.ModuleType(f"batcher_{rev or 'checkout'}")
    sys.modules[module.__name__] = module  # dataclasses look their module up by name
    exec(compile(source, f"<{rev or 'checkout'}:client/_batcher.py>", "exec"),  # noqa: S102
         module.__dict__)
    return module


def training_records(steps: int) -> list[Any]:
    """The records a real loop logs in ``steps`` steps (see the module docstring)."""
    model, opt, x, y = make_loop()
    buffer: deque[Any] = deque()
    sink = Sink(buffer, time.time, wake_at=1 << 60, on_full=lambda: None)
    watch_optimizer(opt, sink, norms_every=100, prefix=TELEMETRY_PREFIX, step_fn=None)
    for step in range(1, steps + 1):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad(set_to_none=True)
        # What Monitor.log(step, loss=loss, **others) appends: the CPU tensor read at once, the
        # watch() hook's wall time for the step.
        buffer.append((step, sink.wall_time, {"loss": loss.tolist(), **other_metrics(step)},
                       None))
    return list(buffer)


def flush_caches(scratch: bytearray) -> None:
    """Write over ``scratch`` (larger than the caches) so the records are read from memory."""
    scratch[::64] = b"\1" * (len(scratch) // 64)


def timed(encode: Callable[..., Any], records: list[Any], scratch: bytearray | None) -> int:
    if scratch is not None:
        flush_caches(scratch)
    clock = time.thread_time_ns
    start = clock()
    encode(records)
    return clock() - start


def paired_round(encoders: tuple[Callable[..., Any], Callable[..., Any]], records: list[Any],
                 scratch: bytearray | None, swap: bool) -> tuple[float, float]:
    """Median thread-CPU µs per step of each encoder over :data:`CALLS` calls in turns."""
    times: tuple[list[int], list[int]] = ([], [])
    order = (1, 0) if swap else (0, 1)
    for _ in range(CALLS):
        for i in order:
            times[i].append(timed(encoders[i], records, scratch))
    steps = len({r[0] for r in records})
    return (statistics.median(times[0]) / 1e3 / steps, statistics.median(times[1]) / 1e3 / steps)


def main(argv: list[str] | None = None) -> int:
    cli = revision_parser(__doc__, rounds=8)
    cli.add_argument("--warm", action="store_true", help="don't flush the caches before calls")
    args = cli.parse_args(argv)
    base_rev = base_revision(cli, args)
    try:
        base, this = module_at(args.base), module_at(None)
    except (subprocess.CalledProcessError, SyntaxError):
        cli.error(f"{args.base} has no client/_batcher.py to compare with")
    if not callable(getattr(base, "encode_records", None)):
        cli.error(f"{args.base}'s client/_batcher.py has no encode_records")
    scratch = None if args.warm else bytearray(FLUSH_BYTES)
    rows: list[list[object]] = []
    ratios: dict[str, list[float]] = {"revision": [], "A/A": []}
    for r in range(args.rounds):
        with phase("encode_paired", "records of a real loop", r + 1, args.rounds):
            records = training_records(STEPS)
        for label, pair in (("revision", (base, this)), ("A/A", (this, this))):
            first, second = paired_round((pair[0].encode_records, pair[1].encode_records),
                                         records, scratch, swap=r % 2 == 1)
            ratios[label].append(second / first)
            rows.append([r + 1, "baseline" if label == "revision" else "this checkout (A/A)",
                         len(records), f"{first:.2f}", f"{second:.2f}", f"{second / first:.3f}"])
            print(f"round {r + 1} {label}: {first:.2f} us against {second:.2f} us a step, "
                  f"ratio {second / first:.3f}", flush=True)
    caches = ("left warm" if args.warm
              else f"flushed before each call ({FLUSH_BYTES >> 20} MiB written)")
    method = (
        f"Baseline: `{base_rev.split()[0]}`. Each round: the records of {STEPS} steps of "
        "`client_overhead`'s loop (MLP, ScheduleFree+; `watch()`'s hook with norms every 100 "
        f"steps, `log()`'s record of 8 metrics a step), encoded by each version {CALLS} times "
        f"in turns (the order swapped every round), caches {caches}; the median thread CPU of "
        f"a call, per step of records. {args.rounds} rounds, each followed by an A/A round "
        "(this checkout against itself).")
    table = markdown_table(["round", "first version", "records", "first µs/step",
                            "this checkout µs/step", "ratio"], rows)
    return publish_paired(args, "encode_paired",
                          "The batcher's `encode_records` against a revision", method, table,
                          ratios, "`encode_records`'s CPU")
