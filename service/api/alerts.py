"""Alerts, alert rules, webhooks and webhook deliveries.

Reads need a read token, acknowledging and silencing an alert an ingest token (the people and
jobs that watch a run), changing rules and webhooks an admin token. Other projects' objects
answer 404. Alerts are evaluated by the background worker, never in a request.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Path, Query, Response
from fastapi import status as http

from curvecast.contract import PROJECT_PATTERN
from curvecast.service.alerting.rules import RULES, rule_config, validate_override
from curvecast.service.alerting.targets import is_allowed_address, literal_address
from curvecast.service.alerting.webhook_urls import masked_url
from curvecast.service.deps import (
    AdminPrincipal,
    IngestPrincipal,
    ReadPrincipal,
    SessionDep,
    SettingsDep,
)
from curvecast.service.errors import InvalidInput, NotFound, WebhookTargetNotAllowed
from curvecast.service.routing import OneHopRoute
from curvecast.service.schemas import PROJECT_FILTER_PATTERN
from curvecast.service.schemas.alerts import (
    AlertList,
    AlertOut,
    AlertState,
    DeliveryList,
    DeliveryStatus,
    RuleList,
    RuleOut,
    RuleOverrideIn,
    SilenceIn,
    WebhookIn,
    WebhookList,
    WebhookOut,
)
from curvecast.service.secrets import SecretUnavailable, box_for
from curvecast.service.store import alerts as alert_store
from curvecast.service.store import webhooks as webhook_store
from curvecast.service.store._common import utcnow

router = APIRouter(prefix="/api/v1", tags=["alerts"], route_class=OneHopRoute)

Limit = Annotated[int, Query(ge=1, le=1000)]
ProjectPath = Annotated[str, Path(pattern=PROJECT_PATTERN)]
RulePath = Annotated[str, Path(max_length=64)]
# Row ids: bounded so that an absurd id answers 422/404 instead of overflowing the
# database (ids are 32-bit integers; a larger one was a 500 on both backends).
IdPath = Annotated[int, Path(ge=1, le=2**31 - 1)]


@router.get("/alerts", response_model=AlertList, summary="List alerts")
def list_alerts(
    session: SessionDep,
    principal: ReadPrincipal,
    project: Annotated[str | None, Query(pattern=PROJECT_FILTER_PATTERN)] = None,
    run_id: uuid.UUID | None = None,
    state: AlertState | None = None,
    limit: Limit = 100,
) -> AlertList:
    """Alerts, newest first, filtered by project, run and state."""
    return alert_store.list_alerts(
        session, project=project, run_id=run_id, state=state, limit=limit,
        allowed_project=principal.project,
    )


@router.get("/runs/{run_id}/alerts", response_model=AlertList, summary="A run's alerts")
def run_alerts(
    run_id: uuid.UUID,
    session: SessionDep,
    principal: ReadPrincipal,
    state: AlertState | None = None,
    limit: Limit = 100,
) -> AlertList:
    """A run's alerts (the client hook polls ``?state=firing``)."""
    return alert_store.run_alerts(
        session, run_id=run_id, state=state, limit=limit, allowed_project=principal.project
    )


@router.post("/alerts/{alert_id}/ack", response_model=AlertOut, summary="Acknowledge an alert")
def acknowledge(alert_id: IdPath, session: SessionDep, principal: IngestPrincipal) -> AlertOut:
    """Mark the alert as seen by someone (kept in its history; notifications continue)."""
    return alert_store.acknowledge(
        session, alert_id=alert_id, now=utcnow(), allowed_project=principal.project
    )


@router.post("/alerts/{alert_id}/silence", response_model=AlertOut, summary="Silence an alert")
def silence(
    alert_id: IdPath, body: SilenceIn, session: SessionDep, principal: IngestPrincipal
) -> AlertOut:
    """No webhook notifications for this alert until ``until`` (``null``: lift the silence)."""
    return alert_store.silence(
        session, alert_id=alert_id, until=body.until, now=utcnow(),
        allowed_project=principal.project,
    )


def _known_rule(rule: str) -> str:
    if rule not in RULES:
        raise NotFound(f"no rule {rule!r}; rules are {', '.join(RULES)}")
    return rule


def _rule_out(rule: str, override: Mapping[str, Any] | None) -> RuleOut:
    """A rule's effective configuration for a project, beside its defaults and docs."""
    spec = RULES[rule]
    cfg = rule_config(rule, override)
    return RuleOut(
        rule=rule,
        title=spec.title,
        description=spec.description,
        enabled=cfg.enabled,
        severity=cfg.severity,
        for_steps=cfg.for_steps,
        resolve_for_steps=cfg.resolve_for_steps,
        for_doc=spec.for_doc,
        params=dict(cfg.params),
        param_docs={k: p.doc for k, p in spec.params.items()},
        defaults=spec.default_config().to_dict(),
        overridden=bool(override),
    )


@router.get("/projects/{project}/rules", response_model=RuleList, summary="A project's rules")
def list_rules(project: ProjectPath, session: SessionDep, principal: ReadPrincipal) -> RuleList:
    """Every rule with its effective configuration, defaults and documentation."""
    overrides = alert_store.project_rule_overrides(
        session, project=project, allowed_project=principal.project
    )
    return RuleList(project=project, rules=[_rule_out(r, overrides.get(r)) for r in RULES])


