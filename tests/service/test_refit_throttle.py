"""The refit throttle on both backends: a run that keeps growing is refitted at most once per
``refit_min_interval_s``, and the points that arrived meanwhile are in the next fit; a run
that ended is refitted with its last points without waiting for the growth or the age."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.forecast.solver import fit_curve
from curvecast.service.schemas import MetricBatch, RunCreate, RunUpdate
from curvecast.service.store import metrics as metric_store
from curvecast.service.store import refits
from curvecast.service.store import runs as run_store
from curvecast.service.store._common import utcnow


@pytest.fixture(scope="module")
def factory(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(Settings(database_url=database_url))
    yield make_sessionmaker(engine)
    engine.dispose()


def _new_run(factory: sessionmaker[Session], project: str) -> uuid.UUID:
    run_id = uuid.uuid4()
    with session_scope(factory) as s:
        run_store.create_or_get_run(s, run_id=run_id, run_in=RunCreate(project=project),
                                    allowed_project=None)
    return run_id


def _grow(factory: sessionmaker[Session], run_id: uuid.UUID, lo: int, hi: int) -> None:
    steps = list(range(lo, hi))
    batch = MetricBatch(steps=steps, values={"loss": [3.0 / math.sqrt(1 + s) + 1 for s in steps]})
    with session_scope(factory) as s:
        metric_store.ingest_batch(s, run_id=run_id, batch=batch, allowed_project=None)


def _claim_and_fit(factory: sessionmaker[Session], run_id: uuid.UUID, now: datetime,
                   growth: float = 0.0) -> int | None:
    """One worker round at ``now`` for this run: the number of points fitted, or None if the
    run was not due."""
    with session_scope(factory) as s:
        jobs = refits.claim_fit_jobs(
            s, now=now, growth=growth, max_age=timedelta(seconds=30), lease=timedelta(seconds=60),
            min_points=4, limit=1000, min_interval=timedelta(seconds=5))
    job = next((j for j in jobs if j.run_id == run_id), None)
    if job is None:
        return None
    with session_scope(factory) as s:
        inputs = refits.read_fit_inputs(s, job=job)
    fits = [(i, fit_curve(i.steps, i.values, config=job.config)) for i in inputs]
    with session_scope(factory) as s:
        refits.save_fits(s, job=job, fits=fits, now=now)
    return len(inputs[0].steps)


def test_a_growing_run_is_refitted_at_most_once_per_min_interval(
    factory: sessionmaker[Session], project: str
) -> None:
    run_id = _new_run(factory, project)
    _grow(factory, run_id, 0, 100)
    t0 = utcnow()
    assert _claim_and_fit(factory, run_id, t0) == 100
    _grow(factory, run_id, 100, 200)  # grows at once: due by size, but too soon
    assert _claim_and_fit(factory, run_id, t0 + timedelta(seconds=4)) is None
    _grow(factory, run_id, 200, 300)
    assert _claim_and_fit(factory, run_id, t0 + timedelta(seconds=5)) == 300


def test_a_run_that_ended_is_refitted_with_its_last_points(
    factory: sessionmaker[Session], project: str
) -> None:
    """The demo's run ended at step 2,000 with its last fit at 1,940 (3% short of the 5%
    growth): the finished run's forecast and f* stayed those of 1,940 until the fit was 30 s
    old. An ended run with new points is due at once (still after ``min_interval``)."""
    run_id = _new_run(factory, project)
    _grow(factory, run_id, 0, 1000)
    t0 = utcnow()
    assert _claim_and_fit(factory, run_id, t0, growth=0.05) == 1000
    _grow(factory, run_id, 1000, 1020)  # 2%: not due by growth, and the fit is young
    assert _claim_and_fit(factory, run_id, t0 + timedelta(seconds=6), growth=0.05) is None
    with session_scope(factory) as s:
        run_store.update_run(s, run_id=run_id, run_in=RunUpdate(status="finished"),
                             allowed_project=None)
    assert _claim_and_fit(factory, run_id, t0 + timedelta(seconds=2), growth=0.05) is None
    assert _claim_and_fit(factory, run_id, t0 + timedelta(seconds=6), growth=0.05) == 1020
    # Fitted with every point: nothing new, nothing due, however long it has ended.
    assert _claim_and_fit(factory, run_id, t0 + timedelta(seconds=60), growth=0.05) is None
