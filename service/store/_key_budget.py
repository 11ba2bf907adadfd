"""How many distinct keys a run may have: checked when a batch brings keys the run has not
logged yet, inside the batch's write transaction (PostgreSQL: under the run row's lock that
ingest takes first; SQLite: in its exclusive write transaction), so two batches racing to add
keys cannot together pass the limit."""

from __future__ import annotations

import uuid
from typing import Any

from curvecast.service.errors import TooManyKeys

_PG_COUNT = "SELECT count(*) FROM series WHERE run_id = %s"
_SQLITE_COUNT = "SELECT count(*) FROM series WHERE run_id = ?"


def check_new_keys(cur: Any, *, run_id: uuid.UUID, run_param: Any, new: int,
                   limit: int | None, postgres: bool) -> None:
    """Refuse a batch that would take the run past ``limit`` keys (None: no limit).

    Args:
        cur: the ingest's DB-API cursor.
        run_param: the run's id as the statement takes it (SQLite: its hex form).
        new: keys of the batch the run does not have yet.

    Raises:
        TooManyKeys: naming the limit and its setting.
    """
    if limit is None or new == 0:
        return
    cur.execute(_PG_COUNT if postgres else _SQLITE_COUNT, (run_param,))
    existing = int(cur.fetchone()[0])
    if existing + new > limit:
        raise TooManyKeys(
            f"values: this batch adds {new} new keys to run {run_id}, which has {existing}; a "
            f"run may have at most {limit} distinct keys (CURVECAST_MAX_KEYS_PER_RUN). Log "
            "fewer distinct metric names (e.g. per-layer statistics summarised into a few)"
        )
