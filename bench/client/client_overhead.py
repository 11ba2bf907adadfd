"""Client hook overhead: ``log()``'s µs a call, the loop's slowdown and the hook's CPU a step.

Microseconds per ``Monitor.log()`` call, training-loop slowdown with the hook on vs off, the
hook's CPU per step, and the client's per-batch HTTP round trip.

Everything runs in one process against a real ``curvecast serve`` subprocess on a temporary
SQLite file ("server up") and against a port nothing listens on ("server down"):

1. ``log()`` with 8 float metrics, timed call by call in a tight loop (the worst case for the
   background thread's competition for the GIL); also with 4 metrics next to TensorBoard's
   ``SummaryWriter.add_scalar`` and, if installed, MLflow's asynchronous ``log_metrics`` (to a
   local file store: ``mlflow-skinny`` has no server), 4 scalars per step.
2. A small CPU model (MLP, ScheduleFree+) trained for 2,000 steps with the hook off and on
   (``watch()`` + ``log()`` with 8 metrics, the loss a tensor), alternating off/on runs so
   drift in the machine's load hits both alike, and in blocks of 100 steps alternating within
   one run. The points logged while the server is down are uploaded afterwards with
   ``curvecast sync``'s code and counted: nothing may be lost. Then the hook's CPU per step by
   CPU accounting (training thread call by call, each background thread on its own clock),
   as a share of the training step (the goal: about 1% of a ~2 ms step), and the paired-block
   slowdown against its 2%.
3. Round trips of small ``POST /metrics`` requests over our keep-alive transport, and over the
   same transport with ``TCP_NODELAY`` cleared (``http.client`` sets it, and writes a request's
   head and body in two sends: without it, the delayed-ACK/Nagle trap), plus the median batch
   round trip seen during the training runs.

Usage: ``python -m bench run client_overhead [--quick] [--no-write]``; ``--cost-runs N`` runs only
the CPU accounting of step 2, N times, and prints a line each (writes nothing).
"""

from __future__ import annotations

import http.client
import io
import logging
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from bench._cli import parser, publish
from bench._report import markdown_table
from bench.client._loop import (
    BATCH,
    N_METRICS,
    Cost,
    bench_cost,
    log_step,
    make_loop,
    median_ci,
    monitor,
    pct,
    server,
)
from curvecast.client import Monitor
from curvecast.client._api import Api
from curvecast.client._batcher import encode_records
from curvecast.client._transport import HTTPTransport
from curvecast.client.sync import sync_run

logging.getLogger("curvecast.client").setLevel(logging.ERROR)  # expected "server down" warnings


def time_calls(call: Callable[[int], None], n: int, warmup: int = 2000) -> tuple[float, float]:
    """Median and p99 microseconds of ``call(step)``, timed one call at a time."""
    for step in range(warmup):
        call(step)
    clock = time.perf_counter_ns
    samples = []
    for step in range(warmup, warmup + n):
        start = clock()
        call(step)
        samples.append(clock() - start)
    return pct(samples, 0.5), pct(samples, 0.99)


def bench_log(url: str, spool: Path, n: int, n_metrics: int) -> tuple[float, float, Monitor]:
    mon = monitor(url, spool)
    values = {f"metric_{i}": 0.5 + i for i in range(n_metrics)}
    med, p99 = time_calls(lambda step: mon.log(step, **values), n)
    return med, p99, mon


def bench_tensorboard(n: int) -> tuple[float, float] | None:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as logdir:
        writer = SummaryWriter(logdir)

        def step4(step: int) -> None:
            for i in range(4):
                writer.add_scalar(f"metric_{i}", 0.5 + i, step)

        result = time_calls(step4, n)
        writer.close()
    return result


def bench_mlflow(n: int) -> tuple[float, float] | None:
    try:
        import mlflow
    except ImportError:
        return None
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as store:
        mlflow.set_tracking_uri(f"file://{store}")
        mlflow.set_experiment("bench")
        with mlflow.start_run():
            values = {f"metric_{i}": 0.5 + i for i in range(4)}
            result = time_calls(
                lambda step: mlflow.log_metrics(values, step=step, synchronous=False), n, 200
            )
            mlflow.flush_async_logging()
    return result


