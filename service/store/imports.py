"""Runs written by ``curvecast import``: opened with their source recorded, the source's read
position kept with each stored batch, and closed with their final status.

Imported points are history: by default the alert rules do not judge them. While a run is
imported its ``alert_eval`` row is leased to the import (the alert worker passes over leased
rows, :mod:`._leases`), and closing the import marks everything up to the run's last step as
evaluated, so rules judge only points that arrive later. The points themselves go through
:func:`curvecast.service.store.metrics.ingest_batch`, the REST ingest's own store call.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from curvecast.service.errors import Conflict
from curvecast.service.models import AlertEval, Project, Run, RunWork
from curvecast.service.schemas import RunOut
from curvecast.service.schemas.imports import ImportStart
from curvecast.service.store._common import insert_ignore, is_postgres, write_connection
from curvecast.service.store.projects import ensure_project
from curvecast.service.store.runs import get_run

__all__ = ["close_import", "open_import", "record_position", "settle_alert_hold"]


def open_import(
    session: Session,
    *,
    run_id: uuid.UUID,
    project: str,
    name: str,
    config: dict[str, Any],
    source: dict[str, Any],
    status_reason: str,
    now: datetime,
    hold_alerts: bool,
    hold_for: timedelta,
) -> ImportStart:
    """Create the run (``running``, ``status_reason`` saying it is being imported) or find it
    again; record ``source`` on it (merged over what an earlier import recorded), merge
    ``config`` into its config, and hold its alerts if asked.

    Raises:
        Conflict: the run exists in another project.
    """
    write_connection(session)
    project_id = ensure_project(session, name=project)
    created = session.execute(
        insert_ignore(
            session, Run.__table__,  # type: ignore[arg-type]
            id=run_id, project_id=project_id, name=name, config=config, status="running",
            status_reason=status_reason[:200], created_at=now, updated_at=now,
            last_seen_at=now, n_points=0, source={**source, "imported_at": now.isoformat()},
        ).returning(Run.id)
    ).first() is not None
    if created:
        session.execute(insert_ignore(session, RunWork.__table__, run_id=run_id, fit_n_points=0))  # type: ignore[arg-type]
    run, run_project = session.execute(
        select(Run, Project.name).join(Project).where(Run.id == run_id)).one()
    if run_project != project:
        raise Conflict(f"run {run_id} (imported from the same source before) is in project "
                       f"{run_project!r}, not {project!r}: import it with --project "
                       f"{run_project}, or delete that run first")
    before = {} if created else dict(run.source or {})
    if not created:
        run.source = {**before, **source, "imported_at": now.isoformat()}
        run.config = {**run.config, **config}
        run.last_seen_at = now
        session.flush()
    hold = uuid.uuid4() if hold_alerts else None
    if hold is not None:
        insert = postgresql.insert if is_postgres(session) else sqlite.insert
        values = {"lease_until": now + hold_for, "lease_token": hold}
        session.execute(
            insert(AlertEval)
            .values(run_id=run_id, n_points=0, state={}, **values)
            .on_conflict_do_update(index_elements=[AlertEval.run_id], set_=values)
        )
    return ImportStart(run_id=run_id, created=created, n_points=0 if created else run.n_points,
                       source=before, alert_hold=hold)


def record_position(
    session: Session,
    *,
    run_id: uuid.UUID,
    position: dict[str, Any],
    alert_hold: uuid.UUID | None,
    hold_until: datetime,
) -> None:
    """Record how far the source was read (merged into ``runs.source``) in the transaction that
    stored the points read so far, and extend the alert hold."""
    write_connection(session)
    if position:
        stored = session.execute(select(Run.source).where(Run.id == run_id)).scalar_one()
        session.execute(update(Run).where(Run.id == run_id)
                        .values(source={**(stored or {}), **position}),
                        execution_options={"synchronize_session": False})
    if alert_hold is not None:
        session.execute(update(AlertEval)
                        .where(AlertEval.run_id == run_id, AlertEval.lease_token == alert_hold)
                        .values(lease_until=hold_until),
                        execution_options={"synchronize_session": False})


def close_import(
    session: Session,
    *,
    run_id: uuid.UUID,
    status: str,
    status_reason: str | None,
    alert_hold: uuid.UUID | None,
    now: datetime,
) -> RunOut:
    """Give the run its final status and, when its alerts were held, mark everything up to its
    last step evaluated and release the hold (the rules judge only later points)."""
    write_connection(session)
    run = session.execute(select(Run).where(Run.id == run_id)).scalar_one()
    if run.status != status or run.ended_at is None:
        run.status = status
        run.ended_at = now
    run.status_reason = status_reason[:200] if status_reason else None
    run.updated_at = now
    session.flush()
    if alert_hold is not None:
        settle_alert_hold(session, run_id=run_id, alert_hold=alert_hold, now=now)
    return get_run(session, run_id=run_id, allowed_project=None)


def settle_alert_hold(session: Session, *, run_id: uuid.UUID, alert_hold: uuid.UUID,
                      now: datetime) -> None:
    """Mark the run's points up to its last step evaluated and release the import's hold on
    its alerts (at the end of an import, or when one stops part way)."""
    write_connection(session)
    run = session.execute(select(Run.last_step, Run.n_points).where(Run.id == run_id)).one()
    session.execute(
        update(AlertEval)
        .where(AlertEval.run_id == run_id, AlertEval.lease_token == alert_hold)
        .values(
            evaluated_step=run.last_step if run.last_step is not None
            else AlertEval.evaluated_step,
            n_points=run.n_points,
            evaluated_at=now,
            next_check_at=None,
            lease_until=None,
            lease_token=None,
        ),
        execution_options={"synchronize_session": False},
    )
