"""Honest answers: each status on a planted curve, the loss floor, and targets answered from
the data (passed), refused (below f* or the floor) or forecast."""

from __future__ import annotations

import math

import numpy as np
import pytest

from curvecast.service.forecast import Fit, model
from curvecast.service.forecast.curve import ends_diverged
from curvecast.service.forecast.solver import fit_curve


def _noisy(y: np.ndarray, sd: float, seed: int = 0) -> np.ndarray:
    return y + np.random.default_rng(seed).normal(0.0, sd, y.size)


def test_before_averaging_starts_is_too_early_with_a_wide_interval() -> None:
    """A plateau before c_warmup: the current loss extended at the pace runs like it kept
    (the transient table), a wide interval, and the step from which a useful one is
    expected -- not the fitted plateau's "no change" dressed as certain."""
    from curvecast.service.forecast import calibration as cal

    t = np.arange(0.0, 400.0)
    y = _noisy(2.0 + 1.5 * np.exp(-t / 30.0), 0.01)  # fast drop, then a plateau at 2.0
    fit = fit_curve(t, y, config={"c_warmup": 500, "total_steps": 2000})
    assert fit.status == "too_early"
    assert fit.useful_from_step == 1000  # 2 x the averaging start
    assert "step 1000" in fit.message
    assert fit.level is not None and fit.level == pytest.approx(2.0, abs=0.02)
    p = fit.predict(2000)
    g_lo, g_mid, g_hi = cal.TRANSIENT.exponents("too_early", None, 0.9)
    assert 0.0 < g_mid < g_hi  # runs in the transient fell afterwards, some a lot
    assert fit.fitted_upto_step is not None
    # Extended from the step the level stands for: the median step of its points (the latest
    # 10% of those fitted), not the last step.
    assert 375 < fit.level_anchor < 390 < fit.fitted_upto_step
    x = math.log(2000 / fit.level_anchor)
    assert p.value == pytest.approx(fit.level * math.exp(-g_mid * x))
    # Each half-width: the exponents' band and the loss's noise (at ratio 1), in quadrature.
    z_lo, z_hi = cal.multipliers(1.0, 0.9)
    sigma = fit.residual_scale or 0.0
    assert p.lo == pytest.approx(p.value - math.hypot(
        p.value - fit.level * math.exp(-g_hi * x), z_lo * sigma))
    assert p.hi == pytest.approx(p.value + math.hypot(
        fit.level * math.exp(-g_lo * x) - p.value, z_hi * sigma))
    assert p.lo < 0.75 * fit.level and p.hi >= 0.95 * fit.level  # wide: it does not know
    # The fitted plateau itself would have said "no change": the answer is not the model's.
    assert abs(fit._value(2000) - fit.level) < 0.05 < fit.level - p.value
    star = fit.f_star()
    assert math.isnan(star.value) and star.hi == fit.level  # "at most the current loss"
    assert fit.params is None  # a provisional fit is no warm start for the real one
    # The same pace answers targets: half-way down to the forecast is reached before 2000.
    est = fit.steps_to(0.5 * (fit.level + p.value))
    assert est.reachable and 399 < (est.step or 0) < 2000


