"""The gradient-norm trend rule live, on both backends: recorded ScheduleFree+ runs from the
corpus (``bench/data/sfplus_corpus``) stream into a real server over REST as the hook would send
them (config with total_steps, warmups and lambda; per-step loss and gradient norm; sparse eval
loss and weight norm), and the worker's own evaluation raises the warning on the run whose
gradient norm climbed, and nothing on the steady one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench import _corpus
from curvecast.service.config import Settings
from tests._servers import thread_server
from tests.alerting._data import create_run, finish, stream, wait_for
from tests.alerting.test_alerts_api import _evaluated_step

#: Its ||g||_1 grew x6.4 after the burn-in (BENCHMARKS.md, "drift").
DRIFTING = "s-wd2"
#: Its ||g||_1 stayed within x2 (x1.52; c_warmup 1000) and raised nothing in the replay.
STEADY = "s-wd10-cw1000"
KEYS = ("loss", "eval_loss", "opt/x_l2")


def recorded(name: str, norm: str = "l1") -> dict[str, Any]:
    """A corpus run as the alert tests' stored-run format, with the gradient norm ``norm``."""
    run = _corpus.load(name)
    keys = (*KEYS, f"opt/grad_{norm}")
    return {
        "name": name,
        "config": run.config,
        "series": {
            k: {"steps": run.series[k][0].tolist(), "values": run.series[k][1].tolist()}
            for k in keys
        },
    }


@pytest.fixture(scope="module")
def server(database_url: str) -> Iterator[str]:
    settings = Settings(database_url=database_url, worker_interval_s=0.05)
    with thread_server(settings) as url:
        yield url


def _trend_alerts(url: str, run_id: uuid.UUID) -> list[dict[str, Any]]:
    resp = httpx.get(f"{url}/api/v1/runs/{run_id}/alerts")
    assert resp.status_code == 200, resp.text
    return [a for a in resp.json()["alerts"] if a["rule"] == "grad_norm_trend"]


def _stream_and_wait(url: str, database_url: str, project: str, run: dict[str, Any]) -> uuid.UUID:
    """Stream the run; return once the worker has judged its last step."""
    run_id = create_run(url, project, run)
    stream(url, run_id, run, size=100)
    last = run["config"]["total_steps"]
    wait_for(lambda: _evaluated_step(database_url, run_id) == last)
    return run_id


def test_a_drifting_run_gets_the_warning_before_60_percent(
    server: str, database_url: str, project: str
) -> None:
    run = recorded(DRIFTING)
    run_id = _stream_and_wait(server, database_url, project, run)
    [alert] = _trend_alerts(server, run_id)
    total = run["config"]["total_steps"]
    assert alert["severity"] == "warning" and alert["state"] == "firing"
    assert alert["fired_step"] < 0.6 * total
    assert "effective learning rate" in alert["summary"]
    assert f"weight_decay (AdamC lambda) {run['config']['weight_decay']:g}" in alert["description"]
    finish(server, run_id)
    resolved = wait_for(
        lambda: [a for a in _trend_alerts(server, run_id) if a["state"] == "resolved"]
    )
    assert "run ended (finished)" in resolved[0]["description"]


def test_the_l2_norm_through_the_project_override(
    server: str, database_url: str, project: str
) -> None:
    resp = httpx.put(
        f"{server}/api/v1/projects/{project}/rules/grad_norm_trend", json={"params": {"norm": "l2"}}
    )
    assert resp.status_code == 200, resp.text
    run_id = _stream_and_wait(server, database_url, project, recorded(DRIFTING, norm="l2"))
    [alert] = _trend_alerts(server, run_id)
    assert alert["key"] == "opt/grad_l2"


def test_a_steady_run_gets_nothing(server: str, database_url: str, project: str) -> None:
    run_id = _stream_and_wait(server, database_url, project, recorded(STEADY))
    resp = httpx.get(f"{server}/api/v1/runs/{run_id}/alerts")
    assert resp.json()["alerts"] == []
