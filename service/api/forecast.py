"""Forecasts: the loss at a horizon, when a target loss is reached, and the fit history.

Answers come from the latest stored fit (the background worker refits as data arrives); no
request ever fits. Intervals at any horizon and confidence are computed from the stored fit.
"""

from __future__ import annotations

import math
import uuid
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query

from curvecast.service.deps import ReadPrincipal, SessionDep
from curvecast.service.forecast import Fit
from curvecast.service.schemas import (
    MAX_STEP,
    EtaOut,
    ForecastHistory,
    ForecastHistoryPoint,
    ForecastOut,
    IntervalOut,
    PredictionOut,
    TargetAnswer,
    TargetOut,
)
from curvecast.service.store import forecasts as forecast_store
from curvecast.service.store._common import utcnow

router = APIRouter(prefix="/api/v1/runs/{run_id}/forecast", tags=["forecast"])

Confidence = Annotated[float, Query(gt=0.5, lt=1.0, description="Interval coverage")]
Horizon = Annotated[
    int | None, Query(ge=0, le=MAX_STEP, description="Default: the run's total_steps")
]


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def default_horizon(config: dict[str, Any], last_step: int | None) -> int | None:
    """The run's planned ``total_steps``, else its last step."""
    total = config.get("total_steps")
    return int(total) if isinstance(total, int) and total > 0 else last_step


def forecast_out(
    fit: Fit, *, horizon: int | None, confidence: float, target_loss: float | None = None
) -> ForecastOut:
    """The public forecast shape for a fit (shared by the API and the CLI)."""
    # Same shapes as `curvecast forecast --json`: the objects are always there, with null
    # values when there is no forecast (prediction is null only without a horizon).
    prediction = None
    if horizon is not None:
        p = fit.predict(horizon, confidence)
        prediction = PredictionOut(step=horizon, value=_num(p.value), lo=_num(p.lo), hi=_num(p.hi))
    s = fit.f_star(confidence)
    f_star = IntervalOut(value=_num(s.value), lo=_num(s.lo), hi=_num(s.hi))
    target = None
    if target_loss is not None:
        t = fit.steps_to(target_loss, confidence)
        target = TargetOut(loss=target_loss, step=t.step, lo=t.lo, hi=t.hi, reachable=t.reachable)
    return ForecastOut(
        status=fit.status,
        n_points=fit.n_points,
        fitted_upto_step=fit.fitted_upto_step,
        a=_num(fit.a),
        b=_num(fit.b),
        c=_num(fit.c),
        f_star=f_star,
        prediction=prediction,
        target=target,
        confidence=confidence,
        off_model=fit.off_model,
        message=fit.message,
    )


def _pending(confidence: float) -> ForecastOut:
    return ForecastOut(
        status="pending",
        n_points=0,
        fitted_upto_step=None,
        a=None,
        b=None,
        c=None,
        f_star=None,
        prediction=None,
        target=None,
        confidence=confidence,
        message="no fit yet: the worker fits a run seconds after its first points arrive",
    )


@router.get("", response_model=ForecastOut, summary="Forecast the loss at a horizon")
def get_forecast(
    run_id: uuid.UUID,
    session: SessionDep,
    principal: ReadPrincipal,
    horizon: Horizon = None,
    confidence: Confidence = 0.9,
) -> ForecastOut:
    """The loss at ``horizon`` with its interval, f* ≈ c, and the fit's parameters."""
    stored, config, last_step = forecast_store.latest_fit(
        session, run_id=run_id, allowed_project=principal.project
    )
    if stored is None:
        return _pending(confidence)
    out = forecast_out(
        Fit.from_dict(stored.fit),
        horizon=horizon if horizon is not None else default_horizon(config, last_step),
        confidence=confidence,
    )
    return out.model_copy(update={"key": stored.key, "fitted_at": stored.created_at})


@router.get("/target", response_model=TargetAnswer, summary="When will the loss reach L?")
def get_target(
    run_id: uuid.UUID,
    session: SessionDep,
    principal: ReadPrincipal,
    loss: Annotated[float, Query(allow_inf_nan=False, description="Target loss")],
    confidence: Confidence = 0.9,
) -> TargetAnswer:
    """The step at which the loss reaches ``loss`` (with interval) and a wall-clock ETA from
    the run's recent step rate."""
    stored, _config, last_step = forecast_store.latest_fit(
        session, run_id=run_id, allowed_project=principal.project
    )
    if stored is None:
        return TargetAnswer(status="pending", key=None, target=None, eta=None)
    out = forecast_out(
        Fit.from_dict(stored.fit), horizon=None, confidence=confidence, target_loss=loss
    )
    eta = None
    rate = forecast_store.recent_step_rate(session, run_id=run_id, key="loss")
    if rate is None and stored.key != "loss":
        rate = forecast_store.recent_step_rate(session, run_id=run_id, key=stored.key)
    if out.target is not None and out.target.step is not None:
        seconds = None
        if rate and rate > 0 and last_step is not None:
            seconds = max(0.0, (out.target.step - last_step) / rate)
        eta = EtaOut(
            steps_per_second=rate,
            seconds=seconds,
            at=utcnow() + timedelta(seconds=seconds) if seconds is not None else None,
        )
    return TargetAnswer(status=out.status, key=stored.key, target=out.target, eta=eta)


@router.get("/history", response_model=ForecastHistory, summary="How the forecast evolved")
def get_history(
    run_id: uuid.UUID,
    session: SessionDep,
    principal: ReadPrincipal,
    horizon: Horizon = None,
    confidence: Confidence = 0.9,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> ForecastHistory:
    """Each stored fit's forecast of the loss at ``horizon`` (default: total_steps), in the
    order they were made, so one can watch the forecast settle."""
    fits, config = forecast_store.fit_history(
        session, run_id=run_id, allowed_project=principal.project, limit=limit
    )
    if horizon is None:
        horizon = default_horizon(config, None)
    points = []
    for stored in fits:
        out = forecast_out(Fit.from_dict(stored.fit), horizon=horizon, confidence=confidence)
        points.append(
            ForecastHistoryPoint(
                fitted_upto_step=out.fitted_upto_step,
                n_points=out.n_points,
                status=out.status,
                created_at=stored.created_at,
                final=out.prediction,
                f_star=out.f_star,
            )
        )
    return ForecastHistory(run_id=run_id, horizon=horizon, points=points)
