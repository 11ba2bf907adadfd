"""``curvecast import tensorboard|mlflow|wandb``: store runs other trackers recorded as ordinary
curvecast runs (forecast, ranked, on the dashboards), straight into the database.

Usage::

    curvecast import tensorboard LOGDIR [--project P] [--key KEY] [--tags GLOB ...]
    curvecast import mlflow (MLRUNS_DIR | TRACKING_URI) [--experiment NAME ...] [--run-id ID ...]
    curvecast import wandb HISTORY.csv|.jsonl [--run-path ENTITY/PROJECT/RUN_ID] [--name NAME]
                           [--step-column _step]

(each with ``[--config JSON] [--alerts] [--batch-points N] [--database-url URL]``).

An imported run's id is derived from its source (:attr:`~.importers.SourceRun.run_id`), so
running the same command again finds the same runs, and ingest keeps the first value of each
(run, key, step): nothing is stored twice, and an interrupted import continues where it
stopped (a TensorBoard file is read from the offset recorded with the last stored batch). The
source is recorded on the run (``source`` in the REST API). Alert rules do not judge imported
points unless ``--alerts`` is given.

The source is read in this thread and stored by a writer thread, one checkpoint (at most
``--batch-points`` points, in one transaction) at a time, with at most two checkpoints
waiting: memory is bounded by the batch, not by the run.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from curvecast.contract import PROJECT_PATTERN, is_valid_key, key_for_name, loss_key

__all__ = ["add_import_parser", "run_import"]

#: How long the alert worker is kept off a run being imported without a stored batch.
ALERT_HOLD = timedelta(minutes=10)
_DONE = object()


@dataclass
class _Job:
    """One source run to import: its description and how to read it."""

    run: Any  # importers.SourceRun
    read: Callable[[Any, int, dict[str, Any]], Iterator[Any]]  # (keymap, batch, source)
    total: int  # progress units (bytes or series)
    #: What reading left out (filled while the source is read).
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Tally:
    accepted: int = 0
    duplicates: int = 0
    skipped: int = 0
    keys: set[str] = field(default_factory=set)


# --- the command's arguments ---------------------------------------------------------------


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--project", help="the project to import into (default: 'default'; for "
                        "MLflow the experiment's name)")
    parser.add_argument("--key", metavar="KEY",
                        help="the series that is the run's loss (stored as the config's fit_key; "
                        "a source's name is mapped to its key); default: the contract's choice "
                        "(an evaluation loss, else loss)")
    parser.add_argument("--tags", action="append", default=[], metavar="GLOB",
                        help="import only the metrics whose names match (shell pattern, "
                        "repeatable; default: every scalar)")
    parser.add_argument("--config", metavar="JSON",
                        help="config keys to add to each run (a JSON object, or a file holding "
                        "one), e.g. '{\"total_steps\": 20000}'")
    parser.add_argument("--alerts", action="store_true",
                        help="let the alert rules judge the imported points (default: only "
                        "points that arrive later are judged)")
    parser.add_argument("--batch-points", type=int, default=50_000, metavar="N",
                        help="points per stored batch, the most held in memory (default 50000)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--database-url",
                        help="SQLAlchemy URL or SQLite file path (default: "
                        "$CURVECAST_DATABASE_URL, else ./curvecast.db)")


def add_import_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``import`` on the ``curvecast`` command's subparsers."""
    parser = subparsers.add_parser(
        "import", help="import runs from TensorBoard, MLflow or W&B",
        description="Store runs other trackers recorded as curvecast runs, in the database "
        "directly. Running the same import again adds only what is new (docs/imports.md).")
    kinds = parser.add_subparsers(dest="source_kind", required=True, metavar="SOURCE")
    tb = kinds.add_parser("tensorboard", help="event directories (one run per directory "
                          "holding event files)")
    tb.add_argument("logdir", help="a log directory (every run below it) or one event file")
    _common(tb)
    ml = kinds.add_parser("mlflow", help="an MLflow tracking server or local store")
    ml.add_argument("source", help="a local mlruns directory, or a tracking URI "
                    "(http://host:5000, sqlite:///mlflow.db, ...)")
    ml.add_argument("--experiment", action="append", default=[], metavar="NAME",
                    help="import this experiment's runs (name or id, repeatable; default: "
                    "every active experiment)")
    ml.add_argument("--run-id", action="append", default=[], metavar="ID",
                    help="import this run (repeatable)")
    _common(ml)
    wb = kinds.add_parser("wandb", help="a W&B run's history exported to CSV or JSON lines")
    wb.add_argument("history", help="the history file (run.history().to_csv(), or "
                    "run.scan_history() rows as JSON lines)")
    wb.add_argument("--run-path", metavar="ENTITY/PROJECT/RUN_ID",
                    help="the W&B run it came from (its identity; default: the file's path)")
    wb.add_argument("--name", help="the run's name (default: the run id, else the file's name)")
    wb.add_argument("--step-column", default="_step", help="the step column (default _step)")
    _common(wb)
    parser.set_defaults(func=run_import)


