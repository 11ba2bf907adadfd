"""Load: 32 training clients streaming into the service while dashboards and forecasts are read.

32 simulated training clients, each streaming 1,000 points/s for 60 s, into ``curvecast serve
--workers 2`` on PostgreSQL (or SQLite), while dashboards and forecasts are read.

Each client is a real :class:`client.Monitor` in a training loop that logs 10 metrics per step
at 100 steps/s (its own run), paced against the wall clock, its monitor created at a random
moment of the second before the load (so the batches leave spread over each second, as
independent jobs' do; ``--lockstep``: all at once); the clients run as threads in
several generator processes (one Python process cannot log and encode 32,000 points/s and also
leave the service CPU). A transport wrapper times every request. Meanwhile "viewers" keep run
pages open as ``dashboards/static/run.js`` does (every figure when a page opens, then every 2 s
the run, its new points, forecast and alerts in one request, and the loss and evolution figures
again when a new fit arrives; ``--page-reloads``: a whole page's figures every 2 s instead) and
two scripts each ask a forecast, a target and a downsampled series 5 times a second, on a
fixed schedule.

The clients and the readers are in :mod:`bench.service._load_traffic`.

Afterwards every run's rows are counted in the database: each (run, key, step) must be stored
exactly once. CPU is sampled with psutil for the service processes, PostgreSQL's processes (the
whole cluster: it is shared with whatever else runs on the machine), the load generator and
the machine; CPU per point is each group's process CPU time over the load window divided by the
points acknowledged in it (robust to other jobs on the machine, unlike latencies). On SQLite
the database runs inside the service's processes, so their CPU includes it.

A Prometheus stand-in scrapes ``/metrics`` every ``--scrape-every`` seconds (5) during the load;
afterwards 50 scrapes back to back give one scrape's CPU, reported as a share of the service's
CPU at Prometheus' default 15 s interval.

With ``--profile`` the service's processes (the uvicorn workers and the background worker)
are sampled by ``py-spy`` during the load window, and the functions holding the most samples
(own time, and time including callees for the service's own code) are added to the report.

Usage: ``python -m bench run load [--clients 32] [--rate 1000] [--duration 60] [--quick]
[--sqlite] [--profile] [--no-worker] [--worker-apart] [--page-reloads] [--lockstep]``.
``--sqlite`` writes its own section of BENCHMARKS.md ("load-sqlite"); the variants
(``--profile``, ``--no-worker``: ingest and reads alone, ``--worker-apart``: the worker as
``curvecast worker`` beside serve processes that have it off, ``--page-reloads``,
``--lockstep``) print and write none.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench._procs import cpu_seconds, process_tree
from bench.service._load_traffic import (
    KEYS,
    PAGE_S,
    SCRIPT_ROUNDS_PER_S,
    GeneratorJob,
    Readers,
    generator_process,
)
from bench.service._scrape import Scraper, cpu_per_scrape


class CpuSampler:
    """CPU use (100% = one core) of process groups, sampled every second."""

    def __init__(self, groups: Mapping[str, Any]) -> None:
        self.groups = groups  # name -> callable returning the current list of psutil.Process
        self.samples: dict[str, list[float]] = {name: [] for name in groups}
        self.samples["machine"] = []
        self.stop = threading.Event()
        self._last: dict[int, float] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _cpu(self, proc: psutil.Process) -> float:
        try:
            t = proc.cpu_times()
            return t.user + t.system
        except psutil.Error:
            return self._last.get(proc.pid, 0.0)

    def _run(self) -> None:
        psutil.cpu_percent(None)
        previous = {name: self._totals(fn()) for name, fn in self.groups.items()}
        while not self.stop.wait(1.0):
            for name, fn in self.groups.items():
                now = self._totals(fn())
                delta = sum(now[p] - previous[name].get(p, now[p]) for p in now)
                self.samples[name].append(100.0 * delta)
                previous[name] = now
            self.samples["machine"].append(psutil.cpu_percent(None) * (psutil.cpu_count() or 1))

    def _totals(self, procs: list[psutil.Process]) -> dict[int, float]:
        return {p.pid: self._cpu(p) for p in procs}


SERVICE = "service (2 workers)"
#: The service's background worker process alone (part of SERVICE): the rest is the serve
#: processes (ingest and reads).
WORKER = "of which: background worker process"
POSTGRES = "PostgreSQL (whole cluster)"


def _us_per_point(sampler: CpuSampler, group: str, points_per_s: float) -> float:
    """Microseconds of CPU per point of a process group: its mean CPU (cores) over the load
    window divided by the points acknowledged per second in it (NaN without samples)."""
    samples = sampler.samples.get(group) or []
    if not samples or points_per_s <= 0:
        return math.nan
    return statistics.mean(samples) / 100.0 * 1e6 / points_per_s


def _per_point(sampler: CpuSampler, points_per_s: float) -> str:
    """The service's and PostgreSQL's CPU per point, as the table shows them."""
    parts = [f"{name.split(' (')[0]} {us:.1f} µs" for name in (SERVICE, WORKER, POSTGRES)
             if math.isfinite(us := _us_per_point(sampler, name, points_per_s))]
    return ", ".join(parts) or "-"


#: Points the storage baseline writes (a few seconds).
BASELINE_POINTS = 400_000


def storage_baseline(database_url: str, backend: str, n_points: int = BASELINE_POINTS) -> float:
    """Microseconds per point of storing points the rawest way, one connection, measured in the
    same run right after the load (the machine's speed of the day, which the load's CPU per
    point is compared with). Wall-clock time on an otherwise idle machine: the client and the
    database take turns, so it is their CPU together (a backend process's own CPU cannot be
    read once its connection has closed).

    PostgreSQL: one binary ``COPY`` of a pre-encoded buffer into ``metric_points``; SQLite: one
    ``executemany`` ``INSERT`` into the same file's ``metric_points`` in one transaction.
    """
    if backend == "postgres":
        from bench.service.ingest import copy_baseline

        return 1e6 / copy_baseline(database_url, n_points, prebuilt=True)
    import sqlite3

    rows = [(-1, step, 2.0 + 1.0 / math.sqrt(step + 10), 1.7e9 + step)
            for step in range(n_points)]
    conn = sqlite3.connect(database_url.removeprefix("sqlite:///"))
    try:
        start = time.perf_counter()
        with conn:  # series -1 exists nowhere: sqlite3 leaves foreign keys unchecked
            conn.executemany("INSERT INTO metric_points (series_id, step, value, wall_time) "
                             "VALUES (?, ?, ?, ?)", rows)
        return (time.perf_counter() - start) * 1e6 / n_points
    finally:
        conn.close()


def _is_worker(proc: psutil.Process) -> bool:
    """Whether a process of the service's tree is its background worker (``curvecast worker``,
    started by ``serve`` or by ``--worker-apart``)."""
    try:
        return "worker" in proc.cmdline()[3:5]
    except psutil.Error:
        return False


def postgres_processes() -> list[psutil.Process]:
    """Every process of the local PostgreSQL cluster."""
    out = []
    for p in psutil.process_iter(["name"]):
        if p.info["name"] in ("postgres", "postmaster"):
            out.append(p)
    return out


def postgres_cpu_seconds() -> float:
    """CPU seconds the local PostgreSQL cluster's processes have used so far."""
    return cpu_seconds(postgres_processes())


