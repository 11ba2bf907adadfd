"""The fitting core: parameter recovery, odd data, intervals, serialisation, off-model, binning."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from curvecast.service.forecast import STATUSES, Fit, FitParams, model
from curvecast.service.forecast import calibration as cal
from curvecast.service.forecast.binning import bin_series
from curvecast.service.forecast.burn_in import choose_burn_in, data_burn_in
from curvecast.service.forecast.off_model import suffix_medians
from curvecast.service.forecast.robust_fit import LineFit, median, solve_ac
from curvecast.service.forecast.solver import fit_curve

DATA = Path(__file__).parent / "data"


def load(name: str) -> tuple[np.ndarray, np.ndarray]:
    arr = np.loadtxt(DATA / name, delimiter=",", skiprows=1)
    return arr[:, 0], arr[:, 1]


def synthetic(a: float, b: float, c: float, n: int, t_max: float, noise: float, seed: int = 0,
              t_min: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.linspace(t_min, t_max, n)
    return t, model(t, a, b, c) + rng.normal(0.0, noise, n)


# --- parameter recovery -------------------------------------------------------------------------
@pytest.mark.parametrize(("a", "b", "c", "t_max", "burn_in"), [
    (20.3, 377.0, 2.07, 100_000.0, 500.0),  # the paper's 500M-parameter run
    (41.5, 3076.0, 1.88, 60_000.0, 1000.0),  # the paper's 2B-parameter run
])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_paper_parameters_from_noisy_curves(a: float, b: float, c: float, t_max: float,
                                                     burn_in: float, seed: int) -> None:
    # b is only identifiable from steps comparable to it, hence the early burn-in here.
    t, y = synthetic(a, b, c, 4000, t_max, noise=0.005, seed=seed)
    fit = fit_curve(t, y, burn_in=burn_in, max_bins=10_000)  # no binning: sigma is per point
    assert fit.status == "ok"
    assert fit.a == pytest.approx(a, rel=0.02)
    assert fit.b == pytest.approx(b, rel=0.1)
    assert fit.c == pytest.approx(c, abs=0.002)
    assert fit.residual_scale == pytest.approx(0.005, rel=0.2)
    assert not fit.off_model


def test_paper_protocol_5_to_15_percent_predicts_the_rest() -> None:
    """Fit 5%-15% of the run, forecast the end: the paper's "near identical" claim."""
    a, b, c, t_max = 20.3, 377.0, 2.07, 200_000.0
    t, y = synthetic(a, b, c, 20_000, t_max, noise=0.005, seed=2)
    m = (t >= 0.05 * t_max) & (t <= 0.15 * t_max)
    fit = fit_curve(t[m], y[m])
    assert fit.status == "ok"
    truth = float(model(t_max, a, b, c))
    pred = fit.predict(t_max)
    assert abs(pred.value - truth) / truth < 0.003
    assert pred.lo < truth < pred.hi
    star = fit.f_star()
    assert star.lo < c < star.hi


def test_robust_to_spikes_and_outliers() -> None:
    t, y = synthetic(41.5, 3076.0, 1.88, 3000, 60_000.0, noise=0.01, seed=3)
    clean = fit_curve(t, y, burn_in=3000)
    spiky = y.copy()
    rng = np.random.default_rng(4)
    idx = rng.choice(t.size, 60, replace=False)
    spiky[idx] += rng.choice([-1.0, 1.0], 60) * rng.uniform(1.0, 50.0, 60)  # 2% gross outliers
    spiky[1500] = 1e6  # and one huge spike
    fit = fit_curve(t, spiky, burn_in=3000)
    assert fit.status == "ok"
    h = 200_000.0
    assert fit.predict(h).value == pytest.approx(clean.predict(h).value, rel=0.002)
    assert fit.c == pytest.approx(1.88, abs=0.02)


def test_plain_least_squares_would_be_ruined_by_the_spike() -> None:
    """The robust fit matters: an unweighted fit of the same data is pulled far off."""
    from scipy.optimize import curve_fit

    t, y = synthetic(20.3, 377.0, 2.07, 500, 20_000.0, noise=0.005, seed=5, t_min=1000)
    y[250] += 500.0
    with np.errstate(all="ignore"):
        p, _ = curve_fit(lambda x, a, b, c: a / np.sqrt(x + b) + c, t, y, p0=(20, 300, 2),
                         maxfev=20000)
    robust = fit_curve(t, y, burn_in=1000)
    truth = float(model(100_000.0, 20.3, 377.0, 2.07))
    plain_err = abs(float(model(100_000.0, *p)) - truth)
    robust_err = abs(robust.predict(100_000.0).value - truth)
    assert robust_err < 0.01
    assert plain_err > 10 * robust_err


