"""Deleting runs: everything of a run, in small batches, each its own short transaction.

One ``DELETE`` of a big run (millions of points, their rollups, thousands of fits) would hold
its locks for as long as it takes, and on SQLite block every writer meanwhile. Here each
statement removes at most ``batch`` rows by primary key, children before parents, and commits;
ingest and the worker interleave between batches. Every step is idempotent: a deletion cut off
half way (a crash, a restart) is finished by calling it again (the API's ``DELETE`` again, or the
retention task on its next round).

On PostgreSQL each batch of the tables ingest writes (points, rollups) first locks the run's
row, as ingest does with its first statement: a batch of the run's points and a batch of ingest
into it then run one after the other. Without that order, a deletion holding a series' rows and
an ingest holding the run row and waiting for those rows deadlocked (PostgreSQL aborted one of
them: a 500 for the ingest). The series rows go with the run row, in one transaction: an ingest
that waited for the run's lock reads the series in the snapshot it took before waiting, so it
must never find the run there and its series gone (a foreign-key violation); it finds the run
gone, and answers 404. The batches of a group of series stop once they removed as many rows as
the run held when its deletion began: a client that keeps sending cannot keep the deletion
going; what it sent meanwhile goes with the run row.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import bindparam, select, text
from sqlalchemy.orm import Session, sessionmaker

from curvecast.contract import ENDED_RUN_STATUSES
from curvecast.service.db import session_scope
from curvecast.service.models import Run, Series
from curvecast.service.store._common import is_postgres, write_connection

#: Rows removed per statement (and per transaction).
DELETE_BATCH = 10_000

_ALERTS_OF_RUN = "SELECT id FROM alerts WHERE run_id = :run"
_DELIVERIES_OF_RUN = f"SELECT id FROM alert_deliveries WHERE alert_id IN ({_ALERTS_OF_RUN})"
#: (table, primary key, which rows), children before parents. ``:run`` is the run's id.
_RUN_TABLES: tuple[tuple[str, str, str], ...] = (
    ("alert_delivery_attempts", "id", f"delivery_id IN ({_DELIVERIES_OF_RUN})"),
    ("alert_deliveries", "id", f"alert_id IN ({_ALERTS_OF_RUN})"),
    ("alerts", "id", "run_id = :run"),
    ("alert_eval", "run_id", "run_id = :run"),
    ("fits", "id", "run_id = :run"),
    ("run_work", "run_id", "run_id = :run"),
)
#: The tables ingest writes, by the run's series: ``:sids`` is a group of series ids (a run of
#: many small series costs few transactions; a list, not a subquery over ``series``, which
#: PostgreSQL answered with a scan of every point of every run).
_SERIES_TABLES: tuple[tuple[str, str, str], ...] = (
    ("metric_points", "series_id, step", "series_id IN :sids"),
    ("metric_rollups", "series_id, level, block", "series_id IN :sids"),
)
#: Series per group (SQLite before 3.32 takes at most 999 parameters).
SERIES_GROUP = 500


@dataclass
class Deleted:
    """Rows removed, per table."""

    rows: dict[str, int] = field(default_factory=dict)

    def add(self, table: str, n: int) -> None:
        self.rows[table] = self.rows.get(table, 0) + n

    @property
    def total(self) -> int:
        return sum(self.rows.values())


#: The lock ingest takes first (its ``UPDATE runs``): no deadlock when both take it first.
_LOCK_RUN = text("SELECT id FROM runs WHERE id = :run FOR NO KEY UPDATE")
_INGESTED = frozenset({"metric_points", "metric_rollups"})


def _delete_in_batches(
    factory: sessionmaker[Session],
    table: str,
    key: str,
    where: str,
    params: dict[str, object],
    batch: int,
    deleted: Deleted,
    on_batch: Callable[[Deleted], None] | None,
    most: int | None = None,
) -> None:
    """Delete the rows in batches until none are left, or ``most`` rows were deleted."""
    # Row values (``(a, b) IN (SELECT a, b ...)``) work on PostgreSQL and SQLite >= 3.15; the
    # subquery's LIMIT bounds each statement.
    sql = text(
        f"DELETE FROM {table} WHERE ({key}) IN "
        f"(SELECT {key} FROM {table} WHERE {where} LIMIT :batch)"
    )
    if "sids" in params:
        sql = sql.bindparams(bindparam("sids", expanding=True))
    removed = 0
    while True:
        with session_scope(factory) as session:
            write_connection(session)
            # SQLite: the write transaction excludes ingest already.
            if table in _INGESTED and is_postgres(session):
                session.execute(_LOCK_RUN, {"run": params["run"]})
            n = int(session.execute(sql, {**params, "batch": batch}).rowcount)  # type: ignore[attr-defined]
        deleted.add(table, n)
        removed += n
        if on_batch is not None and n:
            on_batch(deleted)
        if n < batch or (most is not None and removed >= most):
            return


def delete_run(
    factory: sessionmaker[Session],
    run_id: uuid.UUID,
    *,
    batch: int = DELETE_BATCH,
    on_batch: Callable[[Deleted], None] | None = None,
) -> Deleted:
    """Remove a run and everything of it: points, rollups, series, fits, refit bookkeeping,
    alerts, their evaluation state, deliveries and delivery attempts; then the run row.

    The caller checks that the run exists and may be deleted by whoever asks. A run that no
    longer exists (deleted meanwhile) is fine: nothing is left to remove.

    Args:
        factory: sessions; each batch is its own transaction.
        run_id: the run.
        batch: rows per statement.
        on_batch: called after each batch that removed rows (progress, tests).

    Returns:
        How many rows each table lost.
    """
    run = run_id.hex if factory.kw["bind"].dialect.name == "sqlite" else run_id
    deleted = Deleted()
    for table, key, where in _RUN_TABLES:
        _delete_in_batches(factory, table, key, where, {"run": run}, batch, deleted, on_batch)
    with session_scope(factory) as session:
        stored = session.scalar(select(Run.n_points).where(Run.id == run_id)) or 0
        series_ids = list(session.scalars(select(Series.id).where(Series.run_id == run_id)))
    for start in range(0, len(series_ids), SERIES_GROUP):
        group: dict[str, object] = {"run": run, "sids": series_ids[start:start + SERIES_GROUP]}
        for table, key, where in _SERIES_TABLES:
            # At most what the run held (rollups are fewer than points), plus a batch.
            _delete_in_batches(factory, table, key, where, group, batch, deleted, on_batch,
                               most=stored + batch)
    # The run row, and with it (ON DELETE CASCADE) its series: few rows, and the points an
    # ingest stored since the batches above (not counted in the result).
    _delete_in_batches(factory, "runs", "id", "id = :run", {"run": run}, batch, deleted,
                       on_batch)
    return deleted


def expired_runs(
    session: Session, *, now: datetime, older_than: timedelta, limit: int
) -> list[uuid.UUID]:
    """Runs that ended (finished, failed, crashed or lost) more than ``older_than`` ago, oldest
    first: what the retention setting removes."""
    stmt = (
        select(Run.id)
        .where(Run.status.in_(ENDED_RUN_STATUSES), Run.ended_at < now - older_than)
        .order_by(Run.ended_at)
        .limit(limit)
    )
    return list(session.scalars(stmt))
