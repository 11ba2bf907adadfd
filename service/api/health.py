"""Liveness and readiness probes."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from curvecast.service.migrate import check_schema
from curvecast.service.routing import OneHopRoute
from curvecast.service.schemas import Health

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"], route_class=OneHopRoute)


@router.get("/healthz", response_model=Health, summary="The process is alive")
def healthz() -> Health:
    """Always ok while the process serves requests."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    responses={503: {"model": Health}},
    summary="The database is reachable and migrated",
)
def readyz(request: Request) -> Health | JSONResponse:
    """Ok when the database answers and its schema is current; 503 (with Retry-After) if not."""
    settings = request.app.state.settings
    try:
        revision = check_schema(request.app.state.engine)
    except Exception:  # any failure means "not ready"
        # The probe is public: the reason (host names, user names, driver messages) goes to
        # the server's log, not to whoever asks.
        log.warning("readiness check failed", exc_info=True)
        body = Health(status="unavailable", database="unavailable")
        return JSONResponse(
            status_code=503,
            content=body.model_dump(),
            headers={"Retry-After": str(settings.retry_after_s)},
        )
    return Health(status="ok", database="reachable", schema_revision=revision)
