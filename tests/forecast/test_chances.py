"""The decision core on synthetic curves fitted by the real solver: P(loss < L) at a step,
P(best) among runs, and the runs it refuses to judge (with the reason)."""

from __future__ import annotations

import functools
import uuid
from statistics import NormalDist

import numpy as np
import pytest

from curvecast.service.forecast import Fit, model
from curvecast.service.forecast.chances import (
    MAX_CHANCE,
    MIN_CHANCE,
    PEER_WIDTH_QUANTILE,
    PROBS,
    Outlook,
    RunInput,
    chances_best,
    default_horizon,
    outlook,
    pooled_widths,
    rank,
)
from curvecast.service.forecast.solver import fit_curve

TOTAL = 20_000


@functools.cache
def fitted(c: float, seed: int = 0, upto: int = 6_000) -> Fit:
    """The real solver's fit of a noisy ``20.3/sqrt(t+377) + c`` seen up to ``upto``."""
    rng = np.random.default_rng(seed)
    t = np.arange(200.0, upto, 5.0)
    y = model(t, 20.3, 377.0, c) + rng.normal(0.0, 0.01, t.size)
    fit = fit_curve(t, y, config={"c_warmup": 200, "total_steps": TOTAL})
    assert fit.status == "ok", fit.message
    return fit


def run(fit: Fit | None, *, name: str = "r", status: str = "running", last_step: int = 6_000,
        total_steps: int | None = TOTAL, loss: float | None = None,
        run_id: uuid.UUID | None = None, series_end: int | None = None) -> RunInput:
    """A run whose series has loss ``loss`` at every step up to ``series_end`` (default: the
    run's last step)."""
    end = last_step if series_end is None else series_end
    return RunInput(run_id=run_id or uuid.uuid4(), name=name, status=status, fit=fit,
                    key="loss", total_steps=total_steps, last_step=last_step,
                    loss_at=lambda step: loss if step <= end else None,
                    final=lambda: (end, loss))


def test_chance_below_rises_with_the_loss_and_matches_the_interval() -> None:
    look = outlook(run(fitted(2.0)), TOTAL, confidence=0.9)
    assert look.known and not look.observed and look.value is not None
    assert look.lo is not None and look.hi is not None
    losses = np.linspace(look.lo - 0.2, look.hi + 0.2, 200)
    chances = [look.chance_below(x) for x in losses]
    assert all(c is not None for c in chances)
    assert np.all(np.diff(np.asarray(chances, dtype=float)) >= 0)
    assert chances[0] == MIN_CHANCE and chances[-1] == MAX_CHANCE
    # The interval's ends are the 5% and 95% quantiles of the same distribution.
    assert look.chance_below(look.lo) == pytest.approx(0.05, abs=1e-6)
    assert look.chance_below(look.hi) == pytest.approx(0.95, abs=1e-6)


def test_a_clearly_better_run_is_best_almost_surely() -> None:
    good, bad = run(fitted(1.8), name="good"), run(fitted(2.3), name="bad")
    ranked = rank([bad, good], TOTAL)
    assert [r.run.name for r in ranked] == ["good", "bad"]
    assert ranked[0].p_best == pytest.approx(1.0, abs=0.01)
    assert ranked[1].p_best == pytest.approx(0.0, abs=0.01)


def test_two_identical_runs_are_even_and_chances_sum_to_one() -> None:
    fit = fitted(2.0)
    runs = [run(fit, name="a"), run(fit, name="b"), run(fitted(2.02, seed=1), name="c")]
    ranked = rank(runs, TOTAL)
    chances = {r.run.name: r.p_best for r in ranked}
    assert all(p is not None for p in chances.values())
    assert sum(p for p in chances.values() if p is not None) == pytest.approx(1.0)
    two = rank(runs[:2], TOTAL)
    assert [r.p_best for r in two] == [pytest.approx(0.5, abs=0.02)] * 2