def test_a_transient_forecast_at_the_last_step_is_not_a_point() -> None:
    """The exponents' band has width 0 at the step the level stands for: a run that got to its
    final step was forecast there as a point (the demo's last line: 1.511 [1.511, 1.511] while
    the eval loss read 1.506). The loss's own noise widens it, by the multipliers at ratio 1."""
    from curvecast.service.forecast import calibration as cal

    t = np.arange(0.0, 400.0)
    y = _noisy(2.0 + 1.5 * np.exp(-t / 30.0), 0.05)
    fit = fit_curve(t, y, config={"c_warmup": 500, "total_steps": 400})
    assert fit.status == "too_early" and fit.fitted_upto_step is not None
    sigma = fit.residual_scale
    assert sigma is not None and sigma > 0.02
    z_lo, z_hi = cal.multipliers(1.0, 0.9)
    p = fit.predict(fit.fitted_upto_step)
    # The exponents' band from the level's step (a few steps back) to the last step: narrow;
    # each half-width combined with the noise's in quadrature.
    g_lo, g_mid, g_hi = cal.TRANSIENT.exponents("too_early", None, 0.9)
    assert fit.level is not None
    x = math.log(fit.fitted_upto_step / fit.level_anchor)
    assert 0 < x < 0.1
    value = fit.level * math.exp(-g_mid * x)
    assert p.value == pytest.approx(value)
    assert p.lo == pytest.approx(value - math.hypot(value - fit.level * math.exp(-g_hi * x),
                                                    z_lo * sigma))
    assert p.hi == pytest.approx(value + math.hypot(fit.level * math.exp(-g_lo * x) - value,
                                                    z_hi * sigma))
    assert p.lo <= p.value + z_lo * sigma and p.hi >= p.value + z_hi * sigma
    values, los, his = fit.predict_many([fit.fitted_upto_step, 2 * fit.fitted_upto_step])
    assert (values[0], los[0], his[0]) == pytest.approx((p.value, p.lo, p.hi))
    far = fit.predict(2 * fit.fitted_upto_step)
    assert (values[1], los[1], his[1]) == pytest.approx((far.value, far.lo, far.hi))
    # Far out the exponents' band dominates: the noise adds little to it.
    r = 2 * fit.fitted_upto_step / fit.level_anchor
    bare = fit.level * (r ** -g_lo) - fit.level * (r ** -g_hi)
    assert bare < far.hi - far.lo < bare + 0.5 * (z_hi - z_lo) * sigma


#: The eval loss of a real 600-step ``curvecast demo`` run (every 20 steps) and its config.
_DEMO_600_STEPS = np.arange(20.0, 601.0, 20.0)
_DEMO_600_LOSS = np.array([
    3.4065, 2.8849, 2.6257, 2.5075, 2.4639, 2.431, 2.3863, 2.3478, 2.2718, 2.2867, 2.2616,
    2.2511, 2.3127, 2.292, 2.2476, 2.1955, 2.1437, 2.1016, 2.0682, 2.0363, 1.9975, 1.9602,
    1.9307, 1.8997, 1.8761, 1.8503, 1.8259, 1.8036, 1.7789, 1.7565,
])
_DEMO_600_CONFIG = {"total_steps": 600, "warmup_steps": 150, "c_warmup": 225}


@pytest.mark.parametrize("upto", [400, 500, 600])
def test_a_falling_run_is_forecast_at_its_last_step_around_the_loss_it_reached(upto: int) -> None:
    """The reported bug: at the end of a 600-step demo run the forecast at step 600 read 1.779
    [1.769, 1.794] while the eval loss there was 1.757. The level (the median of the latest
    points) is the value of the window's middle point; extended from the last step, a falling
    curve's forecast lagged by half a window, and its narrow interval missed the data at 400,
    500 and 600 steps. Extended from the step it stands for, it holds them."""
    m = _DEMO_600_STEPS <= upto
    fit = fit_curve(_DEMO_600_STEPS[m], _DEMO_600_LOSS[m], config=_DEMO_600_CONFIG)
    assert fit.status in ("too_early", "no_asymptote") and fit.level is not None
    assert fit.level_anchor == upto - 20  # the middle of the latest three points
    reached = float(_DEMO_600_LOSS[m][-1])
    p = fit.predict(upto)
    assert p.lo <= reached <= p.hi
    assert p.value < fit.level  # the loss kept falling from the level's step to the last


def test_a_fit_stored_before_level_step_estimates_it_from_its_range() -> None:
    """Fits stored before ``level_step`` existed (a finished run is not refitted) take it as
    the median step of the latest points spaced evenly over the fitted range: for evenly
    logged losses, the step the solver records."""
    dense = np.arange(0.0, 3000.0)
    for t, y, config in (
        (_DEMO_600_STEPS, _DEMO_600_LOSS, _DEMO_600_CONFIG),  # eval every 20 steps
        (dense, _noisy(model(dense, 20.0, 300.0, 1.5), 0.003), {"c_warmup": 500}),  # each step
    ):
        fit = fit_curve(t, y, config=config)
        stored = fit.to_dict()
        assert stored.pop("level_step") == fit.level_anchor
        old = Fit.from_dict(stored)
        # Within a bin of it when the solver fitted bins (its range is then bin centres).
        assert old.level_step == pytest.approx(fit.level_anchor, rel=2e-3)
        assert old.predict(10_000).value == pytest.approx(fit.predict(10_000).value, rel=1e-3)
    assert Fit.from_dict({**stored, "level_step": None}).level_step is None  # stored as unknown


