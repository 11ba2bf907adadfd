"""Is the learning rate decaying? Read from the LR the optimizer logged (numpy only, pure).

``a / sqrt(t + b) + c`` describes anytime runs (constant LR, schedule-free). A cosine decay is
fitted by that curve about as well as an anytime run until late in the decay (docs/forecast.md,
"Decaying schedules"), so the shape of the loss alone cannot tell them apart in time. The
learning rate itself can: ``Monitor.watch()`` logs it for every optimizer that is not
ScheduleFree+ (``opt/lr``, or ``opt/lr/<group>``), and a scheduler that decays it shows at once.

:func:`lr_decay` finds where the logged rate fell clearly below its peak. A warmup (rising to
the peak) is not a decay; a constant rate never is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import ArrayLike

from curvecast.contract import RunConfig

__all__ = ["CONSTANT_LR_ASSUMED", "DECAYED_BELOW", "LrDecay", "assumes_constant_lr", "lr_decay"]

#: The rate counts as decaying once it is below this fraction of its peak. Schedulers set the
#: rate exactly, so a 10% fall is no noise: a cosine reaches it at about a fifth of its decay,
#: a linear decay at a tenth, a step schedule at its first step.
DECAYED_BELOW: Final = 0.9


@dataclass(frozen=True)
class LrDecay:
    """Where the logged learning rate left its peak.

    Attributes:
        since_step: the first step after the peak where the rate was below
            :data:`DECAYED_BELOW` times the peak.
        fraction: the latest rate as a fraction of the peak (0.5: half the peak rate).
    """

    since_step: float
    fraction: float

    def message(self) -> str:
        """The reason in words, for a fit's message."""
        return (f"the logged learning rate decays (down to {self.fraction:.0%} of its peak, "
                f"below {DECAYED_BELOW:.0%} of it since step {self.since_step:g})")


def lr_decay(steps: ArrayLike, values: ArrayLike, upto: float | None = None) -> LrDecay | None:
    """Whether a logged learning rate is decaying, and since when.

    Args:
        steps: the steps the rate was logged at.
        values: the rate at those steps (non-finite pairs are ignored).
        upto: consider only steps up to this one (the last step a fit saw).

    Returns:
        :class:`LrDecay` when the latest rate is below :data:`DECAYED_BELOW` times the highest
        rate before it; ``None`` otherwise (no data, a warmup, a constant or rising rate).
    """
    try:
        t = np.asarray(steps, dtype=np.float64).ravel()
        v = np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        return None
    if t.size != v.size or t.size == 0:
        return None
    keep = np.isfinite(t) & np.isfinite(v)
    if upto is not None and math.isfinite(upto):
        keep &= t <= upto
    t, v = t[keep], v[keep]
    if t.size < 2:
        return None
    order = np.argsort(t, kind="stable")
    t, v = t[order], v[order]
    peak_at = int(np.argmax(v))
    peak = float(v[peak_at])
    if not peak > 0 or not v[-1] < DECAYED_BELOW * peak:
        return None
    below = np.flatnonzero(v[peak_at:] < DECAYED_BELOW * peak)
    return LrDecay(since_step=float(t[peak_at + int(below[0])]), fraction=float(v[-1]) / peak)


#: What a forecast says when nothing tells it the schedule (:func:`assumes_constant_lr`).
CONSTANT_LR_ASSUMED: Final = (
    "assumes the learning rate does not decay: the run declares no lr_schedule, logs no "
    "learning rate (opt/lr) and is not schedule-free; under a decaying schedule the loss "
    "falls below this forecast late in the run (declare lr_schedule in the run's config, or "
    "let Monitor.watch(optimizer) log the rate)"
)


def assumes_constant_lr(config: RunConfig, lr_logged: bool) -> bool:
    """Whether a forecast of this run rests on an unchecked assumption: that its learning rate
    does not decay. So it is when the run declares no ``lr_schedule``, logs no learning rate
    and is not schedule-free (ScheduleFree+ has no schedule). The loss alone cannot tell a
    cosine run from an anytime one until late in the decay, so the product says so instead of
    guessing; a declared or logged decay makes the fit ``off_model``."""
    return config.lr_schedule is None and not lr_logged and not config.schedule_free
