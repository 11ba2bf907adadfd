"""The hook benches' shared parts: the training loop, the monitor, and the hook's CPU accounting.

``client_overhead`` and the paired benches (``hook_paired``, ``transport_paired``,
``encode_paired``, ``log_paired``) measure the hook on the same small CPU model with the same
``log()`` call; ``client_cuda`` reuses the metrics on a GPU machine that has torch but not the
service's dependencies, so nothing here imports the service or psutil at the top.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn import functional as F

from curvecast.client import Monitor
from curvecast.client._transport import Transport

if TYPE_CHECKING:
    from tests.support import ServerProcess


def pct(samples_ns: list[int], q: float) -> float:
    """The q-quantile of nanosecond samples, in microseconds."""
    ordered = sorted(samples_ns)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


def monitor(url: str, spool: Path, **kwargs: Any) -> Monitor:
    return Monitor(url=url, project="bench", spool_dir=spool, flush_timeout=60, **kwargs)


#: Metrics log() gets every step in the training-loop measurements: the loss (a 0-d tensor), an
#: int and six floats that change every step (17-digit values, like learning rates or norms).
N_METRICS = 8
#: The training loop's batch (see make_loop).
BATCH = 8
def make_loop() -> tuple[nn.Module, Any, torch.Tensor, torch.Tensor]:
    """The small CPU model every training-loop measurement uses (MLP, ScheduleFree+)."""
    from curvecast.sfplus import ScheduleFreePlus

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10)
    )
    opt = ScheduleFreePlus(model.parameters(), warmup_steps=100, weight_decay=10.0)
    # Batch 8: about 2 ms a step on the 2-core machine, the loop the wall-clock goal names
    # (batch 64 took 3-4.5 ms, which dilutes the hook's share; the step is mostly the
    # optimizer's pass over the 0.4M parameters, which the batch does not change).
    return model, opt, torch.randn(BATCH, 256), torch.randint(0, 10, (BATCH,))


def other_metrics(step: int) -> dict[str, float | int]:
    """What the loop logs besides the loss: an int and six floats."""
    return {"tokens": step * BATCH, "lr": 1e-3 / (1 + step / 977), "grad_norm": 7 / (step + 3),
            "data_s": 0.1 / (step + 11), "step_s": 0.3 / (step + 13), "ema": 1 - 1 / (step + 1.5),
            "scale": step / 1009}


def log_step(mon: Monitor, step: int, loss: torch.Tensor) -> None:
    """The loop's ``log()`` call: :data:`N_METRICS` metrics."""
    mon.log(step, loss=loss, **other_metrics(step))


@dataclass
class Cost:
    """Microseconds of CPU per training step (see :func:`bench_cost`)."""

    step: float  #: the training step itself (training thread, hook calls excluded): the baseline
    log: float  #: ``log()`` calls, in the training thread
    watch: float  #: the ``watch()`` post-step hook, norms steps included, in the training thread
    batcher: float  #: the batcher thread
    sender: float  #: the sender thread (HTTP)
    timer: float  #: a thread CPU clock reading around nothing (subtracted from ``log``)
    empty_call: float  #: ``log()``'s place, arguments and timing, around a function doing nothing
    steps_per_batch: float

    @property
    def total(self) -> float:
        return self.log + self.watch + self.batcher + self.sender


def thread_cpu_ns(thread: threading.Thread) -> int:
    """CPU time a (running) thread has used, from its own clock."""
    assert thread.ident is not None
    return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))


def settle(mon: Monitor, server_up: bool) -> None:
    """Wait until everything logged is acknowledged (server down: spooled)."""
    if server_up:
        assert mon.flush(60)
    else:
        mon._pipe.wake_batcher()
        assert mon._pipe.wait_for(mon._pipe.idle_batcher, time.monotonic() + 60)


