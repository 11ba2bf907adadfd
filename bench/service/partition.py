"""``metric_points`` plain vs hash-partitioned on PostgreSQL: ingest, read of one run, delete.

Part 4 of "Cost per point": does declarative partitioning of the points table pay for itself?
One fresh, migrated PostgreSQL database holds three copies of the points table, fed the same
rows in the same order:

- ``plain``: the real ``metric_points`` exactly as the migrations make it (primary key
  ``(series_id, step)``, foreign key to ``series`` with ``ON DELETE CASCADE``). The baseline.
- ``hash(series_id)``: the same columns and keys, ``PARTITION BY HASH (series_id)``. No new
  column and no change to any query: every store statement names one ``series_id`` and is
  pruned to one partition. A series lives in one partition, but a run's series are scattered
  over up to ``min(series, partitions)`` of them: it does not keep a run together.
- ``hash(run_id)``: ``PARTITION BY HASH (run_id)``, which needs a ``run_id`` column in every
  point (a uuid: 16 bytes in the heap and in the primary key, which must contain the partition
  key, so it becomes ``(series_id, step, run_id)``: ``series_id`` first keeps the index the
  ``ON DELETE CASCADE`` from ``series`` and the store's per-series statements use). A run's
  points share one partition; the store's statements would have to name the run to be pruned.

Partitions: ``--partitions`` (16 by default), a power of two so that one partition can later be
split into two of twice the modulus, few enough that a statement the planner cannot prune
(the store's read on ``hash(run_id)`` today) opens only 16 indexes.

Measured, per layout, on the same data (``--runs`` runs × ``--series`` series × ``--steps``
steps, about a quarter of the runs loaded by COPY and the rest by ingest statements):

1. Ingest: the points statement of ``store.metrics._PG_POINTS`` (``INSERT ... SELECT FROM
   unnest(binary arrays) ON CONFLICT DO NOTHING RETURNING``, one transaction per batch of
   ``--batch-steps`` steps × every series of a run, the hook's 100 × 10 by default), batches of
   all ingest runs interleaved round-robin as concurrent runs arrive; and, the baseline in the
   same run, raw binary ``COPY`` of whole runs into the same table. Only the points statement:
   the rollup upsert and ``runs`` update the service runs in the same statement do not depend
   on the layout, so the full ingest's difference is smaller than the one shown.
2. Read of one run: the store's raw read (``read_series`` without ``max_points``): the run's
   series, then per series ``min(step)``, ``max(step)`` and every point in step order.
3. Delete of one run's points: ``store.retention``'s loop (per series, ``DELETE ... WHERE
   (key) IN (SELECT key ... LIMIT 10000)``, each statement its own transaction), half the runs
   with that statement as it is, half with the partition key also named in the outer
   ``DELETE`` (which a partitioned table needs to prune it; see :meth:`Layout.delete_sql`).

Every timed operation is interleaved across layouts (rotating which goes first), so load from
other jobs on the machine falls on all of them alike. DROP or DETACH of a partition is not
measured: a hash partition holds a slice of every run, never one run's points alone.

Usage: ``python -m bench run partition [--quick] [--no-write]`` (about 2 minutes on 2 cores;
``--quick``: seconds, no BENCHMARKS.md)
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from bench._cli import parser, publish
from bench._db import fresh_database
from bench._report import markdown_table, phase, progress
from curvecast.service.store._pgcopy import (
    Float8Array,
    Int4Array,
    Int8Array,
    encode_rows,
    register_array_dumpers,
)
from curvecast.service.store.retention import DELETE_BATCH

BENCH = "partition"

# --- Layouts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """One copy of the points table and how the store's statements address it.

    Attributes:
        name: the label in the tables.
        table: the (parent) table's name.
        by_run: the table has a ``run_id`` column (partitioned by it).
        partitions: how many hash partitions (0: not partitioned).
        ddl: statements creating it (empty: the migrated table itself).
    """

    name: str
    table: str
    by_run: bool
    partitions: int = 0
    ddl: tuple[str, ...] = field(default=())

    # Statements, in the store's shapes (see service.store.metrics and .retention).

    def insert_sql(self) -> str:
        """The points part of ``metrics._PG_POINTS``: one statement per batch."""
        run_col, run_val = ("run_id, ", "%(run)s::uuid, ") if self.by_run else ("", "")
        return (
            f"WITH new AS (INSERT INTO {self.table} ({run_col}series_id, step, value, wall_time)"
            f" SELECT {run_val}p_sid, p_step, NULLIF(p_value, 'NaN'::float8),"
            " NULLIF(p_wall, 'NaN'::float8)"
            " FROM unnest(%(p_sid)b, %(p_step)b, %(p_value)b, %(p_wall)b)"
            " AS p(p_sid, p_step, p_value, p_wall)"
            " ON CONFLICT DO NOTHING RETURNING series_id, step)"
            " SELECT count(*) FROM new"
        )

    def copy_sql(self) -> str:
        """Binary COPY of whole rows (the baseline)."""
        cols = "run_id, series_id, step, value, wall_time" if self.by_run else (
            "series_id, step, value, wall_time")
        return f"COPY {self.table} ({cols}) FROM STDIN (FORMAT BINARY)"

    def _range(self, with_run: bool) -> str:
        run = " AND run_id = %(run)s" if with_run else ""
        return f"series_id = %(sid)s AND step >= %(lo)s AND step <= %(hi)s{run}"

    def read_sql(self, with_run: bool) -> tuple[str, str, str]:
        """A series' first step, last step and points in a range, one statement each (the
        store's per-series reads when this bench was made) on this table; ``with_run`` adds
        ``run_id = :run`` (what lets ``hash(run_id)`` prune)."""
        where = self._range(with_run)
        return (
            f"SELECT min(step) FROM {self.table} WHERE {where}",
            f"SELECT max(step) FROM {self.table} WHERE {where}",
            f"SELECT step, value, wall_time FROM {self.table} WHERE {where} ORDER BY step",
        )

    def delete_sql(self, named: bool) -> str:
        """``retention._delete_in_batches`` for the points of one series: as the store runs it
        (``named=False``), or with the partition key named in the outer ``DELETE`` too (and, by
        run, ``run_id`` in both halves), which lets the planner prune the outer half."""
        where, outer = "series_id = %(sid)s", ""
        if named:
            where += " AND run_id = %(run)s" if self.by_run else ""
            outer = f"{where} AND "
        return (
            f"DELETE FROM {self.table} WHERE {outer}(series_id, step) IN "
            f"(SELECT series_id, step FROM {self.table} WHERE {where} LIMIT %(batch)s)"
        )


def _partitioned_ddl(table: str, by_run: bool, partitions: int) -> tuple[str, ...]:
    if by_run:
        columns = "run_id uuid NOT NULL, "
        key, part = "series_id, step, run_id", "run_id"
    else:
        columns, key, part = "", "series_id, step", "series_id"
    ddl = [
        f"CREATE TABLE {table} ({columns}"
        "series_id integer NOT NULL REFERENCES series (id) ON DELETE CASCADE,"
        " step bigint NOT NULL, value double precision, wall_time double precision,"
        f" CONSTRAINT pk_{table} PRIMARY KEY ({key})) PARTITION BY HASH ({part})"
    ]
    ddl += [
        f"CREATE TABLE {table}_p{r:02d} PARTITION OF {table}"
        f" FOR VALUES WITH (MODULUS {partitions}, REMAINDER {r})"
        for r in range(partitions)
    ]
    return tuple(ddl)


def layouts(partitions: int) -> list[Layout]:
    """The three copies: plain (the migrated table), by series hash, by run hash."""
    return [
        Layout("plain", "metric_points", by_run=False),
        Layout(f"hash(series_id) ×{partitions}", "mp_by_series", by_run=False,
               partitions=partitions, ddl=_partitioned_ddl("mp_by_series", False, partitions)),
        Layout(f"hash(run_id) ×{partitions}", "mp_by_run", by_run=True,
               partitions=partitions, ddl=_partitioned_ddl("mp_by_run", True, partitions)),
    ]


# --- Data ---------------------------------------------------------------------------------------


@dataclass
class RunData:
    """One run's series ids and its points as parallel arrays in (series, step) order."""

    run_id: uuid.UUID
    series_ids: list[int]
    steps: int

    def columns(self, lo: int, hi: int) -> tuple[np.ndarray, ...]:
        """(series_id, step, value, wall) of steps ``[lo, hi)`` of every series."""
        n = hi - lo
        step = np.arange(lo, hi, dtype=np.int64)
        sid = np.repeat(np.array(self.series_ids, dtype=np.int64), n)
        steps = np.tile(step, len(self.series_ids))
        rng = np.random.default_rng((self.run_id.int + lo) % 2**63)
        value = 2 + 1 / np.sqrt(steps + 10) + rng.normal(0, 0.01, len(steps))
        wall = 1.7e9 + steps * 0.01
        return sid, steps, value, wall


