"""A key the run does not have is answered alike by every read of a run's series: 404 with a
message naming the keys it has (``metrics?keys=nope`` was 200 with an empty series, while
``forecast?key=nope`` was 404: a misspelt key read as "no points yet"). The run page's live
poll, whose charts ask for every key they draw, still gets empty series. Target steps are whole
steps (integers), not a fitted curve's 4467.70431278996."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from curvecast.contract import RunConfig
from curvecast.service.config import Settings
from curvecast.service.forecast.answer import forecast_answer, target_answer, whole_step
from curvecast.service.migrate import upgrade
from tests.forecast.test_answer import NOW, _fit
from tests.support import thread_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = f"sqlite:///{Path(tmp_path_factory.mktemp('keys')) / 'keys.db'}"
    upgrade(db)
    with thread_server(Settings(database_url=db, worker_enabled=False)) as url:
        yield url


@pytest.fixture(scope="module")
def run(server: str) -> str:
    run_id = str(uuid.uuid4())
    httpx.put(f"{server}/api/v1/runs/{run_id}", json={"project": "keys"}).raise_for_status()
    httpx.post(f"{server}/api/v1/runs/{run_id}/metrics", json={
        "steps": [1, 2, 3], "values": {"loss": [3.0, 2.9, 2.8], "eval_loss": [None, None, 3.1]},
    }).raise_for_status()
    return run_id


@pytest.mark.parametrize(("path", "params"), [
    ("metrics", {"keys": "nope"}),
    ("metrics", {"keys": "loss,nope"}),
    ("metrics", {"keys": "nope", "max_points": 10}),
    ("metrics.csv", {"keys": "nope"}),
    ("forecast", {"key": "nope"}),
    ("forecast/target", {"key": "nope", "loss": 1.0}),
    ("forecast/history", {"key": "nope"}),
])
def test_an_unknown_key_is_a_404_naming_the_keys_the_run_has(
    server: str, run: str, path: str, params: dict[str, object]
) -> None:
    resp = httpx.get(f"{server}/api/v1/runs/{run}/{path}", params=params)
    assert resp.status_code == 404, resp.text
    body = resp.json()
    assert body["error_code"] == "not_found"
    assert f"run {run} has no series 'nope'; the keys it has: eval_loss, loss" in body["message"]


def test_a_run_without_points_says_so(server: str) -> None:
    empty = str(uuid.uuid4())
    httpx.put(f"{server}/api/v1/runs/{empty}", json={"project": "keys"}).raise_for_status()
    resp = httpx.get(f"{server}/api/v1/runs/{empty}/metrics", params={"keys": "loss"})
    assert resp.status_code == 404
    assert resp.json()["message"].endswith("has no series 'loss': it has logged no points yet")


def test_known_keys_and_the_page_s_live_poll_still_answer(server: str, run: str) -> None:
    ok = httpx.get(f"{server}/api/v1/runs/{run}/metrics", params={"keys": "loss"})
    assert ok.status_code == 200 and ok.json()["series"][0]["values"] == [3.0, 2.9, 2.8]
    # The run page polls the keys its charts draw, some not logged yet: empty, not an error.
    live = httpx.get(f"{server}/dashboards/api/runs/{run}/live",
                     params={"keys": "loss,opt/grad_norm"})
    assert live.status_code == 200, live.text
    series = {s["key"]: s for s in live.json()["metrics"]["series"]}
    assert series["opt/grad_norm"]["total_points"] == 0 and series["loss"]["total_points"] == 3


def test_target_steps_are_whole_steps() -> None:
    fit = _fit()
    answer = target_answer(fit, loss=2.40, confidence=0.9, key="loss", last_step=2_990,
                           steps_per_second=10.0, now=NOW, total_steps=20_000)
    assert answer.target is not None and answer.target.reachable
    raw = fit.steps_to(2.40, 0.9)
    assert raw.step is not None and raw.step != int(raw.step)  # the curve crosses mid-step
    assert answer.target.step == math.ceil(raw.step)
    dumped = answer.model_dump(mode="json")["target"]
    assert all(isinstance(dumped[k], int) for k in ("step", "lo", "hi")), dumped
    with_target = forecast_answer(fit, config=RunConfig(total_steps=20_000), last_step=2_990,
                                  target_loss=2.40)
    assert with_target.target == answer.target.model_copy(update={"reason": ""})
    # Float fuzz at a whole step is that step, not the next (nor "after the planned end").
    assert whole_step(20000.000000000007) == 20_000 and whole_step(4467.70431278996) == 4468
    assert whole_step(None) is None and whole_step(math.inf) is None
