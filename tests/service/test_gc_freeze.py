"""The service freezes its startup heap, so full garbage collections skip the ~150,000 objects
imports leave behind (a 100 ms pause each, with the GIL held: BENCHMARKS.md, "gc_pauses")."""

from __future__ import annotations

import gc
from pathlib import Path

import httpx

from curvecast.service.config import Settings
from tests._servers import thread_server


def test_startup_freezes_the_imported_heap(tmp_path: Path) -> None:
    gc.unfreeze()  # as in a new process (other tests' servers froze this one's heap)
    assert gc.get_freeze_count() == 0
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'gc.db'}", worker_enabled=False)
    with thread_server(settings) as url:
        assert httpx.get(f"{url}/healthz").status_code == 200
        # plotly, scipy, SQLAlchemy, pydantic: far more than any request makes.
        assert gc.get_freeze_count() > 50_000
