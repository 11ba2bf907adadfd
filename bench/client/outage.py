"""Training step time while the database is down: does an outage slow the training loop?

A small CPU training loop (an MLP on random data, ScheduleFree+, one torch thread) logs its loss
and the optimizer's telemetry every step through ``Monitor.watch`` and ``Monitor.log`` into a
``curvecast serve`` process on a private PostgreSQL cluster. The same run alternates phases:
database up, database stopped (the service answers 503 + Retry-After, the hook spools to disk),
database up again (the hook replays its spool), several times, so that drift in the shared
machine's speed affects both kinds of phase alike. A baseline without any monitor runs first.
Afterwards every point must be in the database exactly once.

Usage: ``python -m bench run outage [--phase-seconds 8] [--cycles 6] [--quick] [--no-write]``
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch


def make_step(seed: int = 0):  # type: ignore[no-untyped-def]
    """One training step of a 4-layer MLP on a fixed random batch; returns (step fn, optimizer)."""
    from curvecast.sfplus import ScheduleFreePlus

    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.GELU(),
        torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 10),
    )
    opt = ScheduleFreePlus(model.parameters(), warmup_steps=20)
    x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))

    def step() -> float:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step(loss=loss)
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step, opt


def timed_phase(step_fn, seconds: float, on_step=None) -> list[float]:  # type: ignore[no-untyped-def]
    """Run training steps for ``seconds``; returns each step's duration in milliseconds."""
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        loss = step_fn()
        if on_step is not None:
            on_step(loss)
        times.append((time.perf_counter() - t0) * 1000)
    return times


