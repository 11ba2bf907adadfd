"""Reads in bounded memory, on both backends through a real server: the CSV export streams page
by page and is exactly the points stored (NaN, infinities, missing wall times included, across
page boundaries); a raw read larger than the configured cap is refused with a message that says
what to do instead, and nothing is read past the cap."""

from __future__ import annotations

import io
import math
import uuid
from collections.abc import Iterator

import httpx
import pandas as pd
import pytest

from curvecast.service.config import Settings
from curvecast.service.store.export import EXPORT_PAGE
from tests._servers import thread_server

CAP = 5_000


@pytest.fixture(scope="module")
def capped_server(database_url: str) -> Iterator[str]:
    settings = Settings(database_url=database_url, worker_enabled=False, max_read_points=CAP)
    with thread_server(settings) as url:
        yield url


def _run_with_points(url: str, project: str, n: int) -> tuple[uuid.UUID, list[str]]:
    """A run with ``loss`` at steps 0..n-1 (a NaN, +inf and -inf among them, wall times on
    even steps) and ``eval`` every 100 steps; returns it and the CSV lines expected."""
    run_id = uuid.uuid4()
    resp = httpx.put(f"{url}/api/v1/runs/{run_id}", json={"project": project})
    assert resp.status_code == 201, resp.text
    special = {7: "NaN", EXPORT_PAGE: "Infinity", EXPORT_PAGE + 1: "-Infinity"}
    expected_loss, expected_eval = [], []
    for lo in range(0, n, 10_000):
        steps = list(range(lo, min(n, lo + 10_000)))
        loss = [special.get(s, 1.0 / (s + 1)) for s in steps]
        walls = [1.7e9 + s / 4 if s % 2 == 0 else None for s in steps]
        evals = [2.0 + s / 1e4 if s % 100 == 0 else None for s in steps]
        body = {"steps": steps, "wall_time": walls, "values": {"loss": loss, "eval": evals}}
        resp = httpx.post(f"{url}/api/v1/runs/{run_id}/metrics", json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        for s, v, w, e in zip(steps, loss, walls, evals, strict=True):
            wall = "" if w is None else repr(w)
            value = {"NaN": "NaN", "Infinity": "inf", "-Infinity": "-inf"}.get(str(v), None)
            expected_loss.append(f"loss,{s},{value or repr(v)},{wall}")
            if e is not None:
                expected_eval.append(f"eval,{s},{e!r},{wall}")
    return run_id, ["key,step,value,wall_time", *expected_eval, *expected_loss]


def test_the_export_streams_every_point_across_pages(capped_server: str, project: str) -> None:
    n = 2 * EXPORT_PAGE + 123
    run_id, expected = _run_with_points(capped_server, project, n)
    with httpx.stream("GET", f"{capped_server}/api/v1/runs/{run_id}/metrics.csv",
                      timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/csv")
        assert "content-length" not in resp.headers  # streamed, not built whole
        text = "".join(resp.iter_text())
    assert text.splitlines() == expected
    frame = pd.read_csv(io.StringIO(text))
    loss = frame[frame["key"] == "loss"].set_index("step")["value"]
    assert math.isnan(loss[7]) and loss[EXPORT_PAGE] == math.inf
    assert loss[EXPORT_PAGE + 1] == -math.inf and len(loss) == n
    only_eval = httpx.get(f"{capped_server}/api/v1/runs/{run_id}/metrics.csv",
                          params={"keys": "eval"}).text
    assert only_eval.splitlines() == [expected[0]] + [x for x in expected if x.startswith("eval")]


def test_a_raw_read_over_the_cap_says_what_to_do(capped_server: str, project: str) -> None:
    run_id, _ = _run_with_points(capped_server, project, CAP + 10)
    base = f"{capped_server}/api/v1/runs/{run_id}/metrics"
    resp = httpx.get(base)
    assert resp.status_code == 422
    body = resp.json()
    assert body["error_code"] == "read_too_large"
    assert f"more than {CAP} raw points" in body["message"]
    assert "max_points" in body["message"] and "metrics.csv" in body["message"]
    # Within the cap: a narrower range, one key, or a downsampled read.
    assert httpx.get(base, params={"end": CAP - 100}).status_code == 200
    assert httpx.get(base, params={"keys": "eval"}).status_code == 200
    down = httpx.get(base, params={"max_points": 1000})
    assert down.status_code == 200 and down.json()["series"][1]["downsampled"] is True
