"""The run page's live poll in one request (``/dashboards/api/runs/{id}/live``): each part must
be what its REST route answers, on both backends, with auth off and on."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from curvecast.service.config import Settings
from curvecast.service.worker.refit import refit_due_runs
from tests.dashboards.conftest import FakeAlerts, app_server, new_app
from tests.support import create_token
from tests.support import synthetic as syn


def _rest(client: httpx.Client, run_id: uuid.UUID, params: dict[str, Any]) -> dict[str, Any]:
    """The four REST answers the page used to ask for."""
    api = f"/api/v1/runs/{run_id}"
    metric_params = {k: params[k] for k in ("keys", "start", "max_points") if k in params}
    return {
        "run": client.get(api).json(),
        "metrics": client.get(api + "/metrics", params=metric_params).json(),
        "forecast": client.get(api + "/forecast", params={"horizon": params["horizon"]}).json(),
        "alerts": client.get(api + "/alerts").json(),
    }


def test_the_live_poll_answers_what_the_four_rest_routes_answer(
    database_url: str, project: str
) -> None:
    settings = Settings(database_url=database_url, worker_enabled=False, refit_min_interval_s=0)
    alerts = FakeAlerts()
    app = new_app(settings, alerts)
    with app_server(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        run_id = uuid.uuid4()
        syn.create_run(client, run_id, project, total_steps=20_000)
        syn.stream(client, run_id, 0, 3_000, total_steps=20_000, eval_every=500)
        # A logged NaN: it travels as the string "NaN" in both answers.
        client.post(f"/api/v1/runs/{run_id}/metrics", json={
            "steps": [3_000], "values": {"loss": ["NaN"]}}).raise_for_status()
        while refit_due_runs(app.state.sessionmaker, settings):
            pass
        alerts.add(run_id, project)

        params = {"keys": "loss,opt/grad_norm", "start": 2_900, "max_points": 2_000,
                  "horizon": 20_000}
        live = client.get(f"/dashboards/api/runs/{run_id}/live", params=params)
        assert live.status_code == 200 and live.headers["content-type"] == "application/json"
        body = live.json()
        rest = _rest(client, run_id, params)
        # Two differences, both meant: the charts ask for every key they draw, so a key not
        # logged yet is an empty series here where REST answers 404 naming the run's keys;
        # and the poll carries the "Train loss reached" card's number (NaN: the newest loss is).
        assert rest["metrics"]["error_code"] == "not_found"
        assert "no series 'opt/grad_norm'; the keys it has: " in rest["metrics"]["message"]
        only_loss = _rest(client, run_id, {**params, "keys": "loss"})
        assert body["metrics"]["series"][0] == only_loss["metrics"]["series"][0]
        assert body["metrics"]["series"][1] == {
            "key": "opt/grad_norm", "total_points": 0, "downsampled": False, "steps": [],
            "values": [], **{k: v for k, v in body["metrics"]["series"][1].items()
                             if k not in ("key", "total_points", "downsampled", "steps",
                                          "values")}}
        assert body["loss_reached"] == {"key": "loss", "step": 3_000, "value": "NaN"}
        assert {k: body[k] for k in ("run", "forecast", "alerts")} == {
            k: rest[k] for k in ("run", "forecast", "alerts")}
        assert body["forecast"]["status"] != "pending" and len(body["alerts"]["alerts"]) == 1
        loss = next(s for s in body["metrics"]["series"] if s["key"] == "loss")
        assert loss["steps"][0] == 2_900 and loss["values"][-1] == "NaN"

        # Without keys there are no points to read (a page with no charts yet).
        bare = client.get(f"/dashboards/api/runs/{run_id}/live", params={"horizon": 20_000})
        assert bare.json()["metrics"] == {"run_id": str(run_id), "series": []}

        # Bad input and an unknown run answer as the REST routes do.
        bad = client.get(f"/dashboards/api/runs/{run_id}/live", params={"keys": "loss,a b"})
        assert bad.status_code == 422 and "keys[1]" in bad.json()["message"]
        negative = client.get(f"/dashboards/api/runs/{run_id}/live", params={"start": -1})
        assert negative.status_code == 422 and "start" in negative.json()["message"]
        missing = client.get(f"/dashboards/api/runs/{uuid.uuid4()}/live")
        assert missing.status_code == 404 and missing.json()["error_code"] == "run_not_found"


def test_the_live_poll_needs_the_pages_login_when_auth_is_on(
    database_url: str, project: str
) -> None:
    read = create_token(database_url, project, "read")
    ingest = create_token(database_url, project, "ingest")
    other = create_token(database_url, project + "-other", "read")
    settings = Settings(database_url=database_url, auth_enabled=True, worker_enabled=False)
    with app_server(new_app(settings)) as url:
        run_id = uuid.uuid4()
        auth = {"authorization": f"Bearer {ingest}"}
        httpx.put(f"{url}/api/v1/runs/{run_id}", json={"project": project},
                  headers=auth).raise_for_status()
        path = f"/dashboards/api/runs/{run_id}/live"
        assert httpx.get(url + path).status_code == 401
        with httpx.Client(base_url=url) as browser:
            assert browser.get(f"/runs/{run_id}", params={"token": read}).status_code == 303
            assert browser.get(path).json()["run"]["id"] == str(run_id)
        stranger = httpx.get(url + path, headers={"authorization": f"Bearer {other}"})
        assert stranger.status_code == 404
