"""Forecasts: the loss at a horizon, when a target loss is reached, and the fit history.

Answers come from the latest stored fit (the background worker refits as data arrives); no
request ever fits. Intervals at any horizon and confidence are computed from the stored fit.
The answers themselves are built by :mod:`curvecast.service.forecast.answer`, the same builder
the pages and the offline CLI use.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query

from curvecast.contract import MAX_STEP
from curvecast.service.deps import ReadPrincipal, SessionDep
from curvecast.service.forecast.answer import forecast_answer, history_answer, target_answer
from curvecast.service.queries import SeriesKey
from curvecast.service.routing import OneHopRoute
from curvecast.service.schemas.forecast import ForecastHistory, ForecastOut, TargetAnswer
from curvecast.service.store import forecasts as forecast_store
from curvecast.service.store._common import utcnow

router = APIRouter(prefix="/api/v1/runs/{run_id}/forecast", tags=["forecast"],
                   route_class=OneHopRoute)

Confidence = Annotated[float, Query(gt=0.5, lt=1.0, description="Interval coverage")]
#: ``?key=`` (declared with the pages' chart routes, which take it too).
Key = SeriesKey
Horizon = Annotated[
    int | None,
    Query(ge=0, le=MAX_STEP, description="Default: the run's total_steps, else its last step"),
]


@router.get("", response_model=ForecastOut, summary="Forecast the loss at a horizon")
def get_forecast(
    run_id: uuid.UUID,
    session: SessionDep,
    principal: ReadPrincipal,
    horizon: Horizon = None,
    confidence: Confidence = 0.9,
    key: Key = None,
) -> ForecastOut:
    """The loss at ``horizon`` with its interval, f* ≈ c, and the fit's parameters; for a
    horizon the run is past, also the loss it had there (``prediction.reached``)."""
    stored, run = forecast_store.latest_fit(
        session, run_id=run_id, allowed_project=principal.project, key=key
    )
    return forecast_answer(
        stored.fit if stored else None,
        config=run.config,
        last_step=run.last_step,
        horizon=horizon,
        confidence=confidence,
        key=stored.key if stored else key,
        fitted_at=stored.created_at if stored else None,
        reached=forecast_store.reached_reader(session, run_id, run.last_step),
    )


@router.get("/target", response_model=TargetAnswer, summary="When will the loss reach L?")
def get_target(
    run_id: uuid.UUID,
    session: SessionDep,
    principal: ReadPrincipal,
    loss: Annotated[float, Query(allow_inf_nan=False, description="Target loss")],
    confidence: Confidence = 0.9,
    key: Key = None,
) -> TargetAnswer:
    """The step at which the loss reaches ``loss`` (with interval) and a wall-clock ETA from
    the run's recent step rate. A target the data already reached is answered from the data
    (``reached``); a finished run gets no ETA, nor does a target the fitted curve reaches only
    after the run's planned ``total_steps`` (``reason`` says which)."""
    stored, run = forecast_store.latest_fit(
        session, run_id=run_id, allowed_project=principal.project, key=key
    )
    return target_answer(
        stored.fit if stored else None,
        loss=loss,
        confidence=confidence,
        key=stored.key if stored else key,
        last_step=run.last_step,
        # The step rate the worker stored with the fit: the request reads nothing else.
        steps_per_second=stored.steps_per_second if stored else None,
        now=utcnow(),
        finished=run.finished,
        total_steps=run.config.total_steps,
    )


@router.get("/history", response_model=ForecastHistory, summary="How the forecast evolved")
def get_history(
    run_id: uuid.UUID,
    session: SessionDep,
    principal: ReadPrincipal,
    horizon: Horizon = None,
    confidence: Confidence = 0.9,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
    key: Key = None,
) -> ForecastHistory:
    """Each stored fit's forecast of the loss at ``horizon``, in the order they were made, so
    one can watch the forecast settle: one row per fit, each naming its series."""
    fits, run = forecast_store.fit_history(
        session, run_id=run_id, allowed_project=principal.project, limit=limit, key=key
    )
    return history_answer(
        run_id,
        fits,
        config=run.config,
        last_step=run.last_step,
        horizon=horizon,
        confidence=confidence,
        key=key,
        reached=forecast_store.reached_reader(session, run_id, run.last_step),
    )
