"""The P(best) calibration bench's scoring: the reliability table names its worst bin, and the
quantile chosen out of sample is the one that scores best on the other sweeps."""

from __future__ import annotations

import random

import pytest

from bench.forecast.pbest_calibration import QUANTILES, Judged, held_out_choice, reliability


def comparisons(sweep: str, first: int, n: int, p_leader: float, wins: float,
                seed: int, soft: float | None = None) -> list[Judged]:
    """``n`` two-run comparisons where the leader gets ``p_leader`` and wins a ``wins``
    fraction of the time; at every quantile but ``None`` (own bands) the leader gets ``soft``
    (default ``p_leader``)."""
    rng = random.Random(seed)
    pooled = p_leader if soft is None else soft

    def variants(p_own: float, p_pooled: float) -> tuple[float, ...]:
        return tuple(p_own if q is None else p_pooled for q in QUANTILES)

    out = []
    for k in range(first, first + n):
        won = rng.random() < wins
        out += [Judged(pooled, 1.0, won, sweep, k, variants(p_leader, pooled)),
                Judged(1 - pooled, 0.0, not won, sweep, k, variants(1 - p_leader, 1 - pooled))]
    return out


def test_the_quantile_chosen_out_of_sample_is_the_one_that_scores_best_elsewhere() -> None:
    # Three sweeps whose leaders get 90% from their own bands but win 60% of the time; pooled,
    # they get 65%: pooling scores better, so every sweep gets a pooled quantile.
    judged = [j for i, s in enumerate("abc")
              for j in comparisons(s, 1000 * i, 300, 0.9, 0.6, seed=i, soft=0.65)]
    held, chosen = held_out_choice(judged)
    assert None not in chosen and len(chosen) == 3
    assert reliability(held).worst < reliability([j.at(None) for j in judged]).worst
    assert {j.chance for j in held} == {0.65, 0.35}


def test_reliability_names_the_bin_with_the_largest_gap() -> None:
    # Leaders at 90% that win 60% of the time: the 80–95% bin is 30 points off, the 5–20%
    # bin (the others at 10%, best 40% of the time) also 30, so either may be named; a
    # well-calibrated 50% bin is not.
    judged = comparisons("a", 0, 400, 0.9, 0.6, seed=1) + comparisons("b", 400, 400, 0.5, 0.5,
                                                                       seed=2)
    table = reliability(judged)
    assert table.worst == pytest.approx(30.0, abs=5.0)
    assert table.worst_bin in {(0.8, 0.95), (0.05, 0.2)}
    assert len(table.rows) == 7