# --- odd data: a status, never an exception ------------------------------------------------------
ODD_CASES = {
    "empty": ([], []),
    "one point": ([10.0], [3.0]),
    "three points": ([100.0, 200.0, 300.0], [3.0, 2.8, 2.7]),
    "all nan": ([1.0, 2.0, 3.0, 4.0, 5.0], [math.nan] * 5),
    "nan and inf mixed in": (list(range(1, 51)), [3.0 / math.sqrt(i) + 1 if i % 7 else math.nan
                                                  for i in range(1, 51)]),
    "inf loss": ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [math.inf, 3.0, 2.5, 2.3, 2.2, 2.1]),
    "flat": (list(range(100, 1100, 10)), [2.5] * 100),
    "flat noisy": (list(range(100, 1100, 10)),
                   (2.5 + np.random.default_rng(0).normal(0, 0.01, 100)).tolist()),
    "rising": (list(range(100, 1100, 10)), [2.0 + 0.001 * i for i in range(100)]),
    "duplicate steps only": ([5.0] * 20, [3.0] * 20),
    "two distinct steps": ([5.0] * 10 + [6.0] * 10, [3.0] * 10 + [2.9] * 10),
    "unsorted": ([500.0, 100.0, 300.0, 200.0, 400.0, 600.0], [2.2, 3.0, 2.5, 2.7, 2.3, 2.15]),
    "negative and zero steps": ([-5.0, 0.0, 5.0, 10.0, 20.0, 40.0], [9.0, 5.0, 4.0, 3.5, 3.0, 2.7]),
    "negative losses": (list(range(10, 1010, 10)), [-1.0 + 5.0 / math.sqrt(i) for i in
                                                    range(10, 1010, 10)]),
    "huge spike": (list(range(10, 1010, 10)), [1e300 if i == 50 else 2 + 3 / math.sqrt(i + 1)
                                               for i in range(100)]),
    "mismatched lengths": ([1.0, 2.0, 3.0, 4.0, 5.0], [3.0, 2.0]),
    "not numbers": (["a", "b"], ["c", "d"]),
    "ragged": ([[1.0, 2.0], [3.0]], [1.0, 2.0]),
    "constant step huge values": (list(range(1, 20)), [1e308] * 19),
    "tiny values": (list(range(1, 101)), [1e-300 / math.sqrt(i) for i in range(1, 101)]),
}


@pytest.mark.parametrize("case", sorted(ODD_CASES))
def test_odd_data_returns_a_status(case: str) -> None:
    steps, values = ODD_CASES[case]
    fit = fit_curve(steps, values)  # type: ignore[arg-type]
    assert fit.status in STATUSES
    # Queries never raise either, and the result survives a JSON round trip.
    fit.predict(1e6)
    fit.f_star()
    fit.steps_to(0.5)
    again = Fit.from_dict(json.loads(json.dumps(fit.to_dict(), allow_nan=False)))
    assert again.status == fit.status


def test_too_few_points_is_insufficient_data() -> None:
    fit = fit_curve([100.0, 200.0, 300.0], [3.0, 2.8, 2.7])
    assert fit.status == "insufficient_data"
    assert not fit.has_forecast
    assert math.isnan(fit.predict(1000.0).value)
    assert fit.steps_to(2.0).reachable is False


def test_flat_curve_forecasts_its_level() -> None:
    steps, values = ODD_CASES["flat noisy"]
    fit = fit_curve(steps, values)  # type: ignore[arg-type]
    assert fit.status == "flat"
    p = fit.predict(1e5)
    assert p.value == pytest.approx(2.5, abs=0.01)
    assert p.lo < 2.5 < p.hi


def test_rising_curve_is_off_model() -> None:
    steps, values = ODD_CASES["rising"]
    fit = fit_curve(steps, values)  # type: ignore[arg-type]
    assert fit.status == "off_model"
    assert fit.off_model


