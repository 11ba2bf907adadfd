"""Optuna integration: ``CurvecastPruner``, which stops the trials a forecast says cannot win.

Usage::

    import optuna
    from curvecast.integrations.optuna import CurvecastPruner

    def objective(trial):
        lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        for step in range(1, 3001):
            loss = train_one_step(lr)
            if step % 30 == 0:
                trial.report(eval_loss(), step)
                if trial.should_prune():
                    raise optuna.TrialPruned()
        return eval_loss()

    study = optuna.create_study(pruner=CurvecastPruner(total_steps=3000))
    study.optimize(objective, n_trials=20)

After every report the pruner fits ``a/sqrt(t+b)+c`` to the trial's intermediate values with the
service's own fit (:func:`~curvecast.service.forecast.solver.fit_curve`, offline: no server),
and asks the decision core (:mod:`curvecast.service.forecast.chances`) for the chance that the
trial's loss at its planned last step ends below the best completed trial's value (or a
``target``). It prunes when that chance falls below ``threshold``. The chance comes from an
``ok`` fit's calibrated band or, when the fit finds no floor yet (``no_asymptote``: a loss that
is noisy, climbs or still falls fast), from the calibrated band that extends the current level
(:func:`~curvecast.service.forecast.chances.outlook`'s ``level_extending``): such a band cannot
say where the loss ends, but it can say that a trial far above the best will not get below it.
A forecast that does not know says so and the trial goes on: no completed trial yet, too few
steps, a fit that is ``too_early``, ``off_model`` (a decaying learning rate), ``flat``, ...
With ``sweep_correction=True`` the forecast is also corrected by how the completed trials'
forecasts erred (:mod:`curvecast.service.forecast.sweep_correction`).

:func:`decide` is the whole decision, pure (no I/O, no Optuna): the pruner, the tests and the
pruning bench call it. With ``url`` the pruner also streams each trial to a curvecast service
as a run (:mod:`curvecast.integrations._optuna_runs`), to watch the sweep there; the decisions
stay local. Needs ``pip install 'curvecast[optuna]'``.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from curvecast.integrations._optuna_runs import TrialRuns
from curvecast.service.forecast.chances import Outlook, RunInput, outlook
from curvecast.service.forecast.solver import fit_curve
from curvecast.service.forecast.sweep_correction import Peer, corrected

__all__ = [
    "DEFAULT_MIN_PROGRESS", "DEFAULT_THRESHOLD", "CurvecastPruner", "Finished", "PruneDecision",
    "decide",
]

#: Prune below a 5% chance of beating the best: about one good trial in twenty may be lost
#: (the chances are calibrated), for the steps of every hopeless one.
DEFAULT_THRESHOLD: Final = 0.05
#: The user attributes a trial may set to override the pruner's ``total_steps`` and ``config``.
TOTAL_STEPS_ATTR: Final = "total_steps"
CONFIG_ATTR: Final = "curvecast_config"
#: Never prune before this fraction of the planned run: the forecast's calibration was measured
#: on cuts from 8% of a run on (bench/forecast/forecast_calibrate.py), and an earlier ``ok``
#: fit of a few points past the burn-in is overconfident.
DEFAULT_MIN_PROGRESS: Final = 0.1
_TRIAL_ID: Final = uuid.UUID(int=0)
#: The sweep correction reads the completed trials that ended lowest, at most this many: each
#: costs a fit of its reports up to the trial's point of its run (cached once made), and the
#: trials that ended far above the best say least about how it erred.
SWEEP_PEERS: Final = 5


@dataclass(frozen=True)
class Finished:
    """A completed trial, as the sweep correction reads it: its reported ``values`` at
    ``steps``, its planned last step, its objective ``value`` and its run ``config``."""

    steps: tuple[int, ...]
    values: tuple[float, ...]
    total_steps: int
    value: float
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PruneDecision:
    """What :func:`decide` concluded about one trial after its latest report.

    Attributes:
        prune: stop the trial now.
        chance: P(its loss at ``horizon`` < ``best``) from the calibrated forecast; None when
            the forecast does not know (``reason`` says why).
        step: its latest reported step (None: nothing reported).
        horizon: its planned last step.
        best: the value to beat (the best, or the target, less the ``margin``).
        fit_status: the status of the fit of its intermediate values (None: no fit made).
        reason: in words, why it is pruned or kept.
    """

    prune: bool
    chance: float | None
    step: int | None
    horizon: int | None
    best: float | None
    fit_status: str | None
    reason: str

    @property
    def steps_saved(self) -> int:
        """The steps a prune saves: from the latest report to the planned last step."""
        if not self.prune or self.step is None or self.horizon is None:
            return 0
        return max(0, self.horizon - self.step)


def _keep(reason: str, *, step: int | None = None, horizon: int | None = None,
          best: float | None = None) -> PruneDecision:
    """Keep the trial, with no fit made."""
    return PruneDecision(False, None, step, horizon, best, None, reason)


def decide(steps: Sequence[int], values: Sequence[float], *, best: float | None,
           total_steps: int | None, threshold: float = DEFAULT_THRESHOLD,
           n_warmup_steps: int = 0, min_progress: float = DEFAULT_MIN_PROGRESS,
           config: Mapping[str, Any] | None = None, margin: float = 0.0,
           finished: Sequence[Finished] = ()) -> PruneDecision:
    """Whether to stop a trial whose loss was ``values`` at ``steps``: pure, never raises on
    odd data (a fit that fails is a fit that does not know).

    Prunes only when the trial is past ``n_warmup_steps`` and ``min_progress`` of
    ``total_steps``, has not reached ``total_steps``, its fit is ``ok`` or ``no_asymptote``
    (module docstring) and the calibrated chance that its loss at ``total_steps`` ends below
    ``best`` is under ``threshold``.
    ``config`` is the run's config as the service reads it (``c_warmup``, ``warmup_steps``,
    ``lr_schedule``, ...): it sets the fit's burn-in and marks a decaying learning rate
    ``off_model``. ``margin``: the trial must end at least this fraction below ``best`` (a
    trial that can at best tie is stopped). ``finished``: the completed trials, to correct the
    trial's forecast by their errors at the same point of their runs
    (:mod:`~curvecast.service.forecast.sweep_correction`; the one that ended lowest is the best
    it is set against, so ``best`` should be its value); empty: no correction.
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), not {threshold}")
    _check_margin(margin)
    pairs = tuple(sorted((int(s), float(v)) for s, v in zip(steps, values, strict=True)))
    last = pairs[-1][0] if pairs else None
    if best is None or not math.isfinite(best):
        return _keep("no completed trial to beat and no target", step=last,
                     horizon=total_steps)
    beat = f"{best:.4g}"
    if margin:  # the trial must end this fraction below the best (or the target)
        lowered = best - margin * abs(best)
        beat, best = f"{lowered:.4g} ({margin:.1%} below {best:.4g})", lowered
    if last is None:
        return _keep("nothing reported yet", horizon=total_steps, best=best)
    if total_steps is None:
        return _keep("no planned last step (total_steps): nothing to forecast to", step=last,
                     best=best)
    if last >= total_steps:
        return _keep("reached its planned last step", step=last, horizon=total_steps,
                     best=best)
    start = max(n_warmup_steps, math.ceil(min_progress * total_steps))
    if last < start:
        return _keep(f"too early to prune: step {last:,} < {start:,} (n_warmup_steps, "
                     f"{min_progress:.0%} of the run)", step=last, horizon=total_steps,
                     best=best)
    plain, status = _outlook(pairs, total_steps, _frozen(config))
    look = _sweep_corrected(plain, pairs, total_steps, finished) if finished else plain
    corrected_note = "" if look is plain else _CORRECTED_NOTE
    chance = look.chance_below(best)
    if chance is None:
        return PruneDecision(False, None, last, total_steps, best, status, look.reason)
    if chance >= threshold:
        return PruneDecision(False, chance, last, total_steps, best, status,
                             f"a {chance:.1%} chance of ending below {beat} by step "
                             f"{total_steps:,}{corrected_note}")
    return PruneDecision(True, chance, last, total_steps, best, status,
                         f"a {chance:.1%} chance (< {threshold:.1%}) of ending below "
                         f"{beat} by step {total_steps:,}: forecast {look.value:.4g} "
                         f"({look.lo:.4g}-{look.hi:.4g}){_BAND_NOTE.get(status, '')}"
                         f"{corrected_note}")


