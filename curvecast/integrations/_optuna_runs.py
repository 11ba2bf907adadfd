"""The trials a :class:`~curvecast.integrations.optuna.CurvecastPruner` judges, streamed to a
curvecast service as runs, when the pruner is given a ``url``.

Each trial becomes one run of the study's project (one :class:`~curvecast.client.Monitor`,
whose background thread sends; the pruner never waits on the network while a trial trains):
its reported values are logged under ``key`` at their steps, its config is the pruner's with
the trial's planned ``total_steps`` and its parameters, and it ends when the trial does:
``finished`` with the pruner's reason when pruned, ``finished`` or ``failed`` as the study
records it otherwise. The service then forecasts, ranks and alerts on the sweep as on any runs:
the project page is its leaderboard while it runs.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Final

import optuna
from optuna.trial import FrozenTrial, TrialState

from curvecast.client import Monitor
from curvecast.contract import project_for_name

__all__ = ["TrialRuns"]

#: How long a trial's end may wait for the service before its points are spooled (``curvecast
#: sync`` uploads them): with the service up it takes milliseconds.
_FINISH_TIMEOUT_S: Final = 5.0


def study_project(study: optuna.Study) -> str:
    """A project name for ``study``: its name, as an MLflow experiment's becomes one."""
    return project_for_name(study.study_name) or "optuna"


class TrialRuns:
    """One curvecast run per trial, logged as the trial reports and ended with it."""

    def __init__(self, url: str, *, project: str | None, token: str | None, key: str) -> None:
        self.url = url
        self.project = project
        self.token = token
        self.key = key
        self._runs: dict[tuple[str, int], tuple[Monitor, int]] = {}  # -> (monitor, last step)
        self._lock = threading.Lock()

    def report(self, study: optuna.Study, trial: FrozenTrial, *, total_steps: int | None,
               config: Mapping[str, Any], pruned_because: str | None) -> None:
        """Log what ``trial`` reported since the last call; end its run when the pruner stops
        it (``pruned_because``: the pruner's reason)."""
        with self._lock:
            mon, last = self._runs.get((study.study_name, trial.number)) or (
                self._start(study, trial, total_steps, config), -1)
            for step, value in sorted(trial.intermediate_values.items()):
                if step > last:
                    mon.log(step, **{self.key: value})
                    last = step
            self._runs[(study.study_name, trial.number)] = mon, last
        if pruned_because is not None:
            self._end(study, trial.number, "finished", f"pruned: {pruned_because}")

    def ended(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """End ``trial``'s run as the study records the trial (the pruner is also an Optuna
        callback, called after each trial)."""
        if trial.state == TrialState.FAIL:
            self._end(study, trial.number, "failed", "the trial failed")
        elif trial.state == TrialState.COMPLETE:
            self._end(study, trial.number, "finished", None)

    def _start(self, study: optuna.Study, trial: FrozenTrial, total_steps: int | None,
               config: Mapping[str, Any]) -> Monitor:
        described = {**config, "optuna": {"study": study.study_name, "trial": trial.number,
                                          "params": dict(trial.params)}}
        # handle_sigterm off: the process is Optuna's and its workers', not this run's.
        return Monitor(url=self.url, project=self.project or study_project(study),
                       run_name=f"trial {trial.number}", config=described,
                       total_steps=total_steps, token=self.token, handle_sigterm=False,
                       flush_timeout=_FINISH_TIMEOUT_S)

    def _end(self, study: optuna.Study, number: int, status: str, reason: str | None) -> None:
        with self._lock:
            got = self._runs.pop((study.study_name, number), None)
        if got is not None:
            got[0].finish(status, reason=None if reason is None else reason[:200])
