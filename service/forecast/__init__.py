"""Loss-curve forecasting: fit ``f(t) = a / sqrt(t + b) + c``, answer from the stored fit.

The modules, lightest first:

* :mod:`.curve` -- the model curve, its gradients, and the value types a fit answers with.
* :mod:`.fit` -- the :class:`Fit` value type: parameters, calibrated intervals; :mod:`.fit_json`
  stores it as JSON. numpy only; this package re-exports the value types, so
  ``from curvecast.service.forecast import Fit`` never loads scipy.
* :mod:`.calibration` -- the interval multipliers fitted offline on the curve corpus.
* :mod:`.binning` -- cleaning and binning a long series before a fit.
* :mod:`.reached` -- the loss a series reached at a step: the one rule (pure, numpy only).
* :mod:`.schedule` -- whether a logged learning rate decays.
* :mod:`.solver` -- :func:`~.solver.fit_curve`, the robust fit (scipy): its optimiser
  (:mod:`.robust_fit`), burn-in (:mod:`.burn_in`) and off-model test (:mod:`.off_model`).
* :mod:`.answer` -- the ONE builder of forecast answers (REST routes, pages, offline CLI).
* :mod:`.chances` -- decisions from forecasts: the chance a run ends below a loss, P(best);
  :mod:`.decision_answers` shapes them; :mod:`.sweep_correction` narrows a trial's forecast
  with its sweep's finished runs (the Optuna pruner's opt-in).
* :mod:`.files` and :mod:`.cli` -- ``curvecast forecast``, the offline command.

Usage (stable; see docs/forecast.md)::

    from curvecast.service.forecast.solver import fit_curve

    fit = fit_curve(steps, losses, config={"c_warmup": 2000})
    fit.predict(200_000)        # Interval(value, lo, hi)
    fit.f_star()                # Interval for the asymptote c ~ f*
    fit.steps_to(2.1)           # TargetEstimate(loss, step, lo, hi, reachable)
    Fit.from_dict(fit.to_dict())

The service's worker calls ``fit_curve`` on each series' points (not warm-started: its answer is
the offline CLI's and the backtests') and stores ``fit.to_dict()``; readers rebuild it once with
:meth:`Fit.from_dict`.
"""

from curvecast.service.forecast.curve import FitParams, Interval, TargetEstimate, model
from curvecast.service.forecast.fit import STATUSES, Fit

__all__ = ["STATUSES", "Fit", "FitParams", "Interval", "TargetEstimate", "model"]