# --------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def count_rows(database_url: str, run_ids: list[str]) -> dict[str, tuple[int, int, int]]:
    """Per run: (rows, distinct (key, step) pairs, runs.n_points) straight from the database."""
    from sqlalchemy import create_engine, text

    from curvecast.service.config import Settings

    engine = create_engine(Settings(database_url=database_url).database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT CAST(s.run_id AS TEXT), count(*), count(DISTINCT s.key || ':' || p.step)"
                " FROM series s JOIN metric_points p ON p.series_id = s.id GROUP BY s.run_id"
            )).all()
            n_points = conn.execute(text("SELECT CAST(id AS TEXT), n_points FROM runs")).all()
    finally:
        engine.dispose()
    # (PostgreSQL writes a uuid with dashes, SQLite stores 32 hex digits.)
    found = {str(uuid.UUID(r)): (int(n), int(d)) for r, n, d in rows}
    totals = {str(uuid.UUID(r)): int(n) for r, n in n_points}
    return {r: (*found.get(r, (0, 0)), totals.get(r, 0)) for r in run_ids}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench._db import fresh_database
    from tests.support import start_server_process

    steps_per_second = args.rate / len(KEYS)
    run_ids = [str(uuid.uuid4()) for _ in range(args.clients)]
    per_process = math.ceil(args.clients / args.processes)
    backend = "sqlite" if args.sqlite else "postgres"
    apart = args.worker_apart and not args.no_worker
    env = ({"CURVECAST_WORKER_ENABLED": "false"} if args.no_worker or apart else None)
    with tempfile.TemporaryDirectory(prefix="curvecast-load-") as tmp, \
            fresh_database(backend, Path(tmp)) as database_url:
        server = start_server_process(database_url, Path(tmp), env=env,
                                      extra_args=["--workers", "2"], healthy_within=120)
        # --worker-apart: the background worker in a `curvecast worker` process of its own.
        worker = subprocess.Popen(
            [sys.executable, "-m", "curvecast.service.cli", "worker", "--database-url",
             database_url], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        ) if apart else None
        try:
            for run_id in run_ids:  # create the runs up front so readers have something
                httpx.put(f"{server.url}/api/v1/runs/{run_id}",
                          json={"project": "load", "config": {"c_warmup": 100}}).raise_for_status()
            start_at = time.time() + 4.0  # the generator processes start within 2-3 s
            jobs = [GeneratorJob(server.url, run_ids[i:i + per_process], steps_per_second,
                                 args.duration, start_at, str(Path(tmp) / "spool"),
                                 phase_spread=0.0 if args.lockstep else 1.0)
                    for i in range(0, len(run_ids), per_process)]
            readers = Readers(server.url, run_ids, page_reloads=args.page_reloads)
            ctx = mp.get_context("spawn")
            with ctx.Pool(len(jobs)) as pool:
                pending = pool.map_async(generator_process, jobs)

                def service() -> list[psutil.Process]:
                    return process_tree(server.proc.pid) + (
                        process_tree(worker.pid) if worker is not None else [])

                sampler = CpuSampler({
                    SERVICE: service,
                    WORKER: lambda: [p for p in service() if _is_worker(p)],
                    **({} if args.sqlite else {POSTGRES: postgres_processes}),
                    "load generator": lambda: [psutil.Process(c.pid)
                                               for c in mp.active_children()],
                    "readers": lambda: [psutil.Process()],
                })
                time.sleep(max(0.0, start_at - time.time()))
                sampler.thread.start()
                profiler = _start_profiler(server.proc.pid, args, Path(tmp)) if args.profile \
                    else None
                readers.wait_until_logged()
                reader_threads = readers.start()
                scraper = Scraper(server.url, args.scrape_every)
                scraper.thread.start()
                time.sleep(args.duration)
                readers.stop.set()
                sampler.stop.set()
                scraper.stop.set()
                for t in reader_threads:
                    t.join()
                results = pending.get(timeout=args.duration + 900)
            drained_at = time.time()
            scrape_cpu = cpu_per_scrape(server.url, service)
            rows = count_rows(database_url, run_ids)
            profile = _finish_profiler(profiler) if profiler is not None else None
        finally:
            if worker is not None:
                worker.terminate()
                worker.wait(30)
            server.stop()
        log = server.log()
        print(f"baseline: storing {BASELINE_POINTS:,} points the raw way", flush=True)
        baseline_us = storage_baseline(database_url, backend)
    return {"results": results, "readers": readers, "sampler": sampler, "rows": rows,
            "start_at": start_at, "drained_at": drained_at, "server_log": log,
            "steps_per_second": steps_per_second, "profile": profile,
            "baseline_us": baseline_us, "scraper": scraper, "scrape_cpu_s": scrape_cpu}


