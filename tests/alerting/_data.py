"""Stored runs (``fixtures/*.json.gz``, written by ``python -m bench run alerts_quality generate``)
and helpers to stream them into a real server."""

from __future__ import annotations

import gzip
import json
import math
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from curvecast.service.alerting.rules import Series
from tests import support as testing

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def load(name: str) -> dict[str, Any]:
    """One stored run: ``name``, ``config``, ``fault`` (kind, onset_step) and ``series``."""
    run: dict[str, Any] = json.loads(gzip.decompress((FIXTURES / f"{name}.json.gz").read_bytes()))
    for s in run["series"].values():
        s["values"] = [float(v) for v in s["values"]]
    return run


def names(prefix: str) -> list[str]:
    """Stored runs whose name starts with ``prefix``."""
    return sorted(p.name.removesuffix(".json.gz") for p in FIXTURES.glob(f"{prefix}*.json.gz"))


def as_series(run: dict[str, Any]) -> dict[str, Series]:
    """The run's series for the pure evaluator."""
    return {k: Series.of(s["steps"], s["values"]) for k, s in run["series"].items()}


def batches(run: dict[str, Any], size: int = 50, upto: int | None = None
            ) -> Iterator[dict[str, Any]]:
    """The run as the client would send it: columnar batches of ``size`` steps."""
    by_key = {k: dict(zip(s["steps"], s["values"], strict=True)) for k, s in run["series"].items()}
    last = max(max(s["steps"]) for s in run["series"].values())
    last = min(last, upto) if upto is not None else last
    for lo in range(1, last + 1, size):
        steps = list(range(lo, min(lo + size, last + 1)))
        values: dict[str, list[Any]] = {}
        for key, points in by_key.items():
            column = [points.get(s) for s in steps]
            if all(v is None for v in column):
                continue
            values[key] = [_api(v) for v in column]
        yield {"steps": steps, "values": values}


def _api(v: float | None) -> float | str | None:
    """Non-finite values travel as the strings the API accepts."""
    if v is None or math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def stream(url: str, run_id: uuid.UUID, run: dict[str, Any], *, size: int = 50,
           upto: int | None = None) -> None:
    """Send a stored run to a server, batch by batch."""
    for body in batches(run, size, upto):
        resp = httpx.post(f"{url}/api/v1/runs/{run_id}/metrics", json=body, timeout=30)
        assert resp.status_code == 200, resp.text


def finish(url: str, run_id: uuid.UUID) -> None:
    """Mark a run finished (a finished run is never 'stalled')."""
    resp = httpx.patch(f"{url}/api/v1/runs/{run_id}", json={"status": "finished"})
    assert resp.status_code == 200, resp.text


def create_run(url: str, project: str, run: dict[str, Any]) -> uuid.UUID:
    """``PUT`` a new run with the stored run's config."""
    run_id = uuid.uuid4()
    resp = httpx.put(f"{url}/api/v1/runs/{run_id}",
                     json={"project": project, "name": run["name"], "config": run["config"]})
    assert resp.status_code == 201, resp.text
    return run_id


#: :func:`tests.support.wait_for` with a minute's deadline: these tests wait on the
#: worker's evaluation rounds, which share the CPUs with the server under test.
wait_for = partial(testing.wait_for, timeout=60.0)
