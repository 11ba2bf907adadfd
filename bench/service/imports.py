"""Import throughput from TensorBoard, MLflow and W&B against the service's own ingest.

``curvecast import`` from TensorBoard into PostgreSQL against the service's own ingest of the
same points in the same run; MLflow and W&B; memory against run size; the CPU a ``/metrics``
scrape costs the service under ingest load.

1. A TensorBoard run of ``--points`` scalars (4 tags logged at every step, one event per
   scalar as ``torch.utils.tensorboard`` writes them; the files are written directly with
   tensorboard's ``Event`` message to save the minutes torch's writer takes).
2. ``curvecast import tensorboard`` into a fresh PostgreSQL database, in a child process
   (interpreter start and imports excluded): wall-clock points/s, its CPU and PostgreSQL's
   (the whole cluster's, shared with whatever else runs) per point, and its peak memory above
   what it held before reading. Then the same import with each of its speed tricks undone
   (:data:`TRICKS`), for what each one earns.
3. The baseline: the same points sent to ``curvecast serve`` (one process, worker off, fresh
   database) as the client hook sends them (50,000-point batches of base64 columns, one
   writer), the service's own ingest path. Ratio: import / ingest, wall-clock.
4. Memory against run size: the import of a run 4x smaller, same batch: the peak should not
   grow with the run.
5. MLflow (a local ``mlruns`` store) and W&B (a JSON-lines history) of ``--other-points``
   points: points/s (what their client libraries allow).
6. ``/metrics`` after step 3's load: one scrape's service CPU (100 scrapes back to back, every
   label series of the load existing). Its share of the service's CPU under load is
   ``bench/service/load.py``'s.

Usage: ``python -m bench run imports [--points 1000000] [--other-points 100000] [--quick]``
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from bench._cli import parser, publish
from bench._db import fresh_database
from bench._procs import cpu_seconds, process_tree
from bench._report import markdown_table, phase

TAGS = ("train/loss", "eval/loss", "opt/lr", "grad_norm")
WALL0 = 1_700_000_000.0
BATCH = 50_000


# --- data ------------------------------------------------------------------------------------


def write_event_file(directory: Path, steps: int) -> None:
    """An event file of ``steps`` x 4 scalars, one ``Event`` per scalar (torch's layout)."""
    import google_crc32c
    from tensorboard.compat.proto import event_pb2, summary_pb2

    def masked(data: bytes) -> int:
        crc = int(google_crc32c.value(data))
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.01, steps)
    with (directory / "events.out.tfevents.1700000000.bench.1.0").open("wb") as f:
        def record(event: Any) -> None:
            data = event.SerializeToString()
            header = struct.pack("<Q", len(data))
            f.write(header + struct.pack("<I", masked(header)) + data
                    + struct.pack("<I", masked(data)))

        record(event_pb2.Event(wall_time=WALL0, file_version="brain.Event:2"))
        for step in range(steps):
            loss = 3.0 / np.sqrt(step + 1) + 1.0 + noise[step]
            for tag, value in zip(TAGS, (loss, loss + 0.1, 1e-3, 1.0 + noise[step]),
                                  strict=True):
                record(event_pb2.Event(
                    wall_time=WALL0 + step * 0.1, step=step,
                    summary=summary_pb2.Summary(value=[
                        summary_pb2.Summary.Value(tag=tag, simple_value=float(value))])))