#: What a decision from a fit other than ``ok`` adds to its reason.
_BAND_NOTE: Final = {
    "no_asymptote": ", its current level carried on (the fit finds no floor yet)",
}


def _sweep_corrected(look: Outlook, pairs: tuple[tuple[int, float], ...], total_steps: int,
                     finished: Sequence[Finished]) -> Outlook:
    """``look`` corrected by the ``SWEEP_PEERS`` finished trials that ended lowest, each
    forecast from its reports up to the trial's fraction of its run; ``look`` where the
    correction does not apply."""
    fraction = pairs[-1][0] / total_steps
    peers: list[Peer] = []
    for done in sorted(finished, key=lambda f: f.value)[:SWEEP_PEERS]:
        upto = tuple(sorted((int(s), float(v)) for s, v in zip(done.steps, done.values,
                                                                strict=True)
                            if s / done.total_steps <= fraction + 1e-12))
        if not upto:
            if not peers:  # the best has no report that early: nothing to set the trial against
                return look
            continue
        their, _ = _outlook(upto, done.total_steps, _frozen(done.config))
        peers.append(Peer(their, upto[-1][1], done.value))
    return corrected(look, pairs[-1][1], peers, peers[0]) or look


_CORRECTED_NOTE: Final = (", corrected by how the completed trials' forecasts erred at the same "
                          "point of their runs")


