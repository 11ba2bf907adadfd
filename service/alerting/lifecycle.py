"""The alert lifecycle, as in Prometheus: inactive -> pending -> firing -> resolved. Pure.

A rule's evaluator turns a run's series into *observations*: at each evaluated step, whether the
condition is ``active`` (past the firing threshold) and whether it is ``clear`` (back inside the
stricter resolving threshold). Between the two thresholds is a dead band: the hysteresis that
keeps a noisy series hovering near one threshold from flapping.

:func:`advance` feeds observations, in step order, through a small state machine:

* ``inactive`` -> ``pending`` on the first active observation (the alert exists and is visible
  through the API, nobody is notified);
* ``pending`` -> ``firing`` once the condition has been active continuously for ``for_steps``
  steps (``for_steps == 0``: at once, as for non-finite values); ``pending`` -> ``inactive``
  (the pending alert is dropped, as Prometheus does) at the first observation that is not
  active;
* ``firing`` -> ``resolved`` once the condition has been *clear* continuously for
  ``resolve_for_steps`` steps (Prometheus' ``keep_firing_for``); an observation in the dead band
  restarts that count;
* after ``resolved`` the next active observation opens a new alert.

Durations are counted in training steps, not seconds: a run streams at its own pace, and a
replay of stored data must give the same answer as the live run did.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, overload

import numpy as np
from numpy.typing import NDArray

LifecycleState = Literal["inactive", "pending", "firing"]
EventKind = Literal["pending", "cancelled", "firing", "resolved"]

__all__ = [
    "Event",
    "EventKind",
    "LifecycleState",
    "Observation",
    "Observations",
    "RuleLifecycle",
    "advance",
]


@dataclass(frozen=True)
class Observation:
    """A rule's verdict at one step.

    Attributes:
        step: the training step.
        active: the firing condition holds.
        clear: the resolving condition holds (stricter than ``not active``).
        value: the rule's statistic at this step (for display), NaN if none.
    """

    step: int
    active: bool
    clear: bool
    value: float = math.nan


@dataclass(frozen=True, eq=False)
class Observations(Sequence[Observation]):
    """Verdicts at many steps, kept as the evaluator's arrays; an :class:`Observation` is made
    only when one is asked for.

    A rule judges every new step of a run, and nearly all of those verdicts are "not active"
    for a rule whose alert is inactive, which :func:`advance` skips without looking at them one
    by one. Building an object per step was a measurable share of the worker's CPU under load.
    """

    steps: NDArray[np.int64]
    active: NDArray[np.bool_]
    clear: NDArray[np.bool_]
    values: NDArray[np.float64]

    def __post_init__(self) -> None:
        # What zip(..., strict=True) checked when verdicts were built as a list.
        sizes = {self.steps.size, self.active.size, self.clear.size, self.values.size}
        if len(sizes) != 1:
            raise ValueError(f"verdict arrays of different lengths: {sorted(sizes)}")

    def __len__(self) -> int:
        return int(self.steps.size)

    @overload
    def __getitem__(self, index: int) -> Observation: ...

    @overload
    def __getitem__(self, index: slice) -> Observations: ...

    def __getitem__(self, index: int | slice) -> Observation | Observations:
        if isinstance(index, slice):
            return Observations(self.steps[index], self.active[index], self.clear[index],
                                self.values[index])
        return Observation(int(self.steps[index]), bool(self.active[index]),
                           bool(self.clear[index]), float(self.values[index]))

    def __iter__(self) -> Iterator[Observation]:
        for i in range(len(self)):
            yield self[i]

    def next_active(self, start: int) -> int:
        """The index of the first active verdict at or after ``start`` (``len`` if none)."""
        hits = np.flatnonzero(self.active[start:])
        return start + int(hits[0]) if hits.size else len(self)


@dataclass(frozen=True)
class RuleLifecycle:
    """Where one (run, rule) pair stands. JSON-serialisable through :meth:`to_dict`.

    Attributes:
        state: ``inactive``, ``pending`` or ``firing``.
        since_step: pending/firing: the step at which the condition became active.
        fired_step: firing: the step at which the alert fired.
        clear_since_step: firing: the first step of the current uninterrupted clear stretch.
        step, value: the last observation of the open alert (for display).
    """

    state: LifecycleState = "inactive"
    since_step: int | None = None
    fired_step: int | None = None
    clear_since_step: int | None = None
    step: int | None = None
    value: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (non-finite values become ``None``)."""
        return {
            "state": self.state,
            "since_step": self.since_step,
            "fired_step": self.fired_step,
            "clear_since_step": self.clear_since_step,
            "step": self.step,
            "value": _finite_or_none(self.value),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> RuleLifecycle:
        """Inverse of :meth:`to_dict`; ``None`` or ``{}`` is the inactive state."""
        if not data:
            return cls()
        state = data.get("state", "inactive")
        if state not in ("inactive", "pending", "firing"):
            state = "inactive"
        return cls(
            state=state,
            since_step=data.get("since_step"),
            fired_step=data.get("fired_step"),
            clear_since_step=data.get("clear_since_step"),
            step=data.get("step"),
            value=data.get("value"),
        )


@dataclass(frozen=True)
class Event:
    """A transition produced by :func:`advance`.

    Attributes:
        kind: ``pending`` (a new alert), ``cancelled`` (a pending alert dropped before firing),
            ``firing`` or ``resolved``.
        step: the step of the observation that caused it.
        value: the rule's statistic at that step.
        since_step: the step at which the alert's condition first became active.
    """

    kind: EventKind
    step: int
    value: float
    since_step: int


def _finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def advance(
    current: RuleLifecycle,
    observations: Sequence[Observation],
    *,
    for_steps: int,
    resolve_for_steps: int,
) -> tuple[RuleLifecycle, list[Event]]:
    """Feed ``observations`` (ascending steps) through the state machine.

    Args:
        current: the state after the previous evaluation.
        observations: new verdicts, in step order; steps before ``current.step`` are ignored
            (a replayed batch changes nothing). The same step may be observed again (the
            ``stalled`` rule judges a silent run at its unchanging last step).
        for_steps: steps the condition must stay active before a pending alert fires.
        resolve_for_steps: steps the condition must stay clear before a firing alert resolves.

    Returns:
        The new state and the transitions, in order.

    Raises:
        ValueError: for a negative duration.
    """
    if for_steps < 0 or resolve_for_steps < 0:
        raise ValueError("for_steps and resolve_for_steps must be >= 0")
    state = current
    events: list[Event] = []
    arrays = observations if isinstance(observations, Observations) else None
    i, n = 0, len(observations)
    while i < n:
        if arrays is not None and state.state == "inactive":
            # An inactive rule ignores verdicts that are not active: go to the next active one.
            i = arrays.next_active(i)
            if i >= n:
                break
        obs = observations[i]
        i += 1
        if state.step is not None and obs.step < state.step and state.state != "inactive":
            continue
        state, event = _one(state, obs, for_steps, resolve_for_steps)
        if event is not None:
            events.append(event)
    return state, events


def _one(
    s: RuleLifecycle, obs: Observation, for_steps: int, resolve_for_steps: int
) -> tuple[RuleLifecycle, Event | None]:
    if s.state == "inactive":
        if not obs.active:
            return s, None
        s = RuleLifecycle(state="pending", since_step=obs.step, step=obs.step, value=obs.value)
        pending = Event("pending", obs.step, obs.value, obs.step)
        if for_steps == 0:
            fired = replace(s, state="firing", fired_step=obs.step)
            # Both events: the store creates the alert and fires it in one go.
            return fired, _merge(pending, Event("firing", obs.step, obs.value, obs.step))
        return s, pending
    since = s.since_step if s.since_step is not None else obs.step
    if s.state == "pending":
        if not obs.active:
            return RuleLifecycle(), Event("cancelled", obs.step, obs.value, since)
        s = replace(s, step=obs.step, value=obs.value)
        if obs.step - since >= for_steps:
            return replace(s, state="firing", fired_step=obs.step), Event(
                "firing", obs.step, obs.value, since
            )
        return s, None
    # firing
    s = replace(s, step=obs.step, value=obs.value)
    if not obs.clear:
        return replace(s, clear_since_step=None), None
    clear_since = s.clear_since_step if s.clear_since_step is not None else obs.step
    if obs.step - clear_since >= resolve_for_steps:
        return RuleLifecycle(), Event("resolved", obs.step, obs.value, since)
    return replace(s, clear_since_step=clear_since), None


def _merge(first: Event, second: Event) -> Event:
    """``pending`` immediately followed by ``firing``: reported as one ``firing`` event whose
    ``since_step`` says when it started (the store inserts the alert already firing)."""
    return Event("firing", second.step, second.value, first.since_step)
