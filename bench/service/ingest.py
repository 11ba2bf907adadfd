"""Ingest throughput over HTTP vs raw COPY, storage per point, and downsampled reads.

Starts a real ``curvecast serve`` process per backend (SQLite file and a fresh PostgreSQL
database), streams columnar batches from 1, 4 and 16 concurrent writers (one run each), and
measures in the same run the baseline: psycopg ``COPY ... FROM STDIN (FORMAT BINARY)`` of the same
points straight into the same ``metric_points`` table. Then measures the service's CPU per point
for batches shaped like the client hook's (100 steps × 10 keys, with wall times), stores a
10^6-point series and times ``GET .../metrics?max_points=2000``.

Usage: ``python -m bench run ingest [--quick] [--no-write]``
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import psutil
import psycopg

from bench._cli import parser, publish
from bench._procs import process_tree
from bench._report import markdown_table
from curvecast.client._batcher import Record, encode_records, plain_body
from curvecast.service.config import Settings
from curvecast.service.migrate import upgrade
from curvecast.service.store._pgcopy import encode_rows
from tests.support import (
    create_pg_database,
    drop_pg_database,
    start_server_process,
)

KEYS = ("loss", "polyak_lr", "grad_l1", "alpha")


def make_bodies(n_batches: int, batch_steps: int, offset: int = 0) -> list[bytes]:
    """Pre-encoded request bodies (encoding is the client's cost, not the server's)."""
    rng = np.random.default_rng(0)
    bodies = []
    for b in range(n_batches):
        steps = np.arange(offset + b * batch_steps, offset + (b + 1) * batch_steps)
        values = {k: (2 + 1 / np.sqrt(steps + 10) + rng.normal(0, 0.01, len(steps))).tolist()
                  for k in KEYS}
        bodies.append(json.dumps({"steps": steps.tolist(), "values": values}).encode())
    return bodies


def http_ingest(url: str, writers: int, bodies: list[bytes]) -> float:
    """Points/s with ``writers`` concurrent clients, each streaming ``bodies`` to its own run."""
    run_ids = [uuid.uuid4() for _ in range(writers)]
    with httpx.Client(timeout=120) as client:
        for run_id in run_ids:
            client.put(f"{url}/api/v1/runs/{run_id}", json={"project": "bench"}).raise_for_status()
    errors: list[str] = []
    barrier = threading.Barrier(writers + 1)

    def writer(run_id: uuid.UUID) -> None:
        with httpx.Client(timeout=120, headers={"content-type": "application/json"}) as client:
            barrier.wait()
            for body in bodies:
                resp = client.post(f"{url}/api/v1/runs/{run_id}/metrics", content=body)
                if resp.status_code != 200:
                    errors.append(resp.text)

    threads = [threading.Thread(target=writer, args=(r,)) for r in run_ids]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} ingest errors, first: {errors[0]}")
    points = writers * len(bodies) * len(json.loads(bodies[0])["steps"]) * len(KEYS)
    return points / elapsed


#: The client hook's batch: about a second of a run logging 10 metrics at 100 steps/s.
HOOK_STEPS, HOOK_KEYS = 100, tuple(f"metric_{i}" for i in range(10))


def hook_bodies(n_batches: int, base64_columns: bool = True) -> list[bytes]:
    """Bodies as ``Monitor`` sends them (its own encoder: base64 columns, wall times,
    consecutive steps), or the same bodies as plain JSON arrays (what an older client sent)."""
    rng = np.random.default_rng(1)
    bodies = []
    for b in range(n_batches):
        steps = range(b * HOOK_STEPS, (b + 1) * HOOK_STEPS)
        values = rng.random((HOOK_STEPS, len(HOOK_KEYS))).tolist()
        records: list[Record] = [(s, 1.7e9 + s * 0.01, dict(zip(HOOK_KEYS, row, strict=True)),
                                  None) for s, row in zip(steps, values, strict=True)]
        [batch], _ = encode_records(records)
        bodies.append(batch.body if base64_columns else plain_body(batch.body))
    return bodies


def _cpu_seconds(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for proc in procs:
        try:
            times = proc.cpu_times()
            out[proc.pid] = times.user + times.system
        except psutil.Error:
            pass
    return out


def _postgres_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"])
            if p.info["name"] in ("postgres", "postmaster")]


def _used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two readings; a process that started meanwhile (a new database
    connection) counts whole."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def cpu_per_point(
    url: str, pid: int, writers: int, n_batches: int, base64_columns: bool
) -> tuple[float, float]:
    """Service CPU (µs, process CPU time of the server's process tree) and PostgreSQL CPU (µs,
    the whole cluster's processes; ~0 for SQLite) per point stored, ``writers`` concurrent
    clients each streaming ``n_batches`` hook-shaped batches into a run of its own."""
    bodies = hook_bodies(n_batches, base64_columns)
    run_ids = [uuid.uuid4() for _ in range(writers)]
    with httpx.Client(timeout=120) as client:
        for run_id in run_ids:
            client.put(f"{url}/api/v1/runs/{run_id}", json={"project": "bench"}).raise_for_status()
            # The run's first batch creates its series: not what a streaming run pays.
            client.post(f"{url}/api/v1/runs/{run_id}/metrics", content=bodies[0],
                        headers={"content-type": "application/json"}).raise_for_status()

    def writer(run_id: uuid.UUID) -> None:
        with httpx.Client(timeout=120, headers={"content-type": "application/json"}) as client:
            for body in bodies[1:]:
                client.post(f"{url}/api/v1/runs/{run_id}/metrics", content=body
                            ).raise_for_status()

    procs = process_tree(pid)
    service0, pg0 = _cpu_seconds(procs), _cpu_seconds(_postgres_processes())
    threads = [threading.Thread(target=writer, args=(r,)) for r in run_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    points = writers * (n_batches - 1) * HOOK_STEPS * len(HOOK_KEYS)
    return (_used(service0, _cpu_seconds(procs)) * 1e6 / points,
            _used(pg0, _cpu_seconds(_postgres_processes())) * 1e6 / points)


def copy_baseline(pg_url: str, n_points: int, prebuilt: bool) -> float:
    """Points/s of raw binary COPY into metric_points (one connection), same run shape.

    ``prebuilt=False`` is the everyday psycopg way (``write_row`` per point);
    ``prebuilt=True`` writes one pre-encoded binary buffer, so it measures the database's own
    COPY speed with almost no client cost: the stricter baseline.
    """
    run_id = uuid.uuid4()
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=False) as conn:
        conn.execute("INSERT INTO projects (name, created_at) VALUES ('copy', now()) "
                     "ON CONFLICT DO NOTHING")
        conn.execute(
            "INSERT INTO runs (id, project_id, name, config, status, created_at, updated_at,"
            " n_points) SELECT %s, id, 'copy', '{}', 'running', now(), now(), 0 FROM projects"
            " WHERE name = 'copy'", (run_id,))
        sids = [conn.execute("INSERT INTO series (run_id, key) VALUES (%s, %s) RETURNING id",
                             (run_id, k)).fetchone()[0] for k in KEYS]
        conn.commit()
        per_key = n_points // len(KEYS)
        steps = np.arange(per_key)
        values = (2 + 1 / np.sqrt(steps + 10)).tolist()
        step_list = steps.tolist()
        payload = encode_rows(
            np.repeat(np.array(sids), per_key), np.tile(steps, len(KEYS)),
            np.tile(np.array(values), len(KEYS)), None,
        )
        start = time.perf_counter()
        with conn.cursor() as cur, cur.copy(
            "COPY metric_points (series_id, step, value, wall_time) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            if prebuilt:
                copy.write(payload)
            else:
                copy.set_types(["int4", "int8", "float8", "float8"])
                for sid in sids:
                    for s, v in zip(step_list, values, strict=True):
                        copy.write_row((sid, s, v, None))
        conn.commit()
        return per_key * len(KEYS) / (time.perf_counter() - start)


def bytes_per_point_pg(pg_url: str) -> float:
    """Points table, its primary key and the rollups, per stored point."""
    with psycopg.connect(pg_url.replace("+psycopg", "")) as conn:
        size, count = conn.execute(
            "SELECT pg_total_relation_size('metric_points')"
            " + pg_total_relation_size('metric_rollups'), (SELECT count(*) FROM metric_points)"
        ).fetchone()
    return size / count


def bytes_per_point_sqlite(db_path: Path) -> float:
    import sqlite3

    with sqlite3.connect(db_path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        count = conn.execute("SELECT count(*) FROM metric_points").fetchone()[0]
        try:
            size = conn.execute(
                "SELECT sum(pgsize) FROM dbstat WHERE name IN ('metric_points', 'metric_rollups')"
            ).fetchone()[0]
        except sqlite3.OperationalError:  # dbstat not compiled in: whole file
            size = db_path.stat().st_size
    return size / count


def downsample_read(url: str, n: int, repeats: int) -> tuple[float, float]:
    """Store one n-point series, then time full reads downsampled to 2,000 buckets (ms)."""
    run_id = uuid.uuid4()
    with httpx.Client(timeout=300) as client:
        client.put(f"{url}/api/v1/runs/{run_id}", json={"project": "bench"}).raise_for_status()
        chunk = 100_000
        for lo in range(0, n, chunk):
            steps = list(range(lo, min(n, lo + chunk)))
            body = {"steps": steps, "values": {"loss": [2 + 1 / (s + 10) ** 0.5 for s in steps]}}
            client.post(f"{url}/api/v1/runs/{run_id}/metrics", json=body).raise_for_status()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            resp = client.get(f"{url}/api/v1/runs/{run_id}/metrics",
                              params={"keys": "loss", "max_points": 2000})
            times.append((time.perf_counter() - start) * 1000)
            resp.raise_for_status()
        assert resp.json()["series"][0]["total_points"] == n
    return statistics.median(times), max(times)


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, quick="small sizes").parse_args(argv)
    batch_steps = 2500  # x 4 keys = 10,000 points per request
    total_per_config = 40_000 if args.quick else 400_000
    big_series = 50_000 if args.quick else 1_000_000
    repeats = 3 if args.quick else 7

    tmp = Path(tempfile.mkdtemp(prefix="curvecast-bench-"))
    pg_url = Settings(database_url=create_pg_database()).database_url
    sqlite_path = tmp / "bench.db"
    backends = {"sqlite": f"sqlite:///{sqlite_path}", "postgres": pg_url}
    rows, read_rows, cpu_rows, storage = [], [], [], {}
    try:
        upgrade(pg_url)
        copy_rate = copy_baseline(pg_url, total_per_config, prebuilt=False)
        fast_copy = copy_baseline(pg_url, total_per_config, prebuilt=True)
        print(f"raw COPY baselines: {copy_rate:,.0f} / {fast_copy:,.0f} points/s", flush=True)
        for name, url in backends.items():
            server = start_server_process(url, tmp)
            try:
                for writers in (1, 4, 16):
                    n_batches = max(1, total_per_config // (writers * batch_steps * len(KEYS)))
                    bodies = make_bodies(n_batches, batch_steps)
                    rate = http_ingest(server.url, writers, bodies)
                    ratio = f"{rate / copy_rate:.0%}"
                    rows.append([name, writers, f"{rate:,.0f}", ratio, f"{rate / fast_copy:.0%}"])
                    print(f"{name} writers={writers}: {rate:,.0f} points/s ({ratio} of COPY)",
                          flush=True)
                med, worst = downsample_read(server.url, big_series, repeats)
                read_rows.append([name, f"{big_series:,}", f"{med:.0f}", f"{worst:.0f}"])
                print(f"{name} read {big_series} -> 2000: median {med:.0f} ms", flush=True)
            finally:
                server.stop()
            storage[name] = (bytes_per_point_pg(pg_url) if name == "postgres"
                             else bytes_per_point_sqlite(sqlite_path))
            # Ingest alone: a server of its own without the background worker (which would
            # evaluate alert rules on the new points meanwhile).
            # Both encodings on the same server, alternating: base64 columns (the hook's),
            # then plain JSON arrays (the baseline), three times; each row is the mean of its
            # three (one stream moves by ±10% with the machine's other load).
            server = start_server_process(url, tmp, env={"CURVECAST_WORKER_ENABLED": "false"})
            measured: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            try:
                for base64_columns in (True, False) * 3:
                    measured[base64_columns].append(cpu_per_point(
                        server.url, server.proc.pid, 4, 26 if args.quick else 76,
                        base64_columns))
            finally:
                server.stop()
            means = {enc: (statistics.mean(s for s, _ in runs),
                           statistics.mean(p for _, p in runs))
                     for enc, runs in measured.items()}
            for enc, label in ((False, "JSON arrays (baseline)"),
                               (True, "base64 columns (the hook's)")):
                service_us, pg_us = means[enc]
                cpu_rows.append([name, label, f"{service_us:.2f}",
                                 f"{service_us / means[False][0]:.2f}",
                                 f"{pg_us:.2f}" if name == "postgres" else "(in the service)"])
                print(f"{name} {label} CPU per point: service {service_us:.2f} µs, "
                      f"PostgreSQL {pg_us:.2f} µs", flush=True)
    finally:
        drop_pg_database(pg_url)

    body = (
        f"One `curvecast serve` process (1 uvicorn worker) per backend; batches of "
        f"{batch_steps:,} steps × {len(KEYS)} keys, pre-encoded JSON, {total_per_config:,} "
        "points per row, each writer its own run. Baseline, same run: binary `COPY` into the "
        f"same table, psycopg `write_row` per point **{copy_rate:,.0f} points/s**, one "
        f"pre-encoded buffer **{fast_copy:,.0f} points/s**.\n\n"
        + markdown_table(
            ["backend", "writers", "points/s over HTTP", "vs COPY write_row",
             "vs COPY pre-encoded"], rows)
        + "\n\nService CPU per point stored (process CPU of the service, and of the PostgreSQL "
        f"cluster, over the stream), batches as the hook encodes them ({HOOK_STEPS} steps × "
        f"{len(HOOK_KEYS)} keys with wall times): base64 columns against plain JSON arrays, "
        "alternating on one server (worker off), 4 writers × "
        f"{75 * HOOK_STEPS * len(HOOK_KEYS):,} points, three streams each:\n\n"
        + markdown_table(["backend", "body", "service µs/point", "vs JSON arrays",
                          "PostgreSQL µs/point"], cpu_rows)
        + "\n\nBytes per stored point (points table, primary key and rollups; SQLite: the "
        "whole file when `dbstat` is missing): "
        + ", ".join(f"{k} {v:.0f}" for k, v in sorted(storage.items()))
        + f" (MLflow ≈ 250). One {big_series:,}-point series read downsampled to 2,000 "
        f"buckets over HTTP, {repeats} repeats: median "
        + ", ".join(f"{r[2]} ms ({r[0]}; max {r[3]})" for r in read_rows)
        + " (goal ≤ 300 ms; MLflow 3.2 s)."
    )
    single = {row[0]: row[4] for row in rows if row[1] == 1}
    hook = [row[3] for row in cpu_rows if row[1].startswith("base64")]
    result = (f"HTTP ingest by one writer {single.get('sqlite')} (SQLite) and "
              f"{single.get('postgres')} (PostgreSQL) of a raw binary `COPY`; the hook's "
              f"bodies {' and '.join(hook)}× the service CPU of JSON arrays")
    return publish(args, "ingest", "Ingest, storage and downsampled reads", body, result)
