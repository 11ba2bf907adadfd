"""Decisions from forecasts: the chance a run ends below a loss, and which run ends best.

Pure (numpy only, no I/O): the store reads the runs and their fits, the route and the CLI call
this, and :mod:`.decision_answers` shapes the result.

The predictive distribution of a run's loss at a step is the forecast's own calibrated one:
the quantile function whose ends at probabilities ``p`` and ``1 - p`` are the ends of the
central ``1 - 2p`` interval :meth:`Fit.predict <curvecast.service.forecast.fit.Fit.predict>`
gives (the calibrated quantiles of the standardised error, :mod:`.calibration`), for each of the
calibration's tabulated probabilities (:data:`~.calibration.PROBS`, 0.5% to 99.5%), linear in
between. The calibration measured nothing beyond those ends, so a chance computed from it is
held within them (:data:`MIN_CHANCE` to :data:`MAX_CHANCE`): "below 0.5%", never "impossible".

A run that already got to the step has data there, not a forecast: its loss there is the
smoothed loss it had (the forecast answers' ``reached``), with no uncertainty; so is a
``finished`` run's final loss at any step past its end (it trains no further).

A forecast that does not know says so: a run whose fit is not ``ok`` (``too_early``,
``no_asymptote``, ``off_model``, ``flat``, no fit yet, ...) or whose run ``failed``,
``crashed`` or was ``lost`` gets no chance, and a plain ``reason`` (:func:`outlook`).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal

import numpy as np

from curvecast.contract import LOST_RUN_STATUS, STOPPED_RUN_STATUSES, ForecastStatus
from curvecast.service.forecast import calibration as _cal
from curvecast.service.forecast.curve import FloatArray
from curvecast.service.forecast.fit import Fit

__all__ = [
    "DRAWS",
    "MAX_CHANCE",
    "MIN_CHANCE",
    "PEER_WIDTH_QUANTILE",
    "SEED",
    "Outlook",
    "Ranked",
    "RunInput",
    "chances_best",
    "default_horizon",
    "outlook",
    "pooled_widths",
    "rank",
]

#: The calibrated probabilities the predictive quantile function is tabulated at.
PROBS: Final = np.asarray(_cal.PROBS, dtype=np.float64)
#: A chance from a forecast is held within the calibration's outermost probabilities.
MIN_CHANCE: Final = float(PROBS[0])
MAX_CHANCE: Final = float(PROBS[-1])
#: Draws per run for P(best): its Monte Carlo error is below 0.005 (one standard error).
DRAWS: Final = 10_000
#: The seed of those draws: the same runs and fits give the same chances, every time.
SEED: Final = 20_260_000
_CHUNK: Final = 2_000  # draws per pass: memory grows with runs x chunk, not runs x DRAWS
#: A peer of a forecast in :func:`pooled_widths` was made from at least this much less of the
#: way to the step (a fraction of it): runs logged at slightly different steps are one stage.
PEER_PROGRESS_SLACK: Final = 0.05
#: :func:`pooled_widths` widens a band to this quantile of its peers' widths: a high one, chosen
#: by cross-validation over the recorded sweeps (docs/decisions.md); not the maximum, so that
#: one odd run of a 100-run leaderboard does not set every band.
PEER_WIDTH_QUANTILE: Final = 0.9
#: The run statuses that never get a chance: the run stopped without finishing.
STOPPED: Final = STOPPED_RUN_STATUSES

#: Why a fit of each status gives no chance (every status but ``ok``).
_STATUS_REASONS: Final = {
    ForecastStatus.TOO_EARLY:
        "a forecast needs more steps: the loss is still in the transient at the start of the run",
    ForecastStatus.NO_ASYMPTOTE:
        "a forecast needs more steps: the fit finds no floor yet, so it cannot say where the "
        "loss levels off",
    ForecastStatus.OFF_MODEL:
        "the loss left the fitted curve's shape (a learning-rate decay?): its forecast does "
        "not hold",
    ForecastStatus.FLAT: "the loss is flat: the curve has no decay to extrapolate",
    ForecastStatus.INSUFFICIENT_DATA:
        "a forecast needs more steps: too few points after the burn-in",
    ForecastStatus.NO_CONVERGENCE: "the fit did not converge: there is no forecast",
    ForecastStatus.DIVERGED: "the loss diverged: its latest values are not finite",
}
_PENDING_REASON: Final = "no fit yet: the worker fits a run seconds after its first points arrive"


def _no_loss(_step: int) -> float | None:
    return None


def _no_final() -> tuple[int, float | None] | None:
    return None


@dataclass(frozen=True)
class RunInput:
    """What deciding about one run needs (the store reads it; nothing here reads anything).

    Attributes:
        run_id, name: the run.
        status: the run's status (``running``, ``finished``, ``failed``, ``crashed``,
            ``lost``).
        fit: its latest fit of the series at hand, or None (none yet, or no such series).
        key: that series, if known.
        total_steps: its planned last step (config), if declared.
        last_step: its last logged step, if any.
        loss_at: the loss the series had at a step the run got to (smoothed, as the forecast
            answers' ``reached``), else None (also where the series has no point at or after
            the step).
        final: the series' last step and the loss it had there (None: NaN or infinite), or
            None when the series has no point.
        missing: why the run has no fit of the series asked for ("" when it has, or may yet).
    """

    run_id: uuid.UUID
    name: str
    status: str
    fit: Fit | None
    key: str | None = None
    total_steps: int | None = None
    last_step: int | None = None
    loss_at: Callable[[int], float | None] = field(default=_no_loss, compare=False)
    final: Callable[[], tuple[int, float | None] | None] = field(default=_no_final,
                                                                 compare=False)
    missing: str = ""


@dataclass(frozen=True)
class Outlook:
    """A run's loss at ``step``: observed, a calibrated distribution, or unknown (``reason``).

    ``value``/``lo``/``hi``: the forecast and its central ``confidence`` interval (all three the
    loss itself when ``observed``; None when unknown). ``quantiles``: the predictive quantile
    function at :data:`PROBS` (None when unknown or observed). ``progress``: how far toward
    ``step`` the forecast was made from (the fit's last step over ``step``; None when not a
    forecast). ``note``: what to know about a known answer (the run ended before ``step``;
    ``step`` is past its planned end).
    """

    step: int
    value: float | None = None
    lo: float | None = None
    hi: float | None = None
    observed: bool = False
    quantiles: tuple[float, ...] | None = None
    reason: str = ""
    note: str = ""
    progress: float | None = None

    @property
    def known(self) -> bool:
        """Whether the loss at ``step`` is observed or has a usable distribution."""
        return self.observed or self.quantiles is not None

    def chance_below(self, loss: float) -> float | None:
        """P(loss at ``step`` < ``loss``): 0 or 1 when observed; from the calibrated quantile
        function otherwise, held within [:data:`MIN_CHANCE`, :data:`MAX_CHANCE`] (non-decreasing
        in ``loss``); None when unknown."""
        if self.observed:
            assert self.value is not None
            return 1.0 if self.value < loss else 0.0
        if self.quantiles is None:
            return None
        return float(np.interp(loss, np.asarray(self.quantiles), PROBS))

    def draw(self, rng: np.random.Generator, n: int) -> FloatArray:
        """``n`` draws of the loss at ``step`` (inverse-CDF sampling of the quantile function;
        an observed loss is the same every draw)."""
        if self.observed:
            assert self.value is not None
            return np.full(n, self.value)
        assert self.quantiles is not None
        drawn: FloatArray = np.interp(rng.random(n), PROBS, np.asarray(self.quantiles))
        return drawn


def _quantiles(fit: Fit, step: int) -> tuple[float, ...] | None:
    """The calibrated quantile function of ``fit``'s loss at ``step`` at :data:`PROBS`
    (:meth:`Fit.predict_quantiles`), made non-decreasing (the held band's ends are held per
    confidence); None where ``predict`` has no number."""
    out = fit.predict_quantiles(step, PROBS)
    if not np.isfinite(out).all():
        return None
    return tuple(float(x) for x in np.maximum.accumulate(out))


def outlook(run: RunInput, step: int, confidence: float = 0.9, *,
            level_extending: bool = False) -> Outlook:
    """What is known of ``run``'s loss at ``step`` (module docstring), with a ``reason`` when
    nothing usable is.

    In order: a stopped run (``failed``/``crashed``/``lost``) is unknown; a run that got to
    ``step`` has its loss there observed; a ``finished`` run that ended before it has its final
    loss; otherwise an ``ok`` fit gives the calibrated distribution, any other fit (or none)
    the reason it cannot.

    ``level_extending``: also answer from a ``no_asymptote`` fit, with its band that extends
    the current level by the decay such runs went on to show
    (:func:`~.calibration.transient_band`, calibrated like the ``ok`` band). That band cannot say
    where the loss levels off, so it cannot rank runs, but it can say that a run far above a
    loss will not get below it: the pruner asks exactly that. ``too_early`` stays unknown (the
    loss may still drop steeply as averaging takes over).
    """
    if run.status in STOPPED:
        # "the run failed", "the run crashed", "the run was lost"
        ended = "was lost" if run.status == LOST_RUN_STATUS else run.status
        if run.last_step is None or run.last_step < step:
            return Outlook(step, reason=f"the run {ended}: it will not train to step {step:,}")
        return Outlook(step, reason=f"the run {ended}: a run that stopped is not compared")
    if run.missing:
        return Outlook(step, reason=run.missing)
    if run.last_step is not None and run.last_step >= step:
        seen = run.loss_at(step)
        if seen is not None and math.isfinite(seen):
            return Outlook(step, value=seen, lo=seen, hi=seen, observed=True)
    if run.status == "finished" and (end := run.final()) is not None and end[0] <= step:
        # The series ended at or before the step (an eval series may end before the run's
        # last step): the run trains no further, its last loss stands.
        last, final = end
        note = ("" if last == step else
                f"ended at step {last:,}: its final loss, as it trains no further")
        if final is not None and math.isfinite(final):
            return Outlook(step, value=final, lo=final, hi=final, observed=True, note=note)
        return Outlook(step, reason=f"the run ended at step {last:,} without a finite loss")
    fit = run.fit
    if fit is None:
        return Outlook(step, reason=_PENDING_REASON)
    if fit.status != ForecastStatus.OK and not (
            level_extending and fit.status == ForecastStatus.NO_ASYMPTOTE):
        reason = _STATUS_REASONS.get(fit.status, f"the fit's status is {fit.status}")
        if fit.status == ForecastStatus.TOO_EARLY and fit.useful_from_step is not None:
            reason += f" (a useful forecast from about step {fit.useful_from_step:,.0f})"
        return Outlook(step, reason=reason)
    quantiles = _quantiles(fit, step)
    if quantiles is None:
        where = (f"step {step:,} is before the fitted range" if fit.before_fitted_range(step)
                 else f"the fit has no forecast at step {step:,}")
        return Outlook(step, reason=where)
    p = fit.predict(step, confidence)
    note = ""
    if run.total_steps is not None and step > run.total_steps:
        note = (f"step {step:,} is past the run's planned end ({run.total_steps:,}): the "
                "forecast is of the run had it gone on")
    made_at = fit.fitted_upto_step if fit.fitted_upto_step is not None else run.last_step
    return Outlook(step, value=float(p.value), lo=float(p.lo), hi=float(p.hi),
                   quantiles=quantiles, note=note,
                   progress=None if made_at is None else float(made_at) / step)


def _stream(seed: int, run_id: uuid.UUID) -> np.random.Generator:
    """The draws of one run: seeded by the run's id, so a run's draws do not depend on which
    other runs are compared, nor in what order."""
    return np.random.default_rng([seed, *run_id.bytes])


def pooled_widths(outlooks: Sequence[Outlook],
                  quantile: float = PEER_WIDTH_QUANTILE) -> list[Outlook]:
    """``outlooks`` with each forecast's band, relative to its median, widened around that
    median to the ``quantile`` of its peers' bands when narrower: the peers are the forecasts
    among them made from at least as far along (``progress`` no more than
    :data:`PEER_PROGRESS_SLACK` below its own), itself included.

    Runs of one task cut at one point of their runs have bands of different widths, and the
    narrower are not better known: their fits saw a calmer stretch, while the final losses of
    such runs differ by more than any one fit's noise says (seeds, data order). Drawn
    independently, a run with a narrow band almost never lost to a wide one, so the chances of
    near-tied runs came out too sure (the reliability table in BENCHMARKS.md, "P(best)
    calibration on the recorded sweeps", where the quantile was chosen by cross-validation
    over sweeps). A run less far along has a wide band for that reason alone, so it widens no
    band of a run further along. Observed losses and unknown outlooks are left as they are.
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {quantile}")
    # Each forecast's progress, median and relative width; a forecast whose median is 0 has no
    # relative width and is left as it is.
    shape = {id(o): (o.progress or 0.0, mid, width) for o in outlooks
             if o.quantiles is not None and not o.observed
             and math.isfinite(width := _relative_width(o, mid := _median(o)))}
    out = []
    for o in outlooks:
        if id(o) not in shape:
            out.append(o)
            continue
        here, mid, own = shape[id(o)]
        pooled = float(np.quantile([w for progress, _, w in shape.values()
                                    if progress >= here - PEER_PROGRESS_SLACK], quantile))
        if pooled <= own:
            out.append(o)
            continue
        assert o.quantiles is not None
        q = np.asarray(o.quantiles)
        wide = mid + (pooled / max(own, 1e-12)) * (q - mid)
        if q[0] >= 0.0:  # a loss that cannot go below 0 is not drawn below it
            wide = np.maximum(wide, 0.0)
        out.append(replace(o, quantiles=tuple(float(x) for x in wide)))
    return out


