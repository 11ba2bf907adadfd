"""Alerts in a real server on both backends: stored runs stream in, the background worker
fires and resolves alerts on its own, a real receiver on loopback gets signed webhooks, and the
rule and webhook endpoints refuse bad input with clear messages."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import create_engine, text

from curvecast.service.alerting.rules import RULES
from curvecast.service.alerting.webhook import verify
from curvecast.service.config import Settings
from curvecast.service.worker.webhooks import backoff_s
from tests._servers import thread_server
from tests.alerting._data import batches, create_run, finish, load, stream, wait_for
from tests.alerting.conftest import Receiver
from tests.support import create_token

SECRET = "a-webhook-secret-of-some-length"


@pytest.fixture(scope="module")
def server(database_url: str) -> Iterator[str]:
    # The fixture runs are streamed in seconds; a real run grows over minutes, and the 5 s
    # refit throttle never holds its forecast back as it would here. Unthrottled, the fit the
    # off-curve rule judges against moves on with every 5% of the run, as live, instead of at
    # whichever moment of the stream the throttle happens to open (a fit landing right after
    # a fault's onset, or one left from the first 25 steps, delays the alert).
    settings = Settings(
        database_url=database_url, worker_interval_s=0.05, webhook_backoff_base_s=0.2,
        webhook_timeout_s=2.0, stalled_after_s=1.5, refit_min_interval_s=0,
    )
    with thread_server(settings) as url:
        yield url


def _alerts(url: str, run_id: uuid.UUID, **params: str) -> list[dict]:
    resp = httpx.get(f"{url}/api/v1/runs/{run_id}/alerts", params=params)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["alerts"])


def _evaluated_step(database_url: str, run_id: uuid.UUID) -> int | None:
    engine = create_engine(Settings(database_url=database_url).database_url)
    try:
        with engine.connect() as conn:
            return conn.execute(
                text("SELECT evaluated_step FROM alert_eval WHERE run_id = :r"),
                {"r": run_id.hex if "sqlite" in database_url else run_id},
            ).scalar()
    finally:
        engine.dispose()


def _hook(url: str, project: str, rx: Receiver, path: str, **extra: object) -> dict:
    resp = httpx.post(f"{url}/api/v1/projects/{project}/webhooks",
                      json={"url": f"{rx.url}{path}", **extra})
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


def test_alerts_fire_and_resolve_as_a_run_streams(
    server: str, database_url: str, project: str, receiver: Receiver
) -> None:
    """The collapse run: eta = 0 from step 400 for 160 steps. The alert fires within 5% of
    the run after the onset and resolves on its own once the optimizer moves again; both
    transitions reach the receiver, signed."""
    run = load("fault-collapse")
    onset, total = run["fault"]["onset_step"], run["config"]["total_steps"]
    hook = _hook(server, project, receiver, "/signed", secret=SECRET)
    assert hook["has_secret"] is True and "secret" not in hook
    run_id = create_run(server, project, run)
    stream(server, run_id, run)
    finish(server, run_id)  # the module's server calls a run silent for 1.5 s 'stalled'

    def collapse_resolved() -> dict | None:
        return next((a for a in _alerts(server, run_id, state="resolved")
                     if a["rule"] == "polyak_collapse"), None)

    alert = wait_for(collapse_resolved)
    assert onset <= alert["fired_step"] <= onset + 0.05 * total
    assert alert["severity"] == "critical" and alert["labels"]["run_id"] == str(run_id)
    assert alert["fired_at"] <= alert["resolved_at"] and alert["resolved_at"] is not None
    assert set(alert) >= {"id", "run_id", "project", "rule", "state", "severity", "summary",
                          "description", "started_at", "fired_at", "resolved_at",
                          "acknowledged_at", "silenced_until", "step", "value", "labels"}
    listed = httpx.get(f"{server}/api/v1/alerts",
                       params={"project": project, "state": "resolved"}).json()["alerts"]
    assert alert["id"] in {a["id"] for a in listed}

    def both_received() -> list | None:
        got = [p for p in receiver.payloads("/signed")
               if p["alerts"][0]["labels"]["alertname"] == "polyak_collapse"]
        return got if len(got) >= 2 else None

    firing, resolved = wait_for(both_received)[:2]
    assert (firing["status"], resolved["status"]) == ("firing", "resolved")
    assert firing["alerts"][0]["fingerprint"] == resolved["alerts"][0]["fingerprint"]
    assert resolved["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
    assert f"/runs/{run_id}" in firing["alerts"][0]["generatorURL"]
    assert "polyak_collapse" in firing["text"]
    last = max(max(v["steps"]) for v in run["series"].values())
    wait_for(lambda: _evaluated_step(database_url, run_id) == last)

    def settled() -> tuple[list, list] | None:
        # Every notification delivered, and the receiver saw exactly those (other rules'
        # transitions may still be on their way when the collapse pair has arrived).
        done = httpx.get(f"{server}/api/v1/projects/{project}/deliveries").json()["deliveries"]
        requests = receiver.by_path("/signed")
        ids = [r.headers["X-Curvecast-Delivery"] for r in requests]
        if done and all(d["status"] == "delivered" for d in done) and (
            {d["id"] for d in done} == set(ids)
        ):
            return done, requests
        return None

    deliveries, requests = wait_for(settled)
    for request in requests:
        assert verify(SECRET, request.headers, request.body, now=time.time())
    ids = [r.headers["X-Curvecast-Delivery"] for r in requests]
    assert len(ids) == len(set(ids))  # each transition once (no failures, so no retries)
    assert all(d["attempt_log"][0]["status_code"] == 200 for d in deliveries)


def test_a_healthy_run_raises_nothing(server: str, database_url: str, project: str,
                                      receiver: Receiver) -> None:
    run = load("healthy-01")
    _hook(server, project, receiver, "/healthy")
    run_id = create_run(server, project, run)
    stream(server, run_id, run)
    finish(server, run_id)
    last = run["config"]["total_steps"]
    wait_for(lambda: _evaluated_step(database_url, run_id) == last)
    assert _alerts(server, run_id) == []
    assert receiver.payloads("/healthy") == []


def test_corrupted_data_is_caught_live_from_the_training_loss(
    server: str, database_url: str, project: str
) -> None:
    """The dense training loss is read and judged by the worker: streamed as a live run (each
    batch evaluated before the next arrives), a corrupted data shard fires off_curve within 5%
    of the run, before two sparse eval losses could have shown it."""
    run = load("fault-corrupt")
    run_id = create_run(server, project, run)
    for body in batches(run, size=25):
        resp = httpx.post(f"{server}/api/v1/runs/{run_id}/metrics", json=body, timeout=30)
        assert resp.status_code == 200, resp.text
        last = body["steps"][-1]
        wait_for(lambda last=last: (_evaluated_step(database_url, run_id) or -1) >= last)
    finish(server, run_id)
    onset, total = run["fault"]["onset_step"], run["config"]["total_steps"]
    off = [a for a in _alerts(server, run_id) if a["rule"] == "off_curve"]
    assert off, _alerts(server, run_id)
    assert onset < off[0]["fired_step"] <= onset + 0.05 * total


def test_ack_and_silence(server: str, project: str, receiver: Receiver) -> None:
    """A silenced alert sends no notifications while silenced; ack is recorded."""
    run = load("fault-collapse")
    _hook(server, project, receiver, "/silence")
    run_id = create_run(server, project, run)
    stream(server, run_id, run, upto=450)
    alert = wait_for(lambda: next((a for a in _alerts(server, run_id, state="firing")
                                   if a["rule"] == "polyak_collapse"), None))
    acked = httpx.post(f"{server}/api/v1/alerts/{alert['id']}/ack").json()
    assert acked["acknowledged_at"] is not None
    again = httpx.post(f"{server}/api/v1/alerts/{alert['id']}/ack").json()
    assert again["acknowledged_at"] == acked["acknowledged_at"]
    past = httpx.post(f"{server}/api/v1/alerts/{alert['id']}/silence",
                      json={"until": "2000-01-01T00:00:00Z"})
    assert past.status_code == 422 and "future" in past.json()["message"]
    naive = httpx.post(f"{server}/api/v1/alerts/{alert['id']}/silence",
                       json={"until": "2100-01-01T00:00:00"})
    assert naive.status_code == 422 and "timezone" in naive.json()["message"]
    until = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    silenced = httpx.post(f"{server}/api/v1/alerts/{alert['id']}/silence", json={"until": until})
    assert silenced.status_code == 200 and silenced.json()["silenced_until"] is not None
    stream(server, run_id, run)  # the rest: the collapse ends and the alert resolves
    finish(server, run_id)
    wait_for(lambda: any(a["id"] == alert["id"] for a in _alerts(server, run_id,
                                                                  state="resolved")))
    events = [(p["alerts"][0]["labels"]["alertname"], p["status"])
              for p in receiver.payloads("/silence")]
    assert ("polyak_collapse", "firing") in events
    assert ("polyak_collapse", "resolved") not in events
    assert httpx.post(f"{server}/api/v1/alerts/999999999/ack").status_code == 404


def test_failing_receiver_is_retried_with_backoff(
    server: str, project: str, receiver: Receiver
) -> None:
    receiver.statuses[:] = [500, 503]
    _hook(server, project, receiver, "/flaky")
    run = load("fault-nan")
    run_id = create_run(server, project, run)
    stream(server, run_id, run)

    def delivered() -> dict | None:
        # The run's first alert meets the failing receiver; a later one (the run raises
        # several) may find it healthy again.
        body = httpx.get(f"{server}/api/v1/projects/{project}/deliveries").json()
        first = min(body["deliveries"], key=lambda x: x["created_at"], default=None)
        return first if first and first["status"] == "delivered" else None

    d = wait_for(delivered)
    assert d["attempts"] == 3 and d["event"] == "firing"
    assert [a["status_code"] for a in d["attempt_log"]] == [500, 503, 200]
    assert "HTTP 500" in d["attempt_log"][0]["error"]
    requests = receiver.by_path("/flaky")
    assert len({r.headers["X-Curvecast-Delivery"] for r in requests}) == 1  # same id each time
    gaps = [b.at - a.at for a, b in zip(requests, requests[1:], strict=False)]
    # Backoff with jitter: base 0.2 s doubling, each delay in [0.5, 1] of its nominal value.
    assert gaps[0] >= 0.1 - 0.02 and gaps[1] >= 0.2 - 0.02


def test_backoff_grows_exponentially_with_jitter_and_is_capped() -> None:
    s = Settings(webhook_backoff_base_s=1.0, webhook_backoff_max_s=60.0)
    assert [backoff_s(n, s, rng=lambda: 1.0) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_s(3, s, rng=lambda: 0.0) == 2.0
    assert backoff_s(30, s, rng=lambda: 1.0) == 60.0


def test_stalled_run_alerts_and_resolves_when_data_returns(server: str, project: str) -> None:
    run = load("healthy-02")
    run_id = create_run(server, project, run)
    stream(server, run_id, run, upto=100)
    alert = wait_for(lambda: next((a for a in _alerts(server, run_id, state="firing")
                                   if a["rule"] == "stalled"), None), timeout=30)
    assert "sent nothing" in alert["summary"]
    stream(server, run_id, run, upto=150)
    wait_for(lambda: any(a["id"] == alert["id"] for a in _alerts(server, run_id,
                                                                  state="resolved")))


def test_rule_configuration(server: str, project: str) -> None:
    base = f"{server}/api/v1/projects/{project}/rules"
    rules = httpx.get(base).json()["rules"]
    assert {r["rule"] for r in rules} == set(RULES)
    grad = next(r for r in rules if r["rule"] == "grad_norm_drift")
    assert grad["enabled"] and not grad["overridden"] and "rise_factor" in grad["param_docs"]
    put = httpx.put(f"{base}/grad_norm_drift",
                    json={"severity": "critical", "for_steps": 25,
                          "params": {"rise_factor": 3.0, "norm": "l2"}})
    assert put.status_code == 200, put.text
    got = httpx.get(f"{base}/grad_norm_drift").json()
    assert got["overridden"] and got["severity"] == "critical" and got["for_steps"] == 25
    assert got["params"]["rise_factor"] == 3.0 and got["params"]["fall_factor"] == 3.0
    bad = {
        "unknown parameter": ({"params": {"rise": 2}}, "has no parameter"),
        "out of range": ({"params": {"rise_factor": 0.5}}, "rise_factor must be >="),
        "wrong type": ({"params": {"rise_factor": "x"}}, "must be a number"),
        "bad choice": ({"params": {"norm": "l3"}}, "norm must be one of"),
        "bad severity": ({"severity": "page"}, "severity"),
        "negative for": ({"for_steps": -1}, "for_steps"),
        "unknown field": ({"threshold": 1}, "threshold"),
    }
    for what, (body, message) in bad.items():
        resp = httpx.put(f"{base}/grad_norm_drift", json=body)
        assert resp.status_code == 422, what
        assert message in resp.json()["message"], (what, resp.json())
    incoherent = httpx.put(f"{base}/polyak_spike",
                           json={"params": {"factor": 3.0, "resolve_factor": 4.0}})
    assert incoherent.status_code == 422 and "resolve_factor" in incoherent.json()["message"]
    assert httpx.put(f"{base}/no_such_rule", json={}).status_code == 404
    assert httpx.get(f"{base}/no_such_rule").status_code == 404
    reset = httpx.put(f"{base}/grad_norm_drift", json={}).json()
    assert not reset["overridden"] and reset["severity"] == "warning"


def test_disabled_rule_stays_quiet(server: str, database_url: str, project: str) -> None:
    httpx.put(f"{server}/api/v1/projects/{project}/rules/non_finite",
              json={"enabled": False}).raise_for_status()
    run = load("fault-nan")
    run_id = create_run(server, project, run)
    stream(server, run_id, run)
    last = max(max(s["steps"]) for s in run["series"].values())
    wait_for(lambda: _evaluated_step(database_url, run_id) == last)
    assert not [a for a in _alerts(server, run_id) if a["rule"] == "non_finite"]


def test_webhook_endpoints(server: str, project: str) -> None:
    base = f"{server}/api/v1/projects/{project}/webhooks"
    for url, message in [("ftp://x.example/h", "http:// or https://"),
                         ("not-a-url", "http:// or https://"),
                         ("https://u:p@x.example/", "credentials")]:
        resp = httpx.post(base, json={"url": url})
        assert resp.status_code == 422 and message in resp.json()["message"], resp.json()
    short = httpx.post(base, json={"url": "https://x.example/h", "secret": "short"})
    assert short.status_code == 422 and "secret" in short.json()["message"]
    created = httpx.post(base, json={"url": "https://x.example/h", "name": "ops",
                                     "secret": SECRET}).json()
    listed = httpx.get(base).json()["webhooks"]
    assert [w["id"] for w in listed] == [created["id"]] and "secret" not in listed[0]
    assert httpx.delete(f"{base}/{created['id']}").status_code == 204
    assert httpx.delete(f"{base}/{created['id']}").status_code == 404
    assert httpx.get(base).json()["webhooks"] == []


def test_unknown_run_is_404(server: str) -> None:
    resp = httpx.get(f"{server}/api/v1/runs/{uuid.uuid4()}/alerts")
    assert resp.status_code == 404 and resp.json()["error_code"] == "run_not_found"
    bad_state = httpx.get(f"{server}/api/v1/alerts", params={"state": "exploded"})
    assert bad_state.status_code == 422 and "state" in bad_state.json()["message"]


def test_scopes_and_projects_with_auth(database_url: str, project: str) -> None:
    other = project + "-b"
    read = create_token(database_url, project, "read")
    admin = create_token(database_url, project, "admin")
    other_admin = create_token(database_url, other, "admin")
    settings = Settings(database_url=database_url, auth_enabled=True, worker_enabled=False)
    with thread_server(settings) as url:
        def call(method: str, path: str, token: str, **kw: object) -> httpx.Response:
            return httpx.request(method, f"{url}{path}",
                                 headers={"Authorization": f"Bearer {token}"}, **kw)

        hooks = f"/api/v1/projects/{project}/webhooks"
        rules = f"/api/v1/projects/{project}/rules/stalled"
        assert call("GET", hooks, read).status_code == 200
        assert call("POST", hooks, read, json={"url": "https://x.example"}).status_code == 403
        assert call("PUT", rules, read, json={"enabled": False}).status_code == 403
        assert call("POST", hooks, admin, json={"url": "https://x.example"}).status_code == 201
        assert call("PUT", rules, admin, json={"enabled": False}).status_code == 200
        # Another project's admin sees nothing of this project: 404, not 403.
        assert call("GET", hooks, other_admin).status_code == 404
        assert call("PUT", rules, other_admin, json={}).status_code == 404
        assert call("GET", f"/api/v1/projects/{project}/deliveries",
                    other_admin).status_code == 404
        assert call("GET", "/api/v1/alerts", other_admin,
                    params={"project": project}).json()["alerts"] == []
        assert httpx.get(f"{url}{hooks}").status_code == 401