def bench_cost(
    url: str, spool: Path, steps: int, server_up: bool, norms_every: int = 100,
    transport: Transport | None = None,
) -> Cost:
    """The hook's CPU cost per step, by CPU accounting, so that other load on the machine
    cannot hide it the way it hides a few microseconds in a wall-clock comparison.

    One run with the hook on (``watch()`` with norms every ``norms_every`` steps, the
    default 100, and ``log()`` with :data:`N_METRICS` metrics), measured after 50 steps of
    warm-up. In the training thread each
    ``log()`` call (its arguments computed before) and the ``watch()`` hook (between two step
    post-hooks registered around it) are timed with the thread CPU clock, after a first,
    cold, reading outside the timing; the timer's own cost is subtracted, measured the same way
    around nothing right after each timing (``log()``: a second reading; the hook: a third
    post-hook, the same hand-over as the hook's). The background threads are measured whole,
    each on its own CPU clock, from the first measured step until everything is acknowledged
    (server down: spooled). The training step's own CPU (the baseline) is the training thread's
    time outside those timings. ``transport``: the monitor's (default: an ``HTTPTransport``).
    """
    model, opt, x, y = make_loop()
    mon = monitor(url, spool, norms_every=norms_every, transport=transport)
    clock = time.thread_time_ns
    marks = [0, 0, 0, 0]  # [start of the hook, its end, hook total, timer total]

    def before(*_: Any) -> None:
        clock()  # the first reading after the step is a cold one: not inside the timing
        marks[0] = clock()

    def middle(*_: Any) -> None:
        marks[1] = clock()

    def after(*_: Any) -> None:
        # middle -> after is the same hand-over as watch -> middle, around nothing: the timer
        now = clock()
        marks[2] += marks[1] - marks[0]
        marks[3] += now - marks[1]

    opt.register_step_post_hook(before)
    mon.watch(opt)
    opt.register_step_post_hook(middle)
    opt.register_step_post_hook(after)
    pipe = mon._pipe
    warmup = 50  # the run created, the config sent, first calls made: then measure
    for step in range(1, warmup + 1):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad(set_to_none=True)
        log_step(mon, step, loss)
    settle(mon, server_up)
    marks[2] = marks[3] = 0
    log_ns = timer_ns = 0
    bg_start = [thread_cpu_ns(t) for t in (pipe.batcher, pipe.sender_thread)]
    batches_start = mon.stats()["batches_sent"]
    thread_start = clock()
    for step in range(warmup + 1, warmup + steps + 1):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad(set_to_none=True)
        others = other_metrics(step)
        clock()  # a cold reading, outside the timing
        start = clock()
        mon.log(step, loss=loss, **others)
        end = clock()
        timer_ns += clock() - end
        log_ns += end - start
    loop_ns = clock() - thread_start
    settle(mon, server_up)
    batcher_ns, sender_ns = (
        thread_cpu_ns(t) - s for t, s in zip((pipe.batcher, pipe.sender_thread), bg_start,
                                             strict=True)
    )
    batches = mon.stats()["batches_sent"] - batches_start
    # What the same place charges for nothing: a function that ignores the same arguments.
    empty_ns, empty_steps = 0, 200

    def nothing(step: int, /, **_: Any) -> None:
        pass

    for step in range(warmup + steps + 1, warmup + steps + empty_steps + 1):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad(set_to_none=True)
        others = other_metrics(step)
        clock()
        start = clock()
        nothing(step, loss=loss, **others)
        end = clock()
        empty_ns += (end - start) - (clock() - end)
    mon.finish(timeout=5 if server_up else 0.5)
    us = 1e-3 / steps
    return Cost(
        step=(loop_ns - log_ns - marks[2]) * us,
        log=(log_ns - timer_ns) * us,
        watch=(marks[2] - marks[3]) * us,
        batcher=batcher_ns * us,
        sender=sender_ns * us,
        timer=timer_ns * us,
        empty_call=empty_ns * 1e-3 / empty_steps,
        steps_per_batch=steps / batches if batches else float("nan"),
    )


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of a median: the order statistics the sign test
    gives (no assumption about how the machine's load noise is distributed)."""
    ordered = sorted(values)
    n = len(ordered)
    # The interval [x_(k), x_(n+1-k)] (1-based) covers the median with probability
    # 1 - 2 P(B <= k - 1), B ~ Binomial(n, 1/2): take the largest k that keeps it >= confidence.
    k = 0
    while k < n // 2 and sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= (1 - confidence) / 2:
        k += 1
    return ordered[max(k - 1, 0)], ordered[min(n - k, n - 1)]


@contextlib.contextmanager
def server(tmp: Path) -> Iterator[ServerProcess]:
    # The service is imported here, not at the top: bench.client_cuda reuses this module's loop
    # helpers on a GPU machine that has torch but not the service's dependencies.
    from curvecast.service.migrate import upgrade
    from tests.support import start_server_process

    db = f"sqlite:///{tmp / 'bench.db'}"
    upgrade(db)
    proc = start_server_process(db, tmp)
    try:
        yield proc
    finally:
        proc.stop()
