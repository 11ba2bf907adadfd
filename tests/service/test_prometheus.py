"""``GET /metrics``: Prometheus' text, open with auth off and behind a token with auth on, and
with ``serve --workers 2`` the sum of every process's values whichever process answers."""

from __future__ import annotations

import base64
import struct
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from curvecast.contract import REPLAY_HEADER
from curvecast.service.config import Settings
from curvecast.service.migrate import upgrade
from tests.support import create_token, start_server_process, thread_server, wait_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str, **headers: str) -> Samples:
    resp = httpx.get(f"{url}/metrics", headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def ingest(client: httpx.Client, url: str, run_id: uuid.UUID, steps: range,
           replay: bool = False) -> dict[str, int]:
    body = {"steps": base64.b64encode(struct.pack(f"<{len(steps)}q", *steps)).decode(),
            "values": {"loss": [1.0 / (s + 1) for s in steps]}}
    headers = {REPLAY_HEADER: "1"} if replay else {}
    resp = client.post(f"{url}/api/v1/runs/{run_id}/metrics", json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_metrics_count_ingest_requests_and_replays(sqlite_url: str) -> None:
    with thread_server(Settings(database_url=sqlite_url, worker_enabled=False)) as url, \
            httpx.Client() as client:
        run_id = uuid.uuid4()
        client.put(f"{url}/api/v1/runs/{run_id}", json={"project": "prom"}).raise_for_status()
        before = scrape(url)
        ingest(client, url, run_id, range(0, 100))
        ingest(client, url, run_id, range(50, 150), replay=True)  # 50 stored already
        client.get(f"{url}/no/such/page")
        after = scrape(url)
    route = "/api/v1/runs/{run_id}/metrics"

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("curvecast_ingest_batches_total") == 2
    assert delta("curvecast_ingest_points_total") == 150
    assert delta("curvecast_ingest_duplicate_points_total") == 50
    assert delta("curvecast_spool_replay_batches_total") == 1
    assert delta("curvecast_spool_replay_points_total") == 50
    assert delta("curvecast_http_request_duration_seconds_count",
                 method="POST", route=route, status="200") == 2
    assert delta("curvecast_http_request_duration_seconds_count",
                 method="GET", route="other", status="404") == 1
    assert value(after, "curvecast_db_connections", state="open") >= 1
    assert ("process_cpu_seconds_total", ()) in after


def test_metrics_need_a_token_when_auth_is_on(tmp_path: Path) -> None:
    url_db = f"sqlite:///{tmp_path / 'auth.db'}"
    upgrade(url_db)
    token = create_token(url_db, "ops", "read")
    with thread_server(Settings(database_url=url_db, auth_enabled=True,
                                worker_enabled=False)) as url:
        refused = httpx.get(f"{url}/metrics")
        assert refused.status_code == 401
        assert refused.json()["error_code"] == "unauthenticated"
        assert httpx.get(f"{url}/metrics",
                         headers={"Authorization": "Bearer cc_0_nope"}).status_code == 401
        # Prometheus scrapes by address: any Host, with the token.
        samples = scrape(url, Authorization=f"Bearer {token}", Host="10.1.2.3:9000")
        assert ("curvecast_ingest_points_total", ()) in samples


@pytest.mark.postgres
@pytest.mark.slow
def test_every_process_answers_for_the_whole_server(pg_url: str, tmp_path: Path) -> None:
    server = start_server_process(pg_url, tmp_path, extra_args=["--workers", "2"],
                                  env={"CURVECAST_REFIT_MIN_INTERVAL_S": "0"},
                                  healthy_within=120)
    try:
        run_id = uuid.uuid4()
        httpx.put(f"{server.url}/api/v1/runs/{run_id}",
                  json={"project": "prom"}).raise_for_status()
        for batch in range(12):
            # A new connection each time: the batches reach both serve processes.
            with httpx.Client() as client:
                ingest(client, server.url, run_id, range(batch * 10, batch * 10 + 10))
        seen = set()
        for _ in range(8):
            samples = scrape(server.url)
            seen.add(value(samples, "curvecast_ingest_batches_total"))
            assert value(samples, "curvecast_ingest_points_total") == 120
        assert seen == {12.0}
        # The refits run in the worker process; their timings are in every scrape too.
        wait_for(lambda: value(scrape(server.url), "curvecast_refit_duration_seconds_count") > 0,
                 timeout=60, what="a refit counted by the worker process")
    finally:
        server.stop()
    assert "Traceback" not in server.log()