def create_runs(conn: psycopg.Connection[Any], n_runs: int, n_series: int,
                steps: int) -> list[RunData]:
    """Project, runs and series rows (shared by every layout)."""
    conn.execute("INSERT INTO projects (name, created_at) VALUES ('partition', now())")
    runs = []
    for i in range(n_runs):
        run_id = uuid.uuid4()
        conn.execute(
            "INSERT INTO runs (id, project_id, name, config, status, created_at, updated_at,"
            " n_points) SELECT %s, id, %s, '{}', 'running', now(), now(), 0 FROM projects"
            " WHERE name = 'partition'", (run_id, f"run-{i}"))
        rows = conn.execute(
            "INSERT INTO series (run_id, key) SELECT %s, 'metric_' || k"
            " FROM generate_series(0, %s) AS k RETURNING id", (run_id, n_series - 1)).fetchall()
        runs.append(RunData(run_id, sorted(int(r[0]) for r in rows), steps))
    conn.commit()
    return runs


# --- Measurements -------------------------------------------------------------------------------


def rotated(items: list[Layout], turn: int) -> list[Layout]:
    """``items`` starting at ``turn`` (mod len): who goes first changes every round."""
    k = turn % len(items)
    return items[k:] + items[:k]


def copy_run(conn: psycopg.Connection[Any], layout: Layout, run: RunData) -> float:
    """Seconds to COPY a whole run (one transaction); the payload is built before timing."""
    sid, step, value, wall = run.columns(0, run.steps)
    payload = (_encode_with_run(run.run_id, sid, step, value, wall) if layout.by_run
               else encode_rows(sid, step, value, wall))
    start = time.perf_counter()
    with conn.cursor() as cur, cur.copy(layout.copy_sql()) as copy:
        copy.write(payload)
    conn.commit()
    return time.perf_counter() - start


