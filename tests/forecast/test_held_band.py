"""The fitted curve's band past the last fitted step: each end held at its lowest so far.

The calibrated multipliers are measured per extrapolation ratio and are noisy from one ratio to
the next, so the band's raw ends could climb with the horizon: in a demo run's eval-loss fit
(below) the 90% low end was 1.564 at step 2,400 and 1.694 at 5,000, the high end 2.414 at step
500 and 2.430 at 800. The answers hold each end instead.
"""

from __future__ import annotations

import numpy as np
import pytest

from curvecast.service.forecast import Fit
from curvecast.service.forecast import fit as fit_module

#: A ``curvecast demo --size tiny --steps 400`` run's eval-loss fit, as the service stores it
#: (``Fit.to_dict``; ``reached`` left out: the targets below are not in the data).
DEMO_EVAL_FIT = {
    "status": "ok", "a": 8.64843230812483, "b": -82.36451846572511, "c": 1.8805440094513033,
    "n_points": 13, "n_fitted": 13, "fitted_from_step": 160.0, "fitted_upto_step": 400.0,
    "residual_scale": 0.02254259494928453, "burn_in": 150.0, "burn_in_source": "config:c_warmup",
    "n_eff": 5.879330041889762,
    "cov": [[7.728774822313126, 1.0445005140635308, -0.4086854955687134],
            [1.0445005140635308, 0.14680142382817069, -0.05426933535488126],
            [-0.4086854955687134, -0.05426933535488126, 0.021861151693020685]],
    "confidence": 0.9, "calibration": "corpus-232curves-2641fits", "loss_floor": 0.0,
    "level": 2.3958988189697266, "decay_rate": 0.13675346808731967, "level_step": 380.0,
}
HORIZONS = np.geomspace(401.0, 1e8, 400)


@pytest.fixture
def fit() -> Fit:
    return Fit.from_dict(DEMO_EVAL_FIT)


@pytest.mark.parametrize("confidence", [0.5, 0.9, 0.99])
def test_neither_end_rises_past_the_last_fitted_step(fit: Fit, confidence: float) -> None:
    steps, _, _ = fit_module._crossing_table(fit, confidence)
    value, lo, hi = fit.predict_many(steps[1:], confidence)
    assert np.all(np.diff(lo) <= 0) and np.all(np.diff(hi) <= 0)
    assert np.all(lo <= value) and np.all(value <= hi)
    # Between the table's steps too, but for a smooth dip between two of them (1e-6 here).
    value, lo, hi = fit.predict_many(HORIZONS, confidence)
    assert np.all(np.diff(lo) <= 1e-5) and np.all(np.diff(hi) <= 1e-5)


def test_the_raw_band_did_rise_so_the_test_can_fail(fit: Fit) -> None:
    _, lo, hi = fit._raw_band_many(np.array([2400.0, 5000.0, 500.0, 800.0]), 0.9)
    assert lo[1] > lo[0] + 0.1  # 1.694 against 1.564
    assert hi[3] > hi[2]  # 2.430 against 2.414


def test_held_ends_are_never_above_the_raw_band(fit: Fit) -> None:
    _, raw_lo, raw_hi = fit._raw_band_many(HORIZONS, 0.9)
    value, lo, hi = fit.predict_many(HORIZONS, 0.9)
    assert np.all(lo <= raw_lo) and np.all(hi <= raw_hi)
    assert lo[np.searchsorted(HORIZONS, 5000.0)] < 1.56  # held from about step 2,600


def test_one_step_and_many_steps_answer_the_same(fit: Fit) -> None:
    for confidence in (0.6, 0.9, 0.99):
        value, lo, hi = fit.predict_many(HORIZONS[::37], confidence)
        for i, step in enumerate(HORIZONS[::37]):
            one = fit.predict(step, confidence)
            assert (one.value, one.lo, one.hi) == pytest.approx((value[i], lo[i], hi[i]))


def test_a_targets_earliest_step_is_where_the_forecasts_low_end_gets_there(fit: Fit) -> None:
    """``steps_to`` and ``predict`` read the same held band: before a target's earliest step no
    forecast's low end reaches the target, and from it on every one does."""
    for loss in (2.2, 2.0, 1.8, 1.6, 1.56):
        earliest = fit.steps_to(loss, 0.9).lo
        assert earliest is not None
        before = np.geomspace(400.5, earliest * 0.999, 50)
        after = np.geomspace(earliest * 1.001, 1e7, 50)
        assert np.all(fit.predict_many(before, 0.9)[1] > loss - 1e-9)
        assert np.all(fit.predict_many(after, 0.9)[1] <= loss + 1e-9)


def test_f_star_is_below_the_band_and_the_loss_now(fit: Fit) -> None:
    for confidence in (0.9, 0.99):
        f_star = fit.f_star(confidence)
        _, lo, hi = fit.predict_many(np.array([1e12]), confidence)
        assert f_star.hi <= hi[0]
        assert f_star.lo <= f_star.value <= f_star.hi
        assert fit.level is not None and f_star.hi <= fit.level
    # At 99% the calibrated band alone put f* up to 2.96, above the 2.396 the run is at.
    assert fit.f_star(0.99).hi == pytest.approx(fit.level)


def test_inside_the_data_the_band_is_unchanged(fit: Fit) -> None:
    steps = np.linspace(160.0, 400.0, 25)
    assert np.array_equal(np.vstack(fit.predict_many(steps, 0.9)),
                          np.vstack(fit._raw_band_many(steps, 0.9)))


@pytest.mark.parametrize("step", [160.0, 300.0, 400.0, 401.0, 2_400.0, 5_000.0, 1e6, 1e9])
def test_predict_quantiles_are_the_ends_predict_gives(fit: Fit, step: float) -> None:
    probs = [0.005, 0.05, 0.25, 0.5, 0.75, 0.95, 0.995]
    want = [fit.predict(step, max(abs(1 - 2 * p), 1e-9)) for p in probs]
    ends = [w.lo if p <= 0.5 else w.hi for p, w in zip(probs, want, strict=True)]
    # rel: predict's median is the limit of a vanishing interval, here of one 1e-9 wide.
    assert fit.predict_quantiles(step, probs) == pytest.approx(ends, rel=1e-9)


def test_predict_quantiles_of_a_band_that_extends_the_level_and_outside_the_range() -> None:
    level = Fit.from_dict({**DEMO_EVAL_FIT, "status": "no_asymptote"})
    band = level.predict(5_000.0, 0.9)
    assert level.predict_quantiles(5_000.0, [0.05, 0.95]) == pytest.approx([band.lo, band.hi],
                                                                           rel=1e-12)
    fit = Fit.from_dict(DEMO_EVAL_FIT)
    assert np.isnan(fit.predict_quantiles(100.0, [0.05, 0.95])).all()  # before the fitted range
