"""The opt-in ``not_competitive`` rule through the real worker (refits, then alert rounds) on a
real database, on recorded runs of the ScheduleFree+ corpus: a clearly worse run fires once its
fit is ``ok`` and says what stopping saves, a decaying-LR run (``off_model``) never does, the
rule stays silent unless the project enables it, and the alert resolves when the chance
recovers."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from bench._corpus import load
from bench.forecast._sweeps import SweepRun, sweep_run
from curvecast.service.alerting.engine import replay
from curvecast.service.alerting.rules.framework import Series
from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.models import Alert
from curvecast.service.schemas import MetricBatch, RunCreate, RunUpdate
from curvecast.service.store import alerts as alert_store
from curvecast.service.store import metrics as metric_store
from curvecast.service.store import runs as run_store
from curvecast.service.worker.alerts import evaluate_alerts
from curvecast.service.worker.refit import refit_due_runs

#: Unthrottled: every round refits and evaluates what is new.
SETTINGS = Settings(database_url="sqlite://", refit_min_interval_s=0,
                    alert_eval_min_interval_s=0)
RULE = "not_competitive"


def corpus(name: str) -> SweepRun:
    made = sweep_run(load(name))
    assert made is not None
    return made


def _start(factory: sessionmaker[Session], project: str, run: SweepRun) -> uuid.UUID:
    run_id = uuid.uuid4()
    with session_scope(factory) as s:
        run_store.create_or_get_run(
            s, run_id=run_id,
            run_in=RunCreate(project=project, name=run.name, config=run.config),
            allowed_project=None,
        )
    return run_id


_LOGGED: dict[uuid.UUID, int] = {}


def _log(factory: sessionmaker[Session], run_id: uuid.UUID, run: SweepRun, upto: int) -> None:
    """The run's eval loss, logged as its loss (the forecast's series), from where it was up
    to step ``upto``."""
    start = _LOGGED.get(run_id, -1)
    _LOGGED[run_id] = upto
    pairs = [(s, v) for s, v in zip(run.steps, run.values, strict=True) if start < s <= upto]
    batch = MetricBatch(steps=[s for s, _ in pairs], values={"loss": [v for _, v in pairs]})
    with session_scope(factory) as s:
        metric_store.ingest_batch(s, run_id=run_id, batch=batch, allowed_project=None)


def _finish(factory: sessionmaker[Session], run_id: uuid.UUID) -> None:
    with session_scope(factory) as s:
        run_store.update_run(s, run_id=run_id, run_in=RunUpdate(status="finished"),
                             allowed_project=None)


def _configure(factory: sessionmaker[Session], project: str, override: dict) -> None:
    with session_scope(factory) as s:
        alert_store.put_rule_override(s, project=project, rule=RULE, override=override,
                                      now=datetime.now(UTC), allowed_project=None)


def _rounds(factory: sessionmaker[Session]) -> None:
    """What the worker does after ingest: refit, then evaluate, until nothing is left."""
    while refit_due_runs(factory, SETTINGS):
        pass
    while evaluate_alerts(factory, SETTINGS):
        pass


def _alerts(factory: sessionmaker[Session], run_id: uuid.UUID) -> list[tuple[str, str, str]]:
    with session_scope(factory) as s:
        rows = s.execute(select(Alert.state, Alert.summary, Alert.description)
                         .where(Alert.run_id == run_id, Alert.rule == RULE)
                         .order_by(Alert.id)).all()
    return [(r[0], r[1], r[2]) for r in rows]


def _finished_project(factory: sessionmaker[Session], project: str,
                      names: Sequence[str] = ("d-s-b128-3k",)) -> None:
    for name in names:
        run = corpus(name)
        run_id = _start(factory, project, run)
        _log(factory, run_id, run, run.total_steps)
        _finish(factory, run_id)
    _rounds(factory)


ENABLED = {"enabled": True, "for_steps": 0, "resolve_for_steps": 0}


def test_a_clearly_worse_run_fires_after_the_burn_in_and_resolves_on_recovery(
        factory: sessionmaker[Session], project: str) -> None:
    _configure(factory, project, ENABLED)
    _finished_project(factory, project)  # final eval loss 1.40
    bad = corpus("s-wd0")  # final eval loss 2.96
    run_id = _start(factory, project, bad)
    _log(factory, run_id, bad, 240)  # before the burn-in (10% of the run)
    _rounds(factory)
    assert _alerts(factory, run_id) == []

    _log(factory, run_id, bad, 1500)
    _rounds(factory)
    [(state, summary, description)] = _alerts(factory, run_id)
    assert state == "firing"
    assert "chance to beat the project's best finished run (d-s-b128-3k, 1.4" in summary
    assert "Stopping it now saves 1,500 of its 3,000 planned steps" in description
    assert "hours of wall time" in description

    # A target the run can reach: its chance recovers, and the alert resolves.
    _configure(factory, project, {**ENABLED, "params": {"target_loss": 3.5}})
    _log(factory, run_id, bad, 1800)
    _rounds(factory)
    assert [a[0] for a in _alerts(factory, run_id)] == ["resolved"]


def test_off_model_runs_and_projects_that_did_not_opt_in_never_fire(
        factory: sessionmaker[Session], project: str) -> None:
    other = f"{project}-off"
    _configure(factory, project, ENABLED)
    _finished_project(factory, project)
    _finished_project(factory, other)
    decay = corpus("s-adamw-linear-3e-3")  # lr_schedule linear: every fit is off_model
    bad = corpus("s-wd0")
    watched = [(_start(factory, project, decay), decay), (_start(factory, other, bad), bad)]
    for upto in (1200, 2400):
        for run_id, run in watched:
            _log(factory, run_id, run, upto)
        _rounds(factory)
    assert [_alerts(factory, run_id) for run_id, _ in watched] == [[], []]


def test_a_replay_judges_with_the_project_best_it_is_given() -> None:
    """The pure replay (stored series through the rules, as the worker saw them) runs
    ``not_competitive`` only when told what the project's best is, and then fires as live."""
    bad = corpus("s-wd0")  # final eval loss 2.96 against the project's best 1.40
    series = {"loss": Series.of(bad.steps, bad.values)}
    on = {RULE: ENABLED}
    assert not [e for e in replay(series, bad.config, overrides=on) if e.rule == RULE]
    events = [e for e in replay(series, bad.config, overrides=on,
                                project_best=(1.40, "d-s-b128-3k")) if e.rule == RULE]
    assert events and events[0].kind == "firing"
    assert 300 <= events[0].step < 3000
    assert "d-s-b128-3k" in events[0].summary