def _encode_with_run(run_id: uuid.UUID, sid: np.ndarray, step: np.ndarray, value: np.ndarray,
                     wall: np.ndarray) -> bytes:
    """Binary COPY payload of (run_id, series_id, step, value, wall_time) rows without NULLs
    (what the bench generates), packed by numpy like ``_pgcopy.encode_rows``."""
    rec = np.empty(len(step), dtype=[
        ("nfields", ">i2"), ("run_len", ">i4"), ("run", "S16"), ("sid_len", ">i4"),
        ("sid", ">i4"), ("step_len", ">i4"), ("step", ">i8"), ("value_len", ">i4"),
        ("value", ">f8"), ("wall_len", ">i4"), ("wall", ">f8"),
    ])  # fmt: skip
    rec["nfields"], rec["run_len"], rec["run"] = 5, 16, run_id.bytes
    rec["sid_len"], rec["sid"], rec["step_len"], rec["step"] = 4, sid, 8, step
    rec["value_len"], rec["value"], rec["wall_len"], rec["wall"] = 8, value, 8, wall
    header = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(8, "big")
    return header + rec.tobytes() + (-1).to_bytes(2, "big", signed=True)


def insert_batch(conn: psycopg.Connection[Any], layout: Layout, run: RunData,
                 params: dict[str, Any], n_points: int) -> float:
    """Seconds for one ingest statement and its commit; checks every point was new."""
    start = time.perf_counter()
    row = conn.execute(layout.insert_sql(), {**params, "run": run.run_id}).fetchone()
    conn.commit()
    elapsed = time.perf_counter() - start
    assert row is not None and row[0] == n_points, (layout.name, row, n_points)
    return elapsed