def test_shortly_after_averaging_starts_is_too_early() -> None:
    t = np.arange(500.0, 800.0)
    y = _noisy(model(t, 20.0, 300.0, 1.5), 0.003)
    fit = fit_curve(t, y, config={"c_warmup": 500})
    assert fit.status == "too_early" and fit.useful_from_step == 1000
    later = fit_curve(np.arange(500.0, 1500.0), _noisy(model(np.arange(500.0, 1500.0), 20.0,
                                                             300.0, 1.5), 0.003),
                      config={"c_warmup": 500})
    assert later.status == "ok" and later.useful_from_step is None


@pytest.mark.parametrize(("optimizer", "averages"), [
    (None, True), ("ScheduleFreePlus", True), ({"name": "AdamWScheduleFree"}, True),
    ("AdamW", False), ({"name": "SGD"}, False)])
def test_the_transient_speaks_of_averaging_only_for_an_optimizer_that_averages(
        optimizer: object, averages: bool) -> None:
    # The start is the same (ScheduleFree+'s rule, twice warmup_steps); the message says what
    # it is: AdamW averages nothing, so its transient is after warmup, and c_warmup moves it.
    t = np.arange(0.0, 300.0)
    y = _noisy(model(t, 20.0, 300.0, 1.5), 0.003)
    config = {"warmup_steps": 100, "total_steps": 350,
              **({} if optimizer is None else {"optimizer": optimizer})}
    fit = fit_curve(t, y, config=config)
    assert fit.status == "too_early" and fit.useful_from_step == 400
    assert fit.message is not None and "so it will get none" in fit.message
    assert ("averaging starts (step 200)" in fit.message) is averages
    assert ("after warmup (the fit starts at step 200" in fit.message) is not averages
    assert ("pass c_warmup" in fit.message) is not averages


def test_straight_line_has_no_asymptote() -> None:
    """c pinned at the floor: no f* value, "at most" the current loss; the forecast extends the
    current loss at the decay rate the data show now, slowed as runs like it slowed, instead of
    trusting the line to the floor."""
    from curvecast.service.forecast import calibration as cal

    t = np.arange(100.0, 1000.0)
    y = _noisy(3.0 - 0.001 * t, 0.002)
    fit = fit_curve(t, y, burn_in=100)
    assert fit.status == "no_asymptote"
    assert fit.c == 0.0
    star = fit.f_star()
    assert math.isnan(star.value)
    assert star.lo == 0.0 and star.hi == pytest.approx(fit.level)
    # The line's slope in log-log terms at its end: d log(3 - 0.001 t) / d log t at ~t = 800.
    assert fit.decay_rate == pytest.approx(0.001 * 800 / 2.2, rel=0.15)
    p = fit.predict(5000)
    g_lo, g_mid, g_hi = cal.TRANSIENT.exponents("no_asymptote", fit.decay_rate, 0.9)
    assert fit.fitted_upto_step is not None
    assert p.value == pytest.approx(fit.level * (5000 / fit.level_anchor) ** -g_mid)
    assert 0.0 <= p.lo < p.value < p.hi
    assert 0.5 < p.value < fit.level  # the line itself would be below 0 by then
    assert "not identifiable" in fit.message


def test_an_asymptote_known_to_within_the_floor_is_not_an_estimate() -> None:
    """c above its floor but f*'s interval reaching it ("0 +- most of the loss") is no estimate
    of f* either: no_asymptote, said in the message."""
    t = np.arange(100.0, 600.0)
    y = _noisy(model(t, 40.0, 50.0, 0.3), 0.02)  # the asymptote far below the data, noisy
    fit = fit_curve(t, y, burn_in=100)
    assert fit.status == "no_asymptote"
    assert fit.c is not None and fit.c > 0.0
    assert "interval reaches the loss floor" in fit.message
    assert math.isnan(fit.f_star().value)