# --- burn-in -------------------------------------------------------------------------------------
def test_burn_in_precedence() -> None:
    assert choose_burn_in({"c_warmup": 2000, "warmup_steps": 500}) == (2000.0, "config:c_warmup")
    assert choose_burn_in({"warmup_steps": 500}) == (1000.0, "config:warmup_steps")
    assert choose_burn_in({"total_steps": 10}) == (None, None)
    assert choose_burn_in(None) == (None, None)
    t, y = synthetic(20.3, 377.0, 2.07, 1000, 50_000.0, noise=0.002)
    assert fit_curve(t, y, burn_in=7000, config={"c_warmup": 2000}).burn_in_source == "argument"
    f = fit_curve(t, y, config={"c_warmup": 2000})
    assert f.burn_in_source == "config:c_warmup"
    assert f.fitted_from_step is not None and f.fitted_from_step >= 2000
    assert fit_curve(t, y).burn_in_source == "data"


def test_data_burn_in_skips_an_initial_transient() -> None:
    """An LLM-like start (fast exponential drop) must not bend the fit of the 1/sqrt phase."""
    t = np.arange(1.0, 40_001.0, 20.0)
    rng = np.random.default_rng(7)
    y = model(t, 41.5, 3076.0, 1.88) + 6.0 * np.exp(-t / 400.0) + rng.normal(0, 0.003, t.size)
    fit = fit_curve(t, y)
    assert fit.status == "ok"
    assert fit.burn_in is not None and fit.burn_in >= 2000  # 5% of the latest step at least
    truth = float(model(400_000.0, 41.5, 3076.0, 1.88))
    assert fit.predict(400_000.0).value == pytest.approx(truth, rel=0.01)


# --- queries -------------------------------------------------------------------------------------
def test_intervals_widen_with_horizon_and_confidence() -> None:
    t, y = synthetic(20.3, 377.0, 2.07, 500, 10_000.0, noise=0.003, t_min=500)
    fit = fit_curve(t, y)
    near, far = fit.predict(20_000.0), fit.predict(1_000_000.0)
    assert near.lo < near.value < near.hi
    assert (far.hi - far.lo) > (near.hi - near.lo)
    i50, i90, i99 = (fit.predict(50_000.0, c) for c in (0.5, 0.9, 0.99))
    assert i50.hi - i50.lo < i90.hi - i90.lo < i99.hi - i99.lo
    assert fit.predict(50_000.0).value == i90.value  # the default confidence is 0.9


def test_steps_to_inverts_predict() -> None:
    t, y = synthetic(20.3, 377.0, 2.07, 500, 10_000.0, noise=0.003, t_min=500)
    fit = fit_curve(t, y)
    target = fit.predict(80_000.0).value
    est = fit.steps_to(target)
    assert est.reachable and est.step is not None
    assert est.step == pytest.approx(80_000.0, rel=1e-6)
    assert est.lo is not None and est.lo < est.step
    assert est.hi is None or est.hi > est.step
    # at or below the asymptote: never
    assert fit.c is not None
    below = fit.steps_to(fit.c - 0.01)
    assert below.reachable is False and below.step is None
    # already reached: a past step, zero-width
    past = fit.steps_to(float(y[0]) + 0.5)
    assert past.reachable and past.step is not None and past.step < 10_000.0
    assert past.lo == past.hi == past.step


def test_serialisation_round_trip_answers_the_same() -> None:
    t, y = load("mpl_400M_constant_72000.csv")
    fit = fit_curve(t[t <= 20_000], y[t <= 20_000])
    blob = json.dumps(fit.to_dict(), allow_nan=False)
    again = Fit.from_dict(json.loads(blob))
    assert again == fit
    for h in (30_000.0, 72_000.0, 1e6):
        assert again.predict(h, 0.8) == fit.predict(h, 0.8)
    assert again.steps_to(2.75) == fit.steps_to(2.75)
    assert again.f_star(0.95) == fit.f_star(0.95)


def test_from_dict_tolerates_missing_and_junk_fields() -> None:
    fit = Fit.from_dict({"status": "weird", "a": "x", "cov": [[1, 2], [3]], "extra": 1})
    assert fit.status == "no_convergence"
    assert not fit.has_forecast
    assert math.isnan(fit.predict(10.0).value)


def test_warm_start_reproduces_the_cold_fit() -> None:
    t, y = synthetic(41.5, 3076.0, 1.88, 2000, 60_000.0, noise=0.01, seed=9)
    first = fit_curve(t[t <= 40_000], y[t <= 40_000], burn_in=3000)
    cold = fit_curve(t, y, burn_in=3000)
    warm = fit_curve(t, y, warm_start=first.params)
    assert warm.burn_in_source == "warm_start" and warm.burn_in == 3000
    assert warm.predict(200_000.0).value == pytest.approx(cold.predict(200_000.0).value,
                                                          rel=1e-3)


