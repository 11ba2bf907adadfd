"""Alerts and webhooks under hostile input: a slow receiver cannot stall delivery for other
projects, silences are bounded and stored in UTC, no stored silence breaks a read, Slack text
is escaped, and a webhook deleted mid-delivery loses no other outcome. Real servers, real
receivers on loopback, both backends; synchronised on events and polling, never on sleeps."""

from __future__ import annotations

import socket
import socketserver
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone

import httpx
import pytest
from sqlalchemy import create_engine, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.alerting.engine import Transition
from curvecast.service.alerting.lifecycle import Event
from curvecast.service.alerting.webhook import AlertView, build_payload, slack_escape
from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.models import AlertDelivery, Run
from curvecast.service.schemas import RunCreate
from curvecast.service.schemas.alerts import WebhookIn
from curvecast.service.store import alerts as alert_store
from curvecast.service.store import runs as run_store
from curvecast.service.store import webhooks as webhook_store
from curvecast.service.store._common import utcnow
from curvecast.service.worker.alerts import apply_evaluation
from curvecast.service.worker.webhooks import SendResult, deliver_round, send_http
from tests._servers import thread_server
from tests.alerting._data import wait_for
from tests.alerting.conftest import Receiver

#: How long the whole wait for something the worker does may take on a loaded machine.
DEADLINE_S = 30.0
#: How long the slow receiver keeps trickling if nobody hangs up (far beyond DEADLINE_S, so
#: a sender without a total deadline is caught by every wait below).
TRICKLE_FOR_S = 300.0


# ---------------------------------------------------------------------------------------------
# A hostile receiver: answers "HTTP/1.1 200 OK\r\nX-Slow: " and then one byte every 0.5 s
# ---------------------------------------------------------------------------------------------


@dataclass
class SlowReceiver:
    """A loopback server that never finishes its answer's headers. ``connected`` is set when a
    request arrives, ``hung_up`` when a sender closes the connection while it still trickles."""

    url: str
    server: socketserver.ThreadingTCPServer
    stop: threading.Event = field(default_factory=threading.Event)
    connected: threading.Event = field(default_factory=threading.Event)
    hung_up: threading.Event = field(default_factory=threading.Event)


def start_slow_receiver() -> SlowReceiver:
    holder: dict[str, SlowReceiver] = {}

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            rx = holder["rx"]
            sock: socket.socket = self.request
            received = b""
            while b"\r\n\r\n" not in received:  # the request's headers (the body may follow)
                chunk = sock.recv(65_536)
                if not chunk:
                    return
                received += chunk
            rx.connected.set()
            try:
                sock.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                # Pacing of the attack, not synchronisation: a byte per half second, each one
                # resetting a per-read timeout.
                for _ in range(int(TRICKLE_FOR_S / 0.5)):
                    if rx.stop.wait(0.5):
                        return
                    sock.sendall(b"x")
            except OSError:
                rx.hung_up.set()  # the sender gave up while the answer was still trickling
                return
            sock.sendall(b"\r\nContent-Length: 0\r\n\r\n")

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server(("127.0.0.1", 0), Handler)
    port = int(server.server_address[1])
    rx = SlowReceiver(url=f"http://127.0.0.1:{port}", server=server)
    holder["rx"] = rx
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return rx


@pytest.fixture
def slow_receiver() -> Iterator[SlowReceiver]:
    rx = start_slow_receiver()
    yield rx
    rx.stop.set()
    rx.server.shutdown()
    rx.server.server_close()


def test_an_attempt_has_a_total_deadline_not_a_per_read_timeout(
    slow_receiver: SlowReceiver,
) -> None:
    """A trickling receiver: each byte arrives well within the timeout; the attempt still ends."""
    result = send_http(f"{slow_receiver.url}/hook", b"{}", {"Content-Type": "application/json"},
                       1.0, allow_private=True)
    assert not result.ok and result.status_code is None
    assert result.error is not None and "deadline" in result.error
    # The receiver was still trickling when the sender hung up.
    assert slow_receiver.hung_up.wait(DEADLINE_S)


def test_a_slow_receiver_of_one_project_does_not_delay_another_projects_alert(
    sqlite_url: str, slow_receiver: SlowReceiver, receiver: Receiver
) -> None:
    """The hostile tenant: project A's receiver trickles its answer for minutes;
    project B's notification still arrives, and A's attempt is cut at its deadline."""
    settings = Settings(database_url=sqlite_url, worker_interval_s=0.05, webhook_timeout_s=2.0,
                        webhook_backoff_base_s=60.0)
    project_a, project_b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    with thread_server(settings) as url:
        _webhook(url, project_a, f"{slow_receiver.url}/a")
        _webhook(url, project_b, f"{receiver.url}/b")
        _diverging_run(url, project_a)
        assert slow_receiver.connected.wait(DEADLINE_S)  # the delivery task is in A's POST
        run_b = _diverging_run(url, project_b)
        # Without a deadline this waits TRICKLE_FOR_S (300 s) and fails after DEADLINE_S.
        wait_for(lambda: any(p["groupLabels"]["run_id"] == str(run_b)
                             for p in receiver.payloads("/b")), timeout=DEADLINE_S)
        attempts = wait_for(lambda: _attempt_errors(url, project_a), timeout=DEADLINE_S)
        assert any("deadline" in (e or "") for e in attempts)
        assert slow_receiver.hung_up.wait(DEADLINE_S)


