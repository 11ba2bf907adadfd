"""A forecast says what it assumes about the learning rate. The loss alone cannot tell a cosine
run from an anytime one until late in the decay; so when a run declares no ``lr_schedule``, logs
no learning rate and is not schedule-free, its ``ok`` forecast says it assumes the rate does not
decay: in the fit's message (REST, CLI), REST's ``assumes_constant_lr`` and the run page's Fit
card."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest

from curvecast.contract import RunConfig
from curvecast.service.config import Settings
from curvecast.service.forecast.schedule import CONSTANT_LR_ASSUMED
from curvecast.service.forecast.solver import fit_curve
from curvecast.service.migrate import upgrade
from tests.support import thread_server, wait_for

STEPS = np.arange(100, 3000, 10, dtype=float)
LOSS = 20.3 / np.sqrt(STEPS + 377) + 2.07 + np.random.default_rng(1).normal(0, 0.003, STEPS.size)
CONSTANT_LR = (STEPS, np.full(STEPS.size, 3e-4))


@pytest.mark.parametrize(("config", "lr", "assumed"), [
    ({}, None, True),
    ({"optimizer": {"name": "AdamW", "lr": 3e-4}}, None, True),
    ({"lr_schedule": "constant"}, None, False),  # declared: nothing assumed
    ({}, CONSTANT_LR, False),  # logged: seen not to decay
    ({"optimizer": {"name": "ScheduleFreePlus"}}, None, False),  # no schedule to decay
    ({"optimizer": "AdamWScheduleFree"}, None, False),
])
def test_an_ok_forecast_says_when_it_assumes_the_rate_does_not_decay(
    config: dict[str, object], lr: tuple[np.ndarray, np.ndarray] | None, assumed: bool
) -> None:
    fit = fit_curve(STEPS, LOSS, config=config, lr=lr)
    assert fit.status == "ok", fit.message
    assert fit.assumes_constant_lr is assumed
    assert (CONSTANT_LR_ASSUMED in fit.message) is assumed
    assert fit.to_dict()["assumes_constant_lr"] is assumed


def test_a_decay_the_run_declares_is_off_model_not_an_assumption() -> None:
    fit = fit_curve(STEPS, LOSS, config={"lr_schedule": "cosine"})
    assert fit.status == "off_model" and not fit.assumes_constant_lr
    assert RunConfig.read({"optimizer": {"name": "ScheduleFreePlus"}}).schedule_free


def test_rest_and_the_run_page_say_it(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'lr.db'}"
    upgrade(db)
    with thread_server(Settings(database_url=db, worker_interval_s=0.05,
                                refit_min_interval_s=0)) as url:
        run_id = str(uuid.uuid4())
        base = f"{url}/api/v1/runs/{run_id}"
        httpx.put(base, json={"project": "lr", "config": {"total_steps": 3000}}
                  ).raise_for_status()
        httpx.post(f"{base}/metrics", json={"steps": STEPS.astype(int).tolist(),
                                            "values": {"loss": LOSS.tolist()}}
                   ).raise_for_status()
        forecast = wait_for(
            lambda: (f := httpx.get(f"{base}/forecast").json())["status"] != "pending" and f,
            60, "a fit")
        assert forecast["status"] == "ok", forecast
        assert forecast["assumes_constant_lr"] is True
        assert CONSTANT_LR_ASSUMED in forecast["message"]
        # The run page's Fit card (its cards come with the figures).
        cards = httpx.get(f"{url}/dashboards/api/runs/{run_id}/figures").json()["kpis"]
        fit_card = next(k for k in cards if k["id"] == "fit")
        assert fit_card["detail"].endswith(
            "; assumes the learning rate does not decay (no lr_schedule, no opt/lr)"), fit_card
