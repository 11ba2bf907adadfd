"""The loss a run "reached" at a step it got to (``PredictionOut.reached``): the series smoothed
over the last 1% of the steps up to it, so a noisy training loss's one batch is not taken for
the loss. The rule is ``reached.smoothed_reached``; the offline CLI applies it to the points at
hand (``reached.loss_reached``) and the store to the database (``store.forecasts.loss_reached``),
which must agree on both backends."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker, session_scope
from curvecast.service.forecast.reached import REACHED_MAX_POINTS, loss_reached
from curvecast.service.schemas import MetricBatch, RunCreate
from curvecast.service.store import forecasts as forecast_store
from curvecast.service.store import metrics as metric_store
from curvecast.service.store import runs as run_store

STEPS = np.arange(0, 60_001, dtype=np.float64)


def _truth(t: np.ndarray) -> np.ndarray:
    return 3.0 / np.sqrt(t + 50.0) + 1.2


def _noisy_training_loss() -> np.ndarray:
    """A training loss logged every step: one batch's loss each, noise sd 0.05."""
    return _truth(STEPS) + np.random.default_rng(7).normal(0.0, 0.05, STEPS.size)


def test_a_noisy_training_loss_is_reached_as_its_level_not_one_batch() -> None:
    y = _noisy_training_loss()
    errors_smoothed, errors_raw = [], []
    for step in (2_000, 5_000, 20_000, 60_000):
        reached = loss_reached(STEPS, y, step)
        assert reached is not None
        window = y[(STEPS > 0.99 * step) & (STEPS <= step)][-REACHED_MAX_POINTS:]
        assert reached == pytest.approx(float(np.median(window)))
        errors_smoothed.append(abs(reached - float(_truth(np.array([step]))[0])))
        errors_raw.append(abs(float(y[int(step)]) - float(_truth(np.array([step]))[0])))
    # A median of >= 20 batches is within a few hundredths of the curve; one batch is not.
    assert max(errors_smoothed) < 0.03
    assert max(errors_raw) > 0.05


def test_a_sparse_eval_loss_is_reached_as_its_point() -> None:
    """An eval every 100 steps has one point in the window (or none: its last point before)."""
    t = np.arange(0.0, 5_001.0, 100.0)
    y = _truth(t)
    assert loss_reached(t, y, 3_000) == pytest.approx(float(y[30]))
    assert loss_reached(t, y, 3_050) == pytest.approx(float(y[30]))  # no point in (3019.5, 3050]
    assert loss_reached(t, y, 5_001) is None  # the series never got there
    assert loss_reached(t, y, -1) is None  # nothing at or before


def test_a_target_the_last_step_reached_is_reached_there() -> None:
    """The targets' smoothing (a running minimum of three-bin medians) lags a series' newest
    points: at a run's end a forecast said the eval loss "reached 2.384 there" while a target
    of 2.39 was "not reached". The fit's reached losses end with the last step's, by the same
    rule as the forecast's, so the two answers agree."""
    from curvecast.service.forecast.solver import fit_curve

    steps = np.arange(20.0, 401.0, 20.0)  # an eval loss every 20 steps, falling to the end
    evals = 5.0 / np.sqrt(steps) + 2.1
    last = loss_reached(steps, evals, 400.0)
    assert last == evals[-1]
    fit = fit_curve(steps, evals, config={"total_steps": 400})
    assert fit.reached is not None and fit.reached[-1] == (400.0, last)
    assert fit.reached[-2][1] > last + 0.005  # the smoothed minimum lags by more than that
    between = last + 0.005
    assert fit.steps_to(between).reached and fit.steps_to(between).step == 400.0
    assert fit.steps_to(last).reached
    assert not fit.steps_to(last - 1e-9).reached
    # A noisy training loss: whatever the forecast says it reached at its last step is a
    # reached target (the median of its last points; here its smoothed minimum was lower).
    y = _noisy_training_loss()[:4001]
    t = STEPS[:4001]
    fit, level = fit_curve(t, y), loss_reached(t, y, 4000.0)
    assert level is not None and fit.steps_to(level).reached


def test_a_series_that_ends_non_finite_has_no_loss_reached() -> None:
    t = np.arange(0.0, 1_001.0)
    y = _truth(t)
    y[995] = math.nan  # inside the window, not the newest: left out of the median
    assert loss_reached(t, y, 1_000) == pytest.approx(
        float(np.median(np.delete(y[991:1001], 995 - 991))))
    y[1000] = math.inf  # the newest point there: the series has no loss at that step
    assert loss_reached(t, y, 1_000) is None


@pytest.fixture(scope="module")
def factory(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(Settings(database_url=database_url))
    yield make_sessionmaker(engine)
    engine.dispose()


def test_the_store_reads_the_same_loss_reached_as_the_rule(
        factory: sessionmaker[Session]) -> None:
    """On both backends: a dense noisy series (windows of 20 to 600 points, capped at the 256
    latest), a sparse one, one that ends in NaN, and steps between points, past a series'
    end, and past the run's."""
    run_id = uuid.uuid4()
    y = _noisy_training_loss()
    sparse_t = np.arange(0.0, 40_001.0, 250.0)
    ends_nan = _truth(STEPS[:1_001]).copy()
    ends_nan[-3:] = math.nan
    with session_scope(factory) as s:
        run_store.create_or_get_run(s, run_id=run_id, run_in=RunCreate(project="reached"),
                                    allowed_project=None)
        metric_store.ingest_batch(s, run_id=run_id, allowed_project=None, batch=MetricBatch(
            steps=STEPS.astype(int).tolist(), values={"loss": y.tolist()}))
        metric_store.ingest_batch(s, run_id=run_id, allowed_project=None, batch=MetricBatch(
            steps=sparse_t.astype(int).tolist(), values={"eval_loss": _truth(sparse_t).tolist()}))
        metric_store.ingest_batch(s, run_id=run_id, allowed_project=None, batch=MetricBatch(
            steps=list(range(1_001)), values={"nan_end": ends_nan.tolist()}))
    last_step = int(STEPS[-1])
    cases = [("loss", step, STEPS, y) for step in (0, 1, 150, 2_000, 20_000, 60_000)]
    cases += [("eval_loss", step, sparse_t, _truth(sparse_t))
              for step in (0, 3_000, 3_100, 40_000, 40_001)]
    cases += [("nan_end", step, STEPS[:1_001], ends_nan) for step in (990, 998, 1_000)]
    with session_scope(factory) as s:
        for key, step, t, values in cases:
            expected = loss_reached(t, values, step)
            got = forecast_store.loss_reached(s, run_id, key, step, last_step)
            if expected is None:
                assert got is None, (key, step)
            else:
                assert got == pytest.approx(expected, rel=1e-9), (key, step)
        assert loss_reached(STEPS[:1_001], ends_nan, 1_000) is None  # it ends in NaN
        assert forecast_store.loss_reached(s, run_id, "loss", 60_001, last_step) is None
        assert forecast_store.loss_reached(s, run_id, "loss", 50, None) is None
