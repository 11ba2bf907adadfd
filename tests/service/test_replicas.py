"""Two uvicorn processes on different ports share one PostgreSQL and ingest overlapping batches
of the same run concurrently: every point is stored exactly once, no 5xx."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

from curvecast.service.config import Settings
from tests._servers import start_server_process


def test_two_processes_ingest_overlapping_batches_once(pg_url: str, tmp_path: Path) -> None:
    servers = [start_server_process(pg_url, tmp_path) for _ in range(2)]
    try:
        run_id = uuid.uuid4()
        put = httpx.put(f"{servers[0].url}/api/v1/runs/{run_id}", json={"project": "replicas"})
        assert put.status_code == 201
        # 40 batches of 500 steps, each overlapping its neighbour by half: 10,250 distinct
        # steps, two keys each, sent to alternating servers from 8 threads at once.
        batches = [list(range(i * 250, i * 250 + 500)) for i in range(40)]

        def send(index: int) -> tuple[int, dict[str, int]]:
            steps = batches[index]
            body = {
                "steps": steps,
                "values": {
                    "loss": [1.0 / (s + 1) for s in steps],
                    "eta": [float(s) for s in steps],
                },
            }
            url = servers[index % 2].url
            resp = httpx.post(f"{url}/api/v1/runs/{run_id}/metrics", json=body, timeout=60)
            return resp.status_code, resp.json()

        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(send, range(40)))
        assert all(status == 200 for status, _ in results), results
        distinct = 40 * 250 + 250
        assert sum(r["accepted"] for _, r in results) == 2 * distinct
        assert sum(r["duplicates"] for _, r in results) == 2 * (40 * 500 - distinct)
        engine = create_engine(Settings(database_url=pg_url).database_url)
        with engine.connect() as conn:
            stored = conn.execute(
                text(
                    "SELECT count(*), count(DISTINCT (p.series_id, p.step)) FROM metric_points p "
                    "JOIN series s ON s.id = p.series_id WHERE s.run_id = :r"
                ),
                {"r": run_id},
            ).one()
        engine.dispose()
        assert tuple(stored) == (2 * distinct, 2 * distinct)
        run = httpx.get(f"{servers[1].url}/api/v1/runs/{run_id}").json()
        assert run["n_points"] == 2 * distinct and run["last_step"] == distinct - 1
    finally:
        for server in servers:
            server.stop()