# -- the training loop ---------------------------------------------------------------------

#: The paired-blocks run is this many times a full run (360 pairs of 100-step blocks): with 40
#: pairs the sign test's 95% interval of a ~1% slowdown was about 2.3 points wide, spanning
#: the 2% goal whichever side the slowdown was on; with 120, three runs in one hour read +0.73%
#: (+0.0 … +1.8), +0.64% (-0.9 … +2.2) and +1.36% (+0.5 … +2.4), two of them still spanning it.
PAIRED_FACTOR = 36


def train(steps: int, mon: Monitor | None) -> tuple[float, float]:
    """Wall and process-CPU seconds (all threads) for ``steps`` steps of a small MLP with
    ScheduleFree+ (hook on when ``mon``)."""
    model, opt, x, y = make_loop()
    handle = mon.watch(opt) if mon is not None else None
    start, cpu_start = time.perf_counter(), time.process_time()
    for step in range(1, steps + 1):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad(set_to_none=True)
        if mon is not None:
            log_step(mon, step, loss)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if handle is not None:
        handle.remove()
    return elapsed, cpu


@dataclass
class FullRuns:
    """Whole training runs with the hook off and on, alternating (see :func:`bench_training`).

    ``off``/``on``: (wall, process CPU) seconds of each run; ``service_off``/``service_on``:
    the service's CPU seconds during each run (its work on the points lands in paired blocks of
    either kind, so only whole runs show it)."""

    off: list[tuple[float, float]]
    on: list[tuple[float, float]]
    service_off: list[float]
    service_on: list[float]
    monitors: list[Monitor]


def bench_training(
    url: str, spool: Path, steps: int, repeats: int, server_up: bool, server_pid: int
) -> FullRuns:
    """Each run with the hook off and on (alternating), the service's CPU during each, and the
    monitors used."""
    # Here, not at the top: bench.client_cuda reuses this module where psutil is missing.
    from bench._procs import cpu_seconds, process_tree

    def service_cpu() -> float:  # the service: `curvecast serve` and anything it started
        return cpu_seconds(process_tree(server_pid))

    train(min(steps, 200), None)  # warm up allocator and kernels
    runs = FullRuns([], [], [], [], [])
    for _ in range(repeats):
        before = service_cpu()
        runs.off.append(train(steps, None))
        middle = service_cpu()
        mon = monitor(url, spool)
        runs.on.append(train(steps, mon))
        runs.service_on.append(service_cpu() - middle)
        runs.service_off.append(middle - before)
        runs.monitors.append(mon)
        mon.finish(timeout=60 if server_up else 0.5)
    return runs


@dataclass
class Paired:
    """Wall-clock slowdown from paired blocks (see :func:`bench_paired`)."""

    ms_per_step_off: float  #: the baseline: median hook-off block, per step
    slowdown: float  #: median of the paired differences, % of the baseline
    low: float  #: ~95% confidence interval of that median (order statistics, sign test)
    high: float
    pairs: int


