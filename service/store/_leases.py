"""Leases: how a background worker takes rows for work it does outside any transaction.

Refits, alert evaluations and webhook deliveries all follow the same pattern: in one short
write transaction, pick candidate rows whose lease is free or expired, lock them with ``FOR
UPDATE SKIP LOCKED`` (PostgreSQL) so concurrent workers pass over each other's candidates, and
stamp a lease expiry on them. The work then happens with no transaction open; if the worker
dies, the lease runs out on its own and another worker takes the row. On SQLite the write
transaction serialises claims, so the lock clause is simply ignored there.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar, TypeVarTuple

from sqlalchemy import Row, Select, or_, update
from sqlalchemy.orm import InstrumentedAttribute, Session

from curvecast.service.store._common import write_connection

#: The leased key (the candidate query's first column) and the columns after it.
_Key = TypeVar("_Key")
_Columns = TypeVarTuple("_Columns")


@dataclass(frozen=True)
class Claim(Generic[_Key, *_Columns]):
    """Rows taken by one :func:`claim_leases` call.

    Attributes:
        rows: the candidate statement's rows, in its order (first column: the leased key).
        token: the lease token written to every claimed row (when a token column was given);
            a later write that names it proves the lease is still this worker's.
    """

    rows: Sequence[Row[_Key, *_Columns]]
    token: uuid.UUID


def claim_leases(
    session: Session,
    candidates: Select[_Key, *_Columns],
    *,
    key: InstrumentedAttribute[_Key],
    lease_until: InstrumentedAttribute[datetime | None],
    lease_token: InstrumentedAttribute[uuid.UUID | None] | None = None,
    now: datetime,
    lease: timedelta,
    limit: int,
) -> Claim[_Key, *_Columns]:
    """Lease up to ``limit`` of ``candidates`` whose lease is free or expired.

    Args:
        session: the caller's session; this starts (or continues) its write transaction.
        candidates: a SELECT whose FIRST column is ``key``, with the caller's own filters,
            joins and ORDER BY. This adds the lease-free condition, the limit and the lock.
        key: the leased table's primary key (``AlertEval.run_id``); its table is locked.
        lease_until: the table's lease-expiry column, set to ``now + lease``.
        lease_token: the table's lease-token column, if it has one; set to the claim's token.
        now: the current time (the caller's clock, so tests can move it).
        lease: how long the claimed rows stay this worker's.
        limit: at most this many rows.

    Returns:
        The claimed rows and the token stamped on them.
    """
    write_connection(session)
    stmt = (
        candidates.where(or_(lease_until.is_(None), lease_until < now))
        .limit(limit)
        .with_for_update(of=key.class_, skip_locked=True)
    )
    rows = session.execute(stmt).all()
    token = uuid.uuid4()
    if rows:
        values: dict[Any, Any] = {lease_until: now + lease}
        if lease_token is not None:
            values[lease_token] = token
        session.execute(
            update(key.class_).where(key.in_([row[0] for row in rows])).values(values),
            execution_options={"synchronize_session": False},
        )
    return Claim(rows=rows, token=token)
