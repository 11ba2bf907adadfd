"""Decision answers: the JSON shapes of ``GET .../ranking`` and ``GET .../forecast/beat``.

Built only by :mod:`curvecast.service.forecast.decision_answers` (the REST API, the CLI and
the project page show the same objects). A chance that is not known is ``null``, with a
``reason``; docs/decisions.md says what the numbers mean.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["BeatOut", "HorizonSource", "LossAtOut", "RankedRunOut", "RankingOut"]

#: Where a ranking's horizon came from: the request, the runs' largest planned
#: ``total_steps``, their largest last logged step (no run plans one), or nowhere (no run).
HorizonSource = Literal["given", "planned_total_steps", "last_step", "none"]


class LossAtOut(BaseModel):
    """A run's loss at ``step``: forecast with its central interval, or ``observed`` (the run
    got there: ``value``, ``lo`` and ``hi`` are the loss it had)."""

    step: int
    value: float
    lo: float
    hi: float
    observed: bool = Field(
        default=False, description="The loss the run had (smoothed over the last 1% of the "
        "steps up to `step`), not a forecast; for a finished run that ended before `step`, "
        "its final loss.")


class RankedRunOut(BaseModel):
    """One run of a ranking."""

    run_id: uuid.UUID
    name: str
    status: str = Field(description="The run's status (running, finished, failed, ...).")
    key: str | None = Field(default=None, description="The series compared.")
    fit_status: str | None = Field(default=None, description="Its latest fit's status "
                                   "(null: no fit).")
    forecast: LossAtOut | None = Field(default=None, description="The loss at the horizon "
                                       "(null: not known; `reason` says why).")
    p_best: float | None = Field(
        default=None, description="The chance this run has the lowest loss at the horizon "
        "among the comparable runs; null when it is not compared (`reason`).")
    comparable: bool = Field(description="Whether its loss at the horizon is known (observed "
                             "or from an ok fit).")
    reason: str = Field(default="", description="Why there is no p_best.")
    note: str = Field(default="", description="What to know about a known forecast (the run "
                      "ended before the horizon; the horizon is past its planned end).")


class RankingOut(BaseModel):
    """Answer of ``GET /api/v1/projects/{project}/ranking``: the project's runs at a common
    step, most likely best first, then the runs that cannot be compared."""

    project: str
    key: str | None = Field(default=None, description="The series asked for (null: each "
                            "run's default).")
    horizon: int | None = Field(description="The step the runs are compared at.")
    horizon_source: HorizonSource
    confidence: float
    draws: int = Field(description="Monte Carlo draws per run behind p_best.")
    runs: list[RankedRunOut]
    message: str = ""


class BeatOut(BaseModel):
    """Answer of ``GET /api/v1/runs/{run_id}/forecast/beat``: the chance the run's loss at
    ``step`` (its planned end) is below ``loss``."""

    run_id: uuid.UUID
    key: str | None
    fit_status: str | None = Field(description="The latest fit's status (null: no fit yet).")
    loss: float
    step: int | None = Field(description="Where the loss is judged: the run's planned "
                             "total_steps (or the horizon asked for); null when unknown.")
    probability: float | None = Field(
        description="P(loss at step < `loss`): 0 or 1 once observed; from a forecast within "
        "[0.005, 0.995] (the calibration's outermost quantiles); null when not known.")
    forecast: LossAtOut | None
    reason: str = Field(default="", description="Why probability is null.")
    note: str = ""
