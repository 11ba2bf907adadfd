"""Reads of several series at once, as a run page asks for them: statements and CPU per read.

A page's live poll asks every 2 s for the points after its cursor of a dozen keys (each series
read raw); a page that opens asks the same keys at 2,000 buckets each. ``store.metric_reads.
read_series`` answers such a read with one statement for every series' bounds and one for the
points of every series read raw; on PostgreSQL a series' buckets (when they are narrower than a
rollup block, as here) come back as five binary columns read with numpy. The baseline, measured
in the same run on the same database, is the way it read them before: one series at a time, two
statements for its bounds, one for its points or its buckets, the buckets as 2,000 row tuples.

Measured in this process, on the calling thread's CPU clock, alternating the two in blocks of
reads; PostgreSQL's own CPU is not counted (it serves both alike).

Usage: ``python -m bench run read_series [--sqlite] [--reads N] [--no-write]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.orm import Session

from bench._cli import parser, publish
from bench._db import fresh_database
from bench._report import markdown_table, phase
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.schemas import MetricBatch, MetricsOut, RunCreate, SeriesOut
from curvecast.service.store import metric_reads
from curvecast.service.store import metrics as metric_store
from curvecast.service.store import runs as run_store
from curvecast.service.store.rollups import choose_level

KEYS = [f"metric_{i:02d}" for i in range(12)]
STEPS = 20_000
MAX_POINTS = 2000
LAG = 64  # dashboards/static/run.js re-asks this many steps back

_RANGE = "series_id = :sid AND step >= :lo AND step <= :hi"
_FIRST = text(f"SELECT min(step) FROM metric_points WHERE {_RANGE}")
_LAST = text(f"SELECT max(step) FROM metric_points WHERE {_RANGE}")
#: The store's raw-point buckets as row tuples (the store reads them as binary columns).
_BUCKETS = text(metric_reads._BUCKET_ROWS + " ORDER BY agg.last_step")


def _row_buckets(session: Session, sid: int, key: str, lo: int, hi: int, max_points: int
                 ) -> SeriesOut:
    """The baseline's buckets: the raw-point aggregate as row tuples, then Python lists."""
    rows = session.execute(_BUCKETS, {
        "sid": sid, "lo": lo, "hi": hi, "nb": max_points, "span": hi - lo + 1}).all()
    steps, last, vmin, vmax, count = zip(*rows, strict=True)
    floats = metric_reads._floats
    return SeriesOut(key=key, total_points=sum(count), downsampled=True, steps=list(steps),
                     values=floats(last), min=floats(vmin), max=floats(vmax), count=list(count))


def one_at_a_time(session: Session, run_id: uuid.UUID, keys: list[str], start: int,
                  max_points: int) -> MetricsOut:
    """The baseline: each series' bounds in two statements, then its points or buckets, one by
    one (this run's spans need no rollup, and every bucketed series here is dense)."""
    found = dict(session.execute(text("SELECT key, id FROM series WHERE run_id = :run"),
                                 {"run": run_id if session.get_bind().dialect.name ==
                                  "postgresql" else run_id.hex}).all())
    series = []
    for key in keys:
        sid = found[key]
        params = {"sid": sid, "lo": start, "hi": 2**62}
        lo = session.execute(_FIRST, params).scalar()
        hi = int(session.execute(_LAST, params).scalar_one())
        if hi - lo + 1 <= max_points:
            series.append(metric_reads._read_all(session, sid, key, lo, hi))
        else:
            assert choose_level(hi - lo + 1, max_points) is None
            series.append(_row_buckets(session, sid, key, lo, hi, max_points))
    return MetricsOut(run_id=run_id, series=series)


def together(session: Session, run_id: uuid.UUID, keys: list[str], start: int,
             max_points: int) -> MetricsOut:
    """What the service does (``read_series``)."""
    return metric_reads.read_series(session, run_id=run_id, keys=keys, start=start, end=None,
                                    max_points=max_points, allowed_project=None)


