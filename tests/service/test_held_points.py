"""A refit reads only the steps logged since the previous refit (``store/_held_points``), and
must still see exactly what a read of the whole series gives: after new steps, a point stored
late inside what is held, logged NaNs, and a series that grows past the raw read's limit."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from curvecast.contract import RunConfig
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.schemas import MetricBatch, RunCreate
from curvecast.service.store import metric_reads, refits
from curvecast.service.store import metrics as metric_store
from curvecast.service.store import runs as run_store
from curvecast.service.store._held_points import HeldPoints
from curvecast.service.store.retention import delete_run


@pytest.fixture(scope="module")
def factory(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(Settings(database_url=database_url))
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def refit_cache(monkeypatch: pytest.MonkeyPatch) -> HeldPoints:
    """A fresh cache for the refits' reads (``refits``), its counters starting at 0."""
    cache = HeldPoints()
    monkeypatch.setattr(refits, "held_points", cache)
    return cache


@pytest.fixture
def read_cache(monkeypatch: pytest.MonkeyPatch) -> HeldPoints:
    """A fresh cache for the downsampled reads (``metric_reads``), its counters starting at 0."""
    cache = HeldPoints()
    monkeypatch.setattr(metric_reads, "held_points", cache)
    return cache


def _create(factory: sessionmaker[Session], run_id: uuid.UUID, project: str) -> uuid.UUID:
    with session_scope(factory) as s:
        run_store.create_or_get_run(s, run_id=run_id, run_in=RunCreate(project=project),
                                    allowed_project=None)
    return run_id


def _log(factory: sessionmaker[Session], run_id: uuid.UUID, steps: list[int],
         nan_every: int = 0) -> None:
    values = [math.nan if nan_every and s % nan_every == 0 else 3.0 / math.sqrt(1 + s) + 1
              for s in steps]
    with session_scope(factory) as s:
        metric_store.ingest_batch(s, run_id=run_id, batch=MetricBatch(
            steps=steps, values={"loss": values}), allowed_project=None)


def _inputs(factory: sessionmaker[Session], run_id: uuid.UUID) -> tuple[np.ndarray, np.ndarray]:
    job = refits.FitJob(run_id=run_id, run_n_points=0, config=RunConfig())
    with session_scope(factory) as s:
        (loss,) = refits.read_fit_inputs(s, job=job)
    return loss.steps, loss.values


def _whole(factory: sessionmaker[Session], run_id: uuid.UUID,
           monkeypatch: pytest.MonkeyPatch) -> tuple[np.ndarray, np.ndarray]:
    """The same read with nothing held: a fresh cache, used once."""
    with monkeypatch.context() as m:
        m.setattr(refits, "held_points", HeldPoints())
        return _inputs(factory, run_id)


