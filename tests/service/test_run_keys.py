"""The keys of a run: bounded in number (a batch that would pass the limit is refused whole,
with a message naming the limit, also when two batches race to add keys), and exported at a
cost that grows with the points, not with the keys (counted in statements sent, through a real
server on both backends)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from curvecast.service.app import create_app
from curvecast.service.config import Settings
from curvecast.service.store.export import EXPORT_PAGE, GROUP
from tests._servers import serve_app

LIMIT = 50


@pytest.fixture(scope="module")
def app_and_url(database_url: str) -> Iterator[tuple[Any, str]]:
    app = create_app(Settings(database_url=database_url, worker_enabled=False,
                              max_keys_per_run=LIMIT))
    with serve_app(app) as url:
        yield app, url


def _run(url: str, project: str) -> str:
    run = f"{url}/api/v1/runs/{uuid.uuid4()}"
    httpx.put(run, json={"project": project}).raise_for_status()
    return run


def _batch(keys: list[str], steps: list[int]) -> dict[str, Any]:
    return {"steps": steps, "values": {k: [float(s) for s in steps] for k in keys}}


def test_a_run_has_at_most_the_configured_number_of_keys(app_and_url: tuple[Any, str],
                                                         project: str) -> None:
    _, url = app_and_url
    run = _run(url, project)
    first = [f"k{i:03d}" for i in range(LIMIT - 2)]
    httpx.post(f"{run}/metrics", json=_batch(first, [1, 2])).raise_for_status()
    # Three new keys beside two existing ones: past the limit, refused whole.
    resp = httpx.post(f"{run}/metrics", json=_batch(["k000", "k001", "x1", "x2", "x3"], [3]))
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["error_code"] == "too_many_keys"
    assert f"at most {LIMIT}" in body["message"] and "CURVECAST_MAX_KEYS_PER_RUN" in body["message"]
    stored = httpx.get(f"{run}/metrics", params={"keys": "k000"}).json()["series"][0]
    assert stored["steps"] == [1, 2]  # nothing of the refused batch was stored
    assert httpx.get(run).json()["n_points"] == 2 * len(first)
    # Up to the limit is fine, and points of known keys always are.
    httpx.post(f"{run}/metrics", json=_batch(["x1", "x2"], [3])).raise_for_status()
    httpx.post(f"{run}/metrics", json=_batch(first + ["x1"], [4])).raise_for_status()
    assert httpx.post(f"{run}/metrics", json=_batch(["x3"], [5])).status_code == 422


def test_batches_racing_to_add_keys_do_not_pass_the_limit(app_and_url: tuple[Any, str],
                                                          project: str) -> None:
    """Eight batches of ten new keys each at once, into a run that may take fifty: five are
    stored, three refused; the run ends with exactly fifty keys."""
    _, url = app_and_url
    run = _run(url, project)
    answers: list[int] = []
    start = threading.Barrier(8)

    def send(i: int) -> None:
        keys = [f"b{i}_{j}" for j in range(10)]
        start.wait()
        answers.append(httpx.post(f"{run}/metrics", json=_batch(keys, [1]), timeout=60
                                  ).status_code)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [200] * 5 + [422] * 3
    series = httpx.get(f"{run}/metrics").json()["series"]
    assert len(series) == LIMIT


class _Statements:
    """Counts the statements an engine sends (a SQLAlchemy event listener)."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.count = engine, 0

    def __enter__(self) -> _Statements:
        event.listen(self.engine, "before_cursor_execute", self._seen)
        return self

    def __exit__(self, *_exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)

    def _seen(self, *_args: object) -> None:
        self.count += 1


def test_the_export_costs_statements_per_points_not_per_key(app_and_url: tuple[Any, str],
                                                            project: str) -> None:
    """A run of many one-point keys and two large ones: every point exported in key and step
    order, in a few statements per page and per thousand keys (it was one session and one
    statement per key: 100 s for 100,000 keys)."""
    app, url = app_and_url
    run = _run(url, project)
    # The limit of this server is small; the store has no limit of its own: seed through it.
    from curvecast.service.db import session_scope
    from curvecast.service.schemas import MetricBatch
    from curvecast.service.store.metrics import ingest_batch

    run_id = uuid.UUID(run.rsplit("/", 1)[1])
    n_small = 2 * GROUP + 345
    big = EXPORT_PAGE + 77
    with session_scope(app.state.sessionmaker) as session:
        small = {f"m{i:05d}": [float(i)] for i in range(n_small)}
        ingest_batch(session, run_id=run_id, batch=MetricBatch(steps=[7], values=small),
                     allowed_project=None)
        ingest_batch(session, run_id=run_id, batch=MetricBatch(
            steps=list(range(big)), values={"a_big": [0.5] * big, "z_big": [0.25] * big}),
            allowed_project=None)
    with _Statements(app.state.engine) as seen:
        text = httpx.get(f"{run}/metrics.csv", timeout=120).text
    lines = text.splitlines()
    assert lines[0] == "key,step,value,wall_time"
    assert len(lines) == 1 + n_small + 2 * big
    keys_in_order = [line.split(",", 1)[0] for line in lines[1:]]
    assert keys_in_order == sorted(keys_in_order)  # key order, then step order within a key
    assert lines[1] == "a_big,0,0.5," and lines[big] == f"a_big,{big - 1},0.5,"
    assert lines[big + 1] == "m00000,7,0.0," and lines[-1] == f"z_big,{big - 1},0.25,"
    # Pages of points: ~3 per large key, ~1 per page of small keys, plus sizes per GROUP keys
    # and each page's session (begin/commit are not cursor statements).
    pages = (n_small + 2 * big) // EXPORT_PAGE + 2
    assert seen.count <= 4 * (pages + (n_small + 2) // GROUP + 1) + 10, seen.count
