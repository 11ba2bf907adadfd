"""Narrow a run's forecast with its sweep: the finished runs' errors at the same point of a run.

The runs of one sweep (one task; other hyper-parameters or seeds) err alike: where the forecasts
the finished runs got at 20% of their runs proved 3% optimistic, a running run's forecast at 20%
likely is too. So, to ask whether a run ends below the best finished run, its forecast is set
against the best's forecast from the same fraction of its run rather than against the best's
final loss: the run's predictive distribution is moved by the best's error there (the log of
its final loss over that forecast's median), and its spread is scaled to the spread of the
finished runs' errors (a difference of two runs' errors has ``sqrt(2)`` times their standard
deviation), weighed against the calibrated width as :data:`PRIOR_RUNS` runs, since two or
three finished runs say little about a spread.

It applies only where the finished runs are like the run: at least two of them have a known
forecast there, the best among them, and the run's forecast extrapolates about as far below its
current loss as theirs did (within :data:`SIMILAR_DROP` in log). A run unlike them errs
otherwise (AlgoPerf's conformer runs of one setting were forecast 90% too low at 15% of the
run, the other setting's 3%): it keeps its own forecast.

Pure (numpy only): :func:`curvecast.integrations.optuna.decide` corrects its trial's outlook with
it (``CurvecastPruner(sweep_correction=True)``), and the pruning benches measure it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

import numpy as np

from curvecast.service.forecast.chances import PROBS, Outlook

__all__ = ["MIN_PEERS", "PRIOR_RUNS", "SIMILAR_DROP", "Peer", "corrected"]

#: A run is corrected only when its forecast's drop below its current loss (in log) is within
#: this of the finished runs' drops at the same fraction of their runs.
SIMILAR_DROP: Final = 0.02
#: The calibrated width counts as this many finished runs against the spread of their errors.
PRIOR_RUNS: Final = 2.0
#: The finished runs with a known forecast a correction needs: one error has no spread.
MIN_PEERS: Final = 2
_Z95: Final = 1.6448536269514722  # the standard normal's 95% quantile


@dataclass(frozen=True)
class Peer:
    """A finished run as the correction reads it.

    Attributes:
        outlook: its forecast of its final loss from its points up to the fraction of its run
            the corrected run is at (unknown: it does not count).
        loss: its loss at the last of those points.
        final: the final loss it ended with.
    """

    outlook: Outlook
    loss: float
    final: float


def _positive(look: Outlook) -> bool:
    return look.quantiles is not None and min(look.quantiles) > 0


def _log_quantiles(look: Outlook) -> np.ndarray:
    assert look.quantiles is not None
    return np.log(np.asarray(look.quantiles, dtype=np.float64))


def _median(log_quantiles: np.ndarray) -> float:
    return float(np.interp(0.5, PROBS, log_quantiles))


def corrected(own: Outlook, loss: float, peers: Sequence[Peer], best: Peer
              ) -> Outlook | None:
    """``own`` (a run's outlook of its final loss, its current loss ``loss``) corrected by the
    finished ``peers`` and the ``best`` of them (module docstring); None where the correction
    does not apply and ``own`` stands: too few peers know, the best does not, or the run is
    unlike them."""
    # The errors are ratios (logs): a loss at or below zero has none.
    if own.observed or not _positive(own) or loss <= 0:
        return None
    known = [p for p in peers if _positive(p.outlook) and p.loss > 0 and p.final > 0]
    if len(known) < MIN_PEERS or best not in known:
        return None
    mine = _log_quantiles(own)
    centre = _median(mine)
    theirs = [_median(_log_quantiles(p.outlook)) for p in known]  # their forecasts, in log
    drops = [m - math.log(p.loss) for m, p in zip(theirs, known, strict=True)]
    if not min(drops) - SIMILAR_DROP <= centre - math.log(loss) <= max(drops) + SIMILAR_DROP:
        return None
    errors = [math.log(p.final) - m for m, p in zip(theirs, known, strict=True)]
    shift = errors[known.index(best)]
    # the run's own calibrated sd in log, read off its 90% band
    sd = (float(np.interp(0.95, PROBS, mine)) - float(np.interp(0.05, PROBS, mine))) / (2 * _Z95)
    spread = 2 * float(np.var(errors, ddof=1)) / max(sd * sd, 1e-12)
    n = len(errors)
    scale = math.sqrt((PRIOR_RUNS + (n - 1) * spread) / (PRIOR_RUNS + n - 1))
    moved = np.exp(centre + shift + scale * (mine - centre))
    return replace(own, value=float(np.exp(centre + shift)),
                   lo=float(np.interp(0.05, PROBS, moved)),
                   hi=float(np.interp(0.95, PROBS, moved)),
                   quantiles=tuple(float(x) for x in moved))