def _webhook(url: str, project: str, target: str) -> int:
    resp = httpx.post(f"{url}/api/v1/projects/{project}/webhooks", json={"url": target})
    assert resp.status_code == 201, resp.text
    return int(resp.json()["id"])


def _diverging_run(url: str, project: str, name: str | None = None) -> uuid.UUID:
    """A run whose loss turns NaN (the non_finite rule fires at once)."""
    run_id = uuid.uuid4()
    body: dict[str, object] = {"project": project}
    if name is not None:
        body["name"] = name
    created = httpx.put(f"{url}/api/v1/runs/{run_id}", json=body)
    assert created.status_code == 201, created.text
    sent = httpx.post(f"{url}/api/v1/runs/{run_id}/metrics",
                      json={"steps": [1, 2, 3], "values": {"loss": [2.0, "NaN", "NaN"]}})
    assert sent.status_code == 200, sent.text
    return run_id


def _attempt_errors(url: str, project: str) -> list[str | None]:
    resp = httpx.get(f"{url}/api/v1/projects/{project}/deliveries")
    assert resp.status_code == 200, resp.text
    return [a["error"] for d in resp.json()["deliveries"] for a in d["attempt_log"]]


# ---------------------------------------------------------------------------------------------
# Silences: bounded, stored in UTC, and no stored value breaks a read (both backends)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def alert_server(database_url: str) -> Iterator[str]:
    """A server whose worker evaluates alerts (the shared ``server`` fixture's does not)."""
    with thread_server(Settings(database_url=database_url, worker_interval_s=0.05)) as url:
        yield url


def _firing_alert(url: str, project: str) -> tuple[uuid.UUID, int]:
    run_id = _diverging_run(url, project)

    def firing() -> int | None:
        resp = httpx.get(f"{url}/api/v1/runs/{run_id}/alerts", params={"state": "firing"})
        assert resp.status_code == 200, resp.text
        return next((a["id"] for a in resp.json()["alerts"] if a["rule"] == "non_finite"), None)

    return run_id, int(wait_for(firing, timeout=DEADLINE_S))


def test_silence_until_is_bounded(alert_server: str, project: str) -> None:
    """The year-9999-at-UTC-14 silence (stored as year 10000 on PostgreSQL) is
    refused with a clear 422, and reads keep working."""
    _, alert_id = _firing_alert(alert_server, project)
    for until in ("9999-12-31T23:59:59-14:00",
                  (datetime.now(UTC) + timedelta(days=400)).isoformat()):
        resp = httpx.post(f"{alert_server}/api/v1/alerts/{alert_id}/silence",
                          json={"until": until})
        assert resp.status_code == 422, resp.text
        assert resp.json()["error_code"] and "days ahead" in resp.json()["message"]
    resp = httpx.get(f"{alert_server}/api/v1/alerts", params={"project": project})
    assert resp.status_code == 200 and resp.json()["alerts"][0]["silenced_until"] is None


def test_silence_keeps_its_utc_offset(alert_server: str, project: str) -> None:
    """``+05:00`` is the same instant when read back (SQLite stored it as ``Z``)."""
    _, alert_id = _firing_alert(alert_server, project)
    plus5 = (datetime.now(UTC) + timedelta(days=3)).astimezone(
        timezone(timedelta(hours=5))).replace(microsecond=0)
    resp = httpx.post(f"{alert_server}/api/v1/alerts/{alert_id}/silence",
                      json={"until": plus5.isoformat()})
    assert resp.status_code == 200, resp.text
    assert datetime.fromisoformat(resp.json()["silenced_until"]) == plus5
    listed = httpx.get(f"{alert_server}/api/v1/alerts", params={"project": project}).json()
    stored = datetime.fromisoformat(listed["alerts"][0]["silenced_until"])
    assert stored == plus5 and stored.utcoffset() == timedelta(0)


def test_no_stored_silence_poisons_reads(alert_server: str, database_url: str,
                                         project: str) -> None:
    """A value written before the bound existed (year 10000 on PostgreSQL, or
    'infinity') is read clamped: lists, the run's alerts, ack and un-silence still answer."""
    if "postgresql" not in Settings(database_url=database_url).database_url:
        pytest.skip("SQLite cannot hold a timestamp Python cannot load (no year 10000)")
    run_id, alert_id = _firing_alert(alert_server, project)
    engine = create_engine(Settings(database_url=database_url).database_url)
    try:
        for poison in ("9999-12-31T23:59:59-14:00", "infinity"):
            with engine.begin() as conn:
                conn.execute(text("UPDATE alerts SET silenced_until = CAST(:v AS timestamptz) "
                                  "WHERE id = :id"), {"v": poison, "id": alert_id})
            for path in ("/api/v1/alerts", f"/api/v1/runs/{run_id}/alerts"):
                resp = httpx.get(f"{alert_server}{path}", params={"project": project}
                                 if path == "/api/v1/alerts" else None)
                assert resp.status_code == 200, resp.text
                assert resp.json()["alerts"][0]["silenced_until"].startswith("9000-")
            acked = httpx.post(f"{alert_server}/api/v1/alerts/{alert_id}/ack")
            assert acked.status_code == 200, acked.text
        lifted = httpx.post(f"{alert_server}/api/v1/alerts/{alert_id}/silence",
                            json={"until": None})
        assert lifted.status_code == 200 and lifted.json()["silenced_until"] is None
    finally:
        engine.dispose()


