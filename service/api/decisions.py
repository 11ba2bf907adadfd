"""Decisions: which run of a project ends best, and will a run beat a loss.

Read from the latest stored fits (no request fits) through :mod:`curvecast.service.store.decisions`;
the answers are built by :mod:`curvecast.service.forecast.decision_answers`, the builder the CLI
and the project page use. docs/decisions.md says what the chances mean.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Path, Query

from curvecast.contract import MAX_STEP, PROJECT_PATTERN
from curvecast.service.api.forecast import Confidence, Key
from curvecast.service.deps import ReadPrincipal, SessionDep
from curvecast.service.forecast.decision_answers import beat_answer, ranking_answer
from curvecast.service.routing import OneHopRoute
from curvecast.service.schemas.decisions import BeatOut, RankingOut
from curvecast.service.store import decisions as decision_store

router = APIRouter(prefix="/api/v1", tags=["decisions"], route_class=OneHopRoute)

ProjectPath = Annotated[str, Path(pattern=PROJECT_PATTERN)]


@router.get("/projects/{project}/ranking", response_model=RankingOut,
            summary="Which run ends best? The runs at a common step, with P(best)")
def get_ranking(
    project: ProjectPath,
    session: SessionDep,
    principal: ReadPrincipal,
    horizon: Annotated[int | None, Query(
        ge=1, le=MAX_STEP, description="The step to compare at (default: the largest planned "
        "total_steps among the runs not failed, crashed or lost; else their largest last "
        "step)")] = None,
    confidence: Confidence = 0.9,
    key: Key = None,
) -> RankingOut:
    """The project's runs (its newest 1,000) at one step, most likely best first: each with
    its loss there (forecast with interval, or observed once the run got there) and the chance
    it is the lowest (``p_best``). A run whose loss there is not known (no usable fit, a run
    that failed) is listed last, with ``reason``; so is the one comparable run when there is
    only one."""
    runs = decision_store.project_runs(session, project=project,
                                       allowed_project=principal.project, key=key)
    return ranking_answer(project, runs, key=key, horizon=horizon, confidence=confidence)


@router.get("/runs/{run_id}/forecast/beat", response_model=BeatOut,
            summary="Will the run end below a loss? P(loss at its planned end < L)")
def get_beat(
    run_id: uuid.UUID,
    session: SessionDep,
    principal: ReadPrincipal,
    loss: Annotated[float, Query(allow_inf_nan=False, description="The loss to beat")],
    horizon: Annotated[int | None, Query(
        ge=1, le=MAX_STEP, description="Judge at this step instead of the run's planned "
        "total_steps")] = None,
    confidence: Confidence = 0.9,
    key: Key = None,
) -> BeatOut:
    """The chance the run's loss at its planned end (``total_steps``; a run that ended and
    planned none: its last step) is below ``loss``, with the forecast there. Once the run got
    there it is the loss it had (0 or 1); ``probability`` is null, with ``reason``, when the
    forecast cannot tell."""
    run = decision_store.run_input(session, run_id=run_id, allowed_project=principal.project,
                                   key=key)
    return beat_answer(run_id, run, loss=loss, horizon=horizon, confidence=confidence)
