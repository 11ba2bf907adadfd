"""Forecast answers: the ONE place a :class:`Fit` becomes what the product shows.

The REST routes (``GET .../forecast``, ``/target``, ``/history``), the pages (the runs list, the
run page's band) and the offline ``curvecast forecast`` command all build their answers here, so
one fit gives one JSON shape and one set of statuses everywhere. The default horizon is the
contract's :meth:`RunConfig.horizon <curvecast.contract.RunConfig.horizon>` (``total_steps``,
else the last step logged) for all of them. numpy and pydantic only: no scipy, no FastAPI.

Functions:

* :func:`forecast_answer` -- a :class:`ForecastOut` for a fit (or the ``pending`` answer when
  there is none yet) at a horizon, optionally with when a target loss is reached.
* :func:`target_answer` -- a :class:`TargetAnswer`: when the loss reaches a target, with a
  wall-clock ETA from the run's step rate.
* :func:`history_answer` -- a :class:`ForecastHistory`: each stored fit's forecast at one horizon.
* :func:`band` -- the forecast interval at many steps at once (the pages' band), as arrays.
* :func:`offline_json` -- the subset of a :class:`ForecastOut` that ``curvecast forecast --json``
  prints (:data:`~curvecast.service.schemas.forecast.OFFLINE_KEYS`).

Every function takes a parsed :class:`Fit`: a stored fit is parsed once per request
(``Fit.from_dict``, in the store) and passed along. The loss a run reached at the horizon comes
from the caller, through a :data:`~.reached.ReachedReader` (the rule is :mod:`.reached`'s).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import numpy as np

from curvecast.contract import ForecastStatus, RunConfig
from curvecast.service.forecast.curve import FloatArray, finite_or_none
from curvecast.service.forecast.fit import Fit
from curvecast.service.forecast.reached import ReachedReader
from curvecast.service.schemas.forecast import (
    OFFLINE_KEYS,
    EtaOut,
    ForecastHistory,
    ForecastHistoryPoint,
    ForecastOut,
    IntervalOut,
    PredictionOut,
    TargetAnswer,
    TargetOut,
)

__all__ = [
    "Band",
    "DatedFit",
    "band",
    "forecast_answer",
    "history_answer",
    "offline_json",
    "target_answer",
]

_PENDING_MESSAGE = "no fit yet: the worker fits a run seconds after its first points arrive"


class DatedFit(Protocol):
    """A stored fit as the history needs it (the store's ``StoredFit`` is one)."""

    @property
    def fit(self) -> Fit:
        """The parsed fit."""

    @property
    def key(self) -> str:
        """The series it fitted."""

    @property
    def created_at(self) -> datetime:
        """When the worker made it."""


def _prediction(fit: Fit, step: int | None, confidence: float,
                reached: float | None = None) -> PredictionOut | None:
    if step is None:
        return None
    p = fit.predict(step, confidence)
    return PredictionOut(
        step=step, value=finite_or_none(p.value), lo=finite_or_none(p.lo), hi=finite_or_none(p.hi),
        reached=finite_or_none(reached),
    )


def _before_the_fit(fit: Fit, step: int | None, reached: float | None = None) -> str:
    """Why a step before the fitted range has no forecast ("" for any other step)."""
    start = fit.fitted_from_step
    if step is None or start is None or not fit.has_forecast or not fit.before_fitted_range(step):
        return ""
    where = "prediction.reached" if reached is not None else "GET .../metrics"
    return (f"step {step} is before the fitted range (steps {start:.0f} to "
            f"{fit.fitted_upto_step or start:.0f}): the model describes the loss from there on, "
            f"not before; the loss the run had there is in {where}")


def _f_star(fit: Fit, confidence: float) -> IntervalOut:
    s = fit.f_star(confidence)
    return IntervalOut(
        value=finite_or_none(s.value), lo=finite_or_none(s.lo), hi=finite_or_none(s.hi)
    )


def whole_step(step: float | None) -> int | None:
    """The first training step at or after ``step`` (a fitted crossing between two steps is
    reached at the later one), forgiving float fuzz: 20000.000000000007 is step 20,000."""
    if step is None or not math.isfinite(step):
        return None
    return math.ceil(step - 1e-9 * max(1.0, abs(step)))


def _target(fit: Fit, loss: float, confidence: float, total_steps: int | None) -> TargetOut:
    """When the fitted curve reaches ``loss``, in whole steps; past the planned
    ``total_steps``, marked ``past_planned_end`` with the ``reason`` that the run is not
    planned to get there (the step stays the curve's)."""
    t = fit.steps_to(loss, confidence)
    step = whole_step(t.step)
    past_end = (total_steps is not None and t.reachable and not t.reached and step is not None
                and step > total_steps)
    reason = (f"after the run's planned last step ({total_steps:,}): not in this run; step is "
              "where the fitted curve puts it, were the run longer") if past_end else t.reason
    return TargetOut(loss=loss, step=step, lo=whole_step(t.lo), hi=whole_step(t.hi),
                     reachable=t.reachable,
                     reached=t.reached, reason=reason, past_planned_end=past_end)


def forecast_answer(
    fit: Fit | None,
    *,
    config: RunConfig,
    last_step: int | None,
    horizon: int | None = None,
    confidence: float = 0.9,
    target_loss: float | None = None,
    key: str | None = None,
    fitted_at: datetime | None = None,
    reached: ReachedReader | None = None,
) -> ForecastOut:
    """The forecast of one fit: parameters, f*, the loss at a horizon, maybe a target.

    Args:
        fit: the fit, or None when the run has none yet (the answer is then ``pending``).
        config: the run's config; gives the default horizon.
        last_step: the run's last logged step (the horizon when the config plans none).
        horizon: the step to forecast; None: ``config.horizon(last_step)``.
        confidence: interval coverage in (0, 1).
        target_loss: also say when the loss reaches this value.
        key: the series that was fitted.
        fitted_at: when the fit was made.
        reached: reads the loss the run had at the horizon, once it got there, for ``key``
            (:data:`ReachedReader`); the answer gives it beside the forecast.

    Returns:
        The answer. Its objects are always present (with null numbers when the fit carries no
        forecast); ``prediction`` is null only when there is no horizon at all.
    """
    if fit is None:
        return ForecastOut(
            status=ForecastStatus.PENDING, n_points=0, fitted_upto_step=None, a=None, b=None,
            c=None, f_star=None, prediction=None, target=None, key=key, confidence=confidence,
            message=_PENDING_MESSAGE,
        )
    if horizon is None:
        horizon = config.horizon(last_step)
    at_horizon = reached(key, horizon) if reached is not None and horizon is not None else None
    return ForecastOut(
        status=fit.status,
        n_points=fit.n_points,
        fitted_upto_step=fit.fitted_upto_step,
        a=finite_or_none(fit.a),
        b=finite_or_none(fit.b),
        c=finite_or_none(fit.c),
        f_star=_f_star(fit, confidence),
        prediction=_prediction(fit, horizon, confidence, at_horizon),
        target=(None if target_loss is None
                else _target(fit, target_loss, confidence, config.total_steps)),
        key=key,
        burn_in=finite_or_none(fit.burn_in),
        burn_in_source=fit.burn_in_source,
        fitted_at=fitted_at,
        confidence=confidence,
        off_model=fit.off_model,
        useful_from_step=finite_or_none(fit.useful_from_step),
        assumes_constant_lr=fit.assumes_constant_lr,
        message=" ".join(m for m in (fit.message, _before_the_fit(fit, horizon, at_horizon))
                         if m),
    )


def target_answer(
    fit: Fit | None,
    *,
    loss: float,
    confidence: float,
    key: str | None,
    last_step: int | None,
    steps_per_second: float | None,
    now: datetime,
    finished: bool = False,
    total_steps: int | None = None,
) -> TargetAnswer:
    """When the loss reaches ``loss``, with a wall-clock ETA.

    Args:
        fit: the run's latest fit, or None (the answer is then ``pending``).
        loss: the target loss.
        confidence: interval coverage in (0, 1).
        key: the series that was fitted.
        last_step: the run's last logged step (where the ETA counts from).
        steps_per_second: the run's recent step rate, if known.
        now: the current time (the ETA's ``at`` is relative to it).
        finished: the run has ended: there is no pace to extrapolate.
        total_steps: the run's planned last step (its config's), if any.

    Returns:
        The answer; ``eta`` is null when the target is never reached, was already reached,
        the run has ended, or the fitted curve gets there only after ``total_steps`` (then
        the target's ``past_planned_end`` is true and its ``reason`` says so), and its
        ``seconds`` null without a positive step rate.
    """
    if fit is None:
        return TargetAnswer(status=ForecastStatus.PENDING, key=key, target=None, eta=None)
    # Past the planned end, a time "at the current pace" would be one the run will not last:
    # the target's reason says so, and there is no ETA.
    target = _target(fit, loss, confidence, total_steps)
    if finished and target.reachable and not target.reached and target.step is not None:
        # The run will not get there unless resumed: the step is the fitted curve's, had it
        # gone on ("forecast at step 2,000" read as a promise on a run that ended there).
        target = target.model_copy(update={"reason": _ended_before(key, last_step)})
    eta = None
    if (target.step is not None and not target.reached and not finished
            and not target.past_planned_end):
        seconds = None
        if steps_per_second and steps_per_second > 0 and last_step is not None:
            seconds = max(0.0, (target.step - last_step) / steps_per_second)
        eta = EtaOut(
            steps_per_second=steps_per_second,
            seconds=seconds,
            at=now + timedelta(seconds=seconds) if seconds is not None else None,
        )
    return TargetAnswer(status=fit.status, key=key, target=target, eta=eta)


def _ended_before(key: str | None, last_step: int | None) -> str:
    """``reason`` of a target a run that ended did not reach (the data never got there)."""
    where = f" at step {last_step:,}" if last_step is not None else ""
    return (f"not reached: the run ended{where} before its smoothed {key or 'loss'} got "
            "there; step is where the fitted curve puts it, had the run gone on")


def history_answer(
    run_id: uuid.UUID,
    fits: Iterable[DatedFit],
    *,
    config: RunConfig,
    last_step: int | None,
    horizon: int | None = None,
    confidence: float = 0.9,
    key: str | None = None,
    reached: ReachedReader | None = None,
) -> ForecastHistory:
    """Each fit's forecast of the loss at one horizon, in the order given (oldest first), so
    one can watch the forecast settle.

    Args:
        run_id: the run.
        fits: its stored fits.
        config: the run's config; gives the default horizon.
        last_step: the run's last logged step (the horizon when the config plans none).
        horizon: the step to forecast; None: ``config.horizon(last_step)``.
        confidence: interval coverage in (0, 1).
        key: the series asked for (None: the default series).
        reached: reads the loss the run had at the horizon once it got there
            (:data:`ReachedReader`); each row's ``final`` gives its series' (the default series
            may have switched mid-run: read once per series).
    """
    if horizon is None:
        horizon = config.horizon(last_step)
    fits = list(fits)
    at_horizon: dict[str, float | None] = {}
    if reached is not None and horizon is not None:
        at_horizon = {k: reached(k, horizon) for k in {stored.key for stored in fits}}
    points = [
        ForecastHistoryPoint(
            fitted_upto_step=stored.fit.fitted_upto_step,
            n_points=stored.fit.n_points,
            status=stored.fit.status,
            key=stored.key,
            created_at=stored.created_at,
            final=_prediction(stored.fit, horizon, confidence, at_horizon.get(stored.key)),
            f_star=_f_star(stored.fit, confidence),
        )
        for stored in fits
    ]
    if key is None and points:
        key = points[-1].key
    return ForecastHistory(run_id=run_id, key=key, horizon=horizon, points=points)


@dataclass(frozen=True)
class Band:
    """The forecast at many steps: the central value and the interval's ends (NaN where there
    is no forecast), one entry per step."""

    steps: FloatArray
    lo: FloatArray
    mid: FloatArray
    hi: FloatArray


def band(fit: Fit | None, steps: Sequence[float] | FloatArray, confidence: float = 0.9) -> Band:
    """The forecast interval at each of ``steps`` (one call per page, no REST round trips).

    Args:
        fit: the fit, or None (all NaN).
        steps: where to evaluate it.
        confidence: interval coverage in (0, 1).
    """
    at = np.asarray(steps, dtype=np.float64)
    if fit is None:
        nan = np.full(at.size, math.nan)
        return Band(steps=at, lo=nan, mid=nan.copy(), hi=nan.copy())
    mid, lo, hi = fit.predict_many(at, confidence)
    return Band(steps=at, lo=lo, mid=mid, hi=hi)


def offline_json(answer: ForecastOut) -> dict[str, Any]:
    """The keys of ``answer`` that ``curvecast forecast --json`` prints, JSON-ready."""
    return answer.model_dump(mode="json", include=set(OFFLINE_KEYS))