def write_mlruns(path: Path, points: int) -> None:
    """A local MLflow store with one run of ``points`` points over the four keys."""
    code = ("import sys, time\n"
            "from mlflow import MlflowClient\n"
            "from mlflow.entities import Metric\n"
            "client = MlflowClient(sys.argv[1])\n"
            "run = client.create_run(client.create_experiment('bench'))\n"
            "steps, now = int(sys.argv[2]) // 4, int(time.time() * 1000)\n"
            "for start in range(0, steps, 250):\n"
            "    client.log_batch(run.info.run_id, metrics=[\n"
            "        Metric(k, 1.0 / (s + 1), now + s, s)\n"
            "        for s in range(start, min(start + 250, steps))\n"
            "        for k in ('train_loss', 'eval_loss', 'lr', 'grad_norm')])\n")
    subprocess.run([sys.executable, "-c", code, path.resolve().as_uri(), str(points)],
                   check=True, env={**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"})


def write_wandb(path: Path, points: int) -> None:
    """A W&B history of ``points`` points: 4 metrics per row, JSON lines."""
    rows = points // 4
    with path.open("w") as f:
        for step in range(rows):
            f.write(json.dumps({"_step": step, "_runtime": step * 0.1,
                                "_timestamp": WALL0 + step * 0.1, "train/loss": 1.0 / (step + 1),
                                "eval/loss": 1.1 / (step + 1), "lr": 1e-3,
                                "grad_norm": 1.0}) + "\n")


# --- PostgreSQL's share --------------------------------------------------------------------


class Backends:
    """CPU seconds of the PostgreSQL backends serving one database (their command line names
    it), sampled every 0.2 s while a measurement runs: the cluster as a whole is shared with
    other jobs, and a backend's time must be read before its connection closes."""

    def __init__(self, database_url: str) -> None:
        self.name = database_url.rpartition("/")[2]
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for proc in psutil.process_iter(["name", "cmdline"]):
            if proc.info["name"] not in ("postgres", "postmaster"):
                continue
            if self.name not in " ".join(proc.info["cmdline"] or ()):
                continue
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            self.seen[proc.pid] = times.user + times.system

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def __enter__(self) -> Backends:
        self._sample()
        self.start = dict(self.seen)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def cpu_s(self) -> float:
        """CPU the database's backends used since the start (new backends: all of theirs)."""
        return sum(t - self.start.get(pid, 0.0) for pid, t in self.seen.items())


# --- one import, measured in a process of its own -------------------------------------------


def child(argv: list[str]) -> None:
    """``python -m bench run imports --child ARGS...``: run ``curvecast import ARGS`` and print
    what it cost as JSON (after its libraries are imported)."""
    import mlflow  # noqa: F401  (imported before the clock starts, as the others)
    import pandas  # noqa: F401
    import tensorboard.compat.proto.event_pb2  # noqa: F401
    import tqdm  # noqa: F401

    from curvecast.service import import_cli
    from curvecast.service.store import metrics

    # The two speed tricks, undone one at a time for their baselines (see TRICKS).
    if "switch" in os.environ.get(UNDO, ""):
        import_cli.IMPORT_SWITCH_INTERVAL_S = sys.getswitchinterval()
    if "copy" in os.environ.get(UNDO, ""):
        metrics.COPY_MIN_POINTS = 2**62
    import_main = import_cli.main

    proc = psutil.Process()
    rss_before = proc.memory_info().rss
    wall, cpu = time.perf_counter(), time.process_time()
    status = import_main([*argv, "--no-progress"])
    out = {"status": status, "wall_s": time.perf_counter() - wall,
           "cpu_s": time.process_time() - cpu,
           "peak_above_start_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
                                   - rss_before) / 2**20}
    print("RESULT " + json.dumps(out), flush=True)


#: The child's environment variable naming the speed tricks to undo ("copy", "switch").
UNDO = "CURVECAST_BENCH_UNDO"
#: Each trick of the import path, and the row of the import without it.
TRICKS = {
    "copy": "without COPY (INSERT ... ON CONFLICT, as for small batches)",
    "switch": "with the interpreter's default 5 ms thread switch interval",
}


def measured_import(args: list[str], points: int, undo: str = "") -> dict[str, Any]:
    with Backends(args[args.index("--database-url") + 1]) as backends:
        done = subprocess.run([sys.executable, "-m", "bench", "run", "imports", "--child", *args],
                              capture_output=True, text=True, check=True,
                              env={**os.environ, UNDO: undo})
    pg = backends.cpu_s
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    out: dict[str, Any] = json.loads(line[len("RESULT "):])
    assert out["status"] == 0, done.stderr
    assert f"{points:,} new points" in done.stdout, done.stdout
    out["points_per_s"] = points / out["wall_s"]
    out["cpu_us"] = out["cpu_s"] / points * 1e6
    out["pg_us"] = pg / points * 1e6
    return out


# --- the baseline: the service's own ingest --------------------------------------------------


def _b64(array: np.ndarray) -> str:
    return base64.b64encode(array.tobytes()).decode()


def ingest_bodies(steps: int) -> list[bytes]:
    """The same points as the event file, in the hook's shape: 50,000-point batches of base64
    columns (int64 steps, float64 wall times and values)."""
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.01, steps)
    per = BATCH // len(TAGS)
    bodies = []
    for start in range(0, steps, per):
        s = np.arange(start, min(start + per, steps), dtype=np.int64)
        loss = 3.0 / np.sqrt(s + 1) + 1.0 + noise[s]
        columns = (loss, loss + 0.1, np.full(len(s), 1e-3), 1.0 + noise[s])
        bodies.append(json.dumps({
            "steps": _b64(s), "wall_time": _b64(WALL0 + s * 0.1),
            "values": {tag: _b64(np.asarray(col, dtype=np.float32).astype(np.float64))
                       for tag, col in zip(TAGS, columns, strict=True)},
        }).encode())
    return bodies


