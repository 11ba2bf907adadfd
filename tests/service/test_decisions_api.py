"""The decision endpoints through the real app on both backends: a project's ranking at a
common step and a run's chance to beat a loss, from fits the real worker task stored."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import pytest

from curvecast.service.app import create_app
from curvecast.service.config import Settings
from curvecast.service.forecast import model
from curvecast.service.worker.refit import refit_due_runs
from tests.support import create_token, serve_app

TOTAL = 20_000


@dataclass
class World:
    url: str
    project: str
    runs: dict[str, uuid.UUID]


def _run(client: httpx.Client, project: str, name: str, c: float, upto: int, *,
         total_steps: int | None = TOTAL, seed: int = 0) -> uuid.UUID:
    """A run named ``name`` whose loss is a noisy ``20.3/sqrt(t+377) + c`` up to ``upto``."""
    run_id = uuid.uuid4()
    config = {"c_warmup": 200, **({"total_steps": total_steps} if total_steps else {})}
    client.put(f"/api/v1/runs/{run_id}", json={"project": project, "name": name,
                                              "config": config}).raise_for_status()
    t = np.arange(200, upto + 1, 5)
    y = model(t, 20.3, 377.0, c) + np.random.default_rng(seed).normal(0.0, 0.01, t.size)
    client.post(f"/api/v1/runs/{run_id}/metrics", json={
        "steps": t.tolist(), "values": {"loss": y.tolist()}}).raise_for_status()
    return run_id


def build(url: str, app_settings: Settings, factory: object, project: str) -> World:
    with httpx.Client(base_url=url, timeout=60) as client:
        runs = {
            "good": _run(client, project, "good <b>", 1.8, 6_000),
            "bad": _run(client, project, "bad", 2.3, 6_000, seed=1),
            "done": _run(client, project, "done", 2.0, TOTAL, seed=2),
            "crashed": _run(client, project, "crashed", 1.5, 6_000, seed=3),
            "young": _run(client, project, "young", 2.0, 230, seed=4),
            "unplanned": _run(client, project, "unplanned", 2.0, 6_000, total_steps=None),
            # Finished at step 20,000, its loss last logged at 19,000.
            "tail": _run(client, project, "tail", 2.6, 19_000, seed=5),
        }
        client.post(f"/api/v1/runs/{runs['tail']}/metrics", json={
            "steps": [TOTAL], "values": {"opt/grad_norm": [1.0]}}).raise_for_status()
        client.patch(f"/api/v1/runs/{runs['tail']}", json={"status": "finished"}
                     ).raise_for_status()
        client.patch(f"/api/v1/runs/{runs['done']}", json={"status": "finished"}
                     ).raise_for_status()
        client.patch(f"/api/v1/runs/{runs['crashed']}", json={"status": "crashed"}
                     ).raise_for_status()
    while refit_due_runs(factory, app_settings):  # type: ignore[arg-type]
        pass
    return World(url, project, runs)


@pytest.fixture(scope="module")
def world(database_url: str) -> Iterator[World]:
    settings = Settings(database_url=database_url, worker_enabled=False,
                        refit_min_interval_s=0)
    app = create_app(settings)
    with serve_app(app) as url:
        yield build(url, settings, app.state.sessionmaker, f"rank-{uuid.uuid4().hex[:8]}")


def test_the_ranking_puts_the_likely_best_first(world: World) -> None:
    body = httpx.get(f"{world.url}/api/v1/projects/{world.project}/ranking").json()
    assert body["horizon"] == TOTAL and body["horizon_source"] == "planned_total_steps"
    assert body["project"] == world.project and body["key"] is None
    names = [r["name"] for r in body["runs"]]
    # The others have (next to) no chance: ordered by their loss at the horizon.
    assert names[0] == "good <b>" and set(names[1:3]) == {"done", "unplanned"}
    assert names[3:5] == ["bad", "tail"]
    by_name = {r["name"]: r for r in body["runs"]}
    good = by_name["good <b>"]
    assert good["p_best"] == pytest.approx(1.0, abs=0.01) and good["comparable"]
    assert good["fit_status"] == "ok" and good["key"] == "loss"
    truth = model(np.array([TOTAL]), 20.3, 377.0, 1.8)[0]
    assert good["forecast"]["lo"] <= truth <= good["forecast"]["hi"]
    assert good["forecast"]["step"] == TOTAL and not good["forecast"]["observed"]
    done = by_name["done"]
    assert done["forecast"]["observed"] and done["forecast"]["lo"] == done["forecast"]["hi"]
    # The unplanned run is forecast past its last step (no plan to be past).
    assert by_name["unplanned"]["comparable"] and by_name["unplanned"]["note"] == ""
    chances = [r["p_best"] for r in body["runs"] if r["p_best"] is not None]
    assert len(chances) == 5 and sum(chances) == pytest.approx(1.0)
    # A finished run whose loss series ended before the horizon: its last loss stands.
    tail = by_name["tail"]
    assert tail["forecast"]["observed"] and "ended at step 19,000" in tail["note"]
    assert tail["forecast"]["value"] == pytest.approx(
        model(np.array([19_000]), 20.3, 377.0, 2.6)[0], abs=0.01)
    crashed, young = by_name["crashed"], by_name["young"]
    assert crashed["p_best"] is None and crashed["reason"].startswith("the run crashed")
    assert young["p_best"] is None and young["forecast"] is None
    assert young["reason"] and not young["comparable"]
    assert names[-2:] == ["crashed", "young"]


def test_the_ranking_at_a_given_horizon_and_key(world: World) -> None:
    url = f"{world.url}/api/v1/projects/{world.project}/ranking"
    body = httpx.get(url, params={"horizon": 5_000}).json()
    assert body["horizon"] == 5_000 and body["horizon_source"] == "given"
    # Every run with data at step 5,000 is compared on the loss it had there.
    observed = {r["name"] for r in body["runs"] if r["forecast"] and r["forecast"]["observed"]}
    assert observed == {"good <b>", "bad", "done", "unplanned", "tail"}
    # A series no run of the project logs (a typo?): a 404 that lists the ones they do, as a
    # run's forecast of a series it does not log.
    none = httpx.get(url, params={"key": "eval/loss"})
    assert none.status_code == 404, none.text
    message = none.json()["message"]
    assert "no run of project" in message and "'eval/loss'" in message
    assert message.endswith("the keys they log: loss, opt/grad_norm")


def test_bad_requests_say_what_to_fix(world: World) -> None:
    unknown = httpx.get(f"{world.url}/api/v1/projects/nope-{uuid.uuid4().hex[:6]}/ranking")
    assert unknown.status_code == 404 and "not found" in unknown.json()["message"]
    for horizon in ("0", "soon"):
        bad = httpx.get(f"{world.url}/api/v1/projects/{world.project}/ranking",
                        params={"horizon": horizon})
        assert bad.status_code == 422 and "horizon" in bad.json()["message"]
    beat = f"{world.url}/api/v1/runs/{world.runs['good']}/forecast/beat"
    for params in ({}, {"loss": "nan"}, {"loss": "low"}):
        bad = httpx.get(beat, params=params)
        assert bad.status_code == 422 and "loss" in bad.json()["message"]
    missing = httpx.get(f"{world.url}/api/v1/runs/{uuid.uuid4()}/forecast/beat",
                        params={"loss": 2.0})
    assert missing.status_code == 404 and "not found" in missing.json()["message"]


def test_the_chance_to_beat_a_loss(world: World) -> None:
    beat = f"{world.url}/api/v1/runs/{world.runs['good']}/forecast/beat"
    easy = httpx.get(beat, params={"loss": 3.0}).json()
    hard = httpx.get(beat, params={"loss": 1.0}).json()
    assert easy["step"] == TOTAL and easy["fit_status"] == "ok" and easy["key"] == "loss"
    assert easy["probability"] == pytest.approx(0.995) and hard["probability"] == 0.005
    middle = httpx.get(beat, params={"loss": easy["forecast"]["value"]}).json()
    assert 0.2 < middle["probability"] < 0.8
    chances = [httpx.get(beat, params={"loss": x}).json()["probability"]
               for x in np.linspace(1.8, 2.1, 7)]
    assert chances == sorted(chances)
    done = httpx.get(f"{world.url}/api/v1/runs/{world.runs['done']}/forecast/beat",
                     params={"loss": 3.0}).json()
    assert done["probability"] == 1.0 and done["forecast"]["observed"]
    unplanned = httpx.get(f"{world.url}/api/v1/runs/{world.runs['unplanned']}/forecast/beat",
                          params={"loss": 2.0}).json()
    assert unplanned["probability"] is None and "total_steps" in unplanned["reason"]
    at = httpx.get(f"{world.url}/api/v1/runs/{world.runs['unplanned']}/forecast/beat",
                   params={"loss": 2.5, "horizon": TOTAL}).json()
    assert at["step"] == TOTAL and at["probability"] == pytest.approx(0.995)
    young = httpx.get(f"{world.url}/api/v1/runs/{world.runs['young']}/forecast/beat",
                      params={"loss": 2.0}).json()
    assert young["probability"] is None and young["reason"]


def test_tokens_see_only_their_project(database_url: str) -> None:
    project = f"rank-auth-{uuid.uuid4().hex[:8]}"
    ingest = create_token(database_url, project, "ingest")
    read = create_token(database_url, project, "read")
    other = create_token(database_url, project + "-other", "read")
    settings = Settings(database_url=database_url, worker_enabled=False, auth_enabled=True)
    with serve_app(create_app(settings)) as url:
        run_id = uuid.uuid4()
        httpx.put(f"{url}/api/v1/runs/{run_id}", json={"project": project, "name": "x"},
                  headers={"Authorization": f"Bearer {ingest}"}).raise_for_status()
        ranking = f"{url}/api/v1/projects/{project}/ranking"
        beat = f"{url}/api/v1/runs/{run_id}/forecast/beat?loss=2"
        assert httpx.get(ranking).status_code == 401
        assert httpx.get(beat).status_code == 401
        mine = httpx.get(ranking, headers={"Authorization": f"Bearer {read}"})
        assert mine.status_code == 200 and [r["name"] for r in mine.json()["runs"]] == ["x"]
        assert mine.json()["horizon"] is None and "pass horizon" in mine.json()["message"]
        at = httpx.get(ranking, params={"horizon": 100},
                       headers={"Authorization": f"Bearer {read}"}).json()
        assert at["runs"][0]["reason"].startswith("no fit yet")
        theirs = {"Authorization": f"Bearer {other}"}
        refused = httpx.get(ranking, headers=theirs)
        assert refused.status_code == 404 and "x" not in [
            r.get("name") for r in refused.json().get("runs", [])]
        assert httpx.get(beat, headers=theirs).status_code == 404