def test_warm_start_params_type() -> None:
    p = FitParams(a=1.0, b=2.0, c=3.0)
    assert p.burn_in is None


# --- off-model -----------------------------------------------------------------------------------
def test_off_model_on_a_real_wsd_decay_but_not_before_it() -> None:
    t, y = load("mpl_100M_wsd_20000_24000.csv")  # LR decay from step 20000
    before = fit_curve(t[t <= 19_500], y[t <= 19_500])
    assert before.status == "ok" and not before.off_model
    during = fit_curve(t[t <= 22_000], y[t <= 22_000])  # half of the decay has passed
    assert during.off_model and during.status == "off_model"
    assert during.off_model_score is not None and during.off_model_score < -3


def test_synthetic_lr_decay_is_off_model_and_a_clean_run_is_not() -> None:
    t, y = synthetic(20.3, 377.0, 2.07, 1000, 40_000.0, noise=0.002, seed=11)
    assert not fit_curve(t, y).off_model
    decayed = y.copy()
    tail = t > 32_000
    decayed[tail] -= 0.15 * (t[tail] - 32_000) / 8_000  # linear cooldown over the last 20%
    fit = fit_curve(t, decayed)
    assert fit.off_model
    assert fit.off_model_excess is not None and fit.off_model_excess < 0


# --- real curves ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "max_err"), [
    ("mpl_400M_constant_72000.csv", 0.005),
    ("schaipp_sl124m_constant_val.csv", 0.005),
    ("algoperf_sf_wmt_val.csv", 0.01),
])
def test_real_anytime_curves_forecast_the_last_loss(name: str, max_err: float) -> None:
    t, y = load(name)
    total = t[-1]
    for k in (0.2, 0.3, 0.5):
        m = (t >= 0.05 * total) & (t <= k * total)
        fit = fit_curve(t[m], y[m])
        assert fit.status == "ok", (name, k, fit.message)
        p = fit.predict(total)
        assert abs(p.value - y[-1]) / y[-1] < max_err, (name, k)
        assert p.lo <= y[-1] <= p.hi, (name, k)


# --- binning -------------------------------------------------------------------------------------
def test_bin_series_medians_counts_and_centres() -> None:
    t = np.arange(1000, dtype=float)
    y = np.full(1000, 2.0)
    y[::100] = 1e9  # one spike per bin of 100
    b = bin_series(t, y, max_bins=10)
    assert b.steps.size == 10
    assert np.all(b.counts == 100)
    assert np.allclose(b.values, 2.0)
    assert np.allclose(b.steps, np.arange(49.5, 1000, 100))


def test_bin_series_uneven_split_nan_and_short_input() -> None:
    t = np.arange(1003, dtype=float)
    y = np.sqrt(t)
    y[5] = math.nan
    b = bin_series(t[::-1], y[::-1], max_bins=10)  # unsorted input
    assert b.counts.sum() == 1002
    assert np.all(np.diff(b.steps) > 0)
    short = bin_series([3.0, 1.0, 2.0], [1.0, 2.0, 3.0], max_bins=10)
    assert short.steps.tolist() == [1.0, 2.0, 3.0]
    assert short.values.tolist() == [2.0, 3.0, 1.0]
    assert bin_series("junk", [1], 10).steps.size == 0


def test_million_points_fit_through_bins() -> None:
    n = 10**6
    t = np.arange(1.0, n + 1.0)
    rng = np.random.default_rng(12)
    y = model(t, 41.5, 3076.0, 1.88) + rng.normal(0, 0.05, n)
    fit = fit_curve(t, y, burn_in=50_000)
    assert fit.n_points == n - 49_999
    assert fit.n_fitted <= 400
    assert fit.c == pytest.approx(1.88, abs=0.01)
    # Fitted up to the data's last step, not to its last bin's centre (1,250 steps back here).
    assert fit.fitted_upto_step == n


# --- calibration table ---------------------------------------------------------------------------
def test_calibration_multipliers_are_ordered() -> None:
    for ratio in (1.0, 1.5, 3.0, 10.0, 100.0, math.inf, math.nan):
        lo50, hi50 = cal.multipliers(ratio, 0.5)
        lo90, hi90 = cal.multipliers(ratio, 0.9)
        assert lo90 <= lo50 < hi50 <= hi90
    assert cal.multipliers(2.0, 7.0) == cal.multipliers(2.0, 0.9)  # invalid -> default
    assert len(cal.QUANTILES) == len(cal.RATIOS)
    assert all(len(row) == len(cal.PROBS) for row in cal.QUANTILES)