def test_the_draws_are_deterministic_and_do_not_depend_on_order() -> None:
    runs = [run(fitted(2.0), name="a"), run(fitted(2.01, seed=1), name="b")]
    first = {r.run.name: r.p_best for r in rank(runs, TOTAL)}
    again = {r.run.name: r.p_best for r in rank(runs[::-1], TOTAL)}
    assert first == again
    assert 0.0 < (first["a"] or 0.0) < 1.0


def test_runs_that_cannot_be_judged_say_why() -> None:
    ok = run(fitted(2.0), name="ok")
    early = Fit(status="too_early", a=1.0, b=1.0, c=2.0, useful_from_step=3000.0)
    runs = [
        ok,
        run(fitted(1.5), name="failed", status="failed"),
        run(fitted(1.5), name="lost", status="lost"),
        run(None, name="pending"),
        run(early, name="early"),
        run(Fit(status="off_model", a=1.0, b=1.0, c=2.0), name="drifting"),
        run(Fit(status="flat", a=0.0, c=2.0), name="flat"),
    ]
    ranked = {r.run.name: r for r in rank(runs, TOTAL)}
    assert ranked["failed"].reason == "the run failed: it will not train to step 20,000"
    assert ranked["lost"].reason == "the run was lost: it will not train to step 20,000"
    assert ranked["pending"].reason.startswith("no fit yet")
    assert "needs more steps" in ranked["early"].reason and "3,000" in ranked["early"].reason
    assert "fitted curve's shape" in ranked["drifting"].reason
    assert "flat" in ranked["flat"].reason
    for name in ("failed", "lost", "pending", "early", "drifting", "flat"):
        assert ranked[name].p_best is None and not ranked[name].outlook.known
        assert outlook(next(r for r in runs if r.name == name), TOTAL).chance_below(2.0) is None
    # One run alone is never "best", though its forecast stands.
    assert ranked["ok"].p_best is None and ranked["ok"].outlook.known
    assert "only run" in ranked["ok"].reason


def test_a_finished_run_is_judged_on_its_observed_loss() -> None:
    done = run(fitted(2.5), name="done", status="finished", last_step=TOTAL, loss=1.9)
    look = outlook(done, TOTAL)
    assert look.observed and look.value == look.lo == look.hi == 1.9
    assert look.chance_below(1.95) == 1.0 and look.chance_below(1.9) == 0.0
    # Its fit says 2.5-ish; the data say 1.9, which beats a run forecast near 2.0.
    ranked = rank([run(fitted(2.0), name="live"), done], TOTAL)
    assert ranked[0].run.name == "done" and ranked[0].p_best == pytest.approx(1.0, abs=0.01)
    # Ended before the step: its final loss stands, and the note says so.
    short = run(None, name="short", status="finished", last_step=10_000, loss=2.2)
    look = outlook(short, TOTAL)
    assert look.observed and look.value == 2.2 and "ended at step 10,000" in look.note
    # Its loss series ended before its last step (an eval every 500 steps): the same.
    sparse = run(None, status="finished", last_step=TOTAL, series_end=19_500, loss=2.1)
    look = outlook(sparse, TOTAL)
    assert look.observed and look.value == 2.1 and "ended at step 19,500" in look.note
    assert outlook(sparse, 19_000).observed and outlook(sparse, 19_000).note == ""
    # A running run whose series ends before the step is forecast, not "ended".
    assert not outlook(run(None, last_step=TOTAL, series_end=19_500, loss=2.1), TOTAL).known
    broken = run(None, status="finished", last_step=TOTAL, loss=None)
    assert outlook(broken, TOTAL).reason == ("the run ended at step 20,000 without a finite "
                                             "loss")


def test_two_observed_ties_split_the_chance() -> None:
    a = run(None, status="finished", last_step=TOTAL, loss=2.0)
    b = run(None, status="finished", last_step=TOTAL, loss=2.0)
    looks = [(r.run_id, outlook(r, TOTAL)) for r in (a, b)]
    assert chances_best(looks) == [0.5, 0.5]


