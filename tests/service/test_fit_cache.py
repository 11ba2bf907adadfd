"""Forecast reads reuse fits parsed earlier in the process (``store/_parsed_fits.ParsedFits``):
they must never answer with a fit other than the newest stored one, whatever the database."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import delete, event, select, text
from sqlalchemy.orm import Session, sessionmaker

from curvecast.contract import RunConfig
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.forecast.fit import Fit
from curvecast.service.forecast.solver import fit_curve
from curvecast.service.migrate import upgrade
from curvecast.service.models import FitRecord, Run
from curvecast.service.schemas import RunCreate
from curvecast.service.store import forecasts, refits
from curvecast.service.store import runs as run_store
from curvecast.service.store._common import utcnow
from curvecast.service.store._parsed_fits import parsed_fits


def _factory(url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(Settings(database_url=url))
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def factory(database_url: str) -> Iterator[sessionmaker[Session]]:
    yield from _factory(database_url)


def _fit(c: float) -> Fit:
    """A fit of a clean curve whose floor is ``c``: fits of different ``c`` tell runs apart."""
    steps = np.arange(1.0, 400.0)
    return fit_curve(steps, 3.0 / np.sqrt(steps + 10.0) + c)


def _new_run(factory: sessionmaker[Session], project: str, run_id: uuid.UUID | None = None
             ) -> uuid.UUID:
    run_id = run_id or uuid.uuid4()
    with session_scope(factory) as s:
        run_store.create_or_get_run(s, run_id=run_id, run_in=RunCreate(project=project),
                                    allowed_project=None)
    return run_id


def _save(s: Session, run_id: uuid.UUID, fit: Fit, now: datetime | None = None) -> None:
    """Store ``fit`` as the worker would, as a new fit of the run's ``loss``."""
    job = refits.FitJob(run_id=run_id, run_n_points=fit.n_points, config=RunConfig())
    data = refits.FitInput(key="loss", steps=np.zeros(0), values=np.zeros(0),
                              previous_fit=None)
    refits.save_fits(s, job=job, fits=[(data, fit)], now=now or utcnow())


def _store(factory: sessionmaker[Session], run_id: uuid.UUID, fit: Fit,
           now: datetime | None = None) -> None:
    with session_scope(factory) as s:
        _save(s, run_id, fit, now)


def _latest(factory: sessionmaker[Session], run_id: uuid.UUID) -> forecasts.StoredFit:
    with session_scope(factory) as s:
        stored, _ = forecasts.latest_fit(s, run_id=run_id, allowed_project=None)
        listed = forecasts.newest_default_fits(s, [run_id])[run_id]
    assert stored is not None
    assert (listed.id, listed.fit) == (stored.id, stored.fit), "both reads agree"
    return stored


def test_a_new_fit_replaces_the_cached_one(factory: sessionmaker[Session], project: str
                                           ) -> None:
    run_id = _new_run(factory, project)
    _store(factory, run_id, _fit(1.0))
    first = _latest(factory, run_id)
    assert first.fit.c == pytest.approx(1.0, abs=1e-3)
    assert _latest(factory, run_id).fit is first.fit, "the second read reuses the parsed fit"
    _store(factory, run_id, _fit(2.0))
    second = _latest(factory, run_id)
    assert second.id > first.id
    assert second.fit.c == pytest.approx(2.0, abs=1e-3)


def test_a_deleted_runs_reused_fit_id_is_not_answered_from_the_cache(
    factory: sessionmaker[Session], project: str
) -> None:
    """SQLite gives a new row the id of a deleted newest row; the cached fit of the deleted run
    must not be served for the new one, even under the same run id."""
    run_id = _new_run(factory, project)
    _store(factory, run_id, _fit(1.0))
    old = _latest(factory, run_id)
    with session_scope(factory) as s:
        s.execute(delete(Run).where(Run.id == run_id))
    _new_run(factory, project, run_id)
    _store(factory, run_id, _fit(3.0))
    new = _latest(factory, run_id)
    assert new.fit.c == pytest.approx(3.0, abs=1e-3)
    assert new.created_at != old.created_at


def test_two_databases_with_the_same_fit_ids_do_not_share_fits(tmp_path: Path) -> None:
    """Same fit id, run id and creation time in two databases open at once (tests do this; so
    could a process serving two apps): each answers its own fit."""
    now = utcnow()
    engines = [make_engine(Settings(database_url=f"sqlite:///{tmp_path / n}.db"))
               for n in ("one", "two")]
    try:
        answers = []
        for engine, c in zip(engines, (1.0, 4.0), strict=True):
            upgrade(str(engine.url))
            factory = make_sessionmaker(engine)
            run_id = _new_run(factory, "p", uuid.UUID(int=1))
            _store(factory, run_id, _fit(c), now)
            answers.append(_latest(factory, run_id))
            answers.append(_latest(factory, run_id))  # the second read comes from the cache
        assert {a.id for a in answers} == {1}, "the case under test: one id, two databases"
        assert [round(a.fit.c or 0, 3) for a in answers] == [1.0, 1.0, 4.0, 4.0]
    finally:
        for engine in engines:
            engine.dispose()


@pytest.mark.postgres
def test_a_fits_commit_skips_the_wal_flush_and_only_that_transaction(
    pg_url: str, project: str
) -> None:
    """A fit is derived data, so its transaction may commit without waiting for the WAL flush
    (a crash loses the fit and the run's bookkeeping together: the run is refitted). The
    setting must stay in that transaction: ingest on the same pooled connection must not
    acknowledge points it has not flushed."""
    engine = make_engine(Settings(database_url=pg_url))
    try:
        factory = make_sessionmaker(engine)
        run_id = _new_run(factory, project)
        with session_scope(factory) as s:
            _save(s, run_id, _fit(1.0))
            assert s.execute(text("SHOW synchronous_commit")).scalar_one() == "off"
            backend = s.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with session_scope(factory) as s:
            # The same pooled connection (one PostgreSQL backend), in its next transaction.
            assert s.execute(text("SELECT pg_backend_pid()")).scalar_one() == backend
            assert s.execute(text("SHOW synchronous_commit")).scalar_one() == "on"
    finally:
        engine.dispose()


def test_a_stored_fit_is_answered_without_reading_its_json_again(
    factory: sessionmaker[Session], project: str
) -> None:
    """The worker that stores a fit keeps it parsed once its transaction commits: this
    process's next reads (an alert round, a request, the next refit's warm start) do not read
    its JSON back, and get exactly what parsing the stored row gives."""
    run_id = _new_run(factory, project)
    _store(factory, run_id, _fit(1.5))
    engine = factory.kw["bind"]
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        stored = _latest(factory, run_id)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert seen and not any(re.search(r"\bfits\.fit\b", s) for s in seen), seen
    with session_scope(factory) as s:
        row = s.scalar(select(FitRecord.fit).where(FitRecord.id == stored.id))
    assert stored.fit == Fit.from_dict(row)


def test_a_fit_whose_transaction_rolls_back_is_not_kept(
    factory: sessionmaker[Session], project: str
) -> None:
    run_id = _new_run(factory, project)
    with pytest.raises(RuntimeError), session_scope(factory) as s:
        _save(s, run_id, _fit(7.0))
        raise RuntimeError("the worker failed after saving")
    cached = parsed_fits._caches.of_engine(factory.kw["bind"]).keys()
    assert not [ident for ident in cached if ident[1] == run_id]
    with session_scope(factory) as s:
        assert forecasts.newest_default_fits(s, [run_id]) == {}