def test_linear_decay_is_off_model() -> None:
    t = np.arange(0.0, 3000.0)
    base = model(t, 20.0, 300.0, 1.5)
    decay = np.where(t > 2000, (t - 2000) * 2e-4, 0.0)  # an LR decay from step 2000 on
    fit = fit_curve(t, _noisy(base - decay, 0.002), burn_in=100)
    assert fit.status == "off_model" and fit.off_model


def test_a_declared_decaying_schedule_is_off_model() -> None:
    t = np.arange(0.0, 2000.0)
    y = _noisy(model(t, 20.0, 300.0, 1.5), 0.002)
    for schedule, status in (("cosine", "off_model"), ("Linear", "off_model"),
                             ("constant", "ok"), ("constant_with_warmup", "ok")):
        fit = fit_curve(t, y, config={"c_warmup": 100, "lr_schedule": schedule})
        assert fit.status == status, schedule
    declared = fit_curve(t, y, config={"c_warmup": 100, "lr_schedule": "wsd"})
    assert declared.off_model and "decaying learning-rate schedule (wsd)" in declared.message


def _cosine_lr(t: np.ndarray, warmup: int, total: int) -> np.ndarray:
    frac = np.clip((t - warmup) / (total - warmup), 0.0, 1.0)
    return np.where(t < warmup, 1e-3 * (t + 1) / warmup, 1e-3 * 0.5 * (1 + np.cos(np.pi * frac)))


def test_a_logged_decaying_learning_rate_is_off_model_from_early_in_the_decay() -> None:
    """The loss of a cosine run looks anytime until late in the decay; the learning rate the
    hook logs (``opt/lr``) shows the decay at once. A warmup or a constant rate does not."""
    t = np.arange(0.0, 4000.0)
    y = _noisy(model(t, 20.0, 300.0, 1.5), 0.002)  # a loss the model fits well
    lr = _cosine_lr(t, warmup=200, total=4000)
    quarter = 200 + 0.25 * 3800  # a quarter of the way into the decay: cos at 85% of its peak
    fit = fit_curve(t[t <= quarter], y[t <= quarter], burn_in=100, lr=(t, lr))
    assert fit.status == "off_model" and fit.off_model
    assert "logged learning rate decays" in fit.message and "since step" in fit.message
    # The fit sees the rate only up to its own last step: early in the run it has not decayed.
    early = fit_curve(t[t <= 600], y[t <= 600], burn_in=100, lr=(t, lr))
    assert early.status == "ok"
    constant = np.minimum(1e-3 * (t + 1) / 200, 1e-3)  # warmup, then constant
    assert fit_curve(t, y, burn_in=100, lr=(t, constant)).status == "ok"


def test_lr_decay_reads_only_what_a_scheduler_makes() -> None:
    from curvecast.service.forecast.schedule import lr_decay

    t = np.arange(0.0, 1000.0)
    assert lr_decay(t, np.minimum(t / 100, 1.0)) is None  # warmup then flat
    assert lr_decay(t, np.full(t.size, 3e-4)) is None  # constant
    assert lr_decay([], []) is None and lr_decay(t, t[:10]) is None  # nothing, ragged
    assert lr_decay(t, np.where(t < 500, 1.0, 0.91)) is None  # within 10% of its peak
    step = np.where(t < 500, 1.0, 0.1)  # a step schedule (ReduceLROnPlateau, MultiStepLR)
    decay = lr_decay(t, step)
    assert decay is not None and decay.since_step == 500 and decay.fraction == pytest.approx(0.1)
    assert lr_decay(t, step, upto=499) is None
    with_nan = np.where(t % 7 == 0, np.nan, step)
    decay = lr_decay(t, with_nan)
    assert decay is not None and decay.since_step == 500


def test_nothing_goes_below_the_loss_floor() -> None:
    """A curve close to 0 with a wide interval: lo, the band and f* stop at 0; a config's
    declared lower bound moves the floor."""
    t = np.arange(100.0, 600.0)
    y = _noisy(model(t, 2.0, 50.0, 0.02), 0.01)
    fit = fit_curve(t, y, burn_in=100)
    assert fit.loss_floor == 0.0
    for step in (600, 5_000, 1e6):
        p = fit.predict(step)
        assert p.lo >= 0.0 and p.value >= 0.0
    assert fit.f_star().lo >= 0.0
    negative = fit_curve(t, y - 1.0, burn_in=100, config={"loss_lower_bound": -5.0})
    assert negative.loss_floor == -5.0
    assert negative.predict(1e6).lo >= -5.0
    never_negative = fit_curve(t, y - 1.0, burn_in=100)  # the data go negative: no floor
    assert never_negative.loss_floor is None


