"""A :class:`~.fit.Fit` as the service stores it: the JSON-ready dict the worker writes
(``Fit.to_dict``) and the fit rebuilt from it (``Fit.from_dict``), forgiving of fits stored
before a field existed and of malformed values. numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from curvecast.contract import FIT_STATUSES, ForecastStatus
from curvecast.service.forecast import calibration as _cal
from curvecast.service.forecast.curve import (
    as_float,
    finite_or_none,
    level_points,
    valid_confidence,
)

if TYPE_CHECKING:
    from curvecast.service.forecast.fit import Fit

__all__ = ["fit_from_dict", "fit_to_dict"]


def fit_to_dict(fit: Fit) -> dict[str, Any]:
    """``fit`` as a JSON-ready dict (NaN and inf become ``None``); :func:`fit_from_dict`
    inverts it."""
    out: dict[str, Any] = {
        "status": str(fit.status),
        "a": finite_or_none(fit.a),
        "b": finite_or_none(fit.b),
        "c": finite_or_none(fit.c),
        "n_points": fit.n_points,
        "n_fitted": fit.n_fitted,
        "fitted_from_step": finite_or_none(fit.fitted_from_step),
        "fitted_upto_step": finite_or_none(fit.fitted_upto_step),
        "residual_scale": finite_or_none(fit.residual_scale),
        "off_model": fit.off_model,
        "off_model_score": finite_or_none(fit.off_model_score),
        "off_model_excess": finite_or_none(fit.off_model_excess),
        "burn_in": finite_or_none(fit.burn_in),
        "burn_in_source": fit.burn_in_source,
        "n_eff": finite_or_none(fit.n_eff),
        "cov": None if fit.cov is None else [[finite_or_none(x) for x in row]
                                              for row in fit.cov],
        "confidence": fit.confidence,
        "message": fit.message,
        "calibration": fit.calibration,
        "loss_floor": finite_or_none(fit.loss_floor),
        "level": finite_or_none(fit.level),
        "useful_from_step": finite_or_none(fit.useful_from_step),
        "reached": None if fit.reached is None else [list(p) for p in fit.reached],
        "decay_rate": finite_or_none(fit.decay_rate),
        "level_step": finite_or_none(fit.level_step),
        "assumes_constant_lr": fit.assumes_constant_lr,
    }
    return out


def fit_from_dict(cls: type[Fit], data: Mapping[str, Any]) -> Fit:
    """Rebuild a ``cls`` (a :class:`~.fit.Fit`) stored with :func:`fit_to_dict`. Unknown keys
    are ignored; a missing or malformed value reads as absent, an unknown status as
    ``no_convergence``."""

    def opt(key: str) -> float | None:
        v = data.get(key)
        f = as_float(v)
        return f if math.isfinite(f) else None

    cov_raw = data.get("cov")
    cov: tuple[tuple[float, float, float], ...] | None = None
    if isinstance(cov_raw, list | tuple) and len(cov_raw) == 3:
        rows: list[tuple[float, float, float]] = []
        for row in cov_raw:
            vals = [as_float(x) for x in row] if isinstance(row, list | tuple) else []
            if len(vals) != 3 or not all(math.isfinite(x) for x in vals):
                rows = []
                break
            rows.append((vals[0], vals[1], vals[2]))
        cov = tuple(rows) if rows else None
    status = str(data.get("status", ""))
    return cls(
        status=(ForecastStatus(status) if status in FIT_STATUSES
                else ForecastStatus.NO_CONVERGENCE),
        a=opt("a"),
        b=opt("b"),
        c=opt("c"),
        n_points=int(data.get("n_points") or 0),
        n_fitted=int(data.get("n_fitted") or 0),
        fitted_from_step=opt("fitted_from_step"),
        fitted_upto_step=opt("fitted_upto_step"),
        residual_scale=opt("residual_scale"),
        off_model=bool(data.get("off_model", False)),
        off_model_score=opt("off_model_score"),
        off_model_excess=opt("off_model_excess"),
        burn_in=opt("burn_in"),
        burn_in_source=(None if data.get("burn_in_source") is None
                        else str(data.get("burn_in_source"))),
        n_eff=opt("n_eff"),
        cov=cov,
        confidence=valid_confidence(opt("confidence"), 0.9),
        message=str(data.get("message", "")),
        calibration=str(data.get("calibration", _cal.CALIBRATION_ID)),
        loss_floor=opt("loss_floor"),
        level=opt("level"),
        useful_from_step=opt("useful_from_step"),
        reached=_read_pairs(data.get("reached")),
        decay_rate=opt("decay_rate"),
        level_step=(opt("level_step") if "level_step" in data else _estimated_level_step(
            int(data.get("n_points") or 0), opt("fitted_from_step"),
            opt("fitted_upto_step"))),
        assumes_constant_lr=bool(data.get("assumes_constant_lr", False)),
    )


def _estimated_level_step(n_points: int, start: float | None, end: float | None
                          ) -> float | None:
    """The step the level stands for, for a fit stored before ``level_step`` was: the median
    step of the latest points, taking the points as evenly spaced over the fitted range (eval
    losses every k steps, training losses every step). Without it such a fit would extend its
    level from the last step, with a transient table measured from the level's step."""
    if n_points < 2 or start is None or end is None or not end > start:
        return None
    n = level_points(n_points)
    return end - 0.5 * (n - 1) * (end - start) / (n_points - 1)


def _read_pairs(raw: Any) -> tuple[tuple[float, float], ...] | None:
    """``[[step, loss], ...]`` as stored, or ``None`` when absent or malformed."""
    if not isinstance(raw, list | tuple):
        return None
    if not raw:
        return ()
    try:  # a stored fit is read every worker round: one numpy pass, not one call per number
        pairs = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if pairs.ndim != 2 or pairs.shape[1] != 2 or not bool(np.isfinite(pairs).all()):
        return None
    return tuple((s, v) for s, v in pairs.tolist())
