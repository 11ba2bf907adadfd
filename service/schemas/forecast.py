"""Forecast answers: the JSON shapes of ``GET .../forecast*``, the pages and ``curvecast forecast``.

Built only by :mod:`curvecast.service.forecast.answer`; pydantic only (no FastAPI), so the
offline CLI prints the very same objects the REST API returns. Numbers that do not exist (no
forecast, an unreachable target) are ``null``.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, Field

from curvecast.contract import ForecastStatus

__all__ = [
    "OFFLINE_KEYS",
    "EtaOut",
    "ForecastHistory",
    "ForecastHistoryPoint",
    "ForecastOut",
    "IntervalOut",
    "PredictionOut",
    "TargetAnswer",
    "TargetOut",
]


class IntervalOut(BaseModel):
    """A value with a two-sided interval (``null`` when there is no forecast)."""

    value: float | None
    lo: float | None
    hi: float | None


class PredictionOut(IntervalOut):
    """The forecast loss at ``step``; once the run got there, also the loss it had there."""

    step: int
    reached: float | None = Field(
        default=None,
        description="The loss the run had at `step`, once the series has a point at or after "
        "it: the median of its points over the last 1% of the steps up to `step` (where none "
        "falls there, its last point before it), so one noisy batch is not taken for the "
        "loss; null before that, or where the series' last value there is NaN or infinite",
    )


class TargetOut(BaseModel):
    """When the run reaches ``loss``: central ``step`` and interval [``lo``, ``hi``].

    ``reached``: the data already got there (``step`` is the first logged step by which the
    smoothed series was at or below ``loss``). ``reachable`` is false when the target is below
    the loss floor, below f*'s interval or at or below the fitted asymptote; ``reason`` says
    which. For a run
    that ended without reaching it, ``reason`` says so, and ``step`` is where the fitted curve
    puts it had the run gone on; so it does for a target the fitted curve reaches only after
    the run's planned ``total_steps`` (and there is no ETA).

    ``past_planned_end``: the fitted curve reaches ``loss`` only after the run's planned
    ``total_steps`` (the data have not got there): the run as planned will not, whatever its
    status. Scripts read this instead of the wording of ``reason``.

    Steps are whole training steps: the first step at or after the fitted crossing.
    """

    loss: float
    step: int | None
    lo: int | None
    hi: int | None
    reachable: bool
    reached: bool = False
    reason: str = ""
    past_planned_end: bool = False


class ForecastOut(BaseModel):
    """A forecast: the keys of ``curvecast forecast --json`` (:data:`OFFLINE_KEYS`), plus where
    it came from."""

    status: ForecastStatus
    n_points: int
    fitted_upto_step: float | None
    a: float | None
    b: float | None
    c: float | None
    f_star: IntervalOut | None
    prediction: PredictionOut | None
    target: TargetOut | None
    key: str | None = Field(default=None, description="The series that was fitted.")
    burn_in: float | None = Field(
        default=None, description="The first step the fit used (the burn-in before it is skipped)."
    )
    burn_in_source: str | None = Field(
        default=None, description="Where the burn-in came from: config:c_warmup, "
        "config:warmup_steps, data, or given.",
    )
    fitted_at: datetime | None = Field(
        default=None, description="When the worker stored the fit. The data it saw ends at "
        "fitted_upto_step: points stored while the fit ran reach the next fit, so wait on "
        "fitted_upto_step, not on this time, for a fit that covers a given step.",
    )
    confidence: float = 0.9
    off_model: bool = False
    useful_from_step: float | None = Field(
        default=None, description="For status too_early: the step from which a useful forecast "
        "is expected.",
    )
    assumes_constant_lr: bool = Field(
        default=False, description="An ok forecast of a run that declares no lr_schedule, logs "
        "no learning rate and is not schedule-free: it assumes the rate does not decay (the "
        "message says so). A declared or logged decay makes the status off_model instead.",
    )
    message: str = ""


#: The keys of :class:`ForecastOut` that ``curvecast forecast --json`` prints: an offline fit has
#: no stored series or fit time, and its text summary carries the rest.
OFFLINE_KEYS = frozenset(
    {"status", "n_points", "fitted_upto_step", "a", "b", "c", "f_star", "prediction", "target"}
)


class EtaOut(BaseModel):
    """Wall-clock estimate from the run's recent step rate."""

    steps_per_second: float | None
    seconds: float | None
    at: datetime | None


class TargetAnswer(BaseModel):
    """Answer of ``GET .../forecast/target``."""

    status: ForecastStatus
    key: str | None
    target: TargetOut | None
    eta: EtaOut | None


class ForecastHistoryPoint(BaseModel):
    """One fit of the history: the final-loss forecast made with data up to a step."""

    fitted_upto_step: float | None
    n_points: int
    status: ForecastStatus
    key: str
    created_at: datetime
    final: PredictionOut | None
    f_star: IntervalOut | None


class ForecastHistory(BaseModel):
    """How the forecast of the loss at ``horizon`` evolved as the run streamed."""

    run_id: uuid.UUID
    key: str | None = Field(default=None, description="The series of these fits (null: none yet).")
    horizon: int | None
    points: list[ForecastHistoryPoint]
