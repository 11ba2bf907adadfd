"""The off-curve rule's vectorised verdicts against a literal step-by-step reference.

``off_curve`` judges a round's steps a stretch at a time (``_judge_with_pins``) and merges the
two series' verdicts with a forward fill. The reference below is the plain loop those replace,
one step at a time (the rule's earlier code): on runs with excursions that pin, clear and pin
again, judged in rounds of many sizes, both must give the same verdicts and the same memory.
No I/O.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest

from curvecast.service.alerting.rules import EvalContext, Series, rule_config
from curvecast.service.alerting.rules import off_curve as oc
from curvecast.service.alerting.rules.framework import burn_in_step
from curvecast.service.alerting.rules.stats import coarse, rolling_median
from curvecast.service.forecast import Fit
from curvecast.service.forecast.solver import fit_curve

CONFIG = {"total_steps": 2000, "c_warmup": 50}


def _lagged(fits: oc._LaggedFits, t: int) -> Fit | None:
    j = int(np.searchsorted(fits.uptos, t - fits.lag, side="right")) - 1
    if j < 0:
        return None
    fit = fits.fit(j)
    return fit if fit.has_forecast else None


def ref_judge_fitted(s: Series, ctx: EvalContext, p: dict[str, Any], fits: oc._LaggedFits,
                     memory: dict[str, Any]) -> oc.Verdicts:
    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    window = oc._window(ctx, p)
    mask = (s.steps > max(ctx.after_step, burn + window)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    smooth = rolling_median(s.steps, s.values, window, at, resolution=coarse(window))
    active = np.zeros(at.size, dtype=bool)
    clear = np.zeros(at.size, dtype=bool)
    excess = np.full(at.size, np.nan)
    stored = memory.get("pinned")
    pinned = Fit.from_dict(stored) if stored is not None else None
    forecast = oc._AtSteps(at)
    for i, (t, y) in enumerate(zip(at.tolist(), smooth.tolist(), strict=True)):
        fit = pinned if pinned is not None else _lagged(fits, t)
        if fit is None or not fit.has_forecast or not math.isfinite(y):
            continue
        hi = float(forecast(fit, p["confidence"])[2][i])
        hi_clear = float(forecast(fit, p["resolve_confidence"])[2][i])
        if not (math.isfinite(hi) and math.isfinite(hi_clear)):
            continue
        active[i], clear[i], excess[i] = y > hi, y <= hi_clear, y - hi
        if active[i] and pinned is None:
            pinned = fit
        elif clear[i]:
            pinned = None
    oc._remember(memory, "pinned", oc._stored(pinned) if pinned is not None else None)
    return at, active, clear, excess


def ref_judge_dense(s: Series, ctx: EvalContext, p: dict[str, Any], fits: oc._LaggedFits,
                    memory: dict[str, Any]) -> oc.Verdicts:
    burn = burn_in_step(ctx, p.get("burn_in_steps"))
    window, ref_len = oc._window(ctx, p), oc._reference_len(ctx, p)
    mask = (s.steps > max(ctx.after_step, burn + window + ref_len)) & (s.steps <= ctx.last_step)
    at = s.steps[mask]
    active = np.zeros(at.size, dtype=bool)
    clear = np.zeros(at.size, dtype=bool)
    excess = np.full(at.size, np.nan)
    if at.size == 0:
        return at, active, clear, excess
    smooth = rolling_median(s.steps, s.values, window, at, resolution=coarse(window))
    reference = rolling_median(s.steps, s.values, ref_len, at - window,
                               resolution=coarse(ref_len))
    jumps = np.abs(np.diff(s.values))
    noise = rolling_median(s.steps[1:], jumps, ref_len, at - window,
                           resolution=coarse(ref_len)) / oc._MEDIAN_ABS_DIFF
    counts = np.searchsorted(s.steps, at, side="right") - np.searchsorted(
        s.steps, at - window, side="right")
    sigma = oc._MEDIAN_SE * noise / np.sqrt(np.maximum(counts, 1))
    z, z_clear = oc._z(p["confidence"]), oc._z(p["resolve_confidence"])
    stored = memory.get("dense_pinned")
    pinned = (Fit.from_dict(stored["fit"]), float(stored["gap"])) if stored else None
    forecast, middle = oc._AtSteps(at), oc._AtSteps(at - window - ref_len / 2)
    for i, t in enumerate(at.tolist()):
        if pinned is not None:
            fit, gap = pinned
        else:
            lagged = _lagged(fits, t)
            if lagged is None:
                continue
            fit = lagged
            gap = float(reference[i]) - float(middle(fit, fit.confidence)[0][i])
        y, sd = float(smooth[i]), float(sigma[i])
        value, _, pred_hi = (float(x[i]) for x in forecast(fit, p["confidence"]))
        clear_value, _, clear_hi = (float(x[i]) for x in forecast(fit, p["resolve_confidence"]))
        if not all(math.isfinite(v) for v in (y, sd, gap, pred_hi, clear_hi)):
            continue
        hi = value + gap + math.hypot(pred_hi - value, z * sd)
        hi_clear = clear_value + gap + math.hypot(clear_hi - clear_value, z_clear * sd)
        active[i], clear[i], excess[i] = y > hi, y <= hi_clear, y - hi
        if active[i] and pinned is None:
            pinned = (fit, gap)
        elif clear[i]:
            pinned = None
    oc._remember(memory, "dense_pinned",
                 {"fit": oc._stored(pinned[0]), "gap": pinned[1]} if pinned else None)
    return at, active, clear, excess


def ref_merge(parts: list[oc.Verdicts], memory: dict[str, Any]) -> oc.Verdicts:
    steps = np.unique(np.concatenate([p[0] for p in parts])) if parts else np.zeros(0, np.int64)
    carried: list[Any] = list(memory.get("last") or [])[: len(parts)]
    carried += [None] * (len(parts) - len(carried))
    active = np.zeros(steps.size, dtype=bool)
    clear = np.zeros(steps.size, dtype=bool)
    excess = np.full(steps.size, np.nan)
    cursors = [0] * len(parts)
    for i, t in enumerate(steps.tolist()):
        for k, (at, act, clr, exc) in enumerate(parts):
            while cursors[k] < at.size and at[cursors[k]] <= t:
                j = cursors[k]
                if math.isfinite(exc[j]):
                    carried[k] = [bool(act[j]), bool(clr[j]), float(exc[j])]
                cursors[k] += 1
        known = [c for c in carried if c is not None]
        if not known:
            continue
        active[i] = any(c[0] for c in known)
        clear[i] = all(c[1] for c in known)
        excess[i] = max(c[2] for c in known)
    memory["last"] = carried
    return steps, active, clear, excess


def run_with_excursions(seed: int, shifts: list[tuple[int, int, float]]) -> dict[str, Series]:
    """An eval loss every 20 steps on the curve and a noisy training loss above it; each
    ``(start, stop, size)`` shifts both up over ``[start, stop)`` (the eval loss by half)."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, 2001)
    curve = 20.3 / np.sqrt(steps + 377.0) + 2.07
    train = curve + 0.3 + 0.05 * rng.standard_normal(steps.size)
    evals = curve + 0.005 * rng.standard_normal(steps.size)
    for start, stop, size in shifts:
        inside = (steps >= start) & (steps < stop)
        train = np.where(inside, train + size, train)
        evals = np.where(inside, evals + size / 2, evals)
    every20 = steps % 20 == 0
    return {"eval_loss": Series.of(steps[every20], evals[every20]),
            "loss": Series.of(steps, train)}