def run(args: argparse.Namespace) -> dict[str, Any]:
    backend = "sqlite" if args.sqlite else "postgres"
    with tempfile.TemporaryDirectory() as tmp, fresh_database(backend, Path(tmp)) as url:
        engine = make_engine(Settings(database_url=url))
        factory = make_sessionmaker(engine)
        run_id = uuid.uuid4()
        with phase("read_series", f"a run of {len(KEYS)} keys x {STEPS:,} steps", 1, 2), \
                session_scope(factory) as s:
            run_store.create_or_get_run(s, run_id=run_id, run_in=RunCreate(project="bench"),
                                        allowed_project=None)
            for lo in range(0, STEPS, 5000):
                steps = list(range(lo, lo + 5000))
                metric_store.ingest_batch(s, run_id=run_id, batch=MetricBatch(
                    steps=steps, wall_time=[1.7e9 + t / 100 for t in steps],
                    values={k: [i + 1 / (t + 1) for t in steps] for i, k in enumerate(KEYS)}),
                    allowed_project=None)
        statements = [0]

        @event.listens_for(engine, "before_cursor_execute")
        def _count(_c: object, _cur: object, statement: str, *_a: object) -> None:
            statements[0] += statement != "BEGIN"


        cases = {"live poll (last 64 steps, raw)": STEPS - LAG,
                 "page opened (2,000 buckets each)": 0}
        results: dict[tuple[str, str], dict[str, float]] = {}
        readers: dict[str, Callable[..., MetricsOut]] = {"one series at a time (before)":
                                                         one_at_a_time, "together": together}
        with phase("read_series", f"{args.reads} reads of each kind, alternating", 2, 2):
            for case, start in cases.items():
                expected = None
                cpu: dict[str, list[float]] = {name: [] for name in readers}
                count: dict[str, int] = {}
                for block in range(args.reads // 10):
                    for name, reader in readers.items():
                        statements[0] = 0
                        t0 = time.thread_time()
                        for _ in range(10):
                            with session_scope(factory) as s:
                                out = reader(s, run_id, KEYS, start, MAX_POINTS)
                        cpu[name].append((time.thread_time() - t0) / 10)
                        count[name] = statements[0] // 10
                        if block == 0:  # both answer the same
                            dump = out.model_dump(mode="json")
                            assert expected is None or dump == expected, case
                            expected = dump
                for name in readers:
                    results[case, name] = {"cpu_ms": statistics.median(cpu[name]) * 1e3,
                                           "statements": count[name]}
        engine.dispose()
    return {"backend": backend, "results": results, "cases": list(cases),
            "readers": list(readers), "reads": args.reads}


def summarise(out: dict[str, Any]) -> tuple[str, str]:
    """The section's body and its one-line result."""
    rows = []
    for case in out["cases"]:
        base = out["results"][case, out["readers"][0]]
        for name in out["readers"]:
            r = out["results"][case, name]
            rows.append([case, name, r["statements"], f"{r['cpu_ms']:.2f}",
                         f"{r['cpu_ms'] / base['cpu_ms']:.2f}"])
    table = markdown_table(["read", "how", "statements", "CPU ms per read (median)",
                            "vs one at a time"], rows)
    body = f"""One run of {len(KEYS)} keys × {STEPS:,} steps on {out['backend']}; each read asks
all {len(KEYS)} keys with `max_points={MAX_POINTS}`, {out['reads']} reads of each kind in blocks of
10, the two ways alternating (the same answer, checked). CPU of the reading thread (SQLAlchemy,
the driver, building the answer), not the database's; the statements the read sends.

{table}"""
    together = [row for row in rows if row[1] == out["readers"][1]]
    result = ("reading a page's series together costs "
              + ", ".join(f"{row[4]}× ({row[0].split(' (')[0]})" for row in together)
              + " the CPU of one series at a time")
    return body, result


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--sqlite", action="store_true", help="SQLite instead of PostgreSQL")
    cli.add_argument("--reads", type=int, default=200)
    args = cli.parse_args(argv)
    out = run(args)
    body, result = summarise(out)
    name = "read_series" + ("-sqlite" if args.sqlite else "")
    return publish(args, name, f"Reading a page's series at once, {out['backend']}", body,
                   result)
