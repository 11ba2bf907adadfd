"""The P(best) calibration bench's candidate recalibration: tempering keeps each comparison's
chances a distribution in the same order, and the temperature chosen out of sample softens
chances that were overconfident."""

from __future__ import annotations

import random

import pytest

from bench.forecast.pbest_calibration import Judged, held_out_temperature, reliability, tempered


def comparisons(sweep: str, first: int, n: int, p_leader: float, wins: float,
                seed: int) -> list[Judged]:
    """``n`` two-run comparisons where the leader gets ``p_leader`` and wins a ``wins``
    fraction of the time."""
    rng = random.Random(seed)
    out = []
    for k in range(first, first + n):
        won = rng.random() < wins
        out += [Judged(p_leader, 1.0, won, sweep, k), Judged(1 - p_leader, 0.0, not won, sweep, k)]
    return out


def test_tempering_keeps_each_comparison_a_distribution_in_order() -> None:
    judged = [Judged(0.7, 1.0, True, "s", 1), Judged(0.2, 0.0, False, "s", 1),
              Judged(0.1, 0.0, False, "s", 1), Judged(0.9, 1.0, False, "s", 2),
              Judged(0.1, 0.0, True, "s", 2)]
    assert [j.chance for j in tempered(judged, 1.0)] == pytest.approx([j.chance for j in judged])
    soft = tempered(judged, 2.0)
    for subset in (1, 2):
        got = [j.chance for j in soft if j.subset == subset]
        assert sum(got) == pytest.approx(1.0)
        assert got == sorted(got, reverse=True)
    assert soft[0].chance < 0.7 and soft[3].chance < 0.9  # less extreme


def test_the_held_out_temperature_softens_overconfident_chances() -> None:
    # Three sweeps whose leaders get 90% but win 60% of the time.
    judged = [j for i, s in enumerate("abc")
              for j in comparisons(s, 1000 * i, 300, 0.9, 0.6, seed=i)]
    held, chosen = held_out_temperature(judged)
    assert all(t > 1.0 for t in chosen)
    assert reliability(held).worst < reliability(judged).worst


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
