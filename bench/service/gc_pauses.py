"""Garbage-collector pauses in the service, with and without freezing the startup heap.

The service imports plotly, scipy, SQLAlchemy and pydantic: ~150,000 long-lived objects that
every full (generation 2) collection walks with the GIL held. ``create_app``'s startup calls
``freeze_startup_heap`` (``gc.freeze``) so those collections skip them. This bench measures what
that buys: in this process, the app (SQLite, worker off) answers ``GET .../forecast/target``
in a closed loop for a fixed time, once with the freeze switched off (the baseline) and once
as shipped, alternating, and records every generation-2 collection's duration
(``gc.callbacks``) and the request latencies.

Usage: ``python -m bench run gc_pauses [--seconds 20] [--rounds 2] [--no-write]``
"""

from __future__ import annotations

import gc
import math
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench._cli import parser, publish
from bench._report import markdown_table, phase


def _serve_queries(freeze: bool, seconds: float, workdir: Path) -> dict[str, Any]:
    """One round: a fresh app and run with a stored fit, queried for ``seconds``."""
    from fastapi.testclient import TestClient

    import curvecast.service.app as app_module
    from curvecast.service.config import Settings
    from curvecast.service.db import make_engine, make_sessionmaker
    from curvecast.service.worker.refit import refit_due_runs

    gc.unfreeze()  # each round starts from an unfrozen heap, as a new process does
    original = app_module.freeze_startup_heap
    if not freeze:
        app_module.freeze_startup_heap = lambda: None
    settings = Settings(database_url=f"sqlite:///{workdir / uuid.uuid4().hex}.db",
                        worker_enabled=False)
    pauses: list[float] = []
    started = [0.0]

    def on_gc(event: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if event == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((time.perf_counter() - started[0]) * 1e3)

    latencies: list[float] = []
    try:
        with TestClient(app_module.create_app(settings), base_url="http://127.0.0.1") as client:
            frozen = gc.get_freeze_count()
            run = str(uuid.uuid4())
            client.put(f"/api/v1/runs/{run}", json={"project": "gc"}).raise_for_status()
            steps = list(range(1, 3001))
            client.post(f"/api/v1/runs/{run}/metrics", json={
                "steps": steps, "values": {"loss": [3 / math.sqrt(s + 20) + 1 for s in steps]},
            }).raise_for_status()
            engine = make_engine(settings)
            refit_due_runs(make_sessionmaker(engine), settings)
            engine.dispose()
            gc.callbacks.append(on_gc)
            try:
                end = time.perf_counter() + seconds
                while time.perf_counter() < end:
                    t = time.perf_counter()
                    client.get(f"/api/v1/runs/{run}/forecast/target",
                               params={"loss": 1.2}).raise_for_status()
                    latencies.append((time.perf_counter() - t) * 1e3)
            finally:
                gc.callbacks.remove(on_gc)
    finally:
        app_module.freeze_startup_heap = original
    return {"frozen": frozen, "pauses": pauses, "latencies": latencies}


def _row(name: str, rounds: list[dict[str, Any]]) -> list[object]:
    pauses = [p for r in rounds for p in r["pauses"]]
    lat = sorted(x for r in rounds for x in r["latencies"])

    def q(p: float) -> str:
        return f"{lat[min(len(lat) - 1, int(p * len(lat)))]:.1f}"

    return [
        name, f"{statistics.mean(r['frozen'] for r in rounds):,.0f}", len(pauses),
        f"{statistics.median(pauses):.1f}" if pauses else "-",
        f"{max(pauses):.1f}" if pauses else "-", f"{len(lat):,}", q(0.5), q(0.99),
        f"{lat[-1]:.1f}",
    ]


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--seconds", type=float, default=20.0, help="query time per round")
    cli.add_argument("--rounds", type=int, default=2, help="rounds of each variant")
    args = cli.parse_args(argv)
    results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="curvecast-gc-") as tmp:
        for i in range(args.rounds):
            for freeze in (False, True):
                with phase("gc_pauses", f"round {i + 1}, freeze {'on' if freeze else 'off'}"):
                    results[freeze].append(_serve_queries(freeze, args.seconds, Path(tmp)))
    base, shipped = _row("not frozen (baseline)", results[False]), _row("frozen (shipped)",
                                                                          results[True])
    body = (
        "In one process, the app on SQLite (worker off) answers `GET .../forecast/target` in a "
        f"closed loop for {args.seconds:.0f} s per round, {args.rounds} rounds of each variant "
        "alternating; every generation-2 collection is timed with `gc.callbacks`. Baseline: "
        "the same app with `freeze_startup_heap` switched off. A pause holds the GIL: every "
        "request of the process waits it out.\n\n"
        + markdown_table(
            ["startup heap", "objects frozen", "gen-2 collections", "median pause ms",
             "max pause ms", "requests", "p50 ms", "p99 ms", "max ms"], [base, shipped])
    )
    frozen = (f"{shipped[3]} ms with the startup heap frozen" if shipped[3] != "-"
              else "never ran with the startup heap frozen")
    result = (f"a full collection pauses {base[3]} ms without freezing (median), {frozen}; "
              f"the slowest request {shipped[8]} against {base[8]} ms")
    return publish(args, "gc_pauses", "Garbage-collector pauses in the service", body, result)
