"""The optimiser under :func:`~.solver.fit_curve`: a robust variable-projection fit of
``f(t) = a / sqrt(t + b) + c`` on normalised data. numpy and scipy; no I/O.

For a fixed ``b`` the model is linear in ``(a, c)``, solved in closed form with ``a >= 0`` and
``c`` above a floor (:func:`solve_ac`, :class:`LineFit`). The 1-D profile over
``q = log(t0 + b)`` is scanned on a grid (vectorised), then polished with a bounded scalar
search; a weak Gaussian prior on ``q`` keeps short prefixes from running off to the linear
(``b -> inf``) or singular (``b -> -t0``) ends. Huber iteratively reweighted least squares
(scale from the MAD of residuals) takes the pull out of spikes (:func:`fit_vp`).
:func:`covariance` gives the delta-method covariance the fit's intervals start from.
docs/forecast.md ("Method") has the long form and why each constant has its value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
from scipy.optimize import minimize_scalar

from curvecast.service.forecast.curve import FloatArray

__all__ = [
    "MIN_POINTS",
    "LineFit",
    "RawFit",
    "covariance",
    "design",
    "fit_vp",
    "location_scale",
    "median",
    "n_effective",
    "robust_sigma",
    "solve_ac",
]

MIN_POINTS: Final = 4  # three parameters need at least one residual degree of freedom
_Q_SPAN_LO: Final = -7.0  # grid for q = log(t0 + b), relative to log of the reference scale
_Q_SPAN_HI: Final = 9.0
_GRID: Final = 65
_WARM_HALF_WIDTH: Final = 1.5  # a warm start scans q within +-1.5 of the previous fit
_WARM_GRID: Final = 13
_PRIOR_MU: Final = -0.5  # prior mean of log((t0 + b) / t0), i.e. b ~ -0.4 t0
_PRIOR_TAU: Final = 1.5  # weak: moves q only where the data cannot tell
_HUBER_K: Final = 1.5  # Huber threshold in robust standard deviations
_IRLS_ITERS: Final = 3


@dataclass
class RawFit:
    """The result of one robust variable-projection fit, on the normalised data."""

    a: float
    b: float
    c: float
    q: float
    t0: float
    residuals: FloatArray
    weights: FloatArray
    sigma: float


def solve_ac(x: FloatArray, y: FloatArray, w: FloatArray, cmin: float
              ) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Weighted least squares ``y ~ a x + c`` for every row of ``x`` at once, ``a >= 0``,
    ``c >= cmin``. Returns ``(a, c, sse)`` per row.

    From weighted sums, with two passes over ``x`` (a product with ``[w, w y]`` and one with
    ``w`` of ``x * x``): a fit scans hundreds of rows, and forming each row's residuals cost
    three times as much. The SSE loses a few of float64's digits to cancellation on a very
    good fit; the grid only ranks rows by it, and the chosen row is re-solved exactly.
    """
    wsum = float(w.sum())
    sy = float(w @ y)
    syy = float(w @ (y * y))
    sx_sxy = x @ np.stack((w, w * y), axis=1)
    sx, sxy = sx_sxy[:, 0], sx_sxy[:, 1]
    sxx = (x * x) @ w
    cxx = sxx - sx * sx / wsum  # centred: the slope's normal equation
    cxy = sxy - sx * sy / wsum
    safe = np.where(cxx > 0, cxx, 1.0)
    a = np.maximum(np.where(cxx > 0, cxy / safe, 0.0), 0.0)
    c = (sy - a * sx) / wsum
    low = c < cmin
    if np.any(low):
        # The asymptote hit its bound: re-solve a with c fixed at the bound.
        num = sxy - cmin * sx
        a2 = np.maximum(np.where(sxx > 0, num / np.where(sxx > 0, sxx, 1.0), 0.0), 0.0)
        a = np.where(low, a2, a)
        c = np.where(low, cmin, c)
    sse = syy - 2.0 * a * sxy - 2.0 * c * sy + a * a * sxx + 2.0 * a * c * sx + c * c * wsum
    return a, c, np.maximum(sse, 0.0)


