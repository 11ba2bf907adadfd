"""The ranking's answer when there is nothing to rank: it says why, in words that are true."""

from __future__ import annotations

import uuid

from curvecast.service.forecast.chances import RunInput
from curvecast.service.forecast.decision_answers import ranking_answer


def stopped(status: str, name: str) -> RunInput:
    return RunInput(run_id=uuid.uuid4(), name=name, status=status, fit=None, key="loss",
                    total_steps=10_000, last_step=250)


def test_a_project_whose_runs_all_stopped_says_so() -> None:
    """It said "no run plans total_steps or has logged a step" of runs that planned 10,000
    steps and logged 250."""
    answer = ranking_answer("p", [stopped("failed", "a"), stopped("lost", "b"),
                                  stopped("crashed", "c")])
    assert answer.horizon is None and answer.horizon_source == "none"
    assert answer.message == ("every run stopped (failed, crashed or lost): a run that "
                              "stopped is not compared")
    assert [r.name for r in answer.runs] == ["a", "b", "c"]
    assert all(not r.comparable and r.p_best is None for r in answer.runs)


def test_no_runs_and_no_planned_end_say_what_is_missing() -> None:
    assert ranking_answer("p", []).message == "no runs in this project yet"
    unplanned = RunInput(run_id=uuid.uuid4(), name="u", status="running", fit=None)
    assert ranking_answer("p", [unplanned]).message.startswith(
        "no run plans total_steps or has logged a step")