def read_run(conn: psycopg.Connection[Any], layout: Layout, run: RunData,
             with_run: bool) -> tuple[float, int]:
    """(seconds, points) of the store's raw read of every series of a run."""
    first, last, every = layout.read_sql(with_run)
    start = time.perf_counter()
    points = 0
    series = conn.execute(
        "SELECT key, id FROM series WHERE run_id = %s ORDER BY key", (run.run_id,)).fetchall()
    for _key, sid in series:
        params = {"sid": sid, "lo": 0, "hi": 2**62, "run": run.run_id}
        lo = conn.execute(first, params).fetchone()
        if lo is None or lo[0] is None:
            continue
        hi = conn.execute(last, params).fetchone()
        assert hi is not None
        params.update(lo=lo[0], hi=hi[0])
        points += len(conn.execute(every, params).fetchall())
    conn.commit()
    return time.perf_counter() - start, points


def delete_run_points(conn: psycopg.Connection[Any], layout: Layout, run: RunData,
                      named: bool) -> tuple[float, int]:
    """(seconds, rows) of retention's batched delete of a run's points, series by series."""
    sql = layout.delete_sql(named)
    rows = 0
    start = time.perf_counter()
    for sid in run.series_ids:
        while True:
            cur = conn.execute(sql, {"sid": sid, "run": run.run_id, "batch": DELETE_BATCH})
            conn.commit()
            rows += cur.rowcount
            if cur.rowcount < DELETE_BATCH:
                break
    return time.perf_counter() - start, rows


def bytes_per_point(conn: psycopg.Connection[Any], layout: Layout) -> float:
    """Heap, TOAST and indexes of the table (all partitions) per stored point."""
    row = conn.execute(
        "SELECT coalesce((SELECT sum(pg_total_relation_size(relid))"
        " FROM pg_partition_tree(%s)), pg_total_relation_size(%s)),"
        f" (SELECT count(*) FROM {layout.table})", (layout.table, layout.table)).fetchone()
    assert row is not None
    return float(row[0]) / int(row[1])


def partitions_touched(conn: psycopg.Connection[Any], layout: Layout, run: RunData) -> int:
    """How many partitions hold some of the run's points (1 for the plain table)."""
    if layout.table == "metric_points":
        return 1
    row = conn.execute(
        f"SELECT count(DISTINCT tableoid) FROM {layout.table} WHERE series_id = ANY(%s)",
        (run.series_ids,)).fetchone()
    assert row is not None
    return int(row[0])


def plan_shape(conn: psycopg.Connection[Any], layout: Layout, sql: str,
               params: dict[str, Any]) -> str:
    """What ``EXPLAIN`` of a statement scans of the table: how many partitions are left after
    plan-time pruning, and whether any of them (or the plain table) is read sequentially."""
    rows = conn.execute(f"EXPLAIN (COSTS OFF) {sql}", params).fetchall()
    conn.rollback()
    pattern = re.compile(rf"Scan .*\bon {layout.table}(_p\d+)?\b")
    scans = [line for (line,) in rows if pattern.search(line)]
    parts = {m.group(1) for line in scans if (m := pattern.search(line)) and m.group(1)}
    seq = any("Seq Scan" in line for line in scans)
    where = f"{len(parts)} of {layout.partitions}" if layout.partitions else "table"
    return where + (", seq scan" if seq else "")


