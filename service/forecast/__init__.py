"""Loss-curve forecasting: the pure fitting core and its offline CLI.

Public API (stable; see docs/forecast.md)::

    fit = fit_curve(steps, losses, config={"c_warmup": 2000})
    fit.predict(200_000)        # Interval(value, lo, hi)
    fit.f_star()                # Interval for the asymptote c ~ f*
    fit.steps_to(2.1)           # TargetEstimate(loss, step, lo, hi, reachable)
    Fit.from_dict(fit.to_dict())

The service's worker calls :func:`fit_curve` (with :func:`bin_series` for long runs and
``warm_start=previous.params``) and stores ``fit.to_dict()``.
"""

from curvecast.service.forecast.core import (
    STATUSES,
    BinnedSeries,
    Fit,
    FitParams,
    Interval,
    TargetEstimate,
    bin_series,
    choose_burn_in,
    fit_curve,
    model,
)

__all__ = [
    "STATUSES",
    "BinnedSeries",
    "Fit",
    "FitParams",
    "Interval",
    "TargetEstimate",
    "bin_series",
    "choose_burn_in",
    "fit_curve",
    "model",
]
