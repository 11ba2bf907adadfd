"""The `make demo` run itself: its training time, its eval curve and its forecast.

How long its training takes here, and whether its eval curve is smooth after the averaging
starts (``c_warmup``). Run from the repository root (about 3 minutes)::

    python -m bench run demo_run

Runs ``curvecast demo --exit-when-done`` exactly as ``make demo`` does (the default size and
steps) into a temporary directory, then reads the run back from the demo's SQLite file:

* **training time**: wall time between the first and the last stored training-loss point,
  compared with the 3-minute goal, and with the time of the whole command;
* **smoothness**: the eval loss at x after ``c_warmup``; a *rise* is the eval loss above the
  lowest value seen before it. Two noises to hold it against: the **sampling noise** of the
  eval estimate -- how far the mean over the demo's 4 held-out batches would move for other
  batches, ``sd / sqrt(4)`` with ``sd`` the batch-to-batch scatter of the training loss (each
  step's loss is one fresh batch of the same size) around its running median, after
  ``c_warmup`` -- and the **jitter** of the eval series itself (second differences, see
  ``smoothness``), which is far smaller because every evaluation uses the same 4 batches. The
  goal: no rise larger than the sampling noise.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._cli import parser, publish
from bench._paths import REPO
from bench._report import markdown_table
from curvecast.contract import EVAL_LOSS_KEYS, TRAIN_LOSS_KEY

GOAL_SECONDS = 180.0
EVAL_BATCHES = 4  # examples/train_charlm.py evaluates on 4 fixed held-out batches


def series(conn: sqlite3.Connection, run_hex: str, key: str) -> list[tuple[int, float, float]]:
    """``(step, value, wall_time)`` of one key of one run, in step order."""
    return conn.execute(
        "SELECT p.step, p.value, p.wall_time FROM metric_points p JOIN series s "
        "ON s.id = p.series_id WHERE s.run_id = ? AND s.key = ? ORDER BY p.step",
        (run_hex, key),
    ).fetchall()


def smoothness(points: list[tuple[int, float]]) -> tuple[float, float, int]:
    """``(largest rise, noise, step of the largest rise)`` of an eval curve (see the docstring).

    The noise is robust to the curve's own trend: the second difference
    ``v[i] - (v[i-1] + v[i+1]) / 2`` of a smooth curve is nearly zero, and of independent noise
    of standard deviation ``s`` it has standard deviation ``s * sqrt(1.5)``; its median absolute
    value (times 1.4826, the normal MAD factor) estimates that.
    """
    values = [v for _, v in points]
    second = [b - (a + c) / 2 for a, b, c in zip(values, values[1:], values[2:], strict=False)]
    noise = 1.4826 * statistics.median(abs(x) for x in second) / 1.5**0.5
    worst, worst_step, lowest = 0.0, points[0][0], values[0]
    for step, value in points[1:]:
        if value - lowest > worst:
            worst, worst_step = value - lowest, step
        lowest = min(lowest, value)
    return worst, noise, worst_step


def _rise_length(points: list[tuple[int, float]], peak_step: int) -> int:
    """Steps from the last low before ``peak_step`` until the curve is back below that low."""
    low_step, low = points[0]
    for step, value in points:
        if step >= peak_step:
            break
        if value <= low:
            low_step, low = step, value
    back = next((s for s, v in points if s > peak_step and v <= low), points[-1][0])
    return back - low_step


def sampling_noise(train: list[tuple[int, float]], after: int, window: int = 10) -> float:
    """Standard error of a mean over ``EVAL_BATCHES`` batches, from the training loss's
    batch-to-batch scatter after step ``after`` (residuals from a running median, robust SD)."""
    values = [v for s, v in train if s > after]
    residuals = [
        v - statistics.median(values[max(0, i - window) : i + window + 1])
        for i, v in enumerate(values)
    ]
    sd = 1.4826 * statistics.median(abs(r) for r in residuals)
    return sd / EVAL_BATCHES**0.5


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, quick="the tiny model for 200 steps").parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="curvecast-demo-bench-") as tmp:
        with socket.socket() as sock:  # a free port (the demo would move off a taken one)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cmd = [sys.executable, "-m", "curvecast.service.cli", "demo", "--exit-when-done",
               "--dir", tmp, "--port", str(port)]
        if args.quick:
            cmd += ["--size", "tiny", "--steps", "200"]
        env = {**os.environ, "CURVECAST_SPOOL_DIR": str(Path(tmp) / "spool")}
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env,
                              timeout=1800)
        total = time.perf_counter() - t0
        print(proc.stdout[-3000:])
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
        match = re.search(r"/runs/([0-9a-f-]{36})", proc.stdout)
        assert match, "the demo did not print its run's URL"
        run_hex = match.group(1).replace("-", "")
        with sqlite3.connect(Path(tmp) / "curvecast.db") as conn:
            (config_text,) = conn.execute("SELECT config FROM runs WHERE id = ?",
                                          (run_hex,)).fetchone()
            train = series(conn, run_hex, TRAIN_LOSS_KEY)
            evals = series(conn, run_hex, EVAL_LOSS_KEYS[0])
    # The demo's own verdict on its forecast from 20% of the run (its 90% interval must hold
    # the final eval loss), as its closing summary prints it.
    quoted = list(re.finditer(r"forecast made at step (\d+) \((\d+)% of the run, status "
                              r"(\w+)\): (\S+) \[(\S+), (\S+)\]\n\s+error ([+-][\d.]+)%; "
                              r"the loss reached is (inside|outside)", proc.stdout))
    verdict = quoted[0] if quoted else None
    # The summary's second quote, when there is one, is the first forecast with status ok.
    first_ok = next((m for m in quoted if m[3] == "ok"), None)
    config = json.loads(config_text)
    c_warmup = int(config.get("c_warmup") or 0)
    training_seconds = train[-1][2] - train[0][2]
    after = [(s, v) for s, v, _ in evals if s > c_warmup]
    rise, jitter, rise_step = smoothness(after)
    noise = sampling_noise([(st, v) for st, v, _ in train], c_warmup)
    optimizer = config.get("optimizer", {})
    rows = [[
        len(train), f"{training_seconds:.0f}", f"{total:.0f}", c_warmup,
        f"{evals[0][1]:.3f} -> {evals[-1][1]:.3f}", f"{rise:.3f} @ {rise_step}",
        f"{noise:.3f} ({rise / noise:.1f}x)", f"{jitter:.4f} ({rise / jitter:.0f}x)",
    ]]
    body = (
        f"`make demo`'s run (`curvecast demo`, {'tiny' if args.quick else 'default'} size: "
        f"d_model {config.get('d_model')}, "
        f"{config.get('layers')} layers, batch {config.get('batch_size')}; ScheduleFreePlus "
        f"{json.dumps({k: optimizer.get(k) for k in ('weight_decay', 'warmup_steps', 'sf_beta')})}"
        f"), on this machine's {os.cpu_count()} cores with the service beside it. Goals: "
        f"training ≤ {GOAL_SECONDS:.0f} s; after c_warmup the eval loss at x rises by no more "
        "than its sampling noise (beside it, the rise against the jitter of the fixed-batch "
        f"eval series: the curve turns up by {100 * rise / evals[-1][1]:.1f}% of the final "
        f"loss for about {_rise_length(after, rise_step)} steps); the 90% interval of the "
        "forecast at 20% of the run holds the final eval loss. "
        + (f"The forecast at step {verdict[1]} ({verdict[2]}%, status `{verdict[3]}`): "
           f"{verdict[4]} [{verdict[5]}, {verdict[6]}] against {evals[-1][1]:.3f} reached "
           f"(error {verdict[7]}%). " if verdict else "The summary quoted no forecast at 20%. ")
        + (f"The first with status `ok`, at step {first_ok[1]} ({first_ok[2]}%): "
           f"{first_ok[4]} [{first_ok[5]}, {first_ok[6]}] (error {first_ok[7]}%, "
           f"{first_ok[8]} its interval)." if first_ok else "No forecast reached `ok`.")
        + "\n\n"
        + markdown_table(
            ["steps", "training s", "whole command s", "c_warmup", "eval loss first -> last",
             "largest rise after c_warmup @ step", "sampling noise (rise / it)",
             "series jitter (rise / it)"],
            rows,
        )
    )
    held = verdict is not None and verdict[8] == "inside"
    result = (f"training {training_seconds:.0f} s (goal ≤ {GOAL_SECONDS:.0f} s: "
              f"{'met' if training_seconds <= GOAL_SECONDS else 'missed'}); the eval loss's "
              f"largest rise after c_warmup {rise / noise:.1f}× its sampling noise (goal ≤ 1: "
              f"{'met' if rise <= noise else 'missed'}); the forecast at 20% held the final "
              f"loss: {'met' if held else 'missed'}")
    return publish(args, "demo_run", "The demo run", body, result)