def _median(o: Outlook) -> float:
    """The median of ``o``'s predictive distribution (its quantile function at 0.5)."""
    assert o.quantiles is not None
    return float(np.interp(0.5, PROBS, np.asarray(o.quantiles)))


def _relative_width(o: Outlook, mid: float) -> float:
    """The width of ``o``'s predictive distribution between its outermost tabulated
    probabilities, over the size of its median ``mid`` (NaN where it is 0)."""
    assert o.quantiles is not None
    return (o.quantiles[-1] - o.quantiles[0]) / abs(mid) if mid != 0 else math.nan


def chances_best(runs: Sequence[tuple[uuid.UUID, Outlook]], *, draws: int = DRAWS,
                 seed: int = SEED, width_quantile: float | None = PEER_WIDTH_QUANTILE
                 ) -> list[float | None]:
    """P(each run has the lowest loss at the common step), one per entry of ``runs``.

    Monte Carlo: ``draws`` joint draws, each run's loss drawn from its own outlook
    **independently of the others** (runs share no noise in this model, though runs of one
    project often do; the chances are then less extreme than a paired comparison would give),
    each forecast's band first widened to the ``width_quantile`` of its peers' widths
    (:func:`pooled_widths`; None draws from the bands as they are); a tie splits the draw
    equally.
    Deterministic: each run's draws come from a numpy generator seeded by ``seed`` and its id.
    Runs whose outlook is unknown get None; so does every run when fewer than two are known
    (one run alone is never "best"). The known chances sum to 1.
    """
    known = [i for i, (_, o) in enumerate(runs) if o.known]
    out: list[float | None] = [None] * len(runs)
    if len(known) < 2:
        return out
    if width_quantile is not None:
        runs = list(zip([r for r, _ in runs],
                        pooled_widths([o for _, o in runs], width_quantile), strict=True))
    streams = [_stream(seed, runs[i][0]) for i in known]
    credit = np.zeros(len(known))
    done = 0
    while done < draws:
        n = min(_CHUNK, draws - done)
        losses = np.vstack([runs[i][1].draw(rng, n) for i, rng in zip(known, streams,
                                                                        strict=True)])
        best = losses == losses.min(axis=0)
        credit += (best / best.sum(axis=0)).sum(axis=1)
        done += n
    for i, c in zip(known, credit / draws, strict=True):
        out[i] = float(c)
    return out