@pytest.fixture(scope="module")
def falling() -> Fit:
    t = np.arange(0.0, 3000.0)
    return fit_curve(t, _noisy(model(t, 20.0, 300.0, 1.5), 0.003), burn_in=100)


def test_passed_target_is_answered_from_the_data(falling: Fit) -> None:
    target = 2.0  # the curve passes it at step (20 / 0.5)^2 - 300 = 1,300
    est = falling.steps_to(target)
    assert est.reached and est.reachable
    assert est.step == pytest.approx(1300, abs=60)
    assert est.lo == est.hi == est.step
    # A logged step, the one by which the smoothed data had got there (it said 1313.5: the mean
    # step of a bin, half a bin before the data showed it).
    assert est.step is not None and est.step.is_integer()
    above_all = falling.steps_to(10.0)  # above the first point: reached at the start
    assert above_all.reached and above_all.step is not None and above_all.step >= 0


def test_target_below_f_star_or_the_floor_is_unreachable(falling: Fit) -> None:
    star = falling.f_star()
    below = falling.steps_to(star.lo - 0.05)
    assert not below.reachable and below.step is None
    assert below.reason.startswith("below f*'s 90% interval")
    negative = falling.steps_to(-1.0)
    assert not negative.reachable and negative.step is None and negative.lo is None
    assert "floor" in negative.reason


def test_future_target_is_never_before_the_data(falling: Fit) -> None:
    target = 1.8  # the curve reaches it at (20 / 0.3)^2 - 300 = ~4,144
    est = falling.steps_to(target)
    assert est.reachable and not est.reached
    assert falling.fitted_upto_step is not None
    assert falling.fitted_upto_step <= est.lo <= est.step <= (est.hi or math.inf)
    assert est.step == pytest.approx(4144, rel=0.05)
    # The crossing table is computed once per fit and confidence, then looked up.
    assert falling.steps_to(target) == est


def test_a_series_that_ends_in_nan_is_diverged() -> None:
    """Finite, then NaN and inf to the end: no forecast (the fit of the finite points gave one,
    a number for a run that no longer has a loss). One or two non-finite points at the end may
    be skipped mixed-precision steps: the fit stands. The service, which reads the finite points
    only, says so with ``ends_non_finite``. Stored and read back, the status stays."""
    t = np.arange(1.0, 600.0)
    y = _noisy(3.0 / np.sqrt(t + 50.0) + 1.0, 0.005)
    tail_t = np.arange(600.0, 603.0)
    for tail in ([math.nan, math.inf, math.nan], [math.inf] * 3):
        fit = fit_curve(np.r_[t, tail_t], np.r_[y, tail], config={"c_warmup": 20})
        assert fit.status == "diverged" and not fit.has_forecast
        assert math.isnan(fit.predict(1000.0).value) and fit.fitted_upto_step == 599
        assert "not finite after step 599" in fit.message
        assert Fit.from_dict(fit.to_dict()) == fit
        # A target the finite points reached is still answered from them; one they did not
        # is not reachable, for that reason.
        passed = fit.steps_to(float(y[100:].max()))
        assert passed.reached and passed.step is not None and passed.step <= 200
        never = fit.steps_to(0.5)
        assert not never.reachable and "the run diverged" in never.reason
    # Out of order: the tail is by step, not by position.
    shuffled = np.r_[tail_t, t], np.r_[[math.nan] * 3, y]
    assert fit_curve(*shuffled, config={"c_warmup": 20}).status == "diverged"
    two = fit_curve(np.r_[t, tail_t[:2]], np.r_[y, [math.nan, math.inf]], config={"c_warmup": 20})
    assert two.status == "ok"
    assert fit_curve(t, y, config={"c_warmup": 20}, ends_non_finite=True).status == "diverged"
    assert fit_curve([1.0, 2.0, 3.0], [math.nan] * 3).status == "diverged"
    # The same rule on a series' tail, as the worker reads it (NULL: a NaN stored).
    assert ends_diverged([math.nan, math.inf, None])
    assert not ends_diverged([math.nan, 2.5, math.nan])  # one finite point among them
    assert not ends_diverged([math.nan, math.inf])  # two may be skipped mixed-precision steps