# --- reading the sources ---------------------------------------------------------------------


def _jobs(args: argparse.Namespace) -> list[_Job]:
    from curvecast.service.importers import events, mlflow_runs, wandb_history

    if args.source_kind == "tensorboard":
        jobs = []
        for tb in events.find_runs(args.logdir):
            def read(keymap: Any, batch: int, source: dict[str, Any],
                     tb: events.TensorBoardRun = tb) -> Iterator[Any]:
                return tb.checkpoints(keymap, batch, source.get("files"))

            jobs.append(_Job(tb.run, read, sum(p.stat().st_size for p in tb.files),
                             tb.warnings))
        return jobs
    if args.source_kind == "mlflow":
        jobs = []
        for ml in mlflow_runs.find_runs(args.source, experiments=args.experiment,
                                        run_ids=args.run_id):
            def read_run(keymap: Any, batch: int, _source: dict[str, Any],
                         ml: mlflow_runs.MlflowRun = ml) -> Iterator[Any]:
                return ml.checkpoints(keymap, batch)

            jobs.append(_Job(ml.run, read_run, len(ml.metric_keys)))
        return jobs
    history = wandb_history.history_file(args.history, run_path=args.run_path, name=args.name,
                                         step_column=args.step_column)

    def read_history(keymap: Any, batch: int, _source: dict[str, Any]) -> Iterator[Any]:
        return history.checkpoints(keymap, batch)

    return [_Job(history.run, read_history, history.bytes_to_read())]


def _extra_config(text: str | None, kind: str) -> dict[str, Any]:
    from curvecast.service.forecast.files import json_object_arg
    from curvecast.service.importers import ImportInputError
    from curvecast.service.importers.wandb_history import unwrap_config

    if text is None:
        return {}
    raw = json_object_arg(text, "--config", ImportInputError)
    return unwrap_config(raw) if kind == "wandb" else raw


#: The interpreter's thread switch interval while importing (:func:`run_import`).
IMPORT_SWITCH_INTERVAL_S = 0.0005


# --- writing ---------------------------------------------------------------------------------


class _Writer(threading.Thread):
    """Stores checkpoints from a bounded queue, one transaction each."""

    def __init__(self, factory: Any, start: Any, tally: _Tally,
                 advance: Callable[[int], None]) -> None:
        super().__init__(name="curvecast-import-writer", daemon=True)
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=2)
        self.error: BaseException | None = None
        self._factory, self._start, self._tally, self._advance = factory, start, tally, advance

    def run(self) -> None:
        from curvecast.service.db import session_scope
        from curvecast.service.schemas import MetricBatch
        from curvecast.service.store import imports as import_store
        from curvecast.service.store._common import utcnow
        from curvecast.service.store.metrics import ingest_batch

        while (checkpoint := self.queue.get()) is not _DONE:
            if self.error is not None:
                continue  # drain: the reader stops at its next put
            try:
                with session_scope(self._factory) as session:
                    for steps, walls, values in checkpoint.columns():
                        batch = MetricBatch.model_construct(steps=steps, wall_time=walls,
                                                            values=values)
                        result = ingest_batch(session, run_id=self._start.run_id, batch=batch,
                                              allowed_project=None)
                        self._tally.accepted += result.accepted
                        self._tally.duplicates += result.duplicates
                        self._tally.keys.update(values)
                    import_store.record_position(
                        session, run_id=self._start.run_id, position=dict(checkpoint.position),
                        alert_hold=self._start.alert_hold, hold_until=utcnow() + ALERT_HOLD)
                self._tally.skipped += sum(checkpoint.skipped.values())
                self._advance(checkpoint.progress)
            except BaseException as exc:  # handed to the reader's thread
                self.error = exc