def _start_profiler(pid: int, args: argparse.Namespace, tmp: Path) -> tuple[Any, Path]:
    """py-spy sampling the service's process tree for the load window (raw collapsed stacks)."""
    import shutil
    import subprocess

    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    output = tmp / "profile.txt"
    proc = subprocess.Popen(
        # --gil: only the thread holding the GIL is sampled, so samples are CPU time in Python
        # code (and in C code called with the GIL held), not time waiting on PostgreSQL.
        [exe, "record", "--pid", str(pid), "--subprocesses", "--nonblocking", "--gil",
         "--rate", "50", "--duration", str(max(1, int(args.duration))), "--format", "raw",
         "--output", str(output)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    return proc, output


def _finish_profiler(profiler: tuple[Any, Path]) -> dict[str, Any]:
    """Wait for py-spy and sum its samples per function: own samples and, for curvecast's
    own functions, samples including callees."""
    proc, output = profiler
    _, err = proc.communicate(timeout=120)
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    text = output.read_text() if output.exists() else ""
    processes = {"serve": 0, "worker": 0}
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        # The second "process" entry is the sampled child: a serve process or the worker's.
        child = stack.split(";", 2)[1:2]
        processes["worker" if child and " worker --parent-pid" in child[0] else "serve"] += count
        # "process ...;thread ...;" prefixes come first; frames are "name (file:line)".
        frames = [f.rsplit(":", 1)[0] + ")" if ":" in f else f
                  for f in stack.split(";")
                  if " (" in f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            if "curvecast" in frame:
                inclusive[frame] = inclusive.get(frame, 0) + count
    return {"total": total, "own": own, "inclusive": inclusive, "processes": processes,
            "error": err.strip()[-500:]}


def _profile_tables(profile: dict[str, Any], top: int = 15) -> str:
    from bench._report import markdown_table

    if not profile["total"]:
        return f"Profile: py-spy recorded no samples ({profile['error'] or 'no message'})."
    total = profile["total"]

    def _share(kind: str) -> str:
        n = profile.get("processes", {}).get(kind, 0)
        return f"{100 * n / total:.0f}%"

    def rows(counts: dict[str, int]) -> list[list[object]]:
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return [[f"`{name}`", n, f"{100 * n / total:.1f}%"] for name, n in ranked]

    return (
        f"Profile of the service's processes during the load window (py-spy `--gil`: 50 "
        f"samples/s of the thread holding each process's GIL, {profile['total']:,} samples, so "
        f"a share is a share of the CPU time spent in Python; a query's wait for PostgreSQL is "
        f"not in it). Serve processes {_share('serve')}, background worker "
        f"{_share('worker')}. Own time, the top {top} functions:\n\n"
        + markdown_table(["function (file)", "samples", "share"], rows(profile["own"]))
        + f"\n\ncurvecast's own functions, time including what they call (top {top}):\n\n"
        + markdown_table(["function (file)", "samples", "share"], rows(profile["inclusive"]))
    )


def _scrape_row(args: argparse.Namespace, out: dict[str, Any], sampler: CpuSampler
                ) -> list[object]:
    """``/metrics`` during the load: its latency, and one scrape's service CPU (50 back to
    back after the load) against the service's CPU per second in the window (goal: <= 1% at
    Prometheus' default 15 s interval)."""
    scraper: Scraper = out["scraper"]
    lat = [x * 1000 for x in scraper.latencies]
    service_per_s = statistics.mean(sampler.samples[SERVICE] or [math.nan]) / 100.0
    share = out["scrape_cpu_s"] / 15.0 / service_per_s
    here = out["scrape_cpu_s"] / args.scrape_every / service_per_s
    return [f"`GET /metrics` every {args.scrape_every:g} s during the load (Prometheus' default "
            "is 15 s; goal: ≤ 1% of the service's CPU)",
            f"{len(lat)} scrapes, {scraper.errors} errors, p50 {pct(lat, 0.5):.0f} ms; one "
            f"costs the service {out['scrape_cpu_s'] * 1e3:.1f} ms of CPU: **{share:.2%}** of "
            f"its CPU at 15 s, {here:.2%} at {args.scrape_every:g} s"]


def summarise(args: argparse.Namespace, out: dict[str, Any]) -> tuple[str, bool, str, str]:
    """The section's body, whether every check passed, its one-line result, and the CPU table
    (printed)."""
    from bench._report import markdown_table

    clients = {k: v for r in out["results"] for k, v in r["clients"].items()}
    records = [rec for c in clients.values() for rec in c["records"]]
    start, end = out["start_at"], out["start_at"] + args.duration
    logged = sum(c["stats"]["points_logged"] for c in clients.values())
    offered_rate = logged / args.duration
    in_window = sum(acc for sent, lat, _s, acc in records if sent + lat <= end)
    acked = sum(acc for *_rest, acc in records)
    last_ack = max((sent + lat for sent, lat, _s, acc in records if acc), default=end)
    ingest_lat = [lat * 1000 for _sent, lat, status, _acc in records if status == 200]
    ingest_errors = sum(1 for _s, _l, status, _a in records if status != 200)
    expected = {r: c["steps"] * len(KEYS) for r, c in clients.items()}
    exact = all(out["rows"][r] == (n, n, n) for r, n in expected.items())
    stats = [c["stats"] for c in clients.values()]
    counters = {k: sum(s[k] for s in stats) for k in ("points_spooled", "points_dropped",
                                                        "points_rejected", "failures")}
    readers: Readers = out["readers"]
    sampler: CpuSampler = out["sampler"]
    reader_errors = sum(readers.errors.values())
    errors = ingest_errors + reader_errors + counters["points_dropped"] + counters[
        "points_rejected"] + sum(not c["finished"] for c in clients.values())
    tracebacks = out["server_log"].count("Traceback")
    ok = exact and errors == 0 and tracebacks == 0
    max_late = max(c["max_late_s"] for c in clients.values())

    def ms(values: list[float], q: float) -> str:
        return f"{pct(values, q):,.0f}" if values else "-"

    offered_note = ("met" if offered_rate >= 0.98 * args.clients * args.rate
                    else f"**not met** (generator fell up to {max_late:.1f} s behind)")
    acked_rate = in_window / args.duration
    rows: list[list[object]] = [
        ["clients × rate", f"{args.clients} × {args.rate:,} points/s "
                           f"({out['steps_per_second']:.0f} steps/s × {len(KEYS)} metrics)"],
        ["offered load (points logged / s)", f"{offered_rate:,.0f} of "
                                             f"{args.clients * args.rate:,}: {offered_note}"],
        ["sustained, acknowledged within the load window",
         f"**{in_window / args.duration:,.0f} points/s**"],
        ["all points stored after", f"{last_ack - start:.1f} s (load: {args.duration} s)"],
        ["sustained over the whole run (stored / time to store)",
         f"{acked / max(1e-9, last_ack - start):,.0f} points/s"],
        [f"CPU per point acknowledged in the window (process CPU time; goal: service "
         f"≤ {SERVICE_GOAL_US:g} µs)", f"**{_per_point(sampler, acked_rate)}**"],
        ["baseline, same run: storing points the raw way (" + (
            "`executemany` INSERT into the same SQLite file" if args.sqlite else
            "binary `COPY` into the same PostgreSQL table, database and client") + ")",
         f"{out['baseline_us']:.2f} µs/point; service CPU per point = "
         f"**{_us_per_point(sampler, SERVICE, acked_rate) / out['baseline_us']:.1f}×** "
         "the raw write"],
        ["points stored exactly once", f"{'yes' if exact else '**NO**'}: "
                                       f"{sum(expected.values()):,} expected, "
                                       f"{sum(r[0] for r in out['rows'].values()):,} rows"],
        ["ingest requests", f"{len(records):,}, latency p50 {ms(ingest_lat, 0.5)} ms, "
                            f"p99 {ms(ingest_lat, 0.99)} ms, max {ms(ingest_lat, 1.0)} ms"],
        ["errors", f"{errors} (ingest non-200: {ingest_errors}, reads: {reader_errors}, "
                   f"server tracebacks: {tracebacks}; client retries: {counters['failures']}, "
                   f"points spooled: {counters['points_spooled']:,})"],
        _scrape_row(args, out, sampler),
    ]
    def read_row(kind: str, seconds: list[float], errors: object, *, goal: bool = False
                 ) -> list[object]:
        """A row of the reads table (``goal``: its p95 is the goal's figure, in bold)."""
        lat = [x * 1000 for x in seconds]
        p95 = f"**{ms(lat, 0.95)}**" if goal else ms(lat, 0.95)
        return [kind, len(lat), f"{len(lat) / args.duration:.1f}", ms(lat, 0.5), p95,
                ms(lat, 0.99), errors]

    read_rows = [read_row(kind, lat, readers.errors.get(kind, 0))
                 for kind, lat in sorted(readers.latencies.items())]
    figures = [x for kind, lat in readers.latencies.items() if kind.startswith("dashboard")
               for x in lat]
    if figures:
        read_rows.append(read_row(f"dashboard figures, all (goal: p95 ≤ {FIGURES_GOAL_MS:g} ms)",
                                  figures, "", goal=True))
    backend = "SQLite" if args.sqlite else "PostgreSQL"
    worker = ("background worker **off**: ingest and reads only" if args.no_worker
              else "background worker on, in a `curvecast worker` process of its own (the serve "
              "processes run with `CURVECAST_WORKER_ENABLED=false`; the service's CPU counts "
              "both)" if args.worker_apart
              else "background worker on: refits and alert evaluation run as in production")
    if args.sqlite:
        worker += "; the database runs inside the service's processes, so their CPU includes it"
    cpu_rows: list[list[object]] = [
        [name, f"{statistics.mean(s):.0f}%" if s else "-", f"{max(s):.0f}%" if s else "-"]
        for name, s in sampler.samples.items()
    ]
    body = "\n\n".join([
        f"{args.clients} simulated training clients (real `Monitor` hooks in paced loops, "
        f"{args.processes} generator processes, "
        + ("every monitor created at once, `--lockstep`" if args.lockstep else
           "batches spread over each second as independent jobs' are")
        + f") stream for {args.duration:g} s into `curvecast serve --workers 2` on {backend} "
        f"({worker}), while {readers.viewers} viewers "
        + ("each load a whole run page's figures every 2 s (`--page-reloads`)"
           if readers.page_reloads else
           f"keep run pages open as the page's script does (a new page every {PAGE_S:.0f} s "
           "each)")
        + f" and {readers.forecasters} scripts each ask a forecast, a target and a downsampled "
        f"series {SCRIPT_ROUNDS_PER_S:g} times a second; all share the machine's "
        f"{psutil.cpu_count() or 1} cores (load average before: {out['load_before']:.1f}).",
        markdown_table(["", "result"], rows),
        "Reads during the load:\n\n" + markdown_table(
            ["request", "count", "per s", "p50 ms", "p95 ms", "p99 ms", "errors"], read_rows),
    ])
    cpu = ("CPU (100% = one core; sampled every second during the load window):\n\n"
           + markdown_table(["process group", "mean", "max"], cpu_rows))
    service_us = _us_per_point(sampler, SERVICE, acked_rate)
    result = (f"service CPU {service_us:.1f} µs a point (goal ≤ {SERVICE_GOAL_US:g} µs: "
              f"{'met' if service_us <= SERVICE_GOAL_US else 'not met'}), "
              f"{service_us / out['baseline_us']:.1f}× a raw write of it; "
              f"{acked_rate:,.0f} of {args.clients * args.rate:,} points/s acknowledged, "
              f"every point stored once: {'yes' if exact else 'NO'}; ingest p99 "
              f"{ms(ingest_lat, 0.99)} ms, figures p95 {ms([x * 1000 for x in figures], 0.95)} ms")
    return body, ok, result, cpu


#: The service's goals under this load: CPU per point, and the dashboards' figures p95.
SERVICE_GOAL_US = 10.0
FIGURES_GOAL_MS = 300.0


def main(argv: list[str] | None = None) -> int:
    from bench._cli import parser, publish, writes

    cli = parser(__doc__, quick="8 clients for 10 s")
    cli.add_argument("--clients", type=int, default=32)
    cli.add_argument("--rate", type=int, default=1000, help="points/s per client")
    cli.add_argument("--duration", type=float, default=60.0)
    cli.add_argument("--processes", type=int, default=4, help="load generator processes")
    cli.add_argument("--profile", action="store_true",
                     help="sample the service with py-spy and print its top functions")
    cli.add_argument("--sqlite", action="store_true",
                     help="serve from a SQLite file instead of PostgreSQL")
    cli.add_argument("--worker-apart", action="store_true",
                     help="run the background worker as `curvecast worker`, not in the serve "
                          "processes")
    cli.add_argument("--page-reloads", action="store_true",
                     help="viewers load a whole run page's figures every 2 s instead of "
                          "keeping pages open as run.js does")
    cli.add_argument("--lockstep", action="store_true",
                     help="create every client's monitor at once, so that all send their "
                          "batches in the same moment of each second (the worst case)")
    cli.add_argument("--scrape-every", type=float, default=5.0, metavar="S",
                     help="scrape /metrics every S seconds during the load (default 5)")
    cli.add_argument("--no-worker", action="store_true",
                     help="background worker off (no refits, no alerts): what ingest and "
                          "reads cost alone")
    args = cli.parse_args(argv)
    variant = (args.profile or args.no_worker or args.worker_apart or args.page_reloads
               or args.lockstep)
    if args.quick:
        args.clients, args.duration, args.processes = 8, 10.0, 2
    load_before = os.getloadavg()[0]
    from bench._report import phase

    with phase("load", f"{args.clients} clients at {args.rate:,} points/s each for "
                       f"{args.duration:.0f} s, with readers (then draining)"):
        out = run(args)
    out["load_before"] = load_before
    body, ok, result, cpu = summarise(args, out)
    if out.get("profile"):
        print(_profile_tables(out["profile"]))
    if variant or not writes(args):
        print(f"Result: {result}\n\n{body}\n\n{cpu}")
    elif args.sqlite:
        publish(args, "load-sqlite", "Load on SQLite: 32 training clients, dashboards and "
                                     "forecasts", body, result, details=cpu)
    else:
        publish(args, "load", "Load on PostgreSQL: 32 training clients, dashboards and "
                              "forecasts", body, result, details=cpu)
    if not ok:
        print(out["server_log"][-5000:], file=sys.stderr)
        return 1
    return 0