def design(t: FloatArray, qs: FloatArray) -> FloatArray:
    """``1 / sqrt(exp(q) + t - t[0])``: one row per ``q`` of the grid (in place: no temporaries)."""
    u: FloatArray = np.exp(qs)[:, None] + (t[None, :] - t[0])
    np.sqrt(u, out=u)
    np.divide(1.0, u, out=u)
    return u


def median(x: FloatArray) -> float:
    """``np.median`` of a non-empty 1-d array, the same value, without its generic machinery
    (a fit asks for dozens of medians of a few hundred points each)."""
    s = np.sort(x)
    h = s.size // 2
    return float(s[h]) if s.size % 2 else float((s[h - 1] + s[h]) / 2.0)


def robust_sigma(r: FloatArray) -> float:
    if r.size == 0:
        return 0.0
    mad = median(np.abs(r - median(r))) * 1.4826
    if mad > 0:
        return mad
    return float(np.sqrt(np.mean(r * r)))


def fit_vp(t: FloatArray, y: FloatArray, w0: FloatArray, cmin: float,
            q_center: float | None = None, half_width: float = _WARM_HALF_WIDTH,
            iters: int = _IRLS_ITERS) -> RawFit | None:
    """Robust variable-projection fit on sorted data (``t[0]`` is the first fitted step).

    ``q = log(t0 + b)``; with ``q_center`` (a warm start) only a narrow grid around it is scanned.
    """
    t0 = float(t[0])
    span = float(t[-1] - t0)
    ref = max(t0, 0.02 * float(t[-1]), 1e-9 * max(span, 1.0), 1e-12)
    log_ref = math.log(ref)
    mu = log_ref + _PRIOR_MU if t0 > 0 else log_ref
    if q_center is not None and math.isfinite(q_center):
        n_grid = max(_WARM_GRID, int(round(_WARM_GRID * half_width / _WARM_HALF_WIDTH)))
        qs = np.linspace(q_center - half_width, q_center + half_width, n_grid)
    else:
        qs = np.linspace(log_ref + _Q_SPAN_LO, log_ref + _Q_SPAN_HI, _GRID)
    tr = t - t0  # the design only needs t - t0, which keeps precision at large steps
    w = w0.copy()
    scale_y = max(float(np.max(np.abs(y))), 1.0)  # data are normalised: O(1)
    best: RawFit | None = None
    x, x_qs = design(t, qs), qs
    for it in range(iters):
        if qs is not x_qs and not np.array_equal(qs, x_qs):
            # A pass whose optimum is the previous grid's centre scans the same grid again
            # (only the weights changed): the design is reused.
            x, x_qs = design(t, qs), qs
        _, _, sse_g = solve_ac(x, y, w, cmin)
        dof = max(float(w.sum() / w.max()) - 3.0, 1.0)
        s2 = max(float(sse_g.min()) / dof, (1e-12 * scale_y) ** 2)
        obj = sse_g / (2.0 * s2) + (qs - mu) ** 2 / (2.0 * _PRIOR_TAU**2)
        obj[np.isnan(obj)] = np.inf  # what np.nanargmin does, without its overhead
        i = int(np.argmin(obj))
        if not math.isfinite(float(obj[i])):
            return None
        q = float(qs[i])
        lo, hi = float(qs[max(i - 1, 0)]), float(qs[min(i + 1, qs.size - 1)])
        line = LineFit(y, w, cmin)
        if it == iters - 1 and hi > lo:
            # Polish the last pass only: earlier passes just need weights.
            def objective(q: float, line: LineFit = line, s2: float = s2) -> float:
                return (line.sse(1.0 / np.sqrt(math.exp(q) + tr)) / (2.0 * s2)
                        + (q - mu) ** 2 / (2.0 * _PRIOR_TAU**2))

            res = minimize_scalar(objective, bounds=(lo, hi), method="bounded",
                                  options={"xatol": 1e-4})
            if res.success and float(res.fun) <= float(obj[i]):
                q = float(res.x)
        xq = 1.0 / np.sqrt(math.exp(q) + tr)
        a, c = line.ac(xq)
        r = y - (a * xq + c)
        sigma = robust_sigma(r)
        b = math.exp(q) - t0
        best = RawFit(a=a, b=b, c=c, q=q, t0=t0, residuals=r, weights=w.copy(), sigma=sigma)
        if sigma <= 0:
            break
        if it < iters - 1:
            k = _HUBER_K * sigma
            w = w0 * np.minimum(1.0, k / np.maximum(np.abs(r), 1e-300))
            if q_center is None:
                # After the first pass, scan a finer grid around the optimum only.
                qs = np.linspace(q - 2.0, q + 2.0, 33)
    return best