def service_ingest(database_url: str, tmp: Path, steps: int) -> dict[str, Any]:
    """Points/s of the service's own ingest of the same points, and the CPU of a /metrics
    scrape once that load's label series exist."""
    from tests.support import start_server_process

    bodies = ingest_bodies(steps)
    points = steps * len(TAGS)
    server = start_server_process(database_url, tmp, env={"CURVECAST_WORKER_ENABLED": "false"},
                                  healthy_within=120)
    try:
        run_id = uuid.uuid4()
        headers = {"content-type": "application/json"}
        with httpx.Client(timeout=300, headers=headers) as client:
            client.put(f"{server.url}/api/v1/runs/{run_id}",
                       json={"project": "bench"}).raise_for_status()
            service = process_tree(server.proc.pid)
            cpu = cpu_seconds(service)
            with Backends(database_url) as backends:
                wall = time.perf_counter()
                for body in bodies:
                    resp = client.post(f"{server.url}/api/v1/runs/{run_id}/metrics",
                                       content=body)
                    assert resp.status_code == 200, resp.text
                wall = time.perf_counter() - wall
                cpu = cpu_seconds(service) - cpu
            pg = backends.cpu_s
            stored = client.get(f"{server.url}/api/v1/runs/{run_id}").json()["n_points"]
            assert stored == points, stored
            # /metrics: the CPU of one scrape, once every label series of the load exists.
            scrapes = 100
            before = cpu_seconds(service)
            started = time.perf_counter()
            for _ in range(scrapes):
                client.get(f"{server.url}/metrics").raise_for_status()
            scrape_wall = time.perf_counter() - started
            scrape_cpu = (cpu_seconds(service) - before) / scrapes
    finally:
        server.stop()
    return {"points_per_s": points / wall, "wall_s": wall, "cpu_us": cpu / points * 1e6,
            "pg_us": pg / points * 1e6, "scrape_cpu_ms": scrape_cpu * 1e3,
            "scrape_ms": scrape_wall / scrapes * 1e3}


# --- the benchmark ---------------------------------------------------------------------------


def run(args: argparse.Namespace) -> tuple[str, str]:
    steps = args.points // len(TAGS)
    small_steps = steps // 4
    with tempfile.TemporaryDirectory(prefix="curvecast-imports-") as tmp_name:
        tmp = Path(tmp_name)
        with phase("imports", f"writing a TensorBoard run of {steps * 4:,} points", 1, 6):
            write_event_file(tmp / "tb" / "big", steps)
            write_event_file(tmp / "tb" / "small", small_steps)
        with phase("imports", "curvecast import tensorboard into PostgreSQL", 2, 6):
            with fresh_database("postgres", tmp) as url:
                big = measured_import(["tensorboard", str(tmp / "tb" / "big"),
                                       "--database-url", url], steps * 4)
            with fresh_database("postgres", tmp) as url:
                small = measured_import(["tensorboard", str(tmp / "tb" / "small"),
                                         "--database-url", url], small_steps * 4)
            undone = {}
            for trick in TRICKS:
                with fresh_database("postgres", tmp) as url:
                    undone[trick] = measured_import(["tensorboard", str(tmp / "tb" / "big"),
                                                     "--database-url", url], steps * 4, trick)
        with phase("imports", "the same points through the service's ingest", 3, 6):
            with fresh_database("postgres", tmp) as url:
                base = service_ingest(url, tmp, steps)
        with phase("imports", f"MLflow and W&B, {args.other_points:,} points each", 4, 6):
            write_mlruns(tmp / "mlruns", args.other_points)
            write_wandb(tmp / "history.jsonl", args.other_points)
            with fresh_database("postgres", tmp) as url:
                mlflow = measured_import(["mlflow", str(tmp / "mlruns"), "--database-url", url],
                                         args.other_points)
            with fresh_database("postgres", tmp) as url:
                wandb = measured_import(["wandb", str(tmp / "history.jsonl"),
                                         "--database-url", url], args.other_points)
    return summarise(args, big, small, base, mlflow, wandb, undone)


