"""Webhooks per project, and the delivery outbox: leasing due deliveries for sending and
recording each attempt's outcome."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, exists, select, update
from sqlalchemy.orm import Session, aliased

from curvecast.service.errors import NotFound
from curvecast.service.models import AlertDelivery, AlertDeliveryAttempt, Project, Webhook
from curvecast.service.schemas.alerts import (
    AttemptOut,
    DeliveryList,
    DeliveryOut,
    WebhookIn,
    WebhookList,
    WebhookOut,
    WebhookTarget,
)
from curvecast.service.secrets import PREFIX as SEALED_PREFIX
from curvecast.service.store._common import as_utc, write_connection
from curvecast.service.store._leases import claim_leases
from curvecast.service.store.projects import ensure_project

MAX_ERROR_CHARS = 500


def _check_project(project: str, allowed_project: str | None) -> None:
    if allowed_project is not None and project != allowed_project:
        raise NotFound(f"project {project!r} not found")


def _out(w: Webhook, project: str, url: str | None = None) -> WebhookOut:
    return WebhookOut(
        id=w.id,
        project=project,
        name=w.name,
        url=url or w.url,
        url_masked=w.url_sealed is not None,
        enabled=w.enabled,
        has_secret=bool(w.secret),
        created_at=as_utc(w.created_at),
    )


def create_webhook(
    session: Session,
    *,
    project: str,
    webhook_in: WebhookIn,
    shown_url: str,
    sealed_url: str | None,
    stored_secret: str | None,
    now: datetime,
    allowed_project: str | None,
) -> WebhookOut:
    """Add a webhook to ``project`` (created if new). What is stored of the URL is
    ``shown_url`` (masked if it carries a token) and ``sealed_url`` (the whole URL, sealed; None
    when nothing is masked); of the secret, ``stored_secret`` (sealed:
    :mod:`curvecast.service.secrets`); never ``webhook_in``'s URL or secret themselves. The
    answer, to the admin who asked, shows the whole URL this once."""
    _check_project(project, allowed_project)
    write_connection(session)
    pid = ensure_project(session, name=project)
    w = Webhook(
        project_id=pid,
        name=webhook_in.name or shown_url[:200],
        url=shown_url[:2000],
        url_sealed=sealed_url,
        secret=stored_secret,
        enabled=webhook_in.enabled,
        created_at=now,
    )
    session.add(w)
    session.flush()
    return _out(w, project, url=webhook_in.url)


def list_webhooks(session: Session, *, project: str, allowed_project: str | None) -> WebhookList:
    """A project's webhooks, oldest first."""
    _check_project(project, allowed_project)
    rows = session.scalars(
        select(Webhook)
        .join(Project, Project.id == Webhook.project_id)
        .where(Project.name == project)
        .order_by(Webhook.id)
    ).all()
    return WebhookList(webhooks=[_out(w, project) for w in rows])


