"""A critical ``non_finite`` alert does not resolve itself while the run goes on (it resolved six
seconds after firing, the run logging finite values again): it stays firing until someone
acknowledges it, then resolves once the run has been finite for 2% of it. Its ``step`` in REST
is the step it describes (the NaN's), the one the run page shows, whatever came after. A real
server and worker, both backends."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from curvecast.service.config import Settings
from curvecast.service.migrate import upgrade
from tests.support import thread_server, wait_for


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ack.db'}"
    else:
        url = str(request.getfixturevalue("fresh_pg_url"))
    upgrade(url)
    return url


def test_a_non_finite_alert_waits_for_an_acknowledgement(db_url: str) -> None:
    settings = Settings(database_url=db_url, worker_interval_s=0.05, alert_eval_min_interval_s=0)
    with thread_server(settings) as server:
        run_id = str(uuid.uuid4())
        base = f"{server}/api/v1/runs/{run_id}"
        httpx.put(base, json={"project": "ack", "config": {"total_steps": 1000}}
                  ).raise_for_status()

        def post(lo: int, hi: int, bad: int | None = None) -> None:
            steps = list(range(lo, hi))
            values: list[Any] = ["NaN" if s == bad else 2.0 for s in steps]
            httpx.post(f"{base}/metrics", json={"steps": steps, "values": {"loss": values}}
                       ).raise_for_status()

        def alert() -> dict[str, Any] | None:
            alerts = httpx.get(f"{base}/alerts").json()["alerts"]
            return next((a for a in alerts if a["rule"] == "non_finite"), None)

        post(0, 101, bad=60)  # one bad batch
        fired = wait_for(lambda: (a := alert()) and a["state"] == "firing" and a, 30, "fired")
        assert (fired["step"], fired["fired_step"], fired["since_step"]) == (60, 60, 60)
        assert fired["severity"] == "critical" and fired["value"] == 1.0
        # 400 finite steps more (20 times the 2% stretch): still firing, still about step 60.
        post(101, 501)
        wait_for(lambda: _evaluated_up_to(db_url, run_id) >= 500, 30, "the worker judged them")
        still = alert()
        assert still is not None and still["state"] == "firing", still
        assert (still["step"], still["value"]) == (60, 1.0)

        ack = httpx.post(f"{server}/api/v1/alerts/{still['id']}/ack")
        assert ack.status_code == 200 and ack.json()["acknowledged_at"] is not None
        post(501, 511)
        resolved = wait_for(lambda: (a := alert()) and a["state"] == "resolved" and a, 30,
                            "resolved once acknowledged")
        assert (resolved["step"], resolved["fired_step"]) == (60, 60)


def _evaluated_up_to(db_url: str, run_id: str) -> int:
    from sqlalchemy import select

    from curvecast.service.db import make_engine, make_sessionmaker, session_scope
    from curvecast.service.models import AlertEval

    engine = make_engine(Settings(database_url=db_url))
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            step = session.scalar(select(AlertEval.evaluated_step).where(
                AlertEval.run_id == uuid.UUID(run_id)))
            return -1 if step is None else int(step)
    finally:
        engine.dispose()
