"""Alerting across service processes: deliveries survive a SIGKILL (the outbox is in the
database), and two processes on one PostgreSQL never raise the same alert twice."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from curvecast.service.config import Settings
from tests._servers import free_port, start_server_process
from tests.alerting._data import batches, create_run, load, stream, wait_for
from tests.alerting.conftest import start_receiver

FAST = {
    "CURVECAST_WORKER_INTERVAL_S": "0.05",
    "CURVECAST_WEBHOOK_BACKOFF_BASE_S": "0.2",
    "CURVECAST_WEBHOOK_BACKOFF_MAX_S": "0.5",
    "CURVECAST_WEBHOOK_TIMEOUT_S": "1",
}


def _deliveries(url: str, project: str) -> list[dict]:
    return list(httpx.get(f"{url}/api/v1/projects/{project}/deliveries").json()["deliveries"])


def test_pending_deliveries_are_sent_after_a_sigkill(
    database_url: str, project: str, tmp_path: Path
) -> None:
    """The receiver is down while alerts fire; the service is killed with the notifications
    still pending; a new process (the receiver now up) sends every one of them."""
    port = free_port()  # nothing listens here yet: every attempt fails
    first = start_server_process(database_url, tmp_path, env=FAST)
    try:
        httpx.post(f"{first.url}/api/v1/projects/{project}/webhooks",
                   json={"url": f"http://127.0.0.1:{port}/after-restart"}).raise_for_status()
        run = load("fault-nan")
        run_id = create_run(first.url, project, run)
        stream(first.url, run_id, run)
        pending = wait_for(lambda: [d for d in _deliveries(first.url, project)
                                    if d["status"] == "pending" and d["attempts"] >= 1])
        first.kill()
    finally:
        first.stop()
    receiver = start_receiver(port)
    second = start_server_process(database_url, tmp_path, env=FAST)
    try:
        wait_for(lambda: all(d["status"] == "delivered"
                             for d in _deliveries(second.url, project)))
        got = {r.headers["X-Curvecast-Delivery"] for r in receiver.by_path("/after-restart")}
        assert {d["id"] for d in pending} <= got
        delivered = _deliveries(second.url, project)
        assert all(d["attempt_log"][-1]["status_code"] == 200 for d in delivered)
        assert all(d["attempt_log"][0]["error"] for d in delivered if d["attempts"] > 1)
        assert "Traceback" not in second.log()
    finally:
        second.stop()
        receiver.server.shutdown()
        receiver.server.server_close()


def test_notification_links_name_the_port_the_server_listens_on(
    database_url: str, project: str, tmp_path: Path
) -> None:
    """``curvecast serve --port P`` without ``CURVECAST_PUBLIC_URL``: the dashboard link in an
    alert notification is on port P (it was the default ``http://127.0.0.1:8000``, another
    server or none, for an on-call person to click)."""
    assert "CURVECAST_PUBLIC_URL" not in os.environ
    receiver = start_receiver()
    server = start_server_process(database_url, tmp_path, env=FAST)
    try:
        assert server.port != 8000
        httpx.post(f"{server.url}/api/v1/projects/{project}/webhooks",
                   json={"url": f"{receiver.url}/links"}).raise_for_status()
        run = load("fault-nan")
        run_id = create_run(server.url, project, run)
        stream(server.url, run_id, run)
        (first, *_) = wait_for(lambda: receiver.by_path("/links"))
        link = first.json()["alerts"][0]["annotations"]["dashboard"]
        assert link == f"{server.url}/runs/{run_id}"
        assert httpx.get(link).status_code == 200
    finally:
        server.stop()
        receiver.server.shutdown()
        receiver.server.server_close()


def test_a_wildcard_host_gets_a_loopback_link_and_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bound to every interface, the server has no address to name: loopback with its port,
    and a warning to set ``CURVECAST_PUBLIC_URL``; a configured one is left alone."""
    from curvecast.service.cli import _default_public_url

    monkeypatch.setenv("CURVECAST_PUBLIC_URL", "unset")  # restored (removed) after the test
    monkeypatch.delenv("CURVECAST_PUBLIC_URL")
    _default_public_url(Settings(), "0.0.0.0", 8123)
    assert os.environ["CURVECAST_PUBLIC_URL"] == "http://127.0.0.1:8123"
    assert "set CURVECAST_PUBLIC_URL" in capsys.readouterr().err
    monkeypatch.setenv("CURVECAST_PUBLIC_URL", "https://cc.example")
    _default_public_url(Settings(), "127.0.0.1", 8123)
    assert os.environ["CURVECAST_PUBLIC_URL"] == "https://cc.example"
    assert capsys.readouterr().err == ""


def test_two_processes_raise_each_alert_once(pg_url: str, project: str, tmp_path: Path) -> None:
    receiver = start_receiver()
    servers = [start_server_process(pg_url, tmp_path, env=FAST) for _ in range(2)]
    try:
        httpx.post(f"{servers[0].url}/api/v1/projects/{project}/webhooks",
                   json={"url": f"{receiver.url}/replicas"}).raise_for_status()
        names = ["fault-collapse", "fault-nan", "fault-low-wd", "fault-collapse"]
        runs = [load(n) for n in names]
        ids = [create_run(servers[0].url, project, r) for r in runs]

        def send(i: int) -> None:
            # Alternate replicas batch by batch: both workers see every run.
            for n, body in enumerate(batches(runs[i], size=40)):
                url = servers[(i + n) % 2].url
                resp = httpx.post(f"{url}/api/v1/runs/{ids[i]}/metrics", json=body, timeout=30)
                assert resp.status_code == 200, resp.text

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(send, range(len(runs))))
        engine = create_engine(Settings(database_url=pg_url).database_url)
        lasts = [max(max(s["steps"]) for s in r["series"].values()) for r in runs]

        def all_evaluated() -> bool:
            with engine.connect() as conn:
                rows = dict(conn.execute(text(
                    "SELECT run_id, evaluated_step FROM alert_eval WHERE run_id = ANY(:ids)"
                ), {"ids": ids}).all())
            return all(rows.get(i) == last for i, last in zip(ids, lasts, strict=True))

        wait_for(all_evaluated)
        with engine.connect() as conn:
            alerts = conn.execute(text(
                "SELECT run_id, rule, since_step, state, id FROM alerts WHERE run_id = ANY(:ids)"
            ), {"ids": ids}).all()
            deliveries = conn.execute(text(
                "SELECT d.alert_id, d.event FROM alert_deliveries d JOIN alerts a "
                "ON a.id = d.alert_id WHERE a.run_id = ANY(:ids)"
            ), {"ids": ids}).all()
        engine.dispose()
        keys = [(r, rule, since) for r, rule, since, _state, _id in alerts]
        assert len(keys) == len(set(keys)), "an alert was raised twice"
        assert {rule for _r, rule, *_ in alerts} >= {"polyak_collapse", "non_finite",
                                                     "weight_norm_drift"}
        assert len(deliveries) == len(set(deliveries)), "a transition was notified twice"
        fired = {(a_id, "firing") for *_x, state, a_id in alerts if state in ("firing",)}
        assert fired <= set(deliveries)
        for server in servers:
            assert "Traceback" not in server.log()
    finally:
        for server in servers:
            server.stop()
        receiver.server.shutdown()
        receiver.server.server_close()