def fits_of(series: Series) -> list[dict[str, Any]]:
    return [oc._stored(fit_curve(series.steps[:n], series.values[:n], config=CONFIG))
            for n in (20, 30, 40, 50, 60, 70, 80, 90)]


def assert_same(new: oc.Verdicts, ref: oc.Verdicts) -> None:
    for a, b in zip(new, ref, strict=True):
        assert a.shape == b.shape
    np.testing.assert_array_equal(new[0], ref[0])
    np.testing.assert_array_equal(new[1], ref[1])
    np.testing.assert_array_equal(new[2], ref[2])
    # math.hypot and np.hypot may round the last bit differently
    np.testing.assert_allclose(new[3], ref[3], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(("seed", "shifts"), [
    (0, []),
    (1, [(1200, 2001, 0.25)]),
    (2, [(900, 1100, 0.3), (1400, 1500, 0.4)]),
    (3, [(700, 760, 0.6), (1000, 1300, 0.2), (1600, 1700, 0.5)]),
])
@pytest.mark.parametrize("round_size", [2000, 97, 13])
def test_vectorised_verdicts_match_the_step_by_step_reference(
    seed: int, shifts: list[tuple[int, int, float]], round_size: int
) -> None:
    series = run_with_excursions(seed, shifts)
    fits = fits_of(series["eval_loss"])
    p = rule_config("off_curve").params
    new_mem: dict[str, Any] = {}
    ref_mem: dict[str, Any] = {}
    excursions = 0  # stretches judged active: each one pinned a reference
    after = -1
    for upto in [*range(round_size, 2000, round_size), 2000]:
        ctx = EvalContext(config=CONFIG, last_step=upto, after_step=after, fit_key="eval_loss")
        lag = oc.auto_steps(ctx, p.get("lag_steps"), oc._OFF_LAG, 20, 500)
        new_parts = [oc._judge_fitted(series["eval_loss"], ctx, p,
                                      oc._LaggedFits(fits, lag), new_mem),
                     oc._judge_dense(series["loss"], ctx, p, oc._LaggedFits(fits, lag), new_mem)]
        ref_parts = [ref_judge_fitted(series["eval_loss"], ctx, p,
                                      oc._LaggedFits(fits, lag), ref_mem),
                     ref_judge_dense(series["loss"], ctx, p, oc._LaggedFits(fits, lag), ref_mem)]
        for new, ref in zip(new_parts, ref_parts, strict=True):
            assert_same(new, ref)
        assert_same(oc._merge_verdicts(new_parts, new_mem), ref_merge(ref_parts, ref_mem))
        assert new_mem.keys() == ref_mem.keys()
        for key in ("pinned", "dense_pinned"):
            assert (key in new_mem) == (key in ref_mem)
        excursions += sum(int(np.sum(np.diff(part[1].astype(np.int8)) == 1) + part[1][:1].sum())
                          for part in new_parts)
        after = upto
    # The cases exercise the pinned paths (and unpinning, with several excursions).
    assert excursions >= len(shifts)


def test_merge_carries_each_part_over_from_memory_and_ignores_unjudged_steps() -> None:
    nan = math.nan
    parts: list[oc.Verdicts] = [
        (np.array([5, 9]), np.array([True, False]), np.array([False, True]),
         np.array([0.5, -0.1])),
        (np.array([3, 7, 9]), np.array([False, False, True]), np.array([True, False, False]),
         np.array([nan, nan, 0.3])),
    ]
    memory: dict[str, Any] = {"last": [[False, True, -1.0], None]}
    ref_memory = copy.deepcopy(memory)
    merged = oc._merge_verdicts(parts, memory)
    assert_same(merged, ref_merge(parts, ref_memory))
    assert memory == ref_memory == {"last": [[False, True, -0.1], [True, False, 0.3]]}
    # Step 3: only the first part's verdict carried from the previous round is known.
    assert merged[0].tolist() == [3, 5, 7, 9]
    assert merged[1].tolist() == [False, True, True, True]
    assert merged[2].tolist() == [True, False, False, False]
    assert merged[3].tolist() == [-1.0, 0.5, 0.5, 0.3]
    # Without memory, step 3 has no verdict at all.
    steps, active, clear, excess = oc._merge_verdicts(parts, {})
    assert active.tolist() == [False, True, True, True]
    assert clear.tolist() == [False, False, False, False]
    np.testing.assert_array_equal(excess, [nan, 0.5, 0.5, 0.3])
