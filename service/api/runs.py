"""Runs: create-or-get, read, update, list, delete."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from curvecast.contract import BASE64_COLUMNS, INGEST_ENCODINGS_HEADER
from curvecast.service.db import session_scope
from curvecast.service.deps import AdminPrincipal, IngestPrincipal, ReadPrincipal, SessionDep
from curvecast.service.routing import OneHopRoute
from curvecast.service.schemas import (
    PROJECT_FILTER_PATTERN,
    RunCreate,
    RunOut,
    RunPage,
    RunStatus,
    RunUpdate,
)
from curvecast.service.store import retention
from curvecast.service.store import runs as run_store

router = APIRouter(prefix="/api/v1/runs", tags=["runs"], route_class=OneHopRoute)


@router.put(
    "/{run_id}",
    response_model=RunOut,
    responses={201: {"model": RunOut, "description": "Created"}},
    summary="Create a run, or get it if it exists (idempotent)",
)
def put_run(
    run_id: uuid.UUID,
    run_in: RunCreate,
    session: SessionDep,
    principal: IngestPrincipal,
    response: Response,
) -> RunOut:
    """Create run ``run_id`` (a UUID the client chooses) or return the stored run unchanged.

    The answer's ``Curvecast-Ingest-Encodings`` header lists the column encodings
    ``POST .../metrics`` reads besides JSON arrays (``base64``): the client hook sends its
    columns so only to a service that says it reads them."""
    run, created = run_store.create_or_get_run(
        session, run_id=run_id, run_in=run_in, allowed_project=principal.project
    )
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    response.headers[INGEST_ENCODINGS_HEADER] = BASE64_COLUMNS
    return run


@router.get("/{run_id}", response_model=RunOut, summary="Get a run")
def get_run(run_id: uuid.UUID, session: SessionDep, principal: ReadPrincipal) -> RunOut:
    """One run with its config, status and progress."""
    return run_store.get_run(session, run_id=run_id, allowed_project=principal.project)


@router.delete(
    "/{run_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Delete a run and everything of it (admin)",
)
def delete_run(run_id: uuid.UUID, request: Request, principal: AdminPrincipal) -> Response:
    """Remove the run, its points, rollups, fits, alerts and webhook deliveries, in batches of
    10,000 rows that each commit on their own (no long locks; ingest into other runs goes on).
    Answers 204 once everything is gone. Idempotent for a run being deleted: if the request is
    cut off, sending it again finishes the job; a finished deletion answers 404. A client still
    sending points to the run gets 404 afterwards (``PUT`` would create it anew)."""
    factory = request.app.state.sessionmaker
    with session_scope(factory) as session:
        run_store.get_run(session, run_id=run_id, allowed_project=principal.project)
    retention.delete_run(factory, run_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.patch("/{run_id}", response_model=RunOut, summary="Update status, name or config")
def patch_run(
    run_id: uuid.UUID, run_in: RunUpdate, session: SessionDep, principal: IngestPrincipal
) -> RunOut:
    """Change a run's status or name; ``config`` keys are merged into the stored config."""
    return run_store.update_run(
        session, run_id=run_id, run_in=run_in, allowed_project=principal.project
    )


@router.get("", response_model=RunPage, summary="List runs, newest first")
def list_runs(
    session: SessionDep,
    principal: ReadPrincipal,
    project: Annotated[str | None, Query(pattern=PROJECT_FILTER_PATTERN)] = None,
    status: RunStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    page_token: Annotated[str | None, Query(max_length=500)] = None,
) -> RunPage:
    """Runs filtered by project and status; follow ``next_page_token`` for more."""
    return run_store.list_runs(
        session,
        project=project,
        status=status,
        limit=limit,
        page_token=page_token,
        allowed_project=principal.project,
    )
