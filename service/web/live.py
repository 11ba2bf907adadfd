"""The run page's live poll in one request.

An open run page asks every 2 s for the run, the points after its cursor, the forecast and the
alerts. As four REST requests, each paid the service's fixed cost of a request (routing,
dependencies, a session and its connection, a thread-pool hand-over) for a few milliseconds of
work: under ``bench/service/load.py`` the page's polls were more requests than every training job's
ingest together. Here the four answers are built in one session: each is exactly what its REST
route answers (the route functions themselves are called), read in one transaction, so the page
never shows a forecast newer than the points beside it.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict

from curvecast.contract import MAX_STEP
from curvecast.service.api import alerts as alerts_api
from curvecast.service.api import forecast as forecast_api
from curvecast.service.api import metrics as metrics_api
from curvecast.service.api import runs as runs_api
from curvecast.service.deps import SessionDep, SettingsDep
from curvecast.service.queries import SeriesKey, parse_keys
from curvecast.service.routing import OneHopRoute
from curvecast.service.schemas import LossReachedOut, MetricsOut, RunOut
from curvecast.service.schemas.alerts import AlertList
from curvecast.service.schemas.forecast import ForecastOut
from curvecast.service.store import dashboard as dashboard_store
from curvecast.service.web.login import PagePrincipal

router = APIRouter(route_class=OneHopRoute)


class LivePoll(BaseModel):
    """What the run page's poll shows: each part as its REST route answers it."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    run: RunOut
    metrics: MetricsOut
    forecast: ForecastOut
    alerts: AlertList
    #: The run page's "Train loss reached" card (``store.dashboard.run_loss_reached``).
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
    run = runs_api.get_run(run_id, session, principal)
    wanted = parse_keys(keys)
    metrics = (
        metrics_api.read_metrics(session, settings, principal, run_id, keys=wanted,
                                 start=start, end=None, max_points=max_points,
                                 require_keys=False)
        if wanted else MetricsOut(run_id=run_id, series=[])
    )
    forecast = forecast_api.get_forecast(run_id, session, principal, horizon=horizon,
                                         confidence=0.9, key=key)
    alerts = alerts_api.run_alerts(run_id, session, principal, state=None, limit=100)
    reached = dashboard_store.run_loss_reached(session, run_id=run_id,
                                               allowed_project=principal.project)
    return LivePoll(run=run, metrics=metrics, forecast=forecast, alerts=alerts,
                    loss_reached=reached)