# --- Main ---------------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    """Seconds as milliseconds for the tables."""
    return f"{seconds * 1000:,.1f}"


def _ratio(value: float, base: float) -> str:
    """``value / base`` for the "vs plain" columns."""
    return f"{value / base:.2f}"


def main(argv: list[str] | None = None) -> int:
    """Build the layouts, measure, print, and write BENCHMARKS.md's section."""
    cli = parser(__doc__, quick="12 runs of 600 steps")
    cli.add_argument("--runs", type=int, default=48, help="runs (default 48)")
    cli.add_argument("--series", type=int, default=10, help="series per run (default 10)")
    cli.add_argument("--steps", type=int, default=2500, help="steps per series (default 2500)")
    cli.add_argument("--batch-steps", type=int, default=100,
                     help="steps per ingest batch (× every series; default 100)")
    cli.add_argument("--partitions", type=int, default=16, help="hash partitions (default 16)")
    cli.add_argument("--sample", type=int, default=16,
                     help="runs read and then deleted per layout (default 16)")
    args = cli.parse_args(argv)
    if args.quick:
        args.runs, args.steps, args.sample = 12, 600, 4
    if args.steps % args.batch_steps:
        cli.error("--steps must be a multiple of --batch-steps")

    all_layouts = layouts(args.partitions)
    copy_runs_every = 4  # runs 0, 4, 8, ... go in by COPY: the baseline
    n_steps = 5
    started = time.perf_counter()
    with fresh_database("postgres", Path(tempfile.gettempdir())) as url:
        with psycopg.connect(url.replace("+psycopg", ""), autocommit=False) as conn:
            register_array_dumpers(conn)
            row = conn.execute("SHOW server_version").fetchone()
            version = str(row[0]).split()[0] if row else "?"
            with phase(BENCH, f"schema: plain + {len(all_layouts) - 1} partitioned copies, "
                              f"{args.runs} runs × {args.series} series", 1, n_steps):
                for layout in all_layouts:
                    for stmt in layout.ddl:
                        conn.execute(stmt)
                conn.commit()
                runs = create_runs(conn, args.runs, args.series, args.steps)
            copy_set = runs[::copy_runs_every]
            insert_set = [r for i, r in enumerate(runs) if i % copy_runs_every]

            # 1. Ingest: COPY baseline, then interleaved ingest statements.
            copy_time = dict.fromkeys([la.name for la in all_layouts], 0.0)
            insert_time = dict.fromkeys([la.name for la in all_layouts], 0.0)
            batch_times: dict[str, list[float]] = {la.name: [] for la in all_layouts}
            copy_points = len(copy_set) * args.series * args.steps
            insert_points = len(insert_set) * args.series * args.steps
            with phase(BENCH, f"ingest: COPY {copy_points:,} + statements {insert_points:,} "
                              "points per layout", 2, n_steps):
                for turn, run in enumerate(copy_set):
                    for layout in rotated(all_layouts, turn):
                        copy_time[layout.name] += copy_run(conn, layout, run)
                turn = 0
                n_batches = args.steps // args.batch_steps
                for b in range(n_batches):
                    lo, hi = b * args.batch_steps, (b + 1) * args.batch_steps
                    for run in insert_set:
                        sid, step, value, wall = run.columns(lo, hi)
                        params = {"p_sid": Int4Array(sid), "p_step": Int8Array(step),
                                  "p_value": Float8Array(value), "p_wall": Float8Array(wall)}
                        for layout in rotated(all_layouts, turn):
                            t = insert_batch(conn, layout, run, params, len(step))
                            insert_time[layout.name] += t
                            batch_times[layout.name].append(t)
                        turn += 1
                    if (b + 1) % max(1, n_batches // 5) == 0:
                        progress(BENCH, f"  ingest batches {b + 1}/{n_batches} of every run")
                counts = {la.name: conn.execute(f"SELECT count(*) FROM {la.table}").fetchone()
                          for la in all_layouts}
                expected = args.runs * args.series * args.steps
                assert all(c is not None and c[0] == expected for c in counts.values()), counts
                sizes = {la.name: bytes_per_point(conn, la) for la in all_layouts}
                spread = {la.name: statistics.mean(partitions_touched(conn, la, r)
                                                   for r in runs[:args.sample])
                          for la in all_layouts}
            conn.commit()
            conn.autocommit = True
            with phase(BENCH, "VACUUM ANALYZE (not timed)", 3, n_steps):
                for layout in all_layouts:
                    conn.execute(f"VACUUM (ANALYZE) {layout.table}")
            conn.autocommit = False

            # 2. Reads of one run (the store's raw read), warm, interleaved.
            sample = runs[1:1 + args.sample]  # COPY-loaded and statement-loaded alike
            read_cases: list[tuple[Layout, bool, str]] = []
            for la in all_layouts:
                if la.by_run:
                    read_cases.append((la, True, f"{la.name}, `run_id =` added"))
                read_cases.append((la, False, la.name + (", as the store reads"
                                                         if la.by_run else "")))
            probe = {"sid": runs[0].series_ids[0], "lo": 0, "hi": args.steps,
                     "run": runs[0].run_id, "batch": DELETE_BATCH}
            read_plan = {label: plan_shape(conn, la, la.read_sql(wr)[2], probe)
                         for la, wr, label in read_cases}
            read_times: dict[str, list[float]] = {label: [] for _, _, label in read_cases}
            rounds = 3
            with phase(BENCH, f"reads: {len(sample)} runs × {rounds} rounds × "
                              f"{len(read_cases)} cases", 4, n_steps):
                for rnd in range(rounds):
                    for i, run in enumerate(sample):
                        k = (rnd + i) % len(read_cases)
                        for la, with_run, label in read_cases[k:] + read_cases[:k]:
                            t, points = read_run(conn, la, run, with_run)
                            assert points == args.series * args.steps, (label, points)
                            if rnd:  # the first round warms the caches
                                read_times[label].append(t)

            # 3. Deleting a run's points (retention), interleaved; runs alternate between the
            # store's statement as it is and the one naming the partition key in both halves.
            delete_plan = {(la.name, named): plan_shape(conn, la, la.delete_sql(named), probe)
                           for la in all_layouts for named in (False, True)}
            delete_times: dict[tuple[str, bool], list[float]] = {
                key: [] for key in delete_plan}
            with phase(BENCH, f"deletes: {len(sample)} runs per layout", 5, n_steps):
                for turn, run in enumerate(sample):
                    named = bool(turn % 2)
                    for layout in rotated(all_layouts, turn // 2):
                        t, rows = delete_run_points(conn, layout, run, named)
                        assert rows == args.series * args.steps, (layout.name, rows)
                        delete_times[layout.name, named].append(t)
    total = time.perf_counter() - started
    progress(BENCH, f"all done in {total:.0f} s; database dropped")

    base = all_layouts[0].name
    run_points = args.series * args.steps
    ingest_rows: list[list[object]] = []
    for la in all_layouts:
        rate = insert_points / insert_time[la.name]
        copy_rate = copy_points / copy_time[la.name]
        p50 = statistics.median(batch_times[la.name])
        ingest_rows.append([
            la.name, f"{rate:,.0f}", _ratio(rate, insert_points / insert_time[base]),
            f"{p50 * 1000:.2f}", f"{copy_rate:,.0f}", _ratio(copy_rate, copy_points
                                                             / copy_time[base]),
            f"{rate / copy_rate:.0%}", f"{sizes[la.name]:.0f}", _ratio(sizes[la.name],
                                                                       sizes[base]),
        ])
    read_rows: list[list[object]] = []
    base_read = statistics.median(read_times[base])
    for _la, _wr, label in read_cases:
        med = statistics.median(read_times[label])
        read_rows.append([label, _ms(med), _ms(max(read_times[label])),
                          f"{run_points / med:,.0f}", _ratio(med, base_read),
                          read_plan[label]])
    delete_rows: list[list[object]] = []
    for named in (False, True):
        base_del = statistics.median(delete_times[base, named])
        for la in all_layouts:
            times = delete_times[la.name, named]
            med = statistics.median(times)
            how = ("key named in the outer `DELETE` too" if named
                   else "retention's statement as it is")
            delete_rows.append([la.name, how, len(times), _ms(med), _ms(max(times)),
                                f"{run_points / med:,.0f}", _ratio(med, base_del),
                                delete_plan[la.name, named], f"{spread[la.name]:.1f}"])

    batch_points = args.series * args.batch_steps
    body = (
        f"One fresh PostgreSQL {version} database, three copies of the points table fed "
        "identical rows: **plain** (the migrated `metric_points`), **hash(series_id)** (same "
        f"keys, {args.partitions} hash partitions) and **hash(run_id)** (a `run_id` column "
        f"added to the primary key, {args.partitions} partitions); {args.runs} runs × "
        f"{args.series} series × {args.steps:,} steps = {args.runs * run_points:,} points per "
        "copy; every timed operation alternates between the copies. Ingest: "
        f"{len(insert_set)} runs through the store's points statement (`INSERT ... SELECT FROM "
        f"unnest(...) ON CONFLICT DO NOTHING`), batches of {batch_points:,} points interleaved "
        f"across runs; baseline, same run: binary `COPY` of {len(copy_set)} whole runs. "
        "Storage: heap, TOAST and indexes, points only, with wall times:\n\n"
        + markdown_table(
            ["layout", "ingest points/s", "vs plain", "batch p50 ms", "COPY points/s",
             "vs plain", "ingest vs COPY", "bytes/point", "vs plain"], ingest_rows)
        + f"\n\nRead of one run ({run_points:,} points, the store's raw read), {len(sample)} "
        f"runs × {rounds - 1} warm rounds, median ms: "
        + ", ".join(f"{r[0]} {r[1]} ({r[4]}×, plan: {r[5]})" for r in read_rows) + "."
        + f"\n\nDeleting one run's points, `store.retention`'s loop (per series, "
        f"{DELETE_BATCH:,} rows a statement), as it is and with the partition key also named "
        "in the outer `DELETE`; a hash partition holds a slice of every run, so `DROP` / "
        "`DETACH PARTITION` cannot delete one:\n\n"
        + markdown_table(["layout", "statement", "runs", "median ms/run", "max ms",
                          "points/s", "vs plain", "plan", "partitions holding the run"],
                         delete_rows)
    )
    ingest = [float(r[2]) for r in ingest_rows[1:]]
    reads = [float(r[4]) for r in read_rows[1:]]
    slowest = max(float(r[6]) for r in delete_rows[:len(all_layouts)])
    result = (f"hash partitions ingest at {min(ingest):.2f}–{max(ingest):.2f}× the plain "
              f"table's rate and read a run in {min(reads):.2f}–{max(reads):.2f}× its time; "
              f"retention's delete as it is runs {slowest:.1f}× slower: not adopted")
    read_table = markdown_table(["layout", "median ms/run", "max ms", "points/s", "vs plain",
                                 "plan"], read_rows)
    return publish(args, BENCH, "Points table: plain against hash-partitioned", body, result,
                   details=read_table)
