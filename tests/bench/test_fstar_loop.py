"""The f* loop's controller (bench/optimizer/fstar_loop.py) on synthetic losses, with the
service's real fit: conservative, moved only by an ``ok`` fit, ramped."""

from __future__ import annotations

import math

import numpy as np

from bench.optimizer.fstar_loop import SAFETY, SMOOTHING, FStarLoop


def drive(loop: FStarLoop, losses: np.ndarray) -> list[float]:
    return [loop.observe(t, float(v)) for t, v in enumerate(losses, start=1)]


def test_the_target_stays_under_the_lowest_loss_and_ramps_in() -> None:
    steps = np.arange(1, 1001)
    rng = np.random.default_rng(0)
    losses = 2.0 / np.sqrt(steps + 10.0) + 1.5 + rng.normal(0, 0.02, steps.size)
    loop = FStarLoop(total_steps=1000)
    trace = drive(loop, losses)
    assert any(status == "ok" for _, status, _ in loop.fits)
    assert 0.0 < trace[-1] <= SAFETY * 1.5 + 1e-9  # learned, and below the true floor
    smooth, lowest = math.nan, math.inf
    for t, (loss, f_star) in enumerate(zip(losses, trace, strict=True), start=1):
        smooth = loss if math.isnan(smooth) else (1 - SMOOTHING) * smooth + SMOOTHING * loss
        if t * SMOOTHING >= 1:
            lowest = min(lowest, smooth)
        assert 0.0 <= f_star <= SAFETY * lowest + 1e-9, t
    # No jump: the largest change in one step is a refit interval's share of the largest gap.
    steps_moved = np.abs(np.diff([0.0, *trace]))
    assert steps_moved.max() <= max(trace) / loop.refit_every + 1e-9


def test_a_fit_that_does_not_know_moves_nothing() -> None:
    rng = np.random.default_rng(1)
    losses = 2.0 + np.arange(600) / 300 + rng.normal(0, 0.02, 600)  # climbing: never ok
    loop = FStarLoop(total_steps=600)
    trace = drive(loop, losses)
    assert loop.fits and all(status != "ok" for _, status, _ in loop.fits)
    assert set(trace) == {0.0}