def _same(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> None:
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_refits_read_new_steps_and_see_what_a_whole_read_sees(
    factory: sessionmaker[Session], project: str, monkeypatch: pytest.MonkeyPatch,
    refit_cache: HeldPoints,
) -> None:
    cache = refit_cache
    run_id = _create(factory, uuid.uuid4(), project)
    _log(factory, run_id, list(range(0, 300)), nan_every=7)
    first = _inputs(factory, run_id)
    assert (cache.hits, cache.misses) == (0, 1)
    assert not np.isnan(first[1]).any() and first[0].size == 300 - 43, "logged NaNs left out"

    _log(factory, run_id, list(range(300, 500)), nan_every=7)
    grown = _inputs(factory, run_id)
    assert (cache.hits, cache.misses) == (1, 1), "the new steps only"
    _same(grown, _whole(factory, run_id, monkeypatch))
    assert grown[0][-1] == 499

    # Steps missing inside what is held, stored late (a resent batch, a second writer): the
    # count disagrees, so the series is read whole, late points included.
    _log(factory, run_id, list(range(500, 520)) + [1_000])
    _log(factory, run_id, list(range(520, 600)))
    late = _inputs(factory, run_id)
    assert cache.hits == 2
    _log(factory, run_id, [700, 701])  # inside [0, 1000], after nothing held
    after_late = _inputs(factory, run_id)
    assert cache.misses == 2, "a late step is not taken for a new one"
    _same(after_late, _whole(factory, run_id, monkeypatch))
    assert {700.0, 701.0} <= set(after_late[0].tolist()) and 700.0 not in late[0]

    # Past the raw limit the refit reads block means, and holds nothing of the series.
    monkeypatch.setattr(refits, "RAW_READ_LIMIT", 600)
    monkeypatch.setattr(refits, "MIN_FIT_BLOCKS", 20)
    means = _inputs(factory, run_id)
    _same(means, _whole(factory, run_id, monkeypatch))
    assert means[0].size < 500, "block means, not raw points"
    assert _inputs(factory, run_id)[0].size == means[0].size


def test_the_cache_holds_at_most_max_points(
    factory: sessionmaker[Session], project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = HeldPoints(max_points=250)
    monkeypatch.setattr(refits, "held_points", cache)
    runs = [uuid.uuid4() for _ in range(3)]
    for run_id in runs:
        _create(factory, run_id, project)
        _log(factory, run_id, list(range(0, 100)))
        _inputs(factory, run_id)
    assert cache.misses == 3
    _inputs(factory, runs[0])  # the oldest was dropped to stay within 250 points
    assert (cache.hits, cache.misses) == (0, 4)
    _inputs(factory, runs[2])
    assert cache.hits == 1


def test_a_run_deleted_and_created_again_is_read_afresh(
    factory: sessionmaker[Session], project: str, refit_cache: HeldPoints
) -> None:
    """A run deleted and created again under the same id (its series may even get the same
    ids back on SQLite) logs new points: none of the old ones may be taken for them, even when
    the counts happen to agree."""
    run_id = uuid.uuid4()

    def create() -> None:
        _create(factory, run_id, project)

    create()
    _log(factory, run_id, list(range(0, 300)))
    assert _inputs(factory, run_id)[1][0] == pytest.approx(4.0)
    delete_run(factory, run_id)
    create()
    # 400 points where 300 were held: the held ones plus the 100 after them match the count.
    steps = list(range(0, 400))
    with session_scope(factory) as s:
        metric_store.ingest_batch(s, run_id=run_id, batch=MetricBatch(
            steps=steps, values={"loss": [7.0] * 400}), allowed_project=None)
    again = _inputs(factory, run_id)
    assert again[0].size == 400 and set(again[1].tolist()) == {7.0}


def _buckets(factory: sessionmaker[Session], run_id: uuid.UUID, max_points: int = 1_000,
             **window: int) -> Any:
    """A downsampled read whose buckets are narrower than a rollup block (raw points)."""
    with session_scope(factory) as s:
        out = metric_reads.read_series(s, run_id=run_id, keys=["loss"], max_points=max_points,
                                       allowed_project=None, start=window.get("start"),
                                       end=window.get("end"))
    return json.loads(out.series[0].model_dump_json())  # NaN as "NaN": comparable


def test_raw_bucket_reads_from_held_points_answer_as_fresh_reads(
    factory: sessionmaker[Session], project: str, monkeypatch: pytest.MonkeyPatch,
    database_url: str, read_cache: HeldPoints,
) -> None:
    cache = read_cache
    run_id = uuid.uuid4()

    def create() -> None:
        _create(factory, run_id, project)

    def fresh(**window: int) -> Any:
        with monkeypatch.context() as m:
            m.setattr(metric_reads, "held_points", HeldPoints())
            return _buckets(factory, run_id, **window)

    create()
    _log(factory, run_id, list(range(0, 3_000)), nan_every=11)
    first = _buckets(factory, run_id)
    assert first["downsampled"] and first == fresh()
    _log(factory, run_id, list(range(3_000, 3_500)), nan_every=11)
    assert _buckets(factory, run_id) == fresh()
    assert _buckets(factory, run_id, start=1_000, end=3_200) == fresh(start=1_000, end=3_200)
    _log(factory, run_id, [5_000])
    assert _buckets(factory, run_id) == fresh()
    _log(factory, run_id, [4_000, 4_001])  # late: inside what is held (up to 5,000)
    counts: list[str] = []

    def count_reads(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "FROM metric_rollups WHERE series_id" in statement and "sum(n)" in statement:
            counts.append(statement)

    engine = factory.kw["bind"]
    event.listen(engine, "before_cursor_execute", count_reads)
    try:
        late = _buckets(factory, run_id)
    finally:
        event.remove(engine, "before_cursor_execute", count_reads)
    # The miss read the series' count once, to find the held points stale, and used it.
    assert len(counts) == (1 if database_url.startswith("sqlite") else 0)
    assert late == fresh() and late["total_points"] == 3_503
    sqlite = database_url.startswith("sqlite")
    assert (cache.hits, cache.misses) == ((3, 2) if sqlite else (0, 0)), "SQLite holds"

    delete_run(factory, run_id)
    create()
    # As many points as were held, plus 100 after the last held step: the counts agree.
    steps = list(range(0, 3_503)) + list(range(5_001, 5_101))
    with session_scope(factory) as s:
        metric_store.ingest_batch(s, run_id=run_id, batch=MetricBatch(
            steps=steps, values={"loss": [7.0] * len(steps)}), allowed_project=None)
    again = _buckets(factory, run_id)
    assert again == fresh() and set(again["values"]) == {7.0}


def test_a_read_lets_go_of_a_series_grown_past_the_hold_limit(
    factory: sessionmaker[Session], project: str, monkeypatch: pytest.MonkeyPatch,
    database_url: str, read_cache: HeldPoints,
) -> None:
    cache = read_cache
    monkeypatch.setattr(metric_reads, "HOLD_LIMIT", 500)
    run_id = _create(factory, uuid.uuid4(), project)
    _log(factory, run_id, list(range(0, 400)))
    small = _buckets(factory, run_id, max_points=60)  # held: 400 points
    _log(factory, run_id, list(range(400, 600)))
    grown = _buckets(factory, run_id, max_points=60)  # 600 points: answered, then let go
    again = _buckets(factory, run_id, max_points=60)  # read from the database
    assert small["total_points"] == 400 and grown == again and again["total_points"] == 600
    if database_url.startswith("sqlite"):
        assert (cache.hits, cache.misses) == (1, 2)
