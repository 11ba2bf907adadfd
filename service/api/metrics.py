"""Metric points: columnar ingest, series reads (optionally downsampled), CSV export."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from curvecast.contract import MAX_STEP, REPLAY_HEADER
from curvecast.service import prometheus
from curvecast.service.api._json import FastJSONRoute
from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.deps import IngestPrincipal, ReadPrincipal, SessionDep, SettingsDep
from curvecast.service.errors import TooManyPoints
from curvecast.service.queries import parse_keys
from curvecast.service.schemas import IngestResult, MetricBatch, MetricsOut, Principal
from curvecast.service.store import metric_reads
from curvecast.service.store import metrics as metric_store
from curvecast.service.store.export import ExportReader, export_series

router = APIRouter(prefix="/api/v1/runs/{run_id}", tags=["metrics"], route_class=FastJSONRoute)


def _store_batch(
    factory: sessionmaker[Session], run_id: uuid.UUID, batch: MetricBatch, project: str | None,
    max_keys: int,
) -> IngestResult:
    # The request's one hand-over to the thread pool: session, statements and commit together.
    with session_scope(factory) as session:
        return metric_store.ingest_batch(
            session, run_id=run_id, batch=batch, allowed_project=project, max_keys=max_keys
        )


@router.post("/metrics", response_model=IngestResult, summary="Ingest a columnar batch")
async def post_metrics(
    run_id: uuid.UUID,
    batch: MetricBatch,
    request: Request,
    settings: SettingsDep,
    principal: IngestPrincipal,
) -> IngestResult:
    """Store a batch of points. Idempotent: a (run, key, step) already stored is kept and
    counted in ``duplicates``. The batch is stored whole or not at all."""
    # async, with the database work in one thread-pool call: FastAPI would hand a plain def
    # route, its session dependency (twice) and its answer's serialisation to the thread pool
    # one by one, each hand-over costing more CPU than the checks here.
    if len(batch.values) > settings.max_keys_per_request:
        raise TooManyPoints(
            f"values: {len(batch.values)} keys in one request; the limit is "
            f"{settings.max_keys_per_request}"
        )
    if len(batch.steps) > settings.max_points_per_request:
        # Rows are bounded like points, even when most values are null (no step is free).
        raise TooManyPoints(
            f"steps: {len(batch.steps)} steps in one request; the limit is "
            f"{settings.max_points_per_request} points (and steps): split the batch"
        )
    n_points = batch.n_points()
    if n_points > settings.max_points_per_request:
        raise TooManyPoints(
            f"{n_points} points in one request; the limit is {settings.max_points_per_request}: "
            "split the batch"
        )
    result = await run_in_threadpool(
        _store_batch, request.app.state.sessionmaker, run_id, batch, principal.project,
        settings.max_keys_per_run,
    )
    request.app.state.notify_ingest(run_id)
    prometheus.INGEST_BATCHES.inc()
    prometheus.INGEST_POINTS.inc(result.accepted)
    prometheus.INGEST_DUPLICATES.inc(result.duplicates)
    if REPLAY_HEADER in request.headers:
        prometheus.SPOOL_REPLAYS.inc()
        prometheus.SPOOL_REPLAY_POINTS.inc(result.accepted)
    return result


#: ``?keys=a,b`` or ``?keys=a&keys=b`` (a plain string parameter kept only the last ``keys``:
#: the second form silently read one series).
KeysQuery = Annotated[
    list[str] | None,
    Query(description="Keys, comma-separated or repeated (`?keys=a,b` or `?keys=a&keys=b`); "
                      "default all"),
]


StepQuery = Annotated[int | None, Query(ge=0, le=MAX_STEP)]


@router.get("/metrics", response_model=MetricsOut, summary="Read series")
def get_metrics(
    run_id: uuid.UUID,
    session: SessionDep,
    settings: SettingsDep,
    principal: ReadPrincipal,
    keys: KeysQuery = None,
    start: StepQuery = None,
    end: StepQuery = None,
    max_points: Annotated[
        int | None,
        Query(ge=10, le=100_000, description="Downsample to at most this many min/max buckets"),
    ] = None,
) -> MetricsOut:
    """Series in ``[start, end]``. A key the run has no series of answers 404 naming the keys
    it has (as ``forecast?key=`` does): a misspelt key must not read as "no points yet".
    With ``max_points`` each series is cut into equal-width step
    buckets; each bucket reports its last point and its min and max, so spikes stay visible.
    Without it every point is returned, up to ``CURVECAST_MAX_READ_POINTS`` (200,000) in all:
    a larger raw read answers 422 ``read_too_large`` (page with ``start``/``end``, downsample,
    or export ``metrics.csv``, which streams any size)."""
    return read_metrics(session, settings, principal, run_id, keys=parse_keys(keys),
                        start=start, end=end, max_points=max_points, require_keys=True)


def read_metrics(
    session: Session, settings: Settings, principal: Principal, run_id: uuid.UUID, *,
    keys: list[str] | None, start: int | None, end: int | None, max_points: int | None,
    require_keys: bool,
) -> MetricsOut:
    """What ``GET .../metrics`` answers; ``require_keys`` False for the run page's live poll,
    whose charts ask for every key they draw, logged yet or not (absent: an empty series)."""
    return metric_reads.read_series(
        session,
        run_id=run_id,
        keys=keys,
        start=start,
        end=end,
        max_points=max_points,
        allowed_project=principal.project,
        max_raw_points=settings.max_read_points,
        require_keys=require_keys,
    )


#: The CSV export's columns (the offline CLI reads them back).
CSV_HEADER = "key,step,value,wall_time\n"


def _csv_value(value: float) -> str:
    # NaN was measured: written as "NaN"; infinities as "inf"/"-inf", like Python (and pandas).
    return "NaN" if math.isnan(value) else repr(value)


def _csv_chunks(factory: sessionmaker[Session], reader: ExportReader) -> Iterator[str]:
    """The export, one page of points at a time, each page read in its own short session: the
    memory held is one page whatever the run's size, and no transaction stays open while a
    slow client reads."""
    yield CSV_HEADER
    while True:
        with session_scope(factory) as session:
            page = reader.next_page(session)
        if not page:
            return
        yield "".join(
            f"{key},{step},{_csv_value(value)},{'' if wall is None else repr(wall)}\n"
            for key, step, value, wall in page
        )


@router.get("/metrics.csv", summary="Export points as CSV", response_class=StreamingResponse)
def export_csv(
    run_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    principal: ReadPrincipal,
    keys: KeysQuery = None,
) -> StreamingResponse:
    """Every point as ``key,step,value,wall_time`` rows (NaN and ±inf written as such), streamed
    in pages: any size of run, in bounded server memory."""
    series = export_series(
        session, run_id=run_id, keys=parse_keys(keys), allowed_project=principal.project
    )
    return StreamingResponse(
        _csv_chunks(request.app.state.sessionmaker, ExportReader(series)),
        media_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{run_id}.csv"'},
    )