def default_horizon(runs: Sequence[RunInput]
                    ) -> tuple[int | None, Literal["planned_total_steps", "last_step", "none"]]:
    """The step to compare ``runs`` at when none is asked for, and where it came from.

    Among the runs that may still be compared (not ``failed``, ``crashed`` or ``lost``): the
    largest planned ``total_steps`` (``"planned_total_steps"``; when they all plan the same,
    that common end), else the largest last logged step (``"last_step"``, for runs that plan
    none). ``(None, "none")`` when no run says anything. The largest planned end compares every
    run where the longest of them will be: a run planned shorter is compared on its final loss
    once it has finished, and on its curve carried on until then (its ``note`` says so).
    """
    live = [r for r in runs if r.status not in STOPPED]
    planned = [r.total_steps for r in live if r.total_steps is not None]
    if planned:
        return max(planned), "planned_total_steps"
    logged = [r.last_step for r in live if r.last_step is not None and r.last_step > 0]
    if logged:
        return max(logged), "last_step"
    return None, "none"


@dataclass(frozen=True)
class Ranked:
    """One run of a ranking: its outlook at the common step and its chance of being best
    (None with ``reason`` when it cannot be compared)."""

    run: RunInput
    outlook: Outlook
    p_best: float | None
    reason: str


def rank(runs: Sequence[RunInput], step: int, *, confidence: float = 0.9,
         draws: int = DRAWS, seed: int = SEED) -> list[Ranked]:
    """``runs`` at ``step``, best first: the comparable runs by P(best) (then by the loss
    forecast, then name), then the others by name, each with the reason it is not compared."""
    outlooks = [outlook(r, step, confidence) for r in runs]
    chances = chances_best([(r.run_id, o) for r, o in zip(runs, outlooks, strict=True)],
                           draws=draws, seed=seed)
    ranked = []
    for run, look, p in zip(runs, outlooks, chances, strict=True):
        reason = look.reason
        if look.known and p is None:
            reason = (f"the only run that can be compared at step {step:,}: 'best' needs "
                      "another")
        ranked.append(Ranked(run, look, p, reason))

    def order(r: Ranked) -> tuple[int, float, float, str, str]:
        group = 0 if r.p_best is not None else 1 if r.outlook.known else 2
        value = r.outlook.value if r.outlook.value is not None else math.inf
        return group, -(r.p_best or 0.0), value, r.run.name, str(r.run.run_id)

    return sorted(ranked, key=order)
