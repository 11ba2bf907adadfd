"""Deleting a run while it is in use: ingest racing the deletion on PostgreSQL (real concurrent
requests to a real server) never answers 500, and leaves no row of the run behind; a run
deleted during its refit is skipped and the rest of the refit round is fitted and stored."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.migrate import upgrade
from curvecast.service.store import refits
from curvecast.service.worker import refit
from tests._servers import thread_server
from tests.conftest import create_pg_database, drop_pg_database
from tests.service.test_retention import counts

#: Rows no table may hold once a run is gone: points, rollups and fits whose series or run
#: does not exist (the foreign keys cascade; this checks nothing got round them).
ORPHANS = {
    "points": "SELECT count(*) FROM metric_points p WHERE NOT EXISTS "
              "(SELECT 1 FROM series s WHERE s.id = p.series_id)",
    "rollups": "SELECT count(*) FROM metric_rollups r WHERE NOT EXISTS "
               "(SELECT 1 FROM series s WHERE s.id = r.series_id)",
    "series": "SELECT count(*) FROM series s WHERE NOT EXISTS "
              "(SELECT 1 FROM runs r WHERE r.id = s.run_id)",
    "fits": "SELECT count(*) FROM fits f WHERE NOT EXISTS "
            "(SELECT 1 FROM runs r WHERE r.id = f.run_id)",
}


def _factory(url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(Settings(database_url=url))
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def pg_factory(pg_url: str) -> Iterator[sessionmaker[Session]]:
    yield from _factory(pg_url)


def _no_orphans(factory: sessionmaker[Session]) -> dict[str, int]:
    with session_scope(factory) as s:
        return {name: int(s.execute(text(q)).scalar_one()) for name, q in ORPHANS.items()}


def _seed(url: str, project: str, keys: list[str], steps: int) -> str:
    run = f"{url}/api/v1/runs/{uuid.uuid4()}"
    httpx.put(run, json={"project": project}).raise_for_status()
    body = {"steps": list(range(steps)), "values": {k: [1.0] * steps for k in keys}}
    httpx.post(f"{run}/metrics", json=body, timeout=60).raise_for_status()
    return run


@pytest.mark.postgres
def test_ingest_racing_delete_never_answers_500(pg_url: str,
                                                pg_factory: sessionmaker[Session]) -> None:
    """Four clients send batches (each with a key the run does not have yet) while the run is
    deleted, six runs in a row: every answer is 200, 404 (the run is gone) or 503 with
    Retry-After; the deletion answers 204; nothing of the run is left. It was 500 for about
    one ingest in five here (a deadlock between the deletion's series rows and ingest's run
    row, then a foreign-key violation from series read before the wait)."""
    answers: Counter[tuple[str, int]] = Counter()
    problems: list[str] = []
    keys = [f"k{i:02d}" for i in range(20)]
    with thread_server(Settings(database_url=pg_url, worker_enabled=False)) as url:
        for _ in range(6):
            run = _seed(url, "race", keys, 2_000)
            stop = threading.Event()
            stored = threading.Semaphore(0)

            def ingest(client_no: int, run: str = run, stop: threading.Event = stop,
                       stored: threading.Semaphore = stored) -> None:
                step = 100_000 * (client_no + 1)
                with httpx.Client(timeout=120) as client:
                    while not stop.is_set():
                        batch = keys + [f"new{client_no}_{step}"]
                        resp = client.post(f"{run}/metrics", json={
                            "steps": list(range(step, step + 200)),
                            "values": {k: [0.5] * 200 for k in batch}})
                        answers["ingest", resp.status_code] += 1
                        if resp.status_code == 503 and "retry-after" not in resp.headers:
                            problems.append(f"503 without Retry-After: {resp.text}")
                        elif resp.status_code not in (200, 404, 503):
                            problems.append(f"ingest {resp.status_code}: {resp.text[:300]}")
                        if resp.status_code == 404:
                            return
                        stored.release()
                        step += 200

            clients = [threading.Thread(target=ingest, args=(i,)) for i in range(4)]
            for t in clients:
                t.start()
            try:
                for _ in range(4):  # the deletion starts while batches are being stored
                    assert stored.acquire(timeout=60), "no batch was stored"
                for _ in range(5):  # a 503 (the deletion aborted by the database) is retried
                    resp = httpx.delete(run, timeout=300)
                    answers["delete", resp.status_code] += 1
                    if resp.status_code != 503:
                        break
                assert resp.status_code == 204, resp.text
            finally:
                stop.set()
                for t in clients:
                    t.join(timeout=300)
            assert httpx.get(run).status_code == 404
            late = httpx.post(f"{run}/metrics", json={"steps": [1], "values": {"x": [1.0]}})
            assert late.status_code == 404
            run_id = uuid.UUID(run.rsplit("/", 1)[1])
            assert set(counts(pg_factory, run_id).values()) == {0}, counts(pg_factory, run_id)
    assert problems == [], (problems[:5], answers)
    assert answers["ingest", 200] > 0 and answers["ingest", 404] > 0, answers
    assert _no_orphans(pg_factory) == dict.fromkeys(ORPHANS, 0)


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of this test's own: the refit round claims every run that is due."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'refit.db'}"
        upgrade(url)
        yield url
        return
    url = create_pg_database()
    try:
        upgrade(url)
        yield url
    finally:
        drop_pg_database(url)


def test_a_run_deleted_during_its_refit_is_skipped_and_the_round_goes_on(
    empty_database: str, monkeypatch: pytest.MonkeyPatch, project: str,
) -> None:
    """Three runs due for a refit; the first one the round reaches is deleted (a real DELETE
    through the server, from another thread of this test) after its points were read and
    fitted, before its fit is stored. The round returns normally, the other two runs get their
    fits, and nothing of the deleted one is left. (The fit's foreign key failed on the deleted
    run and aborted the round: the other runs waited for their 30 s lease.)"""
    settings = Settings(database_url=empty_database, worker_enabled=False,
                        refit_min_interval_s=0, refit_max_age_s=0.001)
    real_save = refits.save_fits
    deleted: list[uuid.UUID] = []

    with thread_server(settings) as url:
        runs = []
        for _ in range(3):
            run = f"{url}/api/v1/runs/{uuid.uuid4()}"
            httpx.put(run, json={"project": project, "config": {"total_steps": 400}}
                      ).raise_for_status()
            steps = list(range(1, 301))
            httpx.post(f"{run}/metrics", json={
                "steps": steps, "values": {"loss": [2.0 / s ** 0.5 + 1.0 for s in steps]}},
            ).raise_for_status()
            runs.append(uuid.UUID(run.rsplit("/", 1)[1]))

        def save_after_a_deletion(session: Session, *, job: Any, **kwargs: Any) -> None:
            if not deleted and job.run_id in runs:
                # Another thread deletes the run while this refit holds its fit.
                done = threading.Event()

                def delete() -> None:
                    resp = httpx.delete(f"{url}/api/v1/runs/{job.run_id}", timeout=60)
                    assert resp.status_code == 204, resp.text
                    done.set()

                threading.Thread(target=delete).start()
                assert done.wait(60), "the deletion did not finish"
                deleted.append(job.run_id)
            real_save(session, job=job, **kwargs)

        monkeypatch.setattr(refits, "save_fits", save_after_a_deletion)
        engine = make_engine(settings)
        try:
            factory = make_sessionmaker(engine)
            handled = refit.refit_due_runs(factory, settings)  # raised IntegrityError
            assert deleted and handled == 3
            victim = deleted[0]
            assert set(counts(factory, victim).values()) == {0}, counts(factory, victim)
            for run_id in set(runs) - {victim}:
                assert counts(factory, run_id)["fits"] >= 1, run_id
                assert httpx.get(f"{url}/api/v1/runs/{run_id}/forecast").status_code == 200
            # Nothing waits for a lease: every claimed run was released or is gone.
            with session_scope(factory) as s:
                leased = s.execute(text(
                    "SELECT count(*) FROM run_work WHERE fit_lease_until IS NOT NULL")).scalar_one()
            assert leased == 0
        finally:
            engine.dispose()
