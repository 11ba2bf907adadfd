"""The alert lifecycle: pending -> firing after `for`, resolved after a clear stretch, a dead
band between the thresholds (hysteresis), one open alert at a time. Pure, no I/O."""

from __future__ import annotations

import numpy as np
import pytest

from curvecast.service.alerting.lifecycle import (
    Observation,
    Observations,
    RuleLifecycle,
    advance,
)


def obs(step: int, active: bool, clear: bool | None = None, value: float = 1.0) -> Observation:
    return Observation(step, active, (not active) if clear is None else clear, value)


def kinds(events: list) -> list[tuple[str, int]]:
    return [(e.kind, e.step) for e in events]


def test_pending_then_firing_after_for_steps() -> None:
    state, events = advance(RuleLifecycle(), [obs(s, True) for s in range(10, 16)],
                            for_steps=3, resolve_for_steps=2)
    assert kinds(events) == [("pending", 10), ("firing", 13)]
    assert state.state == "firing" and state.since_step == 10 and state.fired_step == 13


def test_pending_is_dropped_when_the_condition_goes_away() -> None:
    state, events = advance(RuleLifecycle(), [obs(1, True), obs(2, True), obs(3, False)],
                            for_steps=5, resolve_for_steps=0)
    assert kinds(events) == [("pending", 1), ("cancelled", 3)]
    assert state.state == "inactive"


def test_for_zero_fires_at_once() -> None:
    state, events = advance(RuleLifecycle(), [obs(7, True)], for_steps=0, resolve_for_steps=0)
    assert kinds(events) == [("firing", 7)] and events[0].since_step == 7
    assert state.state == "firing"


def test_resolves_only_after_a_clear_stretch_and_the_dead_band_restarts_it() -> None:
    firing, _ = advance(RuleLifecycle(), [obs(1, True)], for_steps=0, resolve_for_steps=3)
    # clear, clear, dead band (neither active nor clear), then clear for 3 steps.
    seq = [obs(2, False, True), obs(3, False, True), obs(4, False, False),
           obs(5, False, True), obs(6, False, True), obs(7, False, True), obs(8, False, True)]
    state, events = advance(firing, seq, for_steps=0, resolve_for_steps=3)
    assert kinds(events) == [("resolved", 8)]
    assert state.state == "inactive"


def test_a_new_alert_can_open_after_resolution() -> None:
    seq = [obs(1, True), obs(2, False), obs(3, True)]
    _, events = advance(RuleLifecycle(), seq, for_steps=0, resolve_for_steps=0)
    assert kinds(events) == [("firing", 1), ("resolved", 2), ("firing", 3)]


def test_noisy_series_near_the_threshold_does_not_flap() -> None:
    """A statistic hovering around the firing threshold: with a dead band (clear only well
    below it) the alert fires once and stays firing; without one it would flap."""
    rng = np.random.default_rng(0)
    x = 1.0 + 0.05 * rng.standard_normal(2000)  # threshold 1.0, resolve below 0.8
    seq = [Observation(i, bool(v > 1.0), bool(v < 0.8), float(v)) for i, v in enumerate(x)]
    _, events = advance(RuleLifecycle(), seq, for_steps=0, resolve_for_steps=10)
    assert [e.kind for e in events] == ["firing"]
    naive = [Observation(i, bool(v > 1.0), bool(v <= 1.0), float(v)) for i, v in enumerate(x)]
    _, flapping = advance(RuleLifecycle(), naive, for_steps=0, resolve_for_steps=0)
    assert len(flapping) > 100


def test_replayed_observations_change_nothing() -> None:
    state, _ = advance(RuleLifecycle(), [obs(s, True) for s in range(1, 5)],
                       for_steps=10, resolve_for_steps=0)
    again, events = advance(state, [obs(s, True) for s in range(1, 5)],
                            for_steps=10, resolve_for_steps=0)
    assert events == [] and again == state


def test_state_round_trips_through_json() -> None:
    state, _ = advance(RuleLifecycle(), [obs(1, True), obs(2, True)], for_steps=1,
                       resolve_for_steps=0)
    assert RuleLifecycle.from_dict(state.to_dict()) == state
    assert RuleLifecycle.from_dict(None) == RuleLifecycle()


def test_negative_durations_are_refused() -> None:
    with pytest.raises(ValueError):
        advance(RuleLifecycle(), [], for_steps=-1, resolve_for_steps=0)


@pytest.mark.parametrize("seed", range(40))
def test_array_observations_advance_exactly_as_a_list_of_them(seed: int) -> None:
    """The arrays' fast path (skipping inactive verdicts) changes no state and no event: random
    verdict runs, from each starting state, both ways."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    # Long quiet stretches with bursts: the shape the fast path skips through.
    active = rng.random(n) < rng.choice([0.0, 0.02, 0.3, 0.9])
    clear = ~active & (rng.random(n) < 0.8)
    steps = np.cumsum(rng.integers(1, 4, n)).astype(np.int64)
    values = rng.random(n)
    arrays = Observations(steps, active, clear, values)
    as_list = [Observation(int(s), bool(a), bool(c), float(v))
               for s, a, c, v in zip(steps, active, clear, values, strict=True)]
    assert list(arrays) == as_list
    starts = [RuleLifecycle(),
              RuleLifecycle(state="pending", since_step=0, step=0, value=1.0),
              RuleLifecycle(state="firing", since_step=0, step=0, value=1.0, fired_step=0)]
    for start in starts:
        for for_steps, resolve in ((0, 0), (3, 5), (20, 1)):
            fast = advance(start, arrays, for_steps=for_steps, resolve_for_steps=resolve)
            slow = advance(start, as_list, for_steps=for_steps, resolve_for_steps=resolve)
            assert fast == slow


def test_verdict_arrays_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        Observations(np.arange(3), np.zeros(3, bool), np.zeros(2, bool), np.zeros(3))
