"""The background worker's cost per round: refits and alert evaluations of growing runs.

``bench/service/load.py`` measures the service whole, and on this shared 2-core machine its CPU per
point moves by more from run to run than a change to the worker is worth. This bench isolates
the worker: 32 runs of the synthetic ScheduleFree+ run (the loss and every telemetry key the
hook streams, norms every 10 steps) get a history of ``--history`` steps, then in each round
``--round-steps`` more steps (5 s of a run logging 100 steps a second) are ingested and the
worker's two data tasks run until nothing is due: ``refit_due_runs`` (every run refitted) and
``evaluate_alerts`` (every run judged). The refit and alert throttles are set to 0 so every
round refits and judges every run without waiting.

Measured per round, on the calling thread's CPU clock (the worker's tasks run in it): refit
CPU, alert CPU, and the SQL statements SQLAlchemy sent (raw DB-API reads of points not
counted); PostgreSQL's CPU over the rounds from its processes' CPU times. Baseline, same run:
storing points the raw way (``bench.load``'s storage baseline: one binary ``COPY``, or one
SQLite ``executemany``), per point; the worker's CPU per ingested point is compared with it.

Usage: ``python -m bench run worker_rounds [--sqlite] [--rounds N] [--quick] [--no-write]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from bench._cli import parser, publish
from bench._db import fresh_database
from bench._report import markdown_table, phase
from bench.service.load import postgres_cpu_seconds, storage_baseline
from curvecast.contract import TELEMETRY_PREFIX
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker
from curvecast.service.worker.alerts import evaluate_alerts
from curvecast.service.worker.refit import refit_due_runs
from tests.support import thread_server
from tests.support.synthetic import batch, create_run

RUNS = 32
TOTAL_STEPS = 20_000
PREFIX = TELEMETRY_PREFIX  # what the client hook writes


def _drain(task: Any, sessions: Any, settings: Settings) -> int:
    """Run ``task`` until it finds nothing due; returns the jobs it handled."""
    done = 0
    while n := task(sessions, settings):
        done += n
    return done


def run(args: argparse.Namespace) -> dict[str, Any]:
    backend = "sqlite" if args.sqlite else "postgres"
    with tempfile.TemporaryDirectory() as tmp, fresh_database(backend, Path(tmp)) as url:
        settings = Settings(database_url=url, worker_enabled=False, refit_min_interval_s=0,
                            alert_eval_min_interval_s=0)
        engine = make_engine(settings)
        sessions = make_sessionmaker(engine)
        statements = [0]  # sent through SQLAlchemy since the round began

        @sa.event.listens_for(engine, "before_cursor_execute")
        def _count(*_: Any) -> None:
            statements[0] += 1

        run_ids = [uuid.uuid4() for _ in range(RUNS)]
        rounds: list[dict[str, float]] = []
        points = 0
        with thread_server(settings) as base, httpx.Client(base_url=base, timeout=120) as client:

            def ingest(lo: int, hi: int) -> int:
                n = 0
                for i, run_id in enumerate(run_ids):
                    body = batch(lo, hi, total_steps=TOTAL_STEPS, seed=i, prefix=PREFIX)
                    client.post(f"/api/v1/runs/{run_id}/metrics", json=body).raise_for_status()
                    n += sum(v is not None for col in body["values"].values() for v in col)
                return n

            with phase("worker_rounds", f"{RUNS} runs: {args.history} steps of history", 1, 3):
                for run_id in run_ids:
                    create_run(client, run_id, "bench", total_steps=TOTAL_STEPS)
                ingest(0, args.history)
                _drain(refit_due_runs, sessions, settings)
                _drain(evaluate_alerts, sessions, settings)
            with phase("worker_rounds", f"{args.rounds} rounds of {args.round_steps} steps", 2, 3):
                for r in range(args.rounds):
                    lo = args.history + r * args.round_steps
                    new_points = ingest(lo, lo + args.round_steps)
                    points += new_points
                    statements[0] = 0
                    pg0, c0 = postgres_cpu_seconds(), time.thread_time()
                    refits = _drain(refit_due_runs, sessions, settings)
                    c1 = time.thread_time()
                    judged = _drain(evaluate_alerts, sessions, settings)
                    c2, pg1 = time.thread_time(), postgres_cpu_seconds()
                    rounds.append({"refit": c1 - c0, "alerts": c2 - c1, "postgres": pg1 - pg0,
                                   "refits": refits, "judged": judged, "points": new_points,
                                   "statements": statements[0]})
        engine.dispose()
        with phase("worker_rounds", "storage baseline", 3, 3):
            raw_us = storage_baseline(url, backend)
    return {"backend": backend, "rounds": rounds, "raw_us": raw_us, "args": vars(args)}


def summarise(out: dict[str, Any]) -> tuple[str, str]:
    """The section's body and its one-line result."""
    rounds, raw_us = out["rounds"], out["raw_us"]
    args = out["args"]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    per_run = 1000 / RUNS
    points = med("points")
    refit, alerts, pg = med("refit"), med("alerts"), med("postgres")
    worker_us = (refit + alerts) * 1e6 / points
    raw = "binary `COPY`" if out["backend"] == "postgres" else "one `executemany` INSERT"
    rows = [
        ["refits (`refit_due_runs`)", f"{refit * per_run:.1f}", f"{refit * 1e6 / points:.2f}"],
        ["alert evaluations (`evaluate_alerts`)", f"{alerts * per_run:.1f}",
         f"{alerts * 1e6 / points:.2f}"],
        ["**worker, both**", f"**{(refit + alerts) * per_run:.1f}**", f"**{worker_us:.2f}**"],
        [f"{out['backend']}: PostgreSQL processes" if out["backend"] == "postgres"
         else "(SQLite: in the worker's own CPU)",
         f"{pg * per_run:.1f}" if out["backend"] == "postgres" else "",
         f"{pg * 1e6 / points:.2f}" if out["backend"] == "postgres" else ""],
        [f"baseline, same run: storing points the raw way ({raw})", "",
         f"{raw_us:.2f}"],
    ]
    table = markdown_table(["CPU (median of rounds)", "ms per run per round", "µs per new point"],
                           rows)
    judged = statistics.median(r["judged"] for r in rounds)
    refits = statistics.median(r["refits"] for r in rounds)
    body = f"""{RUNS} runs on {out['backend']}, each with {args['history']:,} steps of history,
then {args['rounds']} rounds of {args['round_steps']} new steps per run ({points:,.0f} points a
round: the loss and every `{PREFIX}` key, norms every 10 steps). Each round: {refits:.0f} refits and
{judged:.0f} alert evaluations (both throttles at 0, as if 5 s had passed),
{med('statements') / RUNS:.1f} SQL statements per run through SQLAlchemy (raw reads of points not
counted). In the service a run gets a round at most every 5 s
(`CURVECAST_REFIT_MIN_INTERVAL_S`, `CURVECAST_ALERT_EVAL_MIN_INTERVAL_S`).

{table}"""
    result = (f"the worker {(refit + alerts) * per_run:.1f} ms of CPU per run and round, "
              f"{worker_us:.2f} µs per new point: {worker_us / raw_us:.1f}× the raw write of a "
              "point")
    return body, result


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, quick="2 rounds")
    cli.add_argument("--sqlite", action="store_true", help="SQLite instead of PostgreSQL")
    cli.add_argument("--history", type=int, default=3000)
    cli.add_argument("--rounds", type=int, default=8)
    cli.add_argument("--round-steps", type=int, default=500)
    args = cli.parse_args(argv)
    if args.quick:
        args.rounds = 2
    out = run(args)
    body, result = summarise(out)
    name = "worker_rounds" + ("_sqlite" if args.sqlite else "")
    return publish(args, name, f"Worker rounds: refits and alert evaluations on "
                               f"{out['backend']}", body, result)