def test_suffix_medians_equal_numpy_medians_of_every_suffix() -> None:
    # The off_model scan's medians of the last m residuals, from one sort: exactly np.median's
    # answers (odd and even lengths, ties, the whole array, magnitudes from 1e-5 to 1e3).
    rng = np.random.default_rng(7)
    for trial in range(300):
        n = int(rng.integers(3, 160))
        x = rng.standard_normal(n) * 10 ** rng.uniform(-5, 3)
        if trial % 3 == 0:
            x = np.round(x, 1)
        lengths = sorted({min(int(round(3 * 1.25**i)), n) for i in range(40)})
        expected = np.array([np.median(x[-m:]) for m in lengths])
        assert np.array_equal(suffix_medians(x, lengths), expected)


def test_median_equals_numpy_median() -> None:
    # The fit's medians (dozens per fit) skip np.median's generic path: the same values exactly.
    rng = np.random.default_rng(11)
    for trial in range(300):
        x = rng.standard_normal(int(rng.integers(1, 90))) * 10 ** rng.uniform(-5, 3)
        if trial % 3 == 0:
            x = np.round(x, 1)  # ties
        assert median(x) == float(np.median(x))


def _line_fit_by_residuals(x: np.ndarray, y: np.ndarray, w: np.ndarray, cmin: float
                           ) -> tuple[float, float, float]:
    """The constrained weighted fit y ~ a x + c (a >= 0, c >= cmin) the textbook way: centred
    normal equations, then the residuals themselves."""
    mx, my = np.average(x, weights=w), np.average(y, weights=w)
    a = max(float(np.sum(w * (x - mx) * (y - my)) / np.sum(w * (x - mx) ** 2)), 0.0)
    c = my - a * mx
    if c < cmin:
        c = cmin
        a = max(float(np.sum(w * x * (y - cmin)) / np.sum(w * x * x)), 0.0)
    r = y - (a * x + c)
    return a, c, float(np.sum(w * r * r))


@pytest.mark.parametrize("cmin", [-np.inf, 0.0, 0.9])
def test_grid_and_polish_solves_match_the_residuals(cmin: float) -> None:
    # The grid's (a, c, SSE) come from weighted sums, the polish's from sums formed once per
    # pass: both must be the fit the residuals give, the asymptote's bound included (cmin 0.9
    # binds on most rows of this curve, whose c is about 0.5).
    rng = np.random.default_rng(3)
    t = np.linspace(100.0, 20_000.0, 300)
    y = model(t, 30.0, 500.0, 0.5) + rng.normal(0.0, 0.01, t.size)
    w = rng.uniform(0.2, 1.0, t.size)
    qs = np.linspace(np.log(100.0) - 3, np.log(100.0) + 6, 40)
    x = 1.0 / np.sqrt(np.exp(qs)[:, None] + (t - t[0])[None, :])
    a, c, sse = solve_ac(x, y, w, cmin)
    line = LineFit(y, w, cmin)
    for i, row in enumerate(x):
        ea, ec, esse = _line_fit_by_residuals(row, y, w, cmin)
        assert a[i] == pytest.approx(ea, rel=1e-7, abs=1e-12)
        assert c[i] == pytest.approx(ec, rel=1e-7, abs=1e-12)
        # The grid only ranks rows by SSE: a few digits lost to cancellation are allowed.
        assert sse[i] == pytest.approx(esse, rel=1e-6, abs=1e-12)
        assert line.ac(row) == pytest.approx((ea, ec), rel=1e-9, abs=1e-12)
        assert line.sse(row) == pytest.approx(esse, rel=1e-9, abs=1e-15)


def test_data_burn_in_fits_a_repeated_start_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Evaluated at 10% of the run the first step logged is at 12%: the 5% and 10% candidates
    # start at the same point and are one fit; a transient before 20% still moves the start.
    import curvecast.service.forecast.burn_in as burn_in

    t = np.linspace(1_200.0, 10_000.0, 120)
    y = np.where(t < 2_000.0, 4.0, model(t, 40.0, 100.0, 1.0))
    starts: list[float] = []
    real = burn_in.fit_vp

    def spy(tt: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        starts.append(float(tt[0]))
        return real(tt, *args, **kwargs)

    monkeypatch.setattr(burn_in, "fit_vp", spy)
    start = data_burn_in(t, y, np.ones_like(t), cmin=0.0)
    assert len(starts) == len(set(starts)) == 3  # 12% (for 5% and 10%), 20%, 30%
    assert start >= 2_000.0
