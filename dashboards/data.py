"""The REST API's JSON shapes as plain arrays: what the figure builders consume.

Everything here is pure: dictionaries shaped like the API's answers come in, numpy arrays and
small frozen dataclasses come out. Non-finite values travel in the API as the contract's strings
(:data:`curvecast.contract.NON_FINITE_STRINGS`); they are parsed back to floats here, once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from curvecast.contract import (
    EVAL_LOSS_KEYS,
    LEVEL_EXTENDING_STATUSES,
    NON_FINITE_STRINGS,
    ForecastStatus,
    RunConfig,
)

FloatArray = NDArray[np.float64]

_NON_FINITE = dict(zip(NON_FINITE_STRINGS, (math.nan, math.inf, -math.inf), strict=True))


def forecast_status(value: Any) -> ForecastStatus | None:
    """A forecast answer's ``status`` as the contract's enum; None when it has none (or one
    this version does not know)."""
    try:
        return ForecastStatus(value)
    except ValueError:
        return None


def to_float(value: Any) -> float:
    """One API value as a float: numbers as they are, ``None`` and the non-finite strings
    parsed (``None`` → NaN)."""
    if value is None:
        return math.nan
    if isinstance(value, str):
        return _NON_FINITE.get(value, math.nan)
    return float(value)


def to_float_array(values: Iterable[Any] | None) -> FloatArray:
    """A list of API values as a float64 array (see :func:`to_float`)."""
    if values is None:
        return np.zeros(0, dtype=np.float64)
    items = list(values)
    try:
        return np.asarray(items, dtype=np.float64)
    except (TypeError, ValueError):  # strings or None inside: the slow path, only then
        return np.fromiter((to_float(v) for v in items), dtype=np.float64, count=len(items))


def plottable(values: FloatArray) -> FloatArray:
    """Values with ±Infinity replaced by NaN: Plotly draws NaN as a gap, infinity not at all."""
    out = values.copy()
    out[~np.isfinite(out)] = np.nan
    return out


@dataclass(frozen=True)
class SeriesData:
    """One metric series (``GET .../metrics`` item). When ``downsampled``, entry i is a bucket:
    ``steps``/``values`` its last point, ``vmin``/``vmax`` its extremes."""

    key: str
    steps: FloatArray
    values: FloatArray
    vmin: FloatArray | None
    vmax: FloatArray | None
    downsampled: bool
    total_points: int

    @classmethod
    def from_api(cls, item: Mapping[str, Any]) -> SeriesData:
        """Parse one item of ``MetricsOut.series``."""
        downsampled = bool(item.get("downsampled"))
        return cls(
            key=str(item["key"]),
            steps=to_float_array(item.get("steps")),
            values=to_float_array(item.get("values")),
            vmin=to_float_array(item["min"]) if downsampled and item.get("min") else None,
            vmax=to_float_array(item["max"]) if downsampled and item.get("max") else None,
            downsampled=downsampled,
            total_points=int(item.get("total_points") or len(item.get("steps") or ())),
        )

    @classmethod
    def empty(cls, key: str) -> SeriesData:
        """A series with no points (the key was never logged)."""
        zero = np.zeros(0, dtype=np.float64)
        return cls(key, zero, zero, None, None, False, 0)

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def last(self) -> tuple[float, float] | None:
        """The last (step, value), or None for an empty series."""
        if not len(self.steps):
            return None
        return float(self.steps[-1]), float(self.values[-1])


SeriesLike = SeriesData | Mapping[str, Any]


def as_series(item: SeriesLike | None, key: str = "") -> SeriesData:
    """Accept an API dict, a :class:`SeriesData` or None (→ empty)."""
    if item is None:
        return SeriesData.empty(key)
    if isinstance(item, SeriesData):
        return item
    return SeriesData.from_api(item)


def series_by_key(
    metrics: Mapping[str, Any] | Sequence[Mapping[str, Any]],
) -> dict[str, SeriesData]:
    """``GET .../metrics`` (the whole answer or its ``series`` list) keyed by metric key."""
    items = metrics.get("series", []) if isinstance(metrics, Mapping) else metrics
    return {str(item["key"]): SeriesData.from_api(item) for item in items}


def eval_key(keys_with_data: Iterable[str]) -> str | None:
    """The evaluation-loss key this run logs, if any (the contract's order of preference)."""
    present = set(keys_with_data)
    return next((k for k in EVAL_LOSS_KEYS if k in present), None)


def chart_horizon(
    config: RunConfig | Mapping[str, Any], last_step: int | None
) -> tuple[int | None, bool]:
    """How far the loss chart draws the forecast, and whether that is the planned end.

    The planned ``total_steps`` when the config has it (the contract's horizon). Without it the
    contract's horizon is the last step logged, where a forecast shows nothing new, so the
    chart looks twice as far as the run has come (and labels it a look-ahead). Numbers the
    pages print are always for :meth:`RunConfig.horizon`, as ``GET .../forecast`` answers.
    """
    cfg = config if isinstance(config, RunConfig) else RunConfig.read(config)
    if cfg.total_steps is not None:
        return cfg.total_steps, True
    if last_step is None or last_step <= 0:
        return None, False
    return int(2 * last_step), False


@dataclass(frozen=True)
class Prediction:
    """A forecast value with its interval at a step (``PredictionOut``)."""

    step: float
    value: float
    lo: float
    hi: float
    #: The loss the run had at ``step``, once it got there (``PredictionOut.reached``: the
    #: series smoothed over the last 1% of the steps up to it).
    reached: float | None = None

    @classmethod
    def from_api(cls, item: Mapping[str, Any] | None) -> Prediction | None:
        """Parse ``PredictionOut``; None when absent or without a finite value."""
        if not item:
            return None
        value = to_float(item.get("value"))
        step = to_float(item.get("step"))
        if not (math.isfinite(value) and math.isfinite(step)):
            return None
        reached = to_float(item.get("reached"))
        return cls(step, value, to_float(item.get("lo")), to_float(item.get("hi")),
                   reached if math.isfinite(reached) else None)


@dataclass(frozen=True)
class ForecastData:
    """The fields of ``GET .../forecast`` the pictures use."""

    status: ForecastStatus | None
    key: str | None
    a: float
    b: float
    c: float
    fitted_upto_step: float | None
    f_star: Prediction | None  # step = NaN: f* has no step; None when not identifiable
    prediction: Prediction | None
    confidence: float
    off_model: bool
    message: str
    f_star_at_most: float | None = None  # f* not identifiable yet: "at most" this (the loss now)
    useful_from_step: float | None = None  # too_early: a useful forecast from this step on

    @classmethod
    def from_api(cls, item: Mapping[str, Any] | None) -> ForecastData | None:
        """Parse ``ForecastOut``; None when there is no usable fit (pending or failed)."""
        if not item:
            return None
        a, b, c = (to_float(item.get(k)) for k in ("a", "b", "c"))
        if a == 0.0 and item.get("b") is None:
            b = 0.0  # a flat fit: f(t) = c, whatever b
        if not all(math.isfinite(x) for x in (a, b, c)):
            return None
        star = item.get("f_star") or None
        f_star = None
        at_most = None
        if star and math.isfinite(to_float(star.get("value"))):
            f_star = Prediction(
                math.nan, to_float(star["value"]), to_float(star.get("lo")),
                to_float(star.get("hi")),
            )
        elif star and math.isfinite(to_float(star.get("hi"))):
            at_most = to_float(star.get("hi"))
        useful = to_float(item.get("useful_from_step"))
        upto = item.get("fitted_upto_step")
        return cls(
            status=forecast_status(item.get("status")),
            key=item.get("key"),
            a=a,
            b=b,
            c=c,
            fitted_upto_step=None if upto is None else float(upto),
            f_star=f_star,
            prediction=Prediction.from_api(item.get("prediction")),
            confidence=float(item.get("confidence") or 0.9),
            off_model=bool(item.get("off_model")),
            message=str(item.get("message") or ""),
            f_star_at_most=at_most,
            useful_from_step=useful if math.isfinite(useful) else None,
        )

    @property
    def extends_level(self) -> bool:
        """Whether the answers beyond the data extend the current loss (``too_early``,
        ``no_asymptote``: the transient table) instead of evaluating the fitted curve, which is
        then not the forecast (docs/forecast.md, "Statuses")."""
        return self.status in LEVEL_EXTENDING_STATUSES

    def curve(self, steps: FloatArray) -> FloatArray:
        """The fitted curve ``a / sqrt(t + b) + c`` (NaN where ``t + b <= 0``)."""
        shifted = steps + self.b
        out = np.full(len(steps), np.nan)
        ok = shifted > 0
        out[ok] = self.a / np.sqrt(shifted[ok]) + self.c
        return out


@dataclass(frozen=True)
class AlertData:
    """The fields of an alert the pictures use (``GET .../alerts`` items)."""

    id: str
    rule: str
    state: str
    severity: str
    summary: str
    step: float | None
    value: float | None

    @classmethod
    def from_api(cls, item: Mapping[str, Any]) -> AlertData:
        """Parse one alert; unknown fields are ignored, missing ones default.

        The marker's step is where the alert fired (``fired_step``), else where its condition
        began (``since_step``, a pending alert), else the last evaluated ``step``.
        """
        step = next((item[k] for k in ("fired_step", "since_step", "step")
                     if item.get(k) is not None), None)
        value = item.get("value")
        return cls(
            id=str(item.get("id", "")),
            rule=str(item.get("rule", "")),
            state=str(item.get("state", "")),
            severity=str(item.get("severity", "")),
            summary=str(item.get("summary", "")),
            step=None if step is None else to_float(step),
            value=None if value is None else to_float(value),
        )


def alerts_list(items: Iterable[Mapping[str, Any]] | None) -> list[AlertData]:
    """Parse alerts (``{"alerts": [...]}`` items)."""
    return [AlertData.from_api(item) for item in items or ()]