def bench_paired(
    url: str, spool: Path, steps: int, server_up: bool, block: int = 100
) -> Paired:
    """Wall-clock slowdown from one run alternating blocks of ``block`` steps with the hook off
    and on: adjacent blocks see the same machine load, so the median of the paired differences
    resists the drift that dominates whole-run comparisons on a shared machine. With ``block``
    equal to ``norms_every`` every hook-on block contains exactly one norms step. The monitor
    lives through the whole run, so the background threads' work for an on block (a batch leaves
    every second) partly lands in the following off block: the paired difference understates
    the background's share, which the CPU accounting of :func:`bench_cost` measures instead.
    """
    model, opt, x, y = make_loop()
    mon = monitor(url, spool, norms_every=block)
    off: list[float] = []
    on: list[float] = []
    step = 0
    for b in range(2 * (steps // (2 * block))):
        hook_on = b % 2 == 1
        handle = mon.watch(opt, log_config=False) if hook_on else None
        start = time.perf_counter()
        for _ in range(block):
            step += 1
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step(loss=loss)
            opt.zero_grad(set_to_none=True)
            if hook_on:
                log_step(mon, step, loss)
        (on if hook_on else off).append(time.perf_counter() - start)
        if handle is not None:
            handle.remove()
    mon.finish(timeout=60 if server_up else 0.5)
    base = statistics.median(off)
    diffs = [(a - b) / base * 100 for a, b in zip(on, off, strict=True)]
    low, high = median_ci(diffs)
    return Paired(base / block * 1e3, statistics.median(diffs), low, high, len(diffs))


# -- round trips ---------------------------------------------------------------------------


class _NoDelayCleared(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)


class NagleHTTPTransport(HTTPTransport):
    """Our transport with ``TCP_NODELAY`` cleared (plain HTTP), to show the trap it avoids."""

    def _new_connection(self) -> http.client.HTTPConnection:
        return _NoDelayCleared(self._host, self._port)


def bench_rtt(url: str, transport: HTTPTransport, n: int) -> tuple[float, float]:
    """Median and p99 ms of small POSTs (one step, 8 metrics) on one keep-alive connection."""
    api = Api(transport)
    mon = monitor(url, Path(tempfile.mkdtemp()))
    assert mon.flush(30)  # creates the run
    mon.finish(timeout=30)
    samples = []
    for step in range(n):
        [batch], _ = encode_records(
            [(step, time.time(), {f"m{i}": 1.0 for i in range(8)}, None)]
        )
        result = api.post_metrics(mon.run_id, batch.body)
        assert result.ok, result.message
        samples.append(int(result.elapsed * 1e9))
    transport.close()
    return pct(samples, 0.5) / 1000, pct(samples, 0.99) / 1000


def bench_health(transport: HTTPTransport, n: int) -> tuple[float, float]:
    """Median and p99 ms of ``GET /healthz`` on one keep-alive connection."""
    api = Api(transport)
    samples = []
    for _ in range(n):
        result = api.call("GET", "/healthz")
        assert result.ok, result.message
        samples.append(int(result.elapsed * 1e9))
    transport.close()
    return pct(samples, 0.5) / 1000, pct(samples, 0.99) / 1000


# -- driver --------------------------------------------------------------------------------


def cost_runs(runs: int, steps: int = 2000, norms_every: int = 100) -> int:
    """``--cost-runs``: only :func:`bench_cost` (server up), ``runs`` times against one server
    (``--norms-every``: ``watch()``'s norms that often, 0 never: what they cost the hook).

    The whole hook moves by ±25% from run to run on a shared machine, and by 2-3x with the
    machine's speed (its training step is the yardstick printed beside it): a few runs in a row
    say whether a reading is the machine's or the code's.
    """
    print("run | training step µs | log() | watch() | batcher | sender | whole hook µs | "
          "of the step", flush=True)
    costs: list[Cost] = []
    with tempfile.TemporaryDirectory() as tmp_name, server(Path(tmp_name)) as srv:
        for run in range(1, runs + 1):
            c = bench_cost(srv.url, Path(tmp_name) / f"spool-{run}", steps, True, norms_every)
            costs.append(c)
            print(f"{run} | {c.step:.0f} | {c.log:.1f} | {c.watch:.1f} | {c.batcher:.1f} | "
                  f"{c.sender:.1f} | {c.total:.1f} | {c.total / c.step * 100:.2f}%", flush=True)
    if runs > 1:
        # The reading the section's goal row takes from its COST_RUNS runs.
        m = median_run(costs)
        print(f"median run | {m.step:.0f} | | | | | {m.total:.1f}{runs_note(costs)} | "
              f"{m.total / m.step * 100:.2f}%", flush=True)
    return 0


def median_run(costs: list[Cost]) -> Cost:
    """The run of median whole-hook cost (of an even number, the upper of the middle two): one
    run's columns, which add up to its total."""
    return sorted(costs, key=lambda c: c.total)[len(costs) // 2]


def runs_note(costs: list[Cost]) -> str:
    """`` (median of N runs: low–high)`` after :func:`median_run`'s total; nothing for one run."""
    if len(costs) < 2:
        return ""
    totals = [c.total for c in costs]
    return f" (median of {len(costs)} runs: {min(totals):.1f}–{max(totals):.1f})"


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, quick="small counts")
    cli.add_argument("--cost-runs", type=int, metavar="N",
                        help="only the CPU accounting (server up), N runs of 2,000 steps against "
                             "one server, one line each; writes nothing")
    cli.add_argument("--norms-every", type=int, metavar="K",
                        help="with --cost-runs: watch()'s weight and gradient norms every K "
                             "steps (default 100, the Monitor's; 0: never)")
    args = cli.parse_args(argv)
    # SIGTERM -> SystemExit, so the server subprocess is stopped by the context manager.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # One intra-op thread: on a small shared machine, OpenMP spin-waiting under oversubscription
    # makes step times swing by several x and would drown the effect being measured.
    torch.set_num_threads(1)
    if args.cost_runs is not None:
        if args.cost_runs < 1:
            cli.error(f"--cost-runs must be 1 or more, got {args.cost_runs}")
        every = 100 if args.norms_every is None else args.norms_every
        if every < 0:
            cli.error(f"--norms-every must be 0 or more, got {every}")
        return cost_runs(args.cost_runs, norms_every=every)
    if args.norms_every is not None:
        cli.error("--norms-every goes with --cost-runs (the full bench keeps the default)")
    n_calls = 20_000 if args.quick else 200_000
    steps, repeats = (300, 1) if args.quick else (2000, 3)
    n_ref = 5_000 if args.quick else 50_000

    with tempfile.TemporaryDirectory() as tmp_name, server(Path(tmp_name)) as srv:
        tmp = Path(tmp_name)
        from tests.support import free_port

        up, down = srv.url, f"http://127.0.0.1:{free_port()}"
        rows: list[list[object]] = []
        log_results: dict[str, tuple[float, float, str]] = {}
        for label, url in (("up", up), ("down", down)):
            med, p99, mon = bench_log(url, tmp / f"spool-log-{label}", n_calls, 8)
            mon.finish(timeout=120 if label == "up" else 0.5)
            c = mon.stats()
            if label == "up":  # everything must be stored, some of it through the spool
                # (a tight loop fills the outbox faster than one connection sends it)
                lost = c["points_logged"] - c["points_sent"]
                fate = (f"{lost:,} ({c['points_sent']:,} sent, {c['points_spooled']:,} of them "
                        "through the spool)")
            else:  # nothing sent: everything must be in the spool
                fate = (f"{c['points_logged'] - c['points_spooled']:,} "
                        f"({c['points_spooled']:,} spooled)")
            log_results[label] = (med, p99, fate)
            print(f"log() 8 metrics, server {label}: median {med:.2f} us, p99 {p99:.2f} us, {c}")
        med4, p994, mon4 = bench_log(up, tmp / "spool-log-4", n_ref, 4)
        mon4.finish(timeout=60)
        tb = bench_tensorboard(n_ref // 5)
        mlf = bench_mlflow(min(n_ref // 5, 5_000))
        for label, (med, p99, fate) in log_results.items():
            rows.append([f"curvecast `log()`, 8 metrics, server {label}", f"{med:.1f}",
                         f"{p99:.1f}", fate])
        rows.append(["curvecast `log()`, 4 metrics, server up", f"{med4:.1f}", f"{p994:.1f}", ""])
        if tb:
            rows.append(["TensorBoard `SummaryWriter.add_scalar` x4 (local files)",
                         f"{tb[0]:.1f}", f"{tb[1]:.1f}", "n/a (no server)"])
        if mlf:
            rows.append(["MLflow `log_metrics(4, synchronous=False)` (file store)",
                         f"{mlf[0]:.1f}", f"{mlf[1]:.1f}", "n/a (no server in mlflow-skinny)"])

        loop_rows: list[list[object]] = []
        cost_rows: list[list[object]] = []
        cost_runs_of: dict[str, list[Cost]] = {}
        paired_results: dict[str, Paired] = {}
        rtt_seen: list[float] = []
        load_start = os.getloadavg()[0]
        for label, url in (("up", up), ("down", down)):
            full = bench_training(
                url, tmp / f"spool-train-{label}", steps, repeats, label == "up", srv.proc.pid
            )
            off, on, monitors = full.off, full.on, full.monitors
            # The service's CPU per 1,000 steps of training (ms): off runs show its idle cost.
            service = [statistics.median(cpu) / steps * 1e6
                       for cpu in (full.service_off, full.service_on)]
            wall_off = statistics.median(w for w, _ in off)
            wall_on = statistics.median(w for w, _ in on)
            cpu_off = statistics.median(c for _, c in off)
            cpu_on = statistics.median(c for _, c in on)
            slowdown = (wall_on / wall_off - 1) * 100
            cpu_slowdown = (cpu_on / cpu_off - 1) * 100
            spread = (max(w for w, _ in off) / min(w for w, _ in off) - 1) * 100
            logged = sum(m.stats()["points_logged"] for m in monitors)
            if label == "down":
                for mon in monitors:  # upload what the down runs spooled, then count
                    sync_run(mon.spool_path, url=up, stream=io.StringIO())
            stored = sum(srv_points(up, m.run_id) for m in monitors)
            for mon in monitors:
                rtt = mon.stats()["rtt_ms_median"]
                if rtt is not None and label == "up":
                    rtt_seen.append(rtt)
            paired = bench_paired(url, tmp / f"spool-paired-{label}", PAIRED_FACTOR * steps,
                                  label == "up")
            # Server up (the goal's case): the run of median whole-hook cost of several, so that
            # one lucky or unlucky run (±25% run to run) does not decide the goal.
            n_cost = COST_RUNS if label == "up" else 1
            runs = cost_runs_of[label] = [
                bench_cost(url, tmp / f"spool-cost-{label}-{i}", steps, label == "up")
                for i in range(n_cost)]
            cost = median_run(runs)
            paired_results[label] = paired
            cost_rows.append([f"server {label}", f"{cost.step:.0f}", f"{cost.log:.1f}",
                              f"{cost.watch:.1f}", f"{cost.batcher:.1f}", f"{cost.sender:.1f}",
                              f"**{cost.total:.1f}**{runs_note(runs)}",
                              f"{cost.total / cost.step * 100:.2f}%",
                              f"{cost.steps_per_batch:.0f}" if label == "up" else "(spooled)",
                              f"{cost.empty_call:.1f}"])
            print(f"cost, server {label}: {cost}, total {cost.total:.1f} us")
            loop_rows.append([f"server {label}", f"{paired.ms_per_step_off:.2f}",
                              f"{paired.slowdown:+.2f}% ({paired.low:+.1f}% … {paired.high:+.1f}%)",
                              f"{wall_off / steps * 1e3:.2f}", f"{wall_on / steps * 1e3:.2f}",
                              f"{slowdown:+.2f}%", f"{cpu_slowdown:+.2f}%", f"{spread:.0f}%",
                              f"{service[0]:.0f} → {service[1]:.0f}",
                              f"{logged:,}", f"{stored:,}"])
            print(f"training loop, server {label}: off {off} on {on} "
                  f"({slowdown:+.2f}% wall, {cpu_slowdown:+.2f}% cpu), logged {logged}, "
                  f"stored {stored}")

        load_end = os.getloadavg()[0]
        n_rtt = 100 if args.quick else 500
        health = bench_health(HTTPTransport(up), n_rtt)
        fast = bench_rtt(up, HTTPTransport(up), n_rtt)
        slow = bench_rtt(up, NagleHTTPTransport(up), n_rtt // 5)
        print(f"RTT small POST: nodelay {fast}, nagle {slow}, batches {rtt_seen}")

    loop = markdown_table(["case", "paired blocks: ms/step off", "paired blocks: slowdown",
                           "full runs: ms/step off", "ms/step on", "slowdown (wall)",
                           "slowdown (process CPU)", "spread of off runs",
                           "service CPU ms per 1,000 steps, off → on",
                           "points logged", "points stored"], loop_rows)
    cost = markdown_table(["case", "training step (baseline)", "`log()`", "`watch()` hook",
                           "batcher thread", "sender thread", "whole hook", "vs step",
                           "steps per batch", "an empty call in `log()`'s place"], cost_rows)
    up_runs, up_paired = cost_runs_of["up"], paired_results["up"]
    up_cost, n_up = median_run(up_runs), len(up_runs)
    rtt = markdown_table(
        ["request", "median ms", "p99 ms"],
        [["`GET /healthz` (no database work): the transport itself",
          f"{health[0]:.2f}", f"{health[1]:.2f}"],
         ["`POST /metrics`, 1 step x 8 metrics, keep-alive, `http.client` (TCP_NODELAY)",
          f"{fast[0]:.2f}", f"{fast[1]:.2f}"],
         ["same, TCP_NODELAY cleared", f"{slow[0]:.2f}", f"{slow[1]:.2f}"],
         ["one batch per second during the training runs (median of runs)",
          f"{statistics.median(rtt_seen):.2f}" if rtt_seen else "n/a", ""]],
    )
    calls = "; ".join(f"{r[0].removeprefix('curvecast `log()`, ')} {r[1]} µs (p99 {r[2]}"
                      + (f", points lost {r[3]})" if r[3] else ")") for r in rows)
    body = f"""
`Monitor.log()` timed call by call in a tight loop ({n_calls:,} calls, wall-clock including the
timer; goal ≤ 20 µs median with 8 metrics): {calls}.

Training loop: MLP 256-512-512-10, batch {BATCH}, ScheduleFree+, CPU, one torch thread; hook on
= `watch()` every step (norms every 100) and `log()` of {N_METRICS} metrics (the loss a tensor).
*Paired blocks*: one run of {PAIRED_FACTOR * steps:,} steps alternating 100-step blocks off and
on, the median paired difference with its 95% sign-test interval (goal ≤ {WALL_GOAL_PCT:g}%);
*full runs*: {steps:,} steps each, off and on alternating, median of {repeats} (whole-run drift
shows in "spread of off runs"). Service CPU: the server process during the full runs. Points
stored: after the runs (server down: after uploading the spools).

{loop}

The hook's CPU per step (server up: the run of median whole hook of {n_up}, its range beside it;
goal about {CPU_GOAL_PCT:g}% of the step): `log()` and the `watch()` hook on the training thread's
CPU clock (the timer's own {up_cost.timer:.1f} µs subtracted), the batcher and sender threads on
theirs until everything is acknowledged; the server is not counted. The baseline is the training
step's own CPU; the last column, an empty function called in `log()`'s place, is what any Python
call costs right after a training step (cold caches). Load average {load_start:.1f} → {load_end:.1f}
on {os.cpu_count()} cores.

{cost}
"""
    wall = ("met" if up_paired.high <= WALL_GOAL_PCT else
            "not met" if up_paired.low > WALL_GOAL_PCT else "undecided")
    result = (f"the whole hook {up_cost.total:.1f} µs of CPU a step, "
              f"{up_cost.total / up_cost.step * 100:.2f}% of the training step (goal about "
              f"{CPU_GOAL_PCT:g}%); "
              f"wall-clock slowdown {up_paired.slowdown:+.2f}% (95% CI {up_paired.low:+.1f}% … "
              f"{up_paired.high:+.1f}%; goal ≤ {WALL_GOAL_PCT:g}%: {wall})")
    return publish(args, "client_overhead", "Client hook overhead", body, result,
                   details="Round trips on loopback (`curvecast serve`, SQLite):\n\n" + rtt)


#: Server up: the hook's cost is the run of median whole-hook cost of this many (one run moves
#: by up to ±25% from the next on this shared machine).
COST_RUNS = 5
#: The client hook's goals: its CPU as a share of a ~2 ms step, and the wall-clock slowdown of
#: such a loop.
CPU_GOAL_PCT = 1.0
WALL_GOAL_PCT = 2.0


def srv_points(url: str, run_id: str) -> int:
    """Points the server stores for a run."""
    api = Api(HTTPTransport(url))
    result = api.call("GET", f"/api/v1/runs/{run_id}")
    return int(result.body["n_points"]) if result.ok else 0

