"""Server memory while exporting a 2M-point run as CSV.

Run from the repository root::

    python -m bench run export_memory              # SQLite (~2 minutes)
    python -m bench run export_memory --postgres   # also PostgreSQL
    python -m bench run export_memory --points 200000 --no-write   # a quick look

It seeds a run with ``--points`` points (two series, ``loss`` and ``grad``, half each) straight
through the store, starts a real ``curvecast serve`` process on that database, and samples the
process's resident memory (``VmRSS`` in ``/proc``, every 20 ms): idle, then during one full
``GET .../metrics.csv`` and during three at once. It reports the peak over idle, the time to
the first byte and the total time, and -- the baseline, in the same run -- how long the
database's own fastest dump of the same rows takes (Python's ``sqlite3`` iterating the joined
rows into CSV, or PostgreSQL's ``COPY ... TO STDOUT``). Goal: peak within 100 MB of idle.
"""

from __future__ import annotations

import csv
import io
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench._cli import parser, publish
from bench._db import fresh_database
from bench._report import markdown_table, phase, progress
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.schemas import MetricBatch, RunCreate
from curvecast.service.store import metrics as metric_store
from curvecast.service.store import runs as run_store
from curvecast.service.store.export import EXPORT_PAGE
from tests.support import start_server_process

GOAL_MB = 100.0
SEED_BATCH = 50_000
DUMP_SQL = (
    "SELECT s.key, mp.step, mp.value, mp.wall_time FROM metric_points mp "
    "JOIN series s ON s.id = mp.series_id WHERE s.run_id = {run} ORDER BY s.key, mp.step"
)


def rss_mb(pid: int) -> float:
    """Resident memory of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


@contextmanager
def sampled_peak(pid: int) -> Iterator[list[float]]:
    """Sample ``pid``'s RSS every 20 ms while the block runs; the list holds the samples."""
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(rss_mb(pid))
            stop.wait(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()
        samples.append(rss_mb(pid))


def seed(database_url: str, points: int) -> uuid.UUID:
    """A run with ``points`` points: ``loss`` and ``grad`` at steps 0..points/2-1."""
    factory = make_sessionmaker(make_engine(Settings(database_url=database_url)))
    run_id = uuid.uuid4()
    with session_scope(factory) as s:
        run_store.create_or_get_run(
            s, run_id=run_id, run_in=RunCreate(project="bench"), allowed_project=None
        )
    steps_total = points // 2
    for lo in range(0, steps_total, SEED_BATCH):
        steps = list(range(lo, min(steps_total, lo + SEED_BATCH)))
        batch = MetricBatch(
            steps=steps,
            wall_time=[1.7e9 + s * 0.01 for s in steps],
            values={
                "loss": [3.0 / (1 + s) ** 0.5 for s in steps],
                "grad": [1.0 + s % 7 for s in steps],
            },
        )
        with session_scope(factory) as s:
            metric_store.ingest_batch(s, run_id=run_id, batch=batch, allowed_project=None)
        progress("export_memory", f"seeded {min(steps_total, lo + SEED_BATCH) * 2:,} points")
    return run_id


def export(url: str, run_id: uuid.UUID) -> tuple[float, float, int]:
    """One full export: (seconds to the first byte, total seconds, bytes)."""
    started = time.perf_counter()
    first = None
    size = 0
    with httpx.stream("GET", f"{url}/api/v1/runs/{run_id}/metrics.csv", timeout=600) as resp:
        resp.raise_for_status()
        for chunk in resp.iter_raw():
            if first is None:
                first = time.perf_counter() - started
            size += len(chunk)
    return first or 0.0, time.perf_counter() - started, size


def baseline_seconds(database_url: str, run_id: uuid.UUID) -> float:
    """The database's own dump of the same rows as CSV, into memory-free sink."""
    started = time.perf_counter()
    if database_url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(database_url.removeprefix("sqlite:///"))
        sink = csv.writer(io.StringIO())
        cur = conn.execute(DUMP_SQL.format(run=f"'{run_id.hex}'"))
        while rows := cur.fetchmany(20_000):
            sink.writerows(rows)
        conn.close()
    else:
        import psycopg

        dsn = database_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn) as conn, conn.cursor() as cur:
            sql = f"COPY ({DUMP_SQL.format(run=repr(str(run_id)))}) TO STDOUT WITH CSV"
            with cur.copy(sql) as copy:
                for _ in copy:
                    pass
    return time.perf_counter() - started


def bench_backend(backend: str, points: int, workdir: Path) -> list[list[object]]:
    with fresh_database(backend, workdir) as url:
        with phase("export_memory", f"{backend}: seeding {points:,} points"):
            run_id = seed(url, points)
        server = start_server_process(url, workdir, env={"CURVECAST_WORKER_ENABLED": "false"})
        try:
            pid = server.proc.pid
            httpx.get(f"{server.url}/api/v1/runs/{run_id}/metrics", params={"max_points": 100})
            time.sleep(1.0)  # settle after start-up (not synchronisation: a measurement pause)
            idle = rss_mb(pid)
            with phase("export_memory", f"{backend}: one export"), sampled_peak(pid) as one:
                ttfb, total, size = export(server.url, run_id)
            with phase("export_memory", f"{backend}: three exports at once"), sampled_peak(
                pid
            ) as three:
                threads = [threading.Thread(target=export, args=(server.url, run_id))
                           for _ in range(3)]
                started = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                three_total = time.perf_counter() - started
        finally:
            server.stop()
        with phase("export_memory", f"{backend}: baseline dump"):
            base = baseline_seconds(url, run_id)
    peak1, peak3 = max(one) - idle, max(three) - idle
    return [[
        backend, f"{points:,}", f"{size / 2**20:.1f} MiB", f"{idle:.0f}",
        f"+{peak1:.0f}", f"+{peak3:.0f}", f"{ttfb * 1000:.0f} ms", f"{total:.1f} s",
        f"{three_total:.1f} s", f"{base:.1f} s", f"{total / base:.2f}x",
        "yes" if max(peak1, peak3) <= GOAL_MB else "NO",
    ]]


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--points", type=int, default=2_000_000)
    cli.add_argument("--postgres", action="store_true", help="also on PostgreSQL")
    args = cli.parse_args(argv)
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("sqlite", "postgres") if args.postgres else ("sqlite",):
            rows += bench_backend(backend, args.points, Path(tmp))
    table = markdown_table(
        ["backend", "points", "CSV size", "idle RSS (MB)", "peak over idle, 1 export (MB)",
         "peak over idle, 3 at once (MB)", "first byte", "1 export", "3 at once",
         "baseline: the database's own dump", "export / baseline", f"within {GOAL_MB:.0f} MB"],
        rows,
    )
    body = (
        "A real `curvecast serve` process exports a run of two series (`GET "
        "/api/v1/runs/{id}/metrics.csv`, streamed in keyset pages of "
        f"{EXPORT_PAGE:,} points); RSS sampled every 20 ms from /proc. Baseline, "
        "same run: the same rows dumped as CSV by the database's own fastest path (sqlite3 "
        "iterating the join; PostgreSQL `COPY TO STDOUT`).\n\n" + table
    )
    result = ("memory over idle " + ", ".join(f"{r[5]} MB ({r[0]})" for r in rows)
              + f" with three exports at once (goal ≤ {GOAL_MB:.0f} MB); an export "
              + ", ".join(f"{r[10]} ({r[0]})" for r in rows) + " the database's own dump")
    return publish(args, "export_memory", "CSV export memory", body, result)