class LineFit:
    """The constrained weighted fit ``y ~ a x + c`` (``a >= 0``, ``c >= cmin``) of fixed data
    ``(y, w)`` against one design vector ``x`` at a time: what the 1-d polish asks for a dozen
    times per pass, so the sums that do not depend on ``x`` are formed once."""

    __slots__ = ("cmin", "my", "w", "wsum", "wyc", "y")

    def __init__(self, y: FloatArray, w: FloatArray, cmin: float) -> None:
        self.y, self.w, self.cmin = y, w, cmin
        self.wsum = float(w.sum())
        self.my = float(w @ y) / self.wsum
        self.wyc = w * (y - self.my)

    def ac(self, x: FloatArray) -> tuple[float, float]:
        """``(a, c)`` for the design vector ``x``."""
        w = self.w
        mx = float(w @ x) / self.wsum
        dx = x - mx
        sxx = float(w @ (dx * dx))
        a = max(float(dx @ self.wyc) / sxx, 0.0) if sxx > 0 else 0.0
        c = self.my - a * mx
        if c < self.cmin:
            # The asymptote hit its bound: re-solve a with c fixed at the bound.
            c = self.cmin
            sx2 = float(w @ (x * x))
            a = max(float(w @ (x * (self.y - c))) / sx2, 0.0) if sx2 > 0 else 0.0
        return a, c

    def sse(self, x: FloatArray) -> float:
        """The weighted sum of squared residuals of the fit on ``x``."""
        a, c = self.ac(x)
        r = self.y - (a * x + c)
        return float(self.w @ (r * r))


def n_effective(r: FloatArray) -> float:
    """Effective sample size under AR(1) residuals: n (1 - rho) / (1 + rho)."""
    n = r.size
    if n < 3:
        return float(n)
    den = float(r @ r)
    if den <= 0:
        return float(n)
    rho = float(r[1:] @ r[:-1]) / den
    rho = min(max(rho, 0.0), 0.95)
    return max(n * (1.0 - rho) / (1.0 + rho), 2.0)


def covariance(raw: RawFit, t: FloatArray, n_eff: float) -> FloatArray | None:
    """Delta-method covariance of (a, q, c), inflated by n / n_eff, with the prior on q."""
    u = np.exp(raw.q) + (t - raw.t0)
    inv = 1.0 / np.sqrt(u)
    jac = np.column_stack([inv, -0.5 * raw.a * inv / u * np.exp(raw.q), np.ones_like(t)])
    w = raw.weights
    s2 = max(float(w @ raw.residuals**2) / max(float(w.sum()) - 3.0, 1.0), raw.sigma**2)
    if s2 <= 0:
        s2 = 1e-30
    info = (jac * w[:, None]).T @ jac / s2
    info[1, 1] += 1.0 / _PRIOR_TAU**2
    try:
        cov = np.linalg.pinv(info) * (t.size / max(n_eff, 1.0))
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(cov)):
        return None
    out: FloatArray = 0.5 * (cov + cov.T)
    return out


def location_scale(y: FloatArray) -> tuple[float, float]:
    """Median and a robust, strictly positive scale (IQR, else MAD, else the level)."""
    mid = median(y)
    q25, q75 = np.percentile(y, [25.0, 75.0])
    scale = float(q75 - q25) / 1.349
    if not scale > 0:
        scale = 1.4826 * median(np.abs(y - mid))
    if not scale > 0:
        scale = abs(mid) if mid != 0 else 1.0
    return mid, scale
