"""When the database is unreachable the service answers 503 with Retry-After, quickly."""

from __future__ import annotations

import time
import uuid

import httpx

from curvecast.service.config import Settings
from tests._servers import free_port, thread_server


def test_unreachable_database_gives_503_with_retry_after() -> None:
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    settings = Settings(database_url=dead, worker_enabled=False, retry_after_s=7)
    with thread_server(settings) as url:
        assert httpx.get(f"{url}/healthz").status_code == 200
        ready = httpx.get(f"{url}/readyz")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "7"
        assert ready.json()["status"] == "unavailable"
        started = time.monotonic()
        resp = httpx.post(
            f"{url}/api/v1/runs/{uuid.uuid4()}/metrics",
            json={"steps": [1], "values": {"loss": [1.0]}},
            timeout=30,
        )
        assert resp.status_code == 503
        assert resp.headers["retry-after"] == "7"
        assert resp.json()["error_code"] == "unavailable"
        # Fails fast rather than hanging (generous bound; the point is "not a hang").
        assert time.monotonic() - started < 15