def _check_margin(margin: float) -> None:
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be a fraction in [0, 1), not {margin}")


def _frozen(config: Mapping[str, Any] | None) -> str:
    return json.dumps(dict(config or {}), sort_keys=True, default=str)


@functools.lru_cache(maxsize=4096)
def _outlook(pairs: tuple[tuple[int, float], ...], total_steps: int,
             config: str) -> tuple[Outlook, str]:
    """The outlook of the trial's loss at ``total_steps`` and its fit's status. Cached: Optuna
    asks again at the same step (each ``should_prune()``), a replayed sweep asks again for the
    same curves, and the answer depends on these arguments alone."""
    fit = fit_curve([s for s, _ in pairs], [v for _, v in pairs],
                    config={**json.loads(config), "total_steps": total_steps})
    run = RunInput(run_id=_TRIAL_ID, name="trial", status="running", fit=fit,
                   total_steps=total_steps, last_step=pairs[-1][0])
    return outlook(run, total_steps, level_extending=True), fit.status


class CurvecastPruner(BasePruner):
    """Prune a trial whose forecast gives it less than ``threshold`` chance of beating the best.

    Args:
        total_steps: the step trials plan to end at (a trial's user attribute ``total_steps``
            overrides it). Without either, the pruner never prunes.
        threshold: prune below this chance of beating the best (default 5%).
        n_warmup_steps: never prune before this step.
        min_progress: never prune before this fraction of the planned run (default 10%).
        target: beat this loss instead of the best completed trial's value.
        config: the run config the fit reads (a trial's user attribute ``curvecast_config``
            is merged over it): ``c_warmup``/``warmup_steps`` set the burn-in, a decaying
            ``lr_schedule`` makes every forecast ``off_model`` (never pruned).
        margin: prune a trial unlikely to end at least this fraction below the best (default
            0: below it at all). ``0.005`` stops the trials that can at best tie, where the
            runs end close together (seed repeats): it saves compute and may stop a trial that
            would have ended slightly better (docs/decisions.md).
        url: also stream each trial to the curvecast service there, as a run of ``project``
            (default: the study's name) whose ``key`` series holds the reported values; its
            run ends when the trial does (pass the pruner to ``study.optimize(...,
            callbacks=[pruner])`` so completed trials end at once). The decisions stay local.
        project, token: the runs' project and the service's bearer token
            (default ``$CURVECAST_TOKEN``).
        key: the metric the reported values are logged as (default ``eval_loss``).
        sweep_correction: set the trial's forecast against the best completed trial's forecast
            from the same fraction of its run, its width scaled to how alike the completed
            trials' forecasts erred (:mod:`~curvecast.service.forecast.sweep_correction`;
            not with a ``target``). Prunes more where the trials are alike (seed repeats); the
            first report at a step fits the ``SWEEP_PEERS`` completed trials' reports up to it
            (docs/decisions.md).

    The study must minimize (the model is of a falling loss). :attr:`decisions` keeps the
    latest :class:`PruneDecision` of each trial (by trial number), to read why.
    """

    def __init__(self, *, total_steps: int | None = None, threshold: float = DEFAULT_THRESHOLD,
                 n_warmup_steps: int = 0, min_progress: float = DEFAULT_MIN_PROGRESS,
                 target: float | None = None, config: Mapping[str, Any] | None = None,
                 margin: float = 0.0, url: str | None = None, project: str | None = None,
                 token: str | None = None, key: str = "eval_loss",
                 sweep_correction: bool = False) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), not {threshold}")
        _check_margin(margin)
        if n_warmup_steps < 0:
            raise ValueError(f"n_warmup_steps must be >= 0, not {n_warmup_steps}")
        if total_steps is not None and total_steps <= 0:
            raise ValueError(f"total_steps must be positive, not {total_steps}")
        self.total_steps = total_steps
        self.threshold = threshold
        self.n_warmup_steps = n_warmup_steps
        self.min_progress = min_progress
        self.target = target
        self.config = dict(config or {})
        self.margin = margin
        self.sweep_correction = sweep_correction
        self.decisions: dict[int, PruneDecision] = {}
        self.runs = None if url is None else TrialRuns(url, project=project, token=token, key=key)

    def best(self, study: optuna.Study) -> float | None:
        """The value to beat: the target, else the lowest finite value of a completed trial."""
        return self._best(self._completed(study))

    def _completed(self, study: optuna.Study) -> Sequence[FrozenTrial]:
        """The study's completed trials; none read when a target replaces them."""
        if self.target is not None:
            return ()
        return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))

    def _best(self, completed: Sequence[FrozenTrial]) -> float | None:
        if self.target is not None:
            return self.target
        done = [t.value for t in completed if t.value is not None and math.isfinite(t.value)]
        return min(done) if done else None

    def decide(self, study: optuna.Study, trial: FrozenTrial) -> PruneDecision:
        """The decision for ``trial`` now (see :func:`decide`)."""
        if study.directions != [StudyDirection.MINIMIZE]:
            raise ValueError("CurvecastPruner forecasts a falling loss: the study must "
                             "minimize a single objective")
        total = trial.user_attrs.get(TOTAL_STEPS_ATTR, self.total_steps)
        reported = trial.intermediate_values
        completed = self._completed(study)  # read once: the best and the correction's peers
        return decide(list(reported), list(reported.values()), best=self._best(completed),
                      total_steps=int(total) if total is not None else None,
                      threshold=self.threshold, n_warmup_steps=self.n_warmup_steps,
                      min_progress=self.min_progress,
                      config=self._config(trial), margin=self.margin,
                      finished=self._finished(completed))

    def _finished(self, completed: Sequence[FrozenTrial]) -> list[Finished]:
        """The completed trials the sweep correction reads (none when it is off, or the trials
        are set against a target): the ``SWEEP_PEERS`` that ended lowest, the only ones
        :func:`decide` reads, so a long study's other trials' reports are not copied at every
        report."""
        if not self.sweep_correction or self.target is not None:
            return []
        usable = []
        for done in completed:
            total = done.user_attrs.get(TOTAL_STEPS_ATTR, self.total_steps)
            if (total is not None and int(total) > 0 and done.intermediate_values
                    and done.value is not None and math.isfinite(done.value)):
                usable.append((done.value, done, int(total)))
        return [Finished(tuple(done.intermediate_values),
                         tuple(done.intermediate_values.values()), total, value,
                         self._config(done))
                for value, done, total in heapq.nsmallest(SWEEP_PEERS, usable,
                                                          key=lambda u: u[0])]

    def _config(self, trial: FrozenTrial) -> dict[str, Any]:
        """The trial's run config: its user attribute over the pruner's."""
        return {**self.config, **(trial.user_attrs.get(CONFIG_ATTR) or {})}

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        decision = self.decide(study, trial)
        self.decisions[trial.number] = decision
        if self.runs is not None:  # the decision's horizon is the trial's planned last step
            self.runs.report(study, trial, total_steps=decision.horizon,
                             config=self._config(trial),
                             pruned_because=decision.reason if decision.prune else None)
        return decision.prune

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """As an Optuna callback (``study.optimize(..., callbacks=[pruner])``): end the run of
        a trial that completed or failed, when the pruner streams to a service."""
        if self.runs is not None:
            self.runs.ended(study, trial)