def _import_run(job: _Job, args: argparse.Namespace, factory: Any, extra: dict[str, Any],
                advance: Callable[[int], None]) -> tuple[Any, _Tally]:
    from curvecast.service.db import session_scope
    from curvecast.service.importers import KeyMap
    from curvecast.service.importers.batches import clean_config
    from curvecast.service.store import imports as import_store
    from curvecast.service.store._common import utcnow

    run = job.run
    project = args.project or run.default_project or "default"
    config, warnings = clean_config({**run.config, **extra})
    run.warnings.extend(warnings)
    if args.key:
        config["fit_key"] = key_for_name(args.key)
    with session_scope(factory) as session:
        start = import_store.open_import(
            session, run_id=run.run_id, project=project, name=run.name, config=config,
            source=run.source, status_reason=f"importing ({run.status_reason})",
            now=utcnow(), hold_alerts=not args.alerts, hold_for=ALERT_HOLD)
    tally = _Tally()
    writer = _Writer(factory, start, tally, advance)
    writer.start()
    try:
        try:
            for checkpoint in job.read(KeyMap(args.tags), args.batch_points, start.source):
                if writer.error is not None:
                    break
                writer.queue.put(checkpoint)
        finally:
            writer.queue.put(_DONE)
            writer.join()
        if writer.error is not None:
            raise writer.error
    except BaseException:
        if start.alert_hold is not None:
            # Stopped part way: what was stored is history too, not for the rules to judge
            # once the hold would have run out (best effort: the database may be the cause).
            try:
                with session_scope(factory) as session:
                    import_store.settle_alert_hold(session, run_id=run.run_id,
                                                   alert_hold=start.alert_hold, now=utcnow())
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass
        raise
    with session_scope(factory) as session:
        out = import_store.close_import(session, run_id=run.run_id, status=run.status,
                                        status_reason=run.status_reason,
                                        alert_hold=start.alert_hold, now=utcnow())
    return out, tally


def _report(out: Any, tally: _Tally, warnings: list[str], args: argparse.Namespace) -> None:
    keys = sorted(tally.keys)
    chosen = loss_key(keys, out.config)
    head = f"{out.name}  (run {out.id}, project {out.project}): "
    if not keys:
        print(head + f"nothing new since the last import ({out.n_points:,} points stored)",
              flush=True)
    else:
        print(head + f"{tally.accepted:,} points new, {tally.duplicates:,} already stored; "
              f"{len(keys)} series" + (f"; loss: {chosen}" if chosen in keys else ""), flush=True)
    if tally.skipped:
        print(f"  note: {tally.skipped:,} points at a step outside [0, 2**62] were left out",
              file=sys.stderr)
    for warning in warnings:
        print(f"  warning: {warning}", file=sys.stderr)
    if keys and not (chosen and chosen in keys):
        sample = ", ".join(keys[:8]) + (", ..." if len(keys) > 8 else "")
        print(f"  warning: no loss series among {sample}: its forecast needs one; import again "
              "with --key NAME (the run's fit_key)", file=sys.stderr)


#: The modules each source needs (the ``[import]`` extra's packages).
IMPORT_MODULES = {
    "tensorboard": ("tensorboard", "google_crc32c", "tqdm"),
    "mlflow": ("mlflow", "tqdm"),
    "wandb": ("tqdm",),
}


def missing_import_modules(kind: str) -> list[str]:
    """The modules ``curvecast import KIND`` needs that this interpreter cannot import."""
    import importlib.util

    return [name for name in IMPORT_MODULES[kind] if importlib.util.find_spec(name) is None]