def pin(procs: list[psutil.Process], cpu: int) -> bool:
    """Pin processes (and threads) to one CPU; False where affinity is not supported."""
    try:
        for proc in procs:
            proc.cpu_affinity([cpu])
    except (AttributeError, psutil.Error):
        return False
    return True


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def main(argv: list[str] | None = None) -> int:
    from bench._cli import parser, publish
    from bench._report import markdown_table, progress
    from curvecast.client import Monitor
    from curvecast.service.migrate import upgrade
    from tests.support import start_server_process
    from tests.support.pgcluster import PrivateCluster, find_bindir
    from tests.support.tables import db_counts

    cli = parser(__doc__, quick="3 s phases, 1 cycle")
    cli.add_argument("--phase-seconds", type=float, default=8.0)
    cli.add_argument("--cycles", type=int, default=6)
    args = cli.parse_args(argv)
    if args.quick:
        args.phase_seconds, args.cycles = 3.0, 1
    torch.set_num_threads(1)
    bindir = find_bindir()
    if bindir is None:
        sys.exit("initdb/pg_ctl not found (set CURVECAST_PG_BINDIR)")

    # The training loop gets CPU 0; the service and its PostgreSQL cluster get CPU 1 (below), as
    # if they ran elsewhere: otherwise the service's ingest work, done only while the database
    # is up, would take CPU from the loop and make outages look faster.
    pinned = (psutil.cpu_count() or 1) >= 2 and pin([psutil.Process()], 0)
    step_fn, _ = make_step()
    timed_phase(step_fn, 2.0)  # warm up
    baseline = timed_phase(step_fn, args.phase_seconds)

    cluster = PrivateCluster(bindir).create()
    tmp = Path(tempfile.mkdtemp(prefix="curvecast-outage-"))
    try:
        database_url = cluster.create_database("outage_bench")
        upgrade(database_url)
        server = start_server_process(database_url, tmp, env={"CURVECAST_RETRY_AFTER_S": "2"})
        postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
        pinned = pinned and pin(tree(server.proc.pid) + tree(postmaster), 1)
        step_fn, opt = make_step()
        mon = Monitor(url=server.url, project="outage-bench", run_name="step-time",
                      spool_dir=tmp / "spool")
        mon.watch(opt, norms_every=50)
        counter = [0]

        def log(loss: float) -> None:
            counter[0] += 1
            mon.log(counter[0], loss=loss)

        timed_phase(step_fn, 2.0, log)  # warm up with the monitor
        phases: dict[str, list[float]] = {"up": [], "down": [], "recovering": []}
        per_cycle = []
        spooled = 0
        for cycle in range(args.cycles):
            progress("outage", f"cycle: {args.phase_seconds:.0f} s up, {args.phase_seconds:.0f} s "
                     "database down, then recovering", cycle + 1, args.cycles)
            up = timed_phase(step_fn, args.phase_seconds, log)  # steady state: spool empty
            cluster.stop("fast")
            down = timed_phase(step_fn, args.phase_seconds, log)
            spooled = max(spooled, mon.stats()["points_spooled"])
            cluster.start()
            if pinned:  # a restarted cluster has new processes
                pin(tree(int((cluster.data / "postmaster.pid").read_text().split()[0])), 1)
            # Keep training while the hook replays its spool (measured apart: the price of
            # catching up, paid after the outage).
            deadline = time.monotonic() + 120
            while mon.stats()["spool_bytes"] and time.monotonic() < deadline:
                phases["recovering"] += timed_phase(step_fn, 0.5, log)
            phases["up"] += up
            phases["down"] += down
            per_cycle.append((statistics.median(up), statistics.median(down)))
        assert mon.flush(300), mon.stats()
        stats = mon.stats()
        assert mon.finish(timeout=60)
        counts = db_counts(database_url, mon.run_id)
        n = counter[0]
        exact = counts["loss"].rows == n == counts["loss"].distinct_steps
        telemetry_ok = all(c.rows == c.distinct_steps for c in counts.values())
        server.stop()
    finally:
        cluster.destroy()

    def row(name: str, times: list[float]) -> list[object]:
        med = statistics.median(times)
        mean = statistics.fmean(times)
        return [name, f"{len(times):,}", f"{med:.2f}", f"{mean:.2f}",
                f"{sorted(times)[int(0.99 * len(times))]:.2f}",
                f"{med / statistics.median(phases['up']) - 1:+.1%}"]

    cycle_ratio = statistics.median(d / u - 1 for u, d in per_cycle)
    verdict = "within" if cycle_ratio <= 0.05 else "outside"
    table = markdown_table(
        ["phase", "steps", "median ms", "mean ms", "p99 ms", "median vs database up"],
        [row("no monitor (baseline)", baseline), row("monitor, database up", phases["up"]),
         row("monitor, database stopped", phases["down"]),
         row("monitor, replaying the spool after the outage", phases["recovering"])],
    )
    cycles = ", ".join(f"{u:.2f} → {d:.2f}" for u, d in per_cycle)
    stored = "yes" if exact and telemetry_ok else "**NO**"
    body = (
        "A 4-layer MLP (256-512-512-512-10, batch 128, one torch thread) trained with "
        "ScheduleFreePlus; `Monitor.watch` logs 11 telemetry values every step (norms every 50) "
        f"and the loop the loss. Phases of {args.phase_seconds:.0f} s alternate database up and "
        f"PostgreSQL stopped (`pg_ctl stop -m fast`, a private cluster), {args.cycles} times in "
        "one run. "
        + ("The loop is pinned to CPU 0, the service and the cluster to CPU 1. "
           if pinned else "Nothing is pinned (CPU affinity unavailable). ")
        + f"Median step per cycle, up → down (ms): {cycles}. The hook spooled up to "
        f"{spooled:,} points in an outage and replayed them; every point stored exactly once: "
        f"{stored} ({n:,} steps, {sum(c.rows for c in counts.values()):,} points; client "
        f"retries {stats['failures']}, dropped {stats['points_dropped']}). The service's side "
        "(503 + Retry-After, `/readyz`) is tested in `tests/reliability/test_faults.py`."
        f"\n\n{table}"
    )
    result = (f"the step time changes by {cycle_ratio:+.1%} while the database is down (the "
              f"median of the cycles' changes; goal ≤ +5%: {verdict.strip('*')} it); every point "
              f"stored exactly once: {stored.strip('*')}")
    publish(args, "outage", "Training step time during a database outage", body, result)
    return 0 if exact and telemetry_ok else 1