def delete_webhook(
    session: Session, *, project: str, webhook_id: int, allowed_project: str | None
) -> None:
    """Remove a webhook; its pending deliveries go with it."""
    _check_project(project, allowed_project)
    write_connection(session)
    pid = session.scalar(select(Project.id).where(Project.name == project))
    result = session.execute(
        delete(Webhook).where(Webhook.id == webhook_id, Webhook.project_id == pid)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise NotFound(f"webhook {webhook_id} not found in project {project!r}")


def list_deliveries(
    session: Session,
    *,
    project: str,
    status: str | None,
    limit: int,
    allowed_project: str | None,
) -> DeliveryList:
    """A project's deliveries, newest first, each with its attempts."""
    _check_project(project, allowed_project)
    stmt = (
        select(AlertDelivery)
        .join(Webhook, Webhook.id == AlertDelivery.webhook_id)
        .join(Project, Project.id == Webhook.project_id)
        .where(Project.name == project)
    )
    if status is not None:
        stmt = stmt.where(AlertDelivery.status == status)
    deliveries = session.scalars(
        stmt.order_by(AlertDelivery.created_at.desc(), AlertDelivery.id).limit(limit)
    ).all()
    attempts: dict[uuid.UUID, list[AttemptOut]] = {d.id: [] for d in deliveries}
    if deliveries:
        for a in session.scalars(
            select(AlertDeliveryAttempt)
            .where(AlertDeliveryAttempt.delivery_id.in_(list(attempts)))
            .order_by(AlertDeliveryAttempt.delivery_id, AlertDeliveryAttempt.attempt)
        ):
            attempts[a.delivery_id].append(
                AttemptOut(
                    attempt=a.attempt,
                    at=as_utc(a.at),
                    status_code=a.status_code,
                    error=a.error,
                    duration_ms=a.duration_ms,
                )
            )
    return DeliveryList(
        deliveries=[
            DeliveryOut(
                id=d.id,
                webhook_id=d.webhook_id,
                alert_id=d.alert_id,
                event=d.event,
                status=d.status,  # type: ignore[arg-type]
                attempts=d.attempts,
                next_attempt_at=as_utc(d.next_attempt_at) if d.status == "pending" else None,
                last_status=d.last_status,
                last_error=d.last_error,
                created_at=as_utc(d.created_at),
                delivered_at=as_utc(d.delivered_at) if d.delivered_at else None,
                attempt_log=attempts[d.id],
            )
            for d in deliveries
        ]
    )


def enabled_webhooks(session: Session, *, project_id: int) -> list[WebhookTarget]:
    """The project's enabled webhooks, oldest first: who hears of an alert's change."""
    rows = session.execute(
        select(Webhook.id, Webhook.name)
        .where(Webhook.project_id == project_id, Webhook.enabled.is_(True))
        .order_by(Webhook.id)
    ).all()
    return [WebhookTarget(int(i), str(n)) for i, n in rows]


# ---------------------------------------------------------------------------------------------
# The sender's side of the outbox
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeliveryJob:
    """A delivery leased for one sending attempt."""

    id: uuid.UUID
    url: str  #: masked when ``sealed_url`` is set
    sealed_url: str | None  #: the whole URL, sealed (or in clear, from an older version)
    secret: str | None
    body: bytes
    attempts: int
    created_at: datetime


def claim_deliveries(
    session: Session, *, now: datetime, lease: timedelta, limit: int
) -> list[DeliveryJob]:
    """Lease up to ``limit`` due deliveries (pending, ``next_attempt_at`` passed, lease free),
    oldest first. The lease covers the HTTP attempt, which happens outside any transaction
    (see :func:`claim_leases`).

    A delivery waits while an earlier one of the same alert to the same webhook is pending:
    a receiver sees an alert's notifications in the order they happened (its firing before its
    resolution, even when one evaluation round made both), never two of them racing.
    """
    earlier = aliased(AlertDelivery)
    waiting = exists().where(
        earlier.webhook_id == AlertDelivery.webhook_id,
        earlier.alert_id == AlertDelivery.alert_id,
        earlier.status == "pending",
        earlier.created_at < AlertDelivery.created_at,
    )
    candidates = (
        select(
            AlertDelivery.id,
            Webhook.url,
            Webhook.url_sealed,
            Webhook.secret,
            AlertDelivery.body,
            AlertDelivery.attempts,
            AlertDelivery.created_at,
        )
        .join(Webhook, Webhook.id == AlertDelivery.webhook_id)
        .where(AlertDelivery.status == "pending", AlertDelivery.next_attempt_at <= now, ~waiting)
        .order_by(AlertDelivery.next_attempt_at, AlertDelivery.created_at)
    )
    claim = claim_leases(
        session,
        candidates,
        key=AlertDelivery.id,
        lease_until=AlertDelivery.lease_until,
        now=now,
        lease=lease,
        limit=limit,
    )
    return [
        DeliveryJob(
            id=r[0],
            url=r[1],
            sealed_url=r[2],
            secret=r[3],
            body=r[4].encode(),
            attempts=int(r[5]),
            created_at=as_utc(r[6]),
        )
        for r in claim.rows
    ]


def record_attempt(
    session: Session,
    *,
    job: DeliveryJob,
    at: datetime,
    status_code: int | None,
    error: str | None,
    duration_ms: float,
    delivered: bool,
    next_attempt_at: datetime | None,
) -> bool:
    """Log one attempt and move the delivery on: ``delivered``, back to pending at
    ``next_attempt_at``, or ``failed`` when ``next_attempt_at`` is None (gave up).

    Returns:
        False, writing nothing, if the delivery is gone: its webhook was deleted while the
        attempt was in flight (the delete cascades to the outbox). Logging the attempt anyway
        was a foreign-key violation that lost the rest of the round's outcomes.
    """
    write_connection(session)
    # Lock the row (PostgreSQL; SQLite's write transaction already excludes other writers),
    # so that a webhook deleted from now on waits for this transaction instead of racing it.
    still_there = session.scalar(
        select(AlertDelivery.id).where(AlertDelivery.id == job.id).with_for_update()
    )
    if still_there is None:
        return False
    attempt = job.attempts + 1
    error = error[:MAX_ERROR_CHARS] if error else None
    session.add(
        AlertDeliveryAttempt(
            delivery_id=job.id,
            attempt=attempt,
            at=at,
            status_code=status_code,
            error=error,
            duration_ms=duration_ms,
        )
    )
    values: dict[str, object] = {
        "attempts": attempt,
        "last_status": status_code,
        "last_error": error,
        "lease_until": None,
    }
    if delivered:
        values.update(status="delivered", delivered_at=at)
    elif next_attempt_at is None:
        values.update(status="failed")
    else:
        values.update(next_attempt_at=next_attempt_at)
    # Only a pending delivery moves: if a lease ran out and another sender already delivered
    # it, that outcome stands (the receiver saw the same delivery id twice and de-duplicates).
    session.execute(
        update(AlertDelivery)
        .where(AlertDelivery.id == job.id, AlertDelivery.status == "pending")
        .values(**values),
        execution_options={"synchronize_session": False},
    )
    return True


def seal_plaintext_secrets(session: Session, *, seal: Callable[[str], str]) -> int:
    """Seal every secret, and every token-bearing URL, an older version stored in clear
    (``seal``: the deployment's ``SecretBox.seal``); returns how many values. Run by
    ``curvecast migrate``."""
    write_connection(session)
    sealed = 0
    for column in (Webhook.secret, Webhook.url_sealed):
        rows = session.execute(
            select(Webhook.id, column).where(
                column.is_not(None), ~column.startswith(SEALED_PREFIX)
            )
        ).all()
        for webhook_id, value in rows:
            session.execute(
                update(Webhook).where(Webhook.id == webhook_id)
                .values({column.key: seal(str(value))}),
                execution_options={"synchronize_session": False},
            )
        sealed += len(rows)
    return sealed
