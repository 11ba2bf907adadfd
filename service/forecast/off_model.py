"""Has the data left the model? The off-model test of a fit, and the fit of a curve without
significant decay. numpy and scipy (through :mod:`.robust_fit`); no I/O.

The recent part of the fitted window is compared with a fit on the data before it: a sustained
departure (the median of the latest points, several standard errors away and well beyond the
predicted decay: an LR decay began, or a divergence) makes the fit ``off_model``
(:func:`mark_off_model`). A curve with no significant decay is fitted as its level, ``flat``, or
``off_model`` when it rises (:func:`flat_fit`). docs/forecast.md, "6. `off_model`", has the long
form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

import numpy as np

from curvecast.contract import ForecastStatus
from curvecast.service.forecast.curve import FloatArray, curve_gradients, finite_or_none, model
from curvecast.service.forecast.fit import Fit
from curvecast.service.forecast.robust_fit import (
    MIN_POINTS,
    covariance,
    fit_vp,
    median,
    n_effective,
    robust_sigma,
)

__all__ = ["flat_fit", "mark_off_model", "off_model_stats", "suffix_medians"]

_RECENT_FRACTION: Final = 0.3  # off-model test: the last 30% of the fitted step range ...
# ... sits, as a block (median), below the older fit by >= 3 standard errors and >= 10% more
# decay than it predicted, or by >= 2 standard errors and twice the predicted decay (an LR decay
# began); or above it by >= 3 standard errors, having given back more than the whole predicted
# decay (a rise). How often they flag anytime runs: BENCHMARKS.md, "Forecast backtest on the
# public curves".
_OFF_RULES_BELOW: Final = ((3.0, 0.1), (2.0, 1.0))
_OFF_RULE_ABOVE: Final = (3.0, 1.0)
_OFF_Z: Final = 3.0  # a flat fit's upward trend, in standard errors, that counts as a rise


def mark_off_model(fit: Fit, t: FloatArray, y: FloatArray, w: FloatArray, cmin: float,
                   q_main: float) -> Fit:
    """``fit`` (an ``ok`` fit of the normalised, binned data ``t, y`` with robust weights
    ``w``) with the off-model test's answer: ``off_model`` with its score, excess and reason
    when the recent data left the model, else ``ok`` with the score it was tested with;
    unchanged when there is too little data to test (:func:`off_model_stats`)."""
    stats = off_model_stats(t, y, w, cmin, q_main)
    if stats is None:
        return fit
    z, excess = stats
    below = any(z < -zt and excess < -et for zt, et in _OFF_RULES_BELOW)
    above = z > _OFF_RULE_ABOVE[0] and excess > _OFF_RULE_ABOVE[1]
    off = below or above
    msg = ""
    if off:
        where = "below" if below else "above"
        msg = (f"the recent data left the model: {abs(z):.1f} standard errors {where} "
               f"a fit on the older data ({excess:+.0%} of its predicted decay)")
    return replace(fit, off_model=off, off_model_score=z, off_model_excess=excess,
                   status=ForecastStatus.OFF_MODEL if off else ForecastStatus.OK, message=msg)


def off_model_stats(t: FloatArray, y: FloatArray, w: FloatArray, cmin: float, q_main: float
                     ) -> tuple[float, float] | None:
    """``(z, excess)``: departure of the recent window from a fit on the data before it.

    The recent window is the last 30% of the fitted step range (at least 3 points); the older
    data (at least 5 points) are fitted alone. ``z`` is the median over recent points of the
    residual from that older fit divided by ``sqrt(se^2 + sigma^2)`` (its delta-method forecast
    error and noise); ``excess`` is the median residual divided by the decay the older fit
    predicted across the recent window. Medians, so a single spike cannot move them; both signs,
    so a divergence shows as well as an LR decay. Returns ``None`` when there is too little data
    or the older part shows no decay to extrapolate.
    """
    t_split = float(t[-1] - _RECENT_FRACTION * (t[-1] - t[0]))
    recent = t > t_split
    if int(recent.sum()) < 3:
        recent = np.zeros(t.size, dtype=bool)
        recent[-3:] = True
    hist = ~recent
    if int(hist.sum()) < MIN_POINTS + 1:
        return None
    th, yh, wh = t[hist], y[hist], w[hist]
    # The main fit's robust weights already mark the outliers: one pass (plus polish) suffices.
    raw = fit_vp(th, yh, wh, cmin, q_main, half_width=2.5, iters=1)
    if raw is None or raw.a <= 0:
        return None
    t_split = float(th[-1])
    cov = covariance(raw, th, n_effective(raw.residuals))
    tr = t[recent]
    pred = model(tr, raw.a, raw.b, raw.c)
    resid = y[recent] - pred
    if cov is not None:
        grads = curve_gradients(tr, raw.a, raw.b, raw.t0)
        se2 = np.maximum(np.einsum("ij,jk,ik->i", grads, cov, grads), 0.0)
    else:
        se2 = np.zeros(tr.size)
    decay = float(model(np.array([t_split]), raw.a, raw.b, raw.c)[0] - pred[-1])
    if not decay > 0 or not np.all(np.isfinite(resid)):
        return None
    # Noise averages down over a block of m recent points (variance of a median: pi/2 s^2/m,
    # fewer effective points when residuals are autocorrelated); the older fit's own forecast
    # error (se^2) does not, it is shared by the whole block.
    phi = n_effective(raw.residuals) / max(raw.residuals.size, 1)
    noise2 = raw.sigma**2 * (0.5 * math.pi) / phi
    # Scan the suffixes (the last 3, 4, ... recent points): a change that began inside the
    # window shows in the suffix after it even when it is not yet the window's majority.
    best: tuple[float, float] = (0.0, 0.0)
    lengths = sorted({min(int(round(3 * 1.25**i)), resid.size) for i in range(40)})
    medians = suffix_medians(resid, lengths)
    for m, med in zip(lengths, medians.tolist(), strict=True):
        var = float(np.mean(se2[-m:])) + noise2 / m
        if var <= 0:
            continue
        z = med / math.sqrt(var)
        if abs(z) > abs(best[0]):
            best = (z, med / decay)
    return best


def suffix_medians(x: FloatArray, lengths: Sequence[int]) -> FloatArray:
    """``np.median(x[-m:])`` for every ``m`` in ``lengths`` (finite ``x``), with one sort
    instead of a median call per suffix (a fit scans about twenty): row ``i`` holds the last
    ``m_i`` values padded with +inf, so once sorted its middle elements are the suffix's."""
    m = np.asarray(lengths, dtype=np.int64)
    rows = np.where(np.arange(x.size)[None, :] < m[:, None], x[::-1][None, :], np.inf)
    rows.sort(axis=1)
    at = np.arange(m.size)
    lo, hi = rows[at, (m - 1) // 2], rows[at, m // 2]
    # As np.median: the middle value, or the mean of the two middle values.
    out: FloatArray = np.where(m % 2 == 1, lo, (lo + hi) / 2.0)
    return out


def flat_fit(t: FloatArray, y: FloatArray, base: dict[str, Any], y_mid: float, y_scale: float
              ) -> Fit:
    """Constant fit for a curve without significant decay; flags a significant rise.

    ``y`` is normalised (``(loss - y_mid) / y_scale``); the level and scale are reported in loss
    units.
    """
    level_n = median(y)
    level = level_n * y_scale + y_mid
    base = dict(base, residual_scale=robust_sigma(y - level_n) * y_scale)
    # A significant upward trend (divergence) is a departure from the model, not just "flat".
    tt = t - t.mean()
    den = float(tt @ tt)
    off = False
    score: float | None = None
    if den > 0 and t.size >= MIN_POINTS:
        slope = float(tt @ (y - y.mean())) / den
        resid = y - y.mean() - slope * tt
        n_eff = n_effective(resid)
        s = robust_sigma(resid)
        se = s / math.sqrt(den) * math.sqrt(t.size / max(n_eff, 1.0)) if s > 0 else 0.0
        if se > 0:
            score = slope / se  # the trend in standard errors
        elif slope > 0:
            score = math.inf
        off = bool(score is not None and score > _OFF_Z)
    if off:
        return Fit(status=ForecastStatus.OFF_MODEL, a=0.0, b=None, c=level, off_model=True,
                   off_model_score=finite_or_none(score),
                   message="the loss is rising: no decay to extrapolate", **base)
    return Fit(status=ForecastStatus.FLAT, a=0.0, b=None, c=level, off_model=False,
               off_model_score=finite_or_none(score),
               message="no significant decay: the forecast is the current level", **base)