@router.get("/projects/{project}/rules/{rule}", response_model=RuleOut, summary="One rule")
def get_rule(
    project: ProjectPath, rule: RulePath, session: SessionDep, principal: ReadPrincipal
) -> RuleOut:
    """One rule's effective configuration."""
    overrides = alert_store.project_rule_overrides(
        session, project=project, allowed_project=principal.project
    )
    return _rule_out(_known_rule(rule), overrides.get(rule))


@router.put("/projects/{project}/rules/{rule}", response_model=RuleOut, summary="Configure a rule")
def put_rule(
    project: ProjectPath,
    rule: RulePath,
    body: RuleOverrideIn,
    session: SessionDep,
    principal: AdminPrincipal,
) -> RuleOut:
    """Replace the project's override of a rule: ``enabled``, ``severity``, ``for_steps``,
    ``resolve_for_steps`` and ``params`` (thresholds). Omitted fields keep the defaults; ``{}``
    returns to them."""
    if principal.project not in (None, project):
        raise NotFound(f"project {project!r} not found")
    _known_rule(rule)
    try:
        clean = validate_override(rule, body.model_dump(exclude_none=True))
    except ValueError as exc:
        raise InvalidInput(f"rule {rule}: {exc}") from None
    alert_store.put_rule_override(
        session, project=project, rule=rule, override=clean, now=utcnow(),
        allowed_project=principal.project,
    )
    return _rule_out(rule, clean)


@router.get("/projects/{project}/webhooks", response_model=WebhookList, summary="Webhooks")
def list_webhooks(
    project: ProjectPath, session: SessionDep, principal: ReadPrincipal
) -> WebhookList:
    """The project's webhooks (secrets are never shown; a token in a URL shows as `***`)."""
    return webhook_store.list_webhooks(
        session, project=project, allowed_project=principal.project
    )


@router.post(
    "/projects/{project}/webhooks",
    response_model=WebhookOut,
    status_code=http.HTTP_201_CREATED,
    summary="Add a webhook",
)
def create_webhook(
    project: ProjectPath,
    body: WebhookIn,
    session: SessionDep,
    settings: SettingsDep,
    principal: AdminPrincipal,
) -> WebhookOut:
    """Notify ``url`` of every alert of the project that fires or resolves. A URL whose host is
    a private, loopback, link-local or reserved address is refused (422
    ``webhook_target_not_allowed``) unless ``CURVECAST_WEBHOOK_ALLOW_PRIVATE`` is set; names are
    checked at each delivery, on the addresses they resolve to. A URL that carries a token
    (Slack, Discord, `?token=`, a generated path segment) is stored encrypted and shown whole
    only in this answer; reads show it masked."""
    host = urlsplit(body.url).hostname or ""
    literal = literal_address(host)
    if literal is not None and not is_allowed_address(
        literal, allow_private=settings.webhook_allow_private
    ):
        raise WebhookTargetNotAllowed(
            f"url: {host} is a private, loopback, link-local or reserved address; webhooks "
            "reach only global addresses unless CURVECAST_WEBHOOK_ALLOW_PRIVATE=true"
        )
    # Sealed before anything is written: a deployment without a key refuses the secret, and a
    # URL that carries a token (a Slack webhook's) is a secret too.
    box = box_for(settings)
    stored_secret = box.seal(body.secret) if body.secret else None
    shown_url = masked_url(body.url)
    sealed_url = None
    if shown_url != body.url:
        try:
            sealed_url = box.seal(body.url)
        except SecretUnavailable:
            raise SecretUnavailable(
                f"url: {shown_url} carries a token (where *** is shown); such URLs are stored "
                "encrypted and this deployment has no key: set CURVECAST_SECRET_KEY (32+ random "
                "characters, the same on every replica)"
            ) from None
    return webhook_store.create_webhook(
        session, project=project, webhook_in=body, shown_url=shown_url, sealed_url=sealed_url,
        stored_secret=stored_secret, now=utcnow(), allowed_project=principal.project,
    )


@router.delete(
    "/projects/{project}/webhooks/{webhook_id}",
    status_code=http.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Remove a webhook",
)
def delete_webhook(
    project: ProjectPath, webhook_id: IdPath, session: SessionDep, principal: AdminPrincipal
) -> Response:
    """Remove a webhook and its undelivered notifications."""
    webhook_store.delete_webhook(
        session, project=project, webhook_id=webhook_id, allowed_project=principal.project
    )
    return Response(status_code=http.HTTP_204_NO_CONTENT)


@router.get(
    "/projects/{project}/deliveries", response_model=DeliveryList, summary="Webhook deliveries"
)
def list_deliveries(
    project: ProjectPath,
    session: SessionDep,
    principal: ReadPrincipal,
    status: DeliveryStatus | None = None,
    limit: Limit = 100,
) -> DeliveryList:
    """Notifications and every attempt to send them (status code, error, duration)."""
    return webhook_store.list_deliveries(
        session, project=project, status=status, limit=limit,
        allowed_project=principal.project,
    )
