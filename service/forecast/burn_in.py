"""Where a fit starts: the burn-in, the steps before ScheduleFree+ averages (or the run's early
transient) that the model does not describe. numpy and scipy (through :mod:`.robust_fit`).

:func:`choose_burn_in` reads it from the run's config (the averaging start);
:func:`data_burn_in` chooses it from the data when neither the caller nor the config gives
one. docs/forecast.md, "2. Burn-in", has the long form.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from curvecast.contract import RunConfig
from curvecast.service.forecast.curve import FloatArray, model
from curvecast.service.forecast.robust_fit import MIN_POINTS, fit_vp, median

__all__ = ["choose_burn_in", "data_burn_in"]

_BURN_IN_CANDIDATES: Final = (0.05, 0.1, 0.2, 0.3)  # fractions of the latest step
_BURN_IN_TOLERANCE: Final = 1.5  # a later start must extrapolate 1.5x better to be chosen


def choose_burn_in(
    config: RunConfig | Mapping[str, Any] | None,
) -> tuple[float | None, str | None]:
    """Burn-in step from a run's config and where it came from, or ``(None, None)``.

    The contract's :attr:`~curvecast.contract.RunConfig.averaging_start` (``c_warmup``, else the
    paper's ``2 * warmup_steps``): the step where ScheduleFree+ starts averaging.
    """
    cfg = config if isinstance(config, RunConfig) else RunConfig.read(config)
    start = cfg.averaging_start
    return (None, None) if start is None else (float(start), cfg.averaging_start_source)


def data_burn_in(t: FloatArray, y: FloatArray, w: FloatArray, cmin: float) -> float:
    """Burn-in chosen from the (binned) data when neither the caller nor the config gives one.

    The data start at the paper's rule (5% of the latest step). A later start (10%, 20%, 30% of
    the latest step) is taken only when a fit from it extrapolates the most recent quarter of the
    data clearly (by a factor ``_BURN_IN_TOLERANCE`` in median absolute error) better than the
    start chosen so far: early transients (the fast initial drop, the pre-averaging phase) bend
    the fit and show up as a worse extrapolation of the run's own recent past.
    """
    base = float(t[0])
    if t.size < 2 * MIN_POINTS + 2:
        return base
    t_last = float(t[-1])
    split = t_last - 0.25 * (t_last - base)
    held = t > split
    if int(held.sum()) < 2:
        return base
    end = int(np.argmax(held))  # t is sorted: the held-out quarter is t[end:]
    chosen, best_err = base, math.inf
    tried = -1
    for frac in _BURN_IN_CANDIDATES:
        start = max(base, frac * t_last)
        first = int(np.searchsorted(t, start, side="left"))
        if first == tried:
            continue  # no point between this start and the last: the same fit, the same error
        tried = first
        if end - first < MIN_POINTS + 1:
            continue
        m = slice(first, end)
        raw = fit_vp(t[m], y[m], w[m], cmin, None)
        if raw is None:
            continue
        err = median(np.abs(model(t[held], raw.a, raw.b, raw.c) - y[held]))
        if not math.isfinite(err):
            continue
        if not math.isfinite(best_err) or err * _BURN_IN_TOLERANCE < best_err:
            chosen, best_err = start, err
    return chosen