def summarise(args: argparse.Namespace, big: dict[str, Any], small: dict[str, Any],
              base: dict[str, Any], mlflow: dict[str, Any], wandb: dict[str, Any],
              undone: dict[str, dict[str, Any]]) -> tuple[str, str]:
    def row(name: str, points: int, m: dict[str, Any], ratio: bool = True) -> list[object]:
        return [name, f"{points:,}", f"{m['points_per_s']:,.0f}",
                f"{m['points_per_s'] / base['points_per_s']:.2f}x" if ratio else "1 (baseline)",
                f"{m['cpu_us']:.2f}", f"{m['pg_us']:.2f}",
                f"{m['peak_above_start_mb']:.0f}" if "peak_above_start_mb" in m else "–"]

    steps = args.points // len(TAGS)
    table = markdown_table(
        ["path", "points", "points/s (wall)", "vs service ingest",
         "importer or service CPU µs/point", "PostgreSQL CPU µs/point",
         "import peak memory above start (MB)"],
        [row("service ingest: POST .../metrics, 50,000-point base64 batches (baseline)",
             steps * 4, base, ratio=False),
         row("curvecast import tensorboard", steps * 4, big),
         *[row(f"curvecast import tensorboard, {TRICKS[t]}", steps * 4, m)
           for t, m in undone.items()],
         row("curvecast import tensorboard, a run 4x smaller", steps, small),
         row("curvecast import mlflow (local mlruns)", args.other_points, mlflow),
         row("curvecast import wandb (JSON lines)", args.other_points, wandb)])
    goal = "met" if big["points_per_s"] >= 100_000 else "NOT met"
    result = (f"TensorBoard into PostgreSQL {big['points_per_s']:,.0f} points/s, "
              f"{big['points_per_s'] / base['points_per_s']:.2f}× the service's own ingest "
              f"(goal ≥ 100,000/s: {goal}); MLflow "
              f"{mlflow['points_per_s'] / base['points_per_s']:.2f}×, W&B "
              f"{wandb['points_per_s'] / base['points_per_s']:.2f}×")
    return (
        f"{table}\n\n"
        f"Goal, >= 100,000 points/s from a local TensorBoard directory into PostgreSQL: {goal} "
        f"({big['points_per_s']:,.0f}/s, {big['points_per_s'] / base['points_per_s']:.2f}x the "
        "service's own ingest of the same points). The import's memory does not grow with the "
        f"run: {big['peak_above_start_mb']:.0f} MB above its start for {steps * 4:,} points, "
        f"{small['peak_above_start_mb']:.0f} MB for a run 4x smaller (batches of 50,000). "
        f"PostgreSQL's own work bounds both paths: {big['pg_us']:.2f} µs of its CPU per point "
        f"imported ({base['pg_us']:.2f} for the service's ingest), at most "
        f"{1e6 / big['pg_us']:,.0f} points/s for a core it had to itself; the importer adds "
        f"{big['cpu_us']:.2f} µs per point of its own. Its two speed tricks, each undone in "
        f"the same run: binary COPY for points past every stored step "
        f"({big['points_per_s'] / undone['copy']['points_per_s']:.2f}x the points/s without "
        f"it) and a 0.5 ms thread switch interval, so the writer thread gets the GIL back "
        f"from the reader's parsing loop sooner "
        f"({big['points_per_s'] / undone['switch']['points_per_s']:.2f}x).\n\n"
        f"`/metrics` of that one-process service after the load: "
        f"{base['scrape_cpu_ms']:.2f} ms of its CPU a scrape ({base['scrape_ms']:.1f} ms "
        "wall); its share of the service's CPU under load is measured by `bench/service/load.py` "
        "(32 clients, `serve --workers 2`, multiprocess mode).\n\n"
        "Method: one child process per import (its interpreter start and library imports not "
        "timed; CPU from `time.process_time`, peak from `ru_maxrss` minus its RSS before "
        "reading), a fresh PostgreSQL database each; the baseline posts the same points to "
        "`curvecast serve` (one process, worker off) from one client, one batch at a time. "
        "PostgreSQL's CPU is that of the backends serving the run's database, sampled every "
        "0.2 s; the machine's cores are shared with whatever else runs on it. "
        f"Load average before the run: {args.load_before[0]:.1f} (1 min)."
    ), result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child(argv[1:])
        return 0
    cli = parser(__doc__, quick="200,000 and 40,000 points")
    cli.add_argument("--points", type=int, default=1_000_000)
    cli.add_argument("--other-points", type=int, default=100_000)
    args = cli.parse_args(argv)
    if args.quick:
        args.points, args.other_points = 200_000, 40_000
    args.load_before = os.getloadavg()
    body, result = run(args)
    return publish(args, "imports", "Import from TensorBoard, MLflow and W&B", body, result)