def test_statuses_round_trip_through_storage(falling: Fit) -> None:
    t = np.arange(100.0, 1000.0)
    line = fit_curve(t, _noisy(3.0 - 0.001 * t, 0.002), burn_in=100)
    for fit in (falling, line):
        back = Fit.from_dict(fit.to_dict())
        assert back == fit


def test_the_transient_table_is_ordered_and_its_band_brackets_the_value() -> None:
    """The shipped table: quantiles non-decreasing; any confidence gives lo <= value <= hi,
    wider for more confidence; no answer before the last fitted step or without a level."""
    from curvecast.service.forecast import calibration as cal

    table = cal.TRANSIENT
    for row in (table.too_early, table.no_asymptote, table.no_asymptote_plain):
        assert len(row) == len(table.probs) and list(row) == sorted(row)
    assert table.id.startswith("transient-")
    for kind, rate in (("too_early", None), ("no_asymptote", 0.2), ("no_asymptote", None)):
        narrow = cal.transient_band(2.0, 1000.0, 5000.0, kind, rate, 0.5)
        wide = cal.transient_band(2.0, 1000.0, 5000.0, kind, rate, 0.9)
        assert narrow[0] == wide[0]  # the median does not depend on the confidence
        assert wide[1] <= narrow[1] <= narrow[0] <= narrow[2] <= wide[2]
        assert cal.transient_band(2.0, 1000.0, 1000.0, kind, rate, 0.9) == (2.0, 2.0, 2.0)
    # A faster decay now means a lower forecast (no_asymptote scales with the decay rate).
    slow = cal.transient_band(2.0, 1000.0, 5000.0, "no_asymptote", 0.05, 0.9)[0]
    fast = cal.transient_band(2.0, 1000.0, 5000.0, "no_asymptote", 0.3, 0.9)[0]
    assert fast < slow < 2.0
    assert all(math.isnan(x) for x in cal.transient_band(2.0, 1000.0, 500.0, "too_early",
                                                          None, 0.9))
    assert all(math.isnan(x) for x in cal.transient_band(math.nan, 1000.0, 5000.0, "too_early",
                                                          None, 0.9))


def test_predict_many_is_predict_at_every_step() -> None:
    """The vectorised queries (charts, the target table, the alert rules) answer what
    ``predict`` answers step by step, for every status that has a forecast."""
    t = np.arange(0.0, 3000.0)
    fits = {
        "ok": fit_curve(t, _noisy(model(t, 20.0, 300.0, 1.5), 0.003), burn_in=100),
        "no_asymptote": fit_curve(t[100:1000], _noisy(3.0 - 0.001 * t[100:1000], 0.002),
                                  burn_in=100),
        "too_early": fit_curve(t[:400], _noisy(2.0 + 1.5 * np.exp(-t[:400] / 30.0), 0.01),
                               config={"c_warmup": 500, "total_steps": 2000}),
        "flat": fit_curve(t, _noisy(np.full(t.size, 2.0), 0.01), burn_in=100),
        "floored": fit_curve(t, _noisy(model(t, 20.0, 300.0, 0.05), 0.003), burn_in=100),
    }
    assert {f.status for f in fits.values()} >= {"ok", "no_asymptote", "too_early", "flat"}
    steps = np.array([-500.0, 0.0, 50.0, 399.0, 999.0, 2500.0, 1e4, 1e6, math.nan])
    for name, fit in fits.items():
        for conf in (0.5, 0.9, 0.99):
            value, lo, hi = fit.predict_many(steps, conf)
            for i, step in enumerate(steps):
                one = fit.predict(float(step), conf)
                np.testing.assert_allclose([value[i], lo[i], hi[i]], [one.value, one.lo, one.hi],
                                           rtol=1e-12, atol=1e-12, err_msg=f"{name} @ {step}")