def test_the_default_horizon_is_the_largest_planned_end() -> None:
    runs = [run(None, total_steps=10_000), run(None, total_steps=30_000),
            run(None, total_steps=50_000, status="failed")]
    assert default_horizon(runs) == (30_000, "planned_total_steps")
    unplanned = [run(None, total_steps=None, last_step=700),
                 run(None, total_steps=None, last_step=900)]
    assert default_horizon(unplanned) == (900, "last_step")
    assert default_horizon([]) == (None, "none")


def test_past_the_planned_end_is_noted() -> None:
    look = outlook(run(fitted(2.0), total_steps=10_000), TOTAL)
    assert look.known and "past the run's planned end (10,000)" in look.note


def normal(mid: float, sd: float, progress: float) -> Outlook:
    """A forecast at ``TOTAL`` of a normal distribution, made ``progress`` of the way there."""
    q = tuple(mid + sd * NormalDist().inv_cdf(float(p)) for p in PROBS)
    return Outlook(TOTAL, value=mid, lo=mid - 1.645 * sd, hi=mid + 1.645 * sd, quantiles=q,
                   progress=progress)


def test_a_band_narrower_than_its_peers_is_widened_to_their_high_quantile() -> None:
    narrow, wide, wider = normal(2.0, 0.01, 0.5), normal(2.02, 0.04, 0.5), normal(2.1, 0.08, 0.5)
    z_width = 2 * NormalDist().inv_cdf(float(PROBS[-1]))  # outermost quantiles apart, in sds
    widths = [z_width * sd / mid for sd, mid in ((0.01, 2.0), (0.04, 2.02), (0.08, 2.1))]
    target = float(np.quantile(widths, PEER_WIDTH_QUANTILE))
    got = pooled_widths([narrow, wide, wider])
    assert got[2] == wider  # the widest band is left as it was
    for before, after in zip([narrow, wide], got[:2], strict=True):
        q = np.asarray(after.quantiles)
        mid = np.interp(0.5, PROBS, q)
        assert mid == pytest.approx(np.interp(0.5, PROBS, before.quantiles))  # the median stays
        assert (q[-1] - q[0]) / mid == pytest.approx(target, rel=1e-6)
    # At the median of the peers, the middle run is left as it was and the narrow one widens
    # to the middle run's relative width.
    by_median = pooled_widths([narrow, wide, wider], 0.5)
    assert by_median[1] == wide
    q = np.asarray(by_median[0].quantiles)
    assert (q[-1] - q[0]) / 2.0 == pytest.approx(widths[1], rel=1e-6)
    # The narrow leader's chance of ending best falls; each run's own bands make it surer.
    ids = [uuid.uuid4() for _ in range(3)]
    pooled = chances_best(list(zip(ids, [narrow, wide, wider], strict=True)))
    own = chances_best(list(zip(ids, [narrow, wide, wider], strict=True)), width_quantile=None)
    assert pooled[0] is not None and own[0] is not None and pooled[0] < own[0]
    with pytest.raises(ValueError, match="within"):
        pooled_widths([narrow, wide], 1.5)


def test_a_forecast_further_along_keeps_its_band_and_observed_losses_are_left() -> None:
    late, early = normal(2.0, 0.01, 0.9), normal(2.05, 0.2, 0.3)
    done = Outlook(TOTAL, value=2.01, lo=2.01, hi=2.01, observed=True)
    got = pooled_widths([late, early, done])
    assert got == [late, early, done]  # the early run's wide band is no peer of the late one
    # Two runs at about the same point of their runs are peers (logged a few steps apart).
    near = pooled_widths([normal(2.0, 0.01, 0.88), normal(2.0, 0.03, 0.9)])
    assert near[0] != normal(2.0, 0.01, 0.88)
