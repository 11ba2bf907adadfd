"""Retry, backoff, Retry-After, spooling and replay decisions, driven tick by tick with a fake
transport and a fake clock: deterministic, no sockets, no sleeping."""

from __future__ import annotations

import json
import logging
import random
import uuid
from pathlib import Path

import pytest

from curvecast.client import Response, TransportError
from curvecast.client._api import Api, Backoff, Outcome, classify, parse_retry_after
from curvecast.client._batcher import Batch, Outbox, encode_records
from curvecast.client._sender import HUMAN_WAIT, Counters, Sender
from curvecast.client._spool import Spool
from tests.client._helpers import FakeClock, FakeTransport

RUN = str(uuid.uuid4())
OK_POST = Response(200, {}, b'{"accepted": 1, "duplicates": 0}')


def batch(step: int = 1, **metrics: float) -> Batch:
    batches, _ = encode_records([(step, 0.0, metrics or {"loss": 1.0}, None)])
    return batches[0]


def make(tmp_path: Path, handler, clock: FakeClock, **kwargs) -> tuple[Sender, FakeTransport]:
    transport = FakeTransport(handler)
    spool = Spool(tmp_path / "spool", RUN, meta=lambda: {"run_id": RUN, "project": "p"},
                  clock=clock)
    sender = Sender(
        api=Api(transport, clock=clock),
        run_id=RUN,
        run_payload=lambda: {"project": "p"},
        outbox=Outbox(1 << 20),
        spool=spool,
        counters=Counters(),
        backoff=Backoff(base=0.5, cap=30.0, rng=random.Random(0)),
        clock=clock,
        **kwargs,
    )
    return sender, transport


def script(*answers):
    """A handler answering PUT/PATCH with 200 and POSTs from ``answers`` in order (then 200)."""
    posts = list(answers)

    def handler(method, path, body):
        if method == "POST":
            return posts.pop(0) if posts else OK_POST
        return Response(200, {}, b"{}")

    return handler


def test_retry_after_is_honoured(tmp_path: Path) -> None:
    clock = FakeClock()
    unavailable = Response(503, {"retry-after": "7"},
                           b'{"error_code": "unavailable", "message": "db down"}')
    sender, transport = make(tmp_path, script(unavailable), clock)
    sender.outbox.offer(batch())
    assert sender.tick() == 0  # PUT
    delay = sender.tick()  # POST -> 503
    assert 7 <= delay < 8
    assert not sender.online and sender.spool.has_data() and not len(sender.outbox)
    clock.advance(6.9)
    assert sender.tick() == pytest.approx(0.1 + delay - 7, abs=1e-6)  # still waiting: no request
    assert len(transport.paths("POST")) == 1
    clock.advance(delay - 6.9)
    assert sender.tick() == 0  # replays the spooled batch
    assert len(transport.paths("POST")) == 2 and sender.online
    assert sender.counters.points_sent == 1


def test_finish_does_not_retry_before_retry_after(tmp_path: Path) -> None:
    clock = FakeClock()
    unavailable = Response(429, {"retry-after": "5"}, b"{}")
    sender, transport = make(tmp_path, script(unavailable), clock)
    sender.outbox.offer(batch())
    sender.tick()
    sender.tick()
    clock.advance(1)
    sender.begin_finish("finished")
    assert sender.tick() == pytest.approx(4)


def test_exponential_backoff_with_jitter_and_cap(tmp_path: Path) -> None:
    clock = FakeClock()
    sender, _ = make(tmp_path, lambda m, p, b: TransportError("connection refused"), clock)
    delays = []
    for _ in range(10):
        delays.append(sender.tick())
        clock.advance(delays[-1])
    for attempt, delay in enumerate(delays, start=1):
        full = min(30.0, 0.5 * 2 ** (attempt - 1))
        assert full / 2 <= delay <= full, (attempt, delay)
    assert not sender.created and sender.counters.failures == 10


def test_success_resets_backoff(tmp_path: Path) -> None:
    clock = FakeClock()
    down = TransportError("refused")
    sender, _ = make(tmp_path, script(down, down, down), clock)
    sender.tick()
    for _ in range(3):
        sender.outbox.offer(batch())
        clock.advance(sender.tick())
    assert sender.attempt == 3
    assert sender.tick() == 0 and sender.attempt == 0 and sender.online