# ---------------------------------------------------------------------------------------------
# Slack text
# ---------------------------------------------------------------------------------------------


def test_slack_text_escapes_links_and_mentions() -> None:
    """A hostile run name renders as text: no link of its own, no @channel."""
    name = "x> … <https://evil.example/login|Re-authenticate here> <!channel"
    view = AlertView(
        run_id=str(uuid.uuid4()), run_name=name, project="p&<q>", rule="non_finite",
        severity="critical", status="firing", summary="loss is <!here> NaN",
        description="d", started_at=datetime(2026, 1, 1, tzinfo=UTC), ended_at=None,
        step=3, value=None,
    )
    payload = build_payload(view, public_url="http://cc.example", receiver="r",
                            delivery_id="d")
    slack = payload["text"]
    # Exactly one control sequence: the dashboard link the service made.
    assert slack.count("<") == 1 and slack.count(">") == 1
    assert f"<http://cc.example/runs/{view.run_id}|" in slack
    assert "&lt;!channel" in slack and "&lt;!here&gt;" in slack
    assert "&lt;https://evil.example/login|Re-authenticate here&gt;" in slack
    assert "(p&amp;&lt;q&gt;)" in slack
    # The structured fields keep the name as it is (they are JSON, not Slack markup).
    assert payload["commonLabels"]["run_name"] == name
    assert slack_escape("a&b<c>d") == "a&amp;b&lt;c&gt;d"


def test_slack_text_reaches_the_receiver_escaped(alert_server: str, project: str,
                                                 receiver: Receiver) -> None:
    """Slack escaping end to end: the run's name as an ingest token set it, escaped on the wire."""
    _webhook(alert_server, project, f"{receiver.url}/slack")
    _diverging_run(alert_server, project, name="x <https://evil.example|login> <!channel>")
    payload = wait_for(lambda: next(iter(receiver.payloads("/slack")), None), timeout=DEADLINE_S)
    assert "<!channel>" not in payload["text"] and "<https://evil" not in payload["text"]
    assert "&lt;!channel&gt;" in payload["text"]


# ---------------------------------------------------------------------------------------------
# A webhook deleted while its delivery is in flight (both backends)
# ---------------------------------------------------------------------------------------------




def test_a_webhook_deleted_mid_delivery_loses_no_other_outcome(
    factory: sessionmaker[Session], project: str
) -> None:
    """The deleted webhook's delivery is dropped; the other one is recorded as
    delivered (it was an FK violation that lost the round's other outcomes)."""
    hooks = []
    with session_scope(factory) as s:
        for path in ("/gone", "/kept"):
            hooks.append(webhook_store.create_webhook(
                s, project=project, webhook_in=WebhookIn(url=f"http://127.0.0.1:9{path}"),
                shown_url=f"http://127.0.0.1:9{path}", sealed_url=None, stored_secret=None,
                now=utcnow(), allowed_project=None).id)
    run_id = uuid.uuid4()
    with session_scope(factory) as s:
        run_store.create_or_get_run(s, run_id=run_id, run_in=RunCreate(project=project),
                                    allowed_project=None)
    with session_scope(factory) as s:
        s.execute(update(Run).where(Run.id == run_id)
                  .values(n_points=10, last_step=9, last_ingest_at=utcnow()))
    with session_scope(factory) as s:
        job = next(j for j in alert_store.claim_eval_jobs(
            s, now=utcnow(), lease=timedelta(seconds=60), limit=1000) if j.run_id == run_id)
    with session_scope(factory) as s:
        apply_evaluation(s, job=job, transitions=[Transition(
            "non_finite", Event("firing", 5, 1.0, 5), "critical", "s", "d", "loss")],
            state={}, evaluated_step=9, n_points=10, next_check_at=None, now=utcnow(),
            public_url="http://x")

    def send(url: str, body: bytes, headers: dict[str, str], timeout: float) -> SendResult:
        if url.endswith("/gone"):  # an admin deletes the webhook while this POST is out
            with session_scope(factory) as s:
                webhook_store.delete_webhook(s, project=project, webhook_id=hooks[0],
                                             allowed_project=None)
        return SendResult(200, None, 1.0)

    assert deliver_round(factory, Settings(database_url="sqlite://"), send=send) >= 2
    with session_scope(factory) as s:
        rows = s.execute(select(AlertDelivery.webhook_id, AlertDelivery.status)
                         .where(AlertDelivery.webhook_id.in_(hooks))).all()
    assert [(w, st) for w, st in rows] == [(hooks[1], "delivered")]
