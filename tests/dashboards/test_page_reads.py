"""A run page reads its run once and its newest fit once per request: the HTML page, its chart
data and its live poll each build everything from one read of each (counted statement by
statement on a real SQLite database, a real run and a fit the worker's code stored)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session

from curvecast.service.config import Settings
from curvecast.service.errors import InvalidInput, NotFound
from curvecast.service.store import forecasts, run_fits
from curvecast.service.store import runs as run_store
from curvecast.service.worker.refit import refit_due_runs
from tests.dashboards.conftest import app_server, new_app
from tests.support import synthetic as syn

#: A statement that reads the ``runs`` table, and one that reads ``fits``.
_RUNS = re.compile(r"\b(FROM|JOIN)\s+runs\b")
_FITS = re.compile(r"\b(FROM|JOIN)\s+fits\b")
#: The existence check every store read of a run's points begins with
#: (``store._common.run_created_at``): it reads no more of the run than that it is there.
_EXISTS = re.compile(r"^\s*SELECT runs\.created_at\s+FROM runs\b")


@contextmanager
def _statements(engine: Engine) -> Iterator[list[str]]:
    """Every statement ``engine`` sends meanwhile, in order."""
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


@pytest.fixture(scope="module")
def run_page_server(sqlite_url: str) -> Iterator[tuple[str, uuid.UUID, Engine]]:
    """A server (worker off) with one run: points, and the fits the worker's refit stored."""
    settings = Settings(database_url=sqlite_url, worker_enabled=False, refit_min_interval_s=0)
    app = new_app(settings)
    with app_server(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        run_id = uuid.uuid4()
        syn.create_run(client, run_id, f"p-{uuid.uuid4().hex[:10]}", total_steps=20_000)
        syn.stream(client, run_id, 0, 3_000, total_steps=20_000, eval_every=500)
        while refit_due_runs(app.state.sessionmaker, settings):
            pass
        yield url, run_id, app.state.sessionmaker.kw["bind"]


@pytest.mark.parametrize("path", [
    "/runs/{id}",
    "/dashboards/api/runs/{id}/figures",
    "/dashboards/api/runs/{id}/figures?charts=loss",
    "/dashboards/api/runs/{id}/live?keys=loss,sfplus/eta&start=2900&max_points=200"
    "&horizon=20000",
])
def test_a_run_page_reads_its_run_and_its_newest_fit_once(
    run_page_server: tuple[str, uuid.UUID, Engine], path: str
) -> None:
    url, run_id, engine = run_page_server
    with httpx.Client(base_url=url, timeout=60) as client:
        forecast = client.get(f"/api/v1/runs/{run_id}/forecast").json()
        assert forecast["status"] == "ok", "the run has a fit to read"
        with _statements(engine) as seen:
            resp = client.get(path.format(id=run_id))
    assert resp.status_code == 200, resp.text[:300]
    run_reads = [s for s in seen if _RUNS.search(s) and not _EXISTS.match(s)]
    fit_reads = [s for s in seen if _FITS.search(s)]
    assert (len(run_reads), len(fit_reads)) == (1, 1), "\n\n".join(run_reads + fit_reads)


def test_the_pages_fit_reads_answer_what_the_forecast_reads_answer(
    run_page_server: tuple[str, uuid.UUID, Engine]
) -> None:
    """``store.run_fits`` (the pages' reads, given the run) and ``store.forecasts`` (REST's,
    which read the run too) find the same fits and raise the same errors."""
    _url, run_id, engine = run_page_server
    with Session(engine) as s:
        run = run_store.get_run(s, run_id=run_id, allowed_project=None)
        found = []
        for key in (None, "loss", "eval_loss"):  # eval_loss: too few points for a fit yet
            expected, _ = forecasts.latest_fit(s, run_id=run_id, allowed_project=None, key=key)
            assert run_fits.newest_fit(s, run=run, allowed_project=None, key=key) == expected
            history, _ = forecasts.fit_history(s, run_id=run_id, allowed_project=None, limit=3,
                                               key=key)
            assert run_fits.recent_fits(s, run=run, allowed_project=None, limit=3,
                                        key=key) == history
            found.append(expected is not None and len(history))
        assert all(found[:2]), "the run's loss has a fit"
        # A series the run does not log; one it logs that no fit is made of.
        for key, error in (("nope", NotFound), ("sfplus/eta", InvalidInput)):
            with pytest.raises(error) as rest:
                forecasts.latest_fit(s, run_id=run_id, allowed_project=None, key=key)
            with pytest.raises(error) as page:
                run_fits.newest_fit(s, run=run, allowed_project=None, key=key)
            assert page.value.message == rest.value.message
        with pytest.raises(NotFound) as rest:
            forecasts.fit_history(s, run_id=run_id, allowed_project=None, limit=3, key="nope")
        with pytest.raises(NotFound) as page:
            run_fits.recent_fits(s, run=run, allowed_project=None, limit=3, key="nope")
        assert page.value.message == rest.value.message
        assert run_fits.recent_fits(s, run=run, allowed_project=None, limit=3,
                                    key="sfplus/eta") == []
