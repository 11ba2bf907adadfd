"""The worker runs each task on its own thread: one task that hangs or fails never stalls the
others. Synchronised on events with deadlines, never on sleeps."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings
from curvecast.service.worker import Worker
from tests._servers import thread_server
from tests.alerting._data import wait_for
from tests.alerting.conftest import Receiver

#: Generous: a loaded CI machine may take seconds to schedule a thread.
DEADLINE_S = 30.0

TaskFn = Callable[[sessionmaker[Session], Settings], int]


def _counting(ran: threading.Event, times: int) -> TaskFn:
    """A task that sets ``ran`` once it has run ``times`` rounds."""
    rounds = [0]

    def count(_factory: sessionmaker[Session], _settings: Settings) -> int:
        rounds[0] += 1
        if rounds[0] >= times:
            ran.set()
        return 0

    return count


def test_a_hanging_task_does_not_stall_the_others(sqlite_url: str) -> None:
    entered, release, ran = threading.Event(), threading.Event(), threading.Event()

    def hang(_factory: sessionmaker[Session], _settings: Settings) -> int:
        entered.set()
        release.wait(DEADLINE_S)
        return 0

    worker = Worker(sessionmaker(), Settings(database_url=sqlite_url, worker_interval_s=0.01),
                    [hang, _counting(ran, times=3)])
    worker.start()
    try:
        assert entered.wait(DEADLINE_S)
        # Three rounds of the other task while the first one is still inside its round.
        assert ran.wait(DEADLINE_S)
        assert not release.is_set()
    finally:
        release.set()
        worker.stop()


def test_a_failing_task_is_retried_and_notify_wakes_every_task(sqlite_url: str) -> None:
    failed_twice, ran = threading.Event(), threading.Event()
    failures = [0]

    def fail(_factory: sessionmaker[Session], _settings: Settings) -> int:
        failures[0] += 1
        if failures[0] >= 2:
            failed_twice.set()
        raise RuntimeError("a bug in one task")

    # An interval far beyond the deadline: only notify() can bring a second round in time.
    worker = Worker(sessionmaker(), Settings(database_url=sqlite_url, worker_interval_s=3600),
                    [fail, _counting(ran, times=2)])
    worker.start()
    try:
        worker.notify()
        assert failed_twice.wait(DEADLINE_S) and ran.wait(DEADLINE_S)
    finally:
        worker.stop(timeout=DEADLINE_S)
    names = {"curvecast-worker-fail", "curvecast-worker-count"}
    assert not [t for t in threading.enumerate() if t.name in names]  # stop() stopped them all


def test_alerts_are_evaluated_while_a_webhook_receiver_hangs(
    sqlite_url: str, project: str, receiver: Receiver
) -> None:
    """The real tasks: a receiver holds the first notification unanswered; a second run's
    alert still fires, and both notifications arrive once the receiver answers."""
    settings = Settings(database_url=sqlite_url, worker_interval_s=0.05, webhook_timeout_s=60)
    receiver.gate.clear()
    with thread_server(settings) as url:
        try:
            hook = httpx.post(f"{url}/api/v1/projects/{project}/webhooks",
                              json={"url": f"{receiver.url}/hold"})
            assert hook.status_code == 201, hook.text
            first = _diverging_run(url, project)
            assert receiver.holding.wait(DEADLINE_S)  # the delivery task is stuck in a POST
            second = _diverging_run(url, project)
            wait_for(lambda: _firing(url, second), timeout=DEADLINE_S)
            assert not receiver.gate.is_set()  # still holding: the alert did not wait for it
        finally:
            receiver.gate.set()
        delivered = wait_for(lambda: {p["groupLabels"]["run_id"] for p in receiver.payloads()}
                             >= {str(first), str(second)}, timeout=DEADLINE_S)
        assert delivered


def _diverging_run(url: str, project: str) -> uuid.UUID:
    """A run whose loss turns NaN (the non_finite rule fires at once)."""
    run_id = uuid.uuid4()
    created = httpx.put(f"{url}/api/v1/runs/{run_id}", json={"project": project})
    assert created.status_code == 201, created.text
    sent = httpx.post(f"{url}/api/v1/runs/{run_id}/metrics",
                      json={"steps": [1, 2, 3], "values": {"loss": [2.0, "NaN", "NaN"]}})
    assert sent.status_code == 200, sent.text
    return run_id


def _firing(url: str, run_id: uuid.UUID) -> bool:
    resp = httpx.get(f"{url}/api/v1/runs/{run_id}/alerts", params={"state": "firing"})
    assert resp.status_code == 200, resp.text
    return any(a["rule"] == "non_finite" for a in resp.json()["alerts"])


def test_notify_wakes_only_data_tasks_and_work_wakes_follow_ups(sqlite_url: str) -> None:
    """Ingest's notify() wakes the tasks that act on new data, not the others; a data task's
    round that did work wakes its follow-ups (an alert round wakes the webhook deliveries)."""
    rounds = {"data": 0, "follow_up": 0, "other": 0}
    data_twice, follow_up_twice = threading.Event(), threading.Event()
    lock = threading.Lock()

    def data(_factory: sessionmaker[Session], _settings: Settings) -> int:
        with lock:
            rounds["data"] += 1
            n = rounds["data"]
        if n == 2:
            data_twice.set()
            return 1  # work done: wakes the follow-up (and runs once more at once)
        return 0

    def follow_up(_factory: sessionmaker[Session], _settings: Settings) -> int:
        with lock:
            rounds["follow_up"] += 1
            if rounds["follow_up"] == 2:
                follow_up_twice.set()
        return 0

    def other(_factory: sessionmaker[Session], _settings: Settings) -> int:
        with lock:
            rounds["other"] += 1
        return 0

    # Intervals far beyond the deadline: only notify() and follow-ups bring second rounds.
    settings = Settings(database_url=sqlite_url, worker_interval_s=3600, worker_wake_gap_s=0)
    worker = Worker(sessionmaker(), settings, [data, follow_up, other],
                    on_new_data=[data], follow_ups={data: [follow_up]})
    worker.start()
    try:
        wait_for(lambda: all(rounds.values()), timeout=DEADLINE_S)  # every first round
        worker.notify()
        assert data_twice.wait(DEADLINE_S) and follow_up_twice.wait(DEADLINE_S)
        wait_for(lambda: rounds["data"] >= 3, timeout=DEADLINE_S)  # at once after work
        with lock:
            assert rounds["other"] == 1  # notify() and the follow-up passed it over
    finally:
        worker.stop(timeout=DEADLINE_S)


def test_worker_refuses_wiring_to_a_task_it_does_not_run(sqlite_url: str) -> None:
    def task(_factory: sessionmaker[Session], _settings: Settings) -> int:
        return 0

    def stranger(_factory: sessionmaker[Session], _settings: Settings) -> int:
        return 0

    settings = Settings(database_url=sqlite_url)
    with pytest.raises(ValueError, match="not one of the worker's tasks"):
        Worker(sessionmaker(), settings, [task], on_new_data=[stranger])
    with pytest.raises(ValueError, match="not one of the worker's tasks"):
        Worker(sessionmaker(), settings, [task], follow_ups={task: [stranger]})
