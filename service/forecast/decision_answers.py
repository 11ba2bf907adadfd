"""Decision answers: where :mod:`.chances` becomes what the product shows.

The REST routes (``GET .../ranking``, ``GET .../forecast/beat``), ``curvecast rank`` and the
project page build their answers here. numpy and pydantic only: no I/O, no FastAPI.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from curvecast.service.forecast.chances import (
    DRAWS,
    STOPPED,
    Outlook,
    Ranked,
    RunInput,
    default_horizon,
    outlook,
    rank,
)
from curvecast.service.schemas.decisions import (
    BeatOut,
    HorizonSource,
    LossAtOut,
    RankedRunOut,
    RankingOut,
)

__all__ = ["beat_answer", "beat_step", "ranking_answer"]


def _loss_at(look: Outlook) -> LossAtOut | None:
    if not look.known or look.value is None or look.lo is None or look.hi is None:
        return None
    return LossAtOut(step=look.step, value=look.value, lo=look.lo, hi=look.hi,
                     observed=look.observed)


def _ranked_out(r: Ranked) -> RankedRunOut:
    return RankedRunOut(
        run_id=r.run.run_id, name=r.run.name, status=r.run.status, key=r.run.key,
        fit_status=r.run.fit.status if r.run.fit is not None else None,
        forecast=_loss_at(r.outlook), p_best=r.p_best, comparable=r.outlook.known,
        reason=r.reason, note=r.outlook.note,
    )


def ranking_answer(project: str, runs: Sequence[RunInput], *, key: str | None = None,
                   horizon: int | None = None, confidence: float = 0.9) -> RankingOut:
    """The ranking of ``runs`` at ``horizon`` (None: :func:`~.chances.default_horizon`).

    Its ``message`` says when no chance could be given at all (no runs, no horizon, fewer
    than two comparable runs)."""
    source: HorizonSource = "given"
    if horizon is None:
        horizon, source = default_horizon(runs)
    if horizon is None:
        if not runs:
            message = "no runs in this project yet"
        elif all(r.status in STOPPED for r in runs):
            message = ("every run stopped (failed, crashed or lost): a run that stopped is not "
                       "compared")
        else:
            message = ("no run plans total_steps or has logged a step: there is no step to "
                       "compare at; pass horizon")
        listed = [RankedRunOut(run_id=r.run_id, name=r.name, status=r.status, key=r.key,
                               fit_status=r.fit.status if r.fit is not None else None,
                               comparable=False, reason=message)
                  for r in sorted(runs, key=lambda r: (r.name, str(r.run_id)))]
        return RankingOut(project=project, key=key, horizon=None, horizon_source="none",
                          confidence=confidence, draws=DRAWS, runs=listed, message=message)
    ranked = rank(runs, horizon, confidence=confidence)
    comparable = sum(r.outlook.known for r in ranked)
    message = ""
    if comparable < 2:
        message = (f"{comparable} run{'' if comparable == 1 else 's'} can be compared at step "
                   f"{horizon:,}: a chance of being best needs two")
    return RankingOut(project=project, key=key, horizon=horizon, horizon_source=source,
                      confidence=confidence, draws=DRAWS,
                      runs=[_ranked_out(r) for r in ranked], message=message)


def beat_step(run: RunInput) -> tuple[int | None, str]:
    """Where ``GET .../forecast/beat`` judges a run by default: its planned ``total_steps``;
    for a run that plans none, its last step once it has ended. ``(None, reason)`` otherwise."""
    if run.total_steps is not None:
        return run.total_steps, ""
    if run.status != "running" and run.last_step is not None:
        return run.last_step, ""
    return None, ("the run plans no total_steps, so its end is unknown: pass horizon, or set "
                  "total_steps in the run's config")


def beat_answer(run_id: uuid.UUID, run: RunInput, *, loss: float, horizon: int | None = None,
                confidence: float = 0.9) -> BeatOut:
    """The chance ``run``'s loss at ``horizon`` (default: :func:`beat_step`) is below
    ``loss``, with the forecast there, or the reason there is none."""
    fit_status = run.fit.status if run.fit is not None else None
    step, reason = (horizon, "") if horizon is not None else beat_step(run)
    if step is None:
        return BeatOut(run_id=run_id, key=run.key, fit_status=fit_status, loss=loss, step=None,
                       probability=None, forecast=None, reason=reason)
    look = outlook(run, step, confidence)
    return BeatOut(run_id=run_id, key=run.key, fit_status=fit_status, loss=loss, step=step,
                   probability=look.chance_below(loss), forecast=_loss_at(look),
                   reason=look.reason, note=look.note)
