"""The sweep correction: a run's forecast set against the best finished run's forecast from the
same point of its run, its width scaled to how alike the finished runs' forecasts erred; and
left alone where the finished runs cannot say (too few, the best unknown, a run unlike them).

The outlooks are log-normal, as a fit's calibrated band nearly is: the arithmetic is checkable
by hand."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from curvecast.service.forecast.chances import PROBS, Outlook
from curvecast.service.forecast.sweep_correction import (
    PRIOR_RUNS,
    SIMILAR_DROP,
    Peer,
    corrected,
)

SD = 0.05  # the runs' calibrated sd of the log final loss
_Z = np.asarray([NormalDist().inv_cdf(float(p)) for p in PROBS])


def look(median: float, sd: float = SD) -> Outlook:
    """A log-normal outlook of the final loss: median ``median``, sd ``sd`` in log."""
    q = median * np.exp(sd * _Z)
    return Outlook(10_000, value=median, lo=float(q[0]), hi=float(q[-1]),
                   quantiles=tuple(float(x) for x in q))


def peer(forecast: float, error: float, drop: float = -0.1) -> Peer:
    """A finished run whose forecast ``forecast`` was made when its loss was
    ``forecast / exp(drop)`` and proved off by ``error`` in log (its final over the forecast)."""
    return Peer(look(forecast), forecast / math.exp(drop), forecast * math.exp(error))


def _log_sd(got: Outlook) -> float:
    assert got.quantiles is not None
    q = np.log(np.asarray(got.quantiles))
    return float((np.interp(0.95, PROBS, q) - np.interp(0.05, PROBS, q)) / (2 * 1.6448536))


def test_alike_errors_move_the_forecast_by_the_best_and_narrow_it() -> None:
    # Every finished run's forecast was 4% pessimistic: the run's likely is too, and the
    # errors agreeing, its band narrows to the prior's share.
    peers = [peer(2.0, -0.04), peer(2.1, -0.04), peer(2.2, -0.04), peer(2.3, -0.04)]
    own = look(1.98)
    got = corrected(own, 1.98 / math.exp(-0.1), peers, peers[0])
    assert got is not None and got.value is not None
    assert got.value == pytest.approx(1.98 * math.exp(-0.04), rel=1e-6)
    n = len(peers)
    assert _log_sd(got) == pytest.approx(SD * math.sqrt(PRIOR_RUNS / (PRIOR_RUNS + n - 1)),
                                         rel=1e-3)
    assert got.lo is not None and got.hi is not None and got.lo < got.value < got.hi
    # Set against the best's forecast, not its final loss: the run whose forecast is below
    # the best's (2.0) likely ends below the best, though its own forecast is above the
    # best's final loss (1.92).
    assert own.chance_below(peers[0].final) < 0.5 < (got.chance_below(peers[0].final) or 0)


def test_errors_that_disagree_widen_the_band() -> None:
    peers = [peer(2.0, 0.15), peer(2.1, -0.1), peer(2.2, 0.12), peer(2.3, -0.08)]
    got = corrected(look(2.05), 2.05 / math.exp(-0.1), peers, peers[0])
    assert got is not None and _log_sd(got) > 1.5 * SD


@pytest.mark.parametrize("why", ["one peer", "the best unknown", "unlike them", "observed",
                                 "a loss below zero"])
def test_the_forecast_stands_where_the_finished_runs_cannot_say(why: str) -> None:
    peers = [peer(2.0, 0.04), peer(2.1, 0.04), peer(2.2, 0.05)]
    own, loss = look(2.05), 2.05 / math.exp(-0.1)
    best = peers[0]
    if why == "one peer":
        peers = peers[:1]
    elif why == "the best unknown":
        best = Peer(Outlook(10_000, reason="too_early"), 2.2, 2.1)
        peers = [best, *peers[1:]]
    elif why == "unlike them":  # its forecast drops far more below its loss than theirs did
        loss = 2.05 / math.exp(-0.1 - 3 * SIMILAR_DROP)
    elif why == "observed":
        own = Outlook(10_000, value=2.0, lo=2.0, hi=2.0, observed=True)
    else:  # an objective that is not a positive loss (a negative log-likelihood, say)
        best = Peer(look(2.0), 2.2, -0.5)
        peers = [best, *peers[1:]]
    assert corrected(own, loss, peers, best) is None


def test_a_run_just_within_their_drops_is_corrected() -> None:
    peers = [peer(2.0, 0.04, drop=-0.1), peer(2.1, 0.04, drop=-0.2)]
    inside = 2.05 / math.exp(-0.2 - SIMILAR_DROP / 2)
    outside = 2.05 / math.exp(-0.2 - 2 * SIMILAR_DROP)
    assert corrected(look(2.05), inside, peers, peers[0]) is not None
    assert corrected(look(2.05), outside, peers, peers[0]) is None