def test_run_missing_recreates_the_run(tmp_path: Path) -> None:
    clock = FakeClock()
    missing = Response(404, {}, b'{"error_code": "run_not_found", "message": "no run"}')
    sender, transport = make(tmp_path, script(missing), clock)
    sender.outbox.offer(batch())
    for _ in range(4):
        assert sender.tick() == 0
    assert sender.counters.points_sent == 1
    assert [m for m, _, _ in transport.requests] == ["PUT", "POST", "PUT", "POST"]


def test_too_large_splits_the_batch(tmp_path: Path) -> None:
    clock = FakeClock()
    too_large = Response(413, {}, b'{"error_code": "payload_too_large", "message": "big"}')
    sender, transport = make(tmp_path, script(too_large), clock)
    batches, _ = encode_records([(s, 0.0, {"a": 1.0}, None) for s in range(10)])
    sender.outbox.offer(batches[0])
    for _ in range(6):
        sender.tick()
    posted = [json.loads(b) for m, _, b in transport.requests if m == "POST"]
    assert [len(p["steps"]) for p in posted] == [10, 5, 5]
    assert sender.counters.points_sent == 10


def test_rejected_batch_is_kept_aside_not_resent(tmp_path: Path, caplog) -> None:
    clock = FakeClock()
    invalid = Response(422, {}, b'{"error_code": "invalid_request", "message": "steps[0]: bad"}')
    sender, transport = make(tmp_path, script(invalid), clock)
    sender.outbox.offer(batch())
    with caplog.at_level(logging.ERROR, "curvecast.client"):
        for _ in range(4):
            sender.tick()
    assert len(transport.paths("POST")) == 1
    assert "refused a batch of 1 points (HTTP 422 invalid_request: steps[0]: bad)" in caplog.text
    assert list(sender.spool.path.glob("*.rejected"))
    assert sender.counters.points_rejected == 1 and sender.online


def test_auth_failure_waits_for_a_human_and_spools(tmp_path: Path, caplog) -> None:
    clock = FakeClock()
    sender, _ = make(
        tmp_path, lambda m, p, b: Response(401, {}, b'{"error_code": "unauthenticated"}'), clock
    )
    sender.outbox.offer(batch())
    with caplog.at_level(logging.ERROR, "curvecast.client"):
        assert sender.tick() >= HUMAN_WAIT
    assert "refused the token" in caplog.text


def test_outage_spools_then_replays_in_order(tmp_path: Path) -> None:
    clock = FakeClock()
    state = {"up": False}
    posted: list[int] = []

    def handler(method, path, body):
        if not state["up"]:
            return TransportError("refused")
        if method == "POST":
            posted.append(json.loads(body)["steps"][0])
            return OK_POST
        return Response(200, {}, b"{}")

    sender, _ = make(tmp_path, handler, clock)
    sender.outbox.offer(batch(1))
    sender.outbox.offer(batch(2))
    clock.advance(sender.tick())  # PUT fails: both batches move to the spool
    assert not len(sender.outbox) and sender.counters.points_spooled == 2
    assert not sender.outbox.offer(batch(3))  # offline: the batcher spools directly
    sender.spool.append(batch(3).body)
    state["up"] = True
    while sender.tick() == 0 and len(posted) < 3:
        pass
    assert posted == [1, 2, 3]
    for _ in range(3):
        sender.tick()
    assert not sender.spool.has_data() and not list(sender.spool.path.glob("*.jsonl"))


def test_corrupted_spool_lines_are_skipped_and_reported(tmp_path: Path, caplog) -> None:
    clock = FakeClock()
    sender, transport = make(tmp_path, script(), clock)
    sender.spool.append(batch(1).body)
    sender.spool.append(b"{not json")
    sender.spool.append(b'{"steps": [1]}')
    sender.spool.append(batch(2).body)
    segment = sender.spool.closed_segments()[0]
    with segment.open("ab") as f:
        f.write(b'{"steps": [3], "values": {"loss": [1.')  # a write cut short by a crash
    with caplog.at_level(logging.WARNING, "curvecast.client"):
        for _ in range(10):
            sender.tick()
    assert len(transport.paths("POST")) == 2
    assert sender.counters.corrupt_lines == 3
    assert f"skipped corrupted spool line {segment}:2 (not JSON" in caplog.text
    assert f"{segment}:3 (not a metrics batch" in caplog.text