def run_import(args: argparse.Namespace) -> int:
    """Execute the command. Returns the exit status (2: a source or argument problem)."""
    import re

    if missing := missing_import_modules(args.source_kind):
        print(f"curvecast import {args.source_kind}: needs the packages of the [import] extra, "
              f"which are not installed here (missing: {', '.join(missing)}).\n"
              "  Install them with:  pip install 'curvecast[import]'", file=sys.stderr)
        return 2
    from sqlalchemy.exc import OperationalError
    from tqdm import tqdm

    from curvecast.service.app import prepare_database
    from curvecast.service.config import Settings
    from curvecast.service.db import make_engine, make_sessionmaker
    from curvecast.service.errors import ServiceError
    from curvecast.service.importers import ImportInputError

    if args.batch_points < 1:
        print("curvecast import: error: --batch-points must be 1 or more", file=sys.stderr)
        return 2
    if args.project is not None and not re.match(PROJECT_PATTERN, args.project):
        print(f"curvecast import: error: --project {args.project!r}: 1-100 characters from "
              "A-Z a-z 0-9 _ . -", file=sys.stderr)
        return 2
    if args.key is not None and not is_valid_key(key_for_name(args.key)):
        print(f"curvecast import: error: --key {args.key!r} is not a metric name",
              file=sys.stderr)
        return 2
    try:
        extra = _extra_config(args.config, args.source_kind)
        jobs = _jobs(args)
    except ImportInputError as exc:
        print(f"curvecast import: error: {exc}", file=sys.stderr)
        return 2
    settings = Settings(database_url=args.database_url) if args.database_url else Settings()
    engine = make_engine(settings)
    failed = 0
    bar = tqdm(total=sum(job.total for job in jobs), unit="B" if args.source_kind != "mlflow"
               else " series", unit_scale=args.source_kind != "mlflow", file=sys.stderr,
               disable=True if args.no_progress else None, leave=False, dynamic_ncols=True)
    lock = threading.Lock()

    def advance(n: int) -> None:
        with lock:
            bar.update(n)

    # The writer thread wakes dozens of times per batch to feed PostgreSQL its COPY, and each
    # time waits for the GIL that the reader's parsing loop holds, up to the switch interval
    # (5 ms): a shorter one lets reading and writing overlap (BENCHMARKS.md, "Import from
    # TensorBoard, MLflow and W&B"). Restored afterwards: a caller's process keeps its own.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(IMPORT_SWITCH_INTERVAL_S)
    started = time.perf_counter()
    total = 0
    try:
        # As `curvecast serve`: the embedded SQLite file is brought up to date, a server
        # database must be at the current schema.
        prepare_database(settings)
        factory = make_sessionmaker(engine)
        for job in jobs:
            bar.set_description(job.run.name[:40])
            try:
                out, tally = _import_run(job, args, factory, extra, advance)
            except (ImportInputError, ServiceError) as exc:
                failed += 1
                message = getattr(exc, "message", None) or str(exc)
                bar.write(f"curvecast import: {job.run.name}: error: {message}",
                          file=sys.stderr)
                continue
            total += tally.accepted
            bar.clear()
            _report(out, tally, [*job.run.warnings, *job.warnings], args)
    except ServiceError as exc:
        print(f"curvecast import: {exc.message}", file=sys.stderr)
        return 2
    except OperationalError as exc:
        print(f"curvecast import: the database cannot be reached ({str(exc).splitlines()[0]}); "
              "run the same command again once it can: what was stored stays", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("curvecast import: interrupted; what was stored stays: run the same command "
              "again to continue", file=sys.stderr)
        return 130
    finally:
        sys.setswitchinterval(switch_interval)
        bar.close()
        engine.dispose()
    elapsed = time.perf_counter() - started
    print(f"imported {len(jobs) - failed} of {len(jobs)} run(s): {total:,} new points in "
          f"{elapsed:.1f} s", flush=True)
    return 2 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m curvecast.service.import_cli SOURCE ...`` (as ``curvecast import``)."""
    parser = argparse.ArgumentParser(prog="curvecast")
    add_import_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["import", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
