"""The run page's live poll in one request.

An open run page asks every 2 s for the run, the points after its cursor, the forecast and the
alerts. As four REST requests, each paid the service's fixed cost of a request (routing,
dependencies, a session and its connection, a thread-pool hand-over) for a few milliseconds of
work: under ``bench/service/load.py`` the page's polls were more requests than every training job's
ingest together. Here the four answers are built in one session, each what its REST route
answers, from the pages' one read path (:mod:`.reads`: the run read once, its newest fit once),
in one transaction, so the page never shows a forecast newer than the points beside it.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict

from curvecast.contract import MAX_STEP
from curvecast.service.deps import SessionDep, SettingsDep
from curvecast.service.queries import SeriesKey, parse_keys
from curvecast.service.routing import OneHopRoute
from curvecast.service.schemas import LossReachedOut, MetricsOut, RunOut
from curvecast.service.schemas.alerts import AlertList
from curvecast.service.schemas.forecast import ForecastOut
from curvecast.service.web import reads
from curvecast.service.web.login import PagePrincipal

router = APIRouter(route_class=OneHopRoute)


class LivePoll(BaseModel):
    """What the run page's poll shows: each part as its REST route answers it."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    run: RunOut
    metrics: MetricsOut
    forecast: ForecastOut
    alerts: AlertList
    #: The run page's "Train loss reached" card (:func:`.reads.loss_reached`).
    loss_reached: LossReachedOut | None = None


@router.get("/dashboards/api/runs/{run_id}/live", response_model=LivePoll)
def live_poll(
    run_id: uuid.UUID,
    session: SessionDep,
    settings: SettingsDep,
    principal: PagePrincipal,
    keys: Annotated[list[str] | None,
                    Query(description="Keys, comma-separated or repeated; none: no points")]
    = None,
    start: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    max_points: Annotated[int | None, Query(ge=10, le=100_000)] = None,
    horizon: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    key: SeriesKey = None,
) -> LivePoll:
    """``GET /api/v1/runs/{id}``, ``.../metrics?keys&start&max_points`` (only with ``keys``),
    ``.../forecast?horizon&key`` and ``.../alerts``, answered together."""
    run = reads.get_run(session, principal, run_id)
    wanted = parse_keys(keys)
    metrics = reads.run_metrics(session, settings, principal, run, wanted, start, max_points)
    fits = reads.run_fits(session, principal, run, key)
    return LivePoll(run=run, metrics=metrics,
                    forecast=reads.answer_forecast(session, run, fits.latest, horizon, key),
                    alerts=reads.run_alerts(session, principal, run),
                    loss_reached=reads.loss_reached(session, run))