def test_alerts_new_firing_ones_call_back_once(tmp_path: Path) -> None:
    clock = FakeClock()
    seen = []
    alerts = {"alerts": [{"id": 1, "rule": "grad_drift", "state": "firing"},
                         {"id": 2, "rule": "lr_spike", "state": "resolved"}]}

    def handler(method, path, body):
        if method == "GET":
            return Response(200, {}, json.dumps(alerts).encode())
        return Response(200, {}, b"{}")

    sender, transport = make(tmp_path, handler, clock, on_alert=seen.append, alert_interval=10)
    sender.tick()  # PUT
    sender.tick()  # poll
    assert [a["id"] for a in seen] == [1]
    assert sender.tick() > 0 and len(transport.paths("GET")) == 1  # not due yet
    alerts["alerts"].append({"id": 3, "rule": "norm", "state": "firing"})
    clock.advance(10)
    sender.tick()
    assert [a["id"] for a in seen] == [1, 3]
    assert transport.paths("GET")[0].endswith("/alerts?state=firing")


def test_missing_alerts_endpoint_means_no_alerts(tmp_path: Path) -> None:
    clock = FakeClock()

    def handler(method, path, body):
        if method == "GET":
            return Response(404, {}, b'{"error_code": "not_found", "message": "Not Found"}')
        return Response(200, {}, b"{}")

    def boom(alert):
        raise AssertionError("no alert expected")

    sender, _ = make(tmp_path, handler, clock, on_alert=boom)
    sender.tick()
    assert sender.tick() > 0 and sender.last_alerts == []


def test_on_alert_exceptions_are_contained(tmp_path: Path, caplog) -> None:
    clock = FakeClock()
    body = b'{"alerts": [{"id": 9, "state": "firing"}]}'
    sender, _ = make(tmp_path, lambda m, p, b: Response(200, {}, body if m == "GET" else b"{}"),
                     clock, on_alert=lambda a: 1 / 0)
    sender.tick()
    with caplog.at_level(logging.ERROR, "curvecast.client"):
        sender.tick()
    assert "on_alert callback raised" in caplog.text


@pytest.mark.parametrize(
    ("header", "expected"),
    [("7", 7.0), ("0.5", 0.5), ("-3", 0.0), ("soon", None), (None, None),
     ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0)],
)
def test_parse_retry_after(header, expected) -> None:
    now = 1445412480.0  # 07:28:00 that day
    assert parse_retry_after(header, now=now) == expected


@pytest.mark.parametrize(
    ("status", "body", "outcome"),
    [
        (200, b"{}", Outcome.OK),
        (503, b"{}", Outcome.RETRY),
        (500, b"oops", Outcome.RETRY),
        (429, b"", Outcome.RETRY),
        (404, b'{"error_code": "run_not_found"}', Outcome.RUN_MISSING),
        (404, b'{"error_code": "not_found"}', Outcome.REJECTED),
        (413, b"{}", Outcome.TOO_LARGE),
        (401, b"{}", Outcome.AUTH),
        (403, b"{}", Outcome.AUTH),
        (422, b"{}", Outcome.REJECTED),
    ],
)
def test_classify(status, body, outcome) -> None:
    assert classify(Response(status, {}, body)).outcome is outcome


def test_monitor_alerts_and_on_alert_from_the_background_thread(tmp_path: Path) -> None:
    import threading

    from curvecast.client import Monitor
    from tests.client._helpers import accept_all, wait_for

    body = {"alerts": [{"id": 1, "rule": "grad_drift", "state": "firing"},
                       {"id": 2, "rule": "lr_spike", "state": "pending"}]}

    def handler(method, path, data):
        if method == "GET":
            return Response(200, {}, json.dumps(body).encode())
        return accept_all(method, path, data)

    seen = []
    mon = Monitor(project="p", transport=FakeTransport(handler), spool_dir=tmp_path,
                  on_alert=lambda a: seen.append((threading.current_thread().name, a["id"])),
                  alert_interval=0.05)
    try:
        assert [a["id"] for a in mon.alerts()] == [1]
        wait_for(lambda: seen, 10, "on_alert called")
        assert seen[0][0].startswith("curvecast-sender") and seen[0][1] == 1
    finally:
        mon.finish(timeout=5)
    assert [x for _, x in seen] == [1]
