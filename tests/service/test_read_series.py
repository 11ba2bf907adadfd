"""Reading several series of a run at once (``store/metric_reads.read_series``, what a page's live
poll and figures ask for): the same answer as reading each alone, in a number of statements
that does not grow with the number of keys, on both backends."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.errors import ReadTooLarge
from curvecast.service.schemas import MetricBatch, RunCreate
from curvecast.service.store import metric_reads
from curvecast.service.store import metrics as metric_store
from curvecast.service.store import runs as run_store

SHORT_KEYS = [f"k{i:02d}" for i in range(12)]


@pytest.fixture(scope="module")
def factory(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(Settings(database_url=database_url))
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def run_id(factory: sessionmaker[Session]) -> uuid.UUID:
    """Twelve short series (300 steps, one with gaps and a NaN, one with wall times), one long
    one (20,000 steps: downsampled at 2,000 buckets) and one sparse one spread over as many."""
    run_id = uuid.uuid4()
    steps = list(range(300))
    values: dict[str, list[float | None]] = {
        key: [i * 0.5 + s / 7 for s in steps] for i, key in enumerate(SHORT_KEYS)}
    values["k03"] = [None if s % 3 else s / 7 for s in steps]
    values["k04"][10] = math.nan
    with session_scope(factory) as s:
        run_store.create_or_get_run(s, run_id=run_id, run_in=RunCreate(project="reads"),
                                    allowed_project=None)
        for batch in (
            MetricBatch(steps=steps, wall_time=[1.7e9 + s for s in steps], values=values),
            MetricBatch(steps=list(range(20_000)),
                        values={"long": [1 / (s + 1) for s in range(20_000)]}),
            MetricBatch(steps=list(range(0, 20_000, 1000)),
                        values={"sparse": [float(s) for s in range(0, 20_000, 1000)]}),
        ):
            metric_store.ingest_batch(s, run_id=run_id, batch=batch, allowed_project=None)
    return run_id


def _read(factory: sessionmaker[Session], run_id: uuid.UUID, keys: list[str] | None,
          **kwargs: object) -> tuple[list[dict[str, object]], int]:
    """The series read (as JSON-ready dicts) and the statements the read sent (not counting
    the ``BEGIN`` SQLite's sessions send)."""
    engine = factory.kw["bind"]
    statements = [0]

    def count(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        statements[0] += statement != "BEGIN"

    event.listen(engine, "before_cursor_execute", count)
    try:
        with session_scope(factory) as s:
            out = metric_reads.read_series(s, run_id=run_id, keys=keys, allowed_project=None,
                                           start=kwargs.get("start"),  # type: ignore[arg-type]
                                           end=kwargs.get("end"),  # type: ignore[arg-type]
                                           max_points=kwargs.get("max_points"),  # type: ignore[arg-type]
                                           max_raw_points=kwargs.get("max_raw"))  # type: ignore[arg-type]
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return [series.model_dump(mode="json") for series in out.series], statements[0]


@pytest.mark.parametrize("window", [{}, {"start": 250}, {"start": 100, "end": 19_500}])
def test_reading_keys_together_answers_as_reading_each_alone(
    factory: sessionmaker[Session], run_id: uuid.UUID, window: dict[str, int]
) -> None:
    keys = [*SHORT_KEYS, "long", "sparse", "missing"]
    together, _ = _read(factory, run_id, keys, max_points=2000, **window)
    alone = [_read(factory, run_id, [key], max_points=2000, **window)[0][0] for key in keys]
    assert together == alone
    by_key = {s["key"]: s for s in together}
    assert by_key["long"]["downsampled"] is (window.get("end", 20_000) - window.get("start", 0)
                                             > 2000)
    assert by_key["sparse"]["downsampled"] is False  # every point fits after all
    assert by_key["missing"]["total_points"] == 0
    assert by_key["k03"]["total_points"] == sum(1 for s in range(window.get("start", 0), 300)
                                                 if s % 3 == 0)


def test_the_statements_of_a_read_do_not_grow_with_its_keys(
    factory: sessionmaker[Session], run_id: uuid.UUID
) -> None:
    """A page's live poll: a dozen keys, the last few steps. The run check, the series ids,
    their bounds and their points: four statements, for one key or twelve."""
    _, one = _read(factory, run_id, SHORT_KEYS[:1], start=280, max_points=2000)
    _, twelve = _read(factory, run_id, SHORT_KEYS, start=280, max_points=2000)
    assert one == twelve == 4
    _, everything = _read(factory, run_id, None)  # raw: every point of every series
    assert everything == 4


def test_the_raw_point_budget_counts_every_series_together(
    factory: sessionmaker[Session], run_id: uuid.UUID
) -> None:
    """Each series alone fits the budget; the twelve together do not."""
    _read(factory, run_id, SHORT_KEYS[:1], max_raw=1000)
    with pytest.raises(ReadTooLarge, match="more than 1000 raw points"):
        _read(factory, run_id, SHORT_KEYS, max_raw=1000)
