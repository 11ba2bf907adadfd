"""Pure figure builders: data shaped like the REST API's answers in, a Plotly figure out.

No HTTP, no database: the service's page routes, the tests and the benchmark call these with
dictionaries (or the parsed dataclasses of :mod:`curvecast.dashboards.data`). Conventions every
builder
follows, because the page's JavaScript relies on them:

* each trace that draws a metric carries ``meta = {"key": <metric key>, "role": ...}`` with role
  ``"last"`` (the line through each bucket's last point, or the raw points), ``"min"``/``"max"``
  (the band between each bucket's extremes, so a one-step spike inside a bucket stays
  visible); live updates append new points to these traces;
* derived traces carry ``meta = {"role": ...}`` (``"fit"``, ``"forecast"``, ``"band_lo"``,
  ``"band_hi"``, ``"f_star"``, ``"prediction"``, ``"ratio"``, ``"guide"``, ...);
* ``layout.meta`` names the chart and the keys it shows; ``layout.uirevision`` is constant so a
  redraw with fresh data keeps the user's zoom;
* every string that came from a user (run names, keys, alert text) is escaped for Plotly's
  pseudo-HTML with :func:`dashboards.fmt.esc`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from curvecast.dashboards import fmt, palette
from curvecast.dashboards.data import (
    AlertData,
    FloatArray,
    ForecastData,
    Prediction,
    SeriesData,
    SeriesLike,
    as_series,
    burn_in,
    plottable,
    weight_decay,
)

#: Traces longer than this are drawn with WebGL (``scattergl``); shorter ones as SVG, which
#: is sharper and as fast at that size.
GL_MIN_POINTS = 1000
#: Alert markers per chart at most (the newest); the alert list on the page has all of them.
MAX_ALERT_MARKS = 60
#: Points of the fitted curve drawn per chart.
CURVE_POINTS = 400
#: Validate figures as they are built (tests switch this on; see FigureBuilder.figure).
VALIDATE = False

#: A small explicit template: plotly.py's named templates are deep-copied into every figure,
#: which costs more than building the figure itself.
_GRID = "#e9edf1"
TEMPLATE: dict[str, Any] = {
    "layout": {
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "colorway": list(palette.SEQUENCE),
        "xaxis": {"gridcolor": _GRID, "zerolinecolor": _GRID, "ticks": "outside",
                  "tickcolor": "#9aa0a6", "ticklen": 4},
        "yaxis": {"gridcolor": _GRID, "zerolinecolor": _GRID, "ticks": "outside",
                  "tickcolor": "#9aa0a6", "ticklen": 4},
    }
}

_FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', Arial, sans-serif"
_BURN_IN_FILL = "rgba(110,110,110,0.13)"


# --- shared pieces -------------------------------------------------------------------------------


def _layout(chart: str, title: str, height: int, keys: Sequence[str], *, x_title: str = "step",
            y_title: str = "") -> dict[str, Any]:
    return {
        "template": TEMPLATE,
        "title": {"text": title, "x": 0.0, "xanchor": "left", "xref": "paper", "y": 1.0,
                  "yref": "container", "yanchor": "top", "pad": {"t": 8},
                  "font": {"size": 15}},
        "height": height,
        "margin": {"l": 70, "r": 24, "t": 64, "b": 50},
        "font": {"family": _FONT, "size": 12, "color": "#1f2328"},
        "legend": {"orientation": "h", "x": 0.0, "xanchor": "left", "y": 1.0, "yanchor": "bottom",
                   "bgcolor": "rgba(255,255,255,0)", "font": {"size": 11},
                   "tracegroupgap": 0},
        "hovermode": "x unified",
        "hoverlabel": {"namelength": -1},
        "uirevision": chart,
        "xaxis": {"title": {"text": x_title}, "tickformat": "~s", "hoverformat": ",d",
                  "showline": True, "linecolor": "#9aa0a6", "zeroline": False,
                  "rangemode": "tozero"},
        "yaxis": {"title": {"text": y_title}, "showline": True, "linecolor": "#9aa0a6",
                  "exponentformat": "power", "zeroline": False},
        "meta": {"chart": chart, "keys": list(keys)},
    }


class FigureBuilder:
    """Collects traces, shapes and annotations as plain dictionaries and validates them into a
    :class:`plotly.graph_objects.Figure` once, at the end (adding them one by one to a Figure
    validates and copies the whole figure each time)."""

    def __init__(self, layout: dict[str, Any]) -> None:
        self.data: list[dict[str, Any]] = []
        self.layout = layout
        self.shapes: list[dict[str, Any]] = []
        self.annotations: list[dict[str, Any]] = []

    def add_trace(self, trace: dict[str, Any]) -> None:
        """Append a trace (a dict with ``type``)."""
        self.data.append(trace)

    def vrect(self, x0: float, x1: float, fill: str, label: str | None = None) -> None:
        """A shaded band across the whole height between steps ``x0`` and ``x1``."""
        self.shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": x0, "x1": x1,
                            "y0": 0, "y1": 1, "fillcolor": fill, "line": {"width": 0},
                            "layer": "below"})
        if label:
            self.annotations.append({"x": x0, "xref": "x", "xanchor": "left", "y": 1,
                                     "yref": "paper", "yanchor": "top", "text": label,
                                     "showarrow": False,
                                     "font": {"size": 10, "color": palette.GREY}})

    def hrect(self, y0: float, y1: float, fill: str, yref: str = "y") -> None:
        """A shaded band across the whole width between ``y0`` and ``y1``."""
        self.shapes.append({"type": "rect", "xref": "paper", "yref": yref, "x0": 0, "x1": 1,
                            "y0": y0, "y1": y1, "fillcolor": fill, "line": {"width": 0},
                            "layer": "below"})

    def vline(self, x: float, line: dict[str, Any], label: str | None = None) -> None:
        """A vertical line at step ``x``, optionally labelled at its top."""
        self.shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x,
                            "y0": 0, "y1": 1, "line": line})
        if label:
            self.annotations.append({"x": x, "xref": "x", "xanchor": "right", "y": 0,
                                     "yref": "paper", "yanchor": "bottom", "text": label,
                                     "showarrow": False, "font": {"size": 10,
                                                                  "color": palette.GREY}})

    def hline(self, y: float, line: dict[str, Any], label: str | None = None,
              yref: str = "y") -> None:
        """A horizontal line at ``y``, optionally labelled at its right end."""
        self.shapes.append({"type": "line", "xref": "paper", "yref": yref, "x0": 0, "x1": 1,
                            "y0": y, "y1": y, "line": line})
        if label:
            self.annotations.append({"x": 1, "xref": "paper", "xanchor": "right", "y": y,
                                     "yref": yref, "yanchor": "bottom", "text": label,
                                     "showarrow": False,
                                     "font": {"size": 10, "color": line.get("color")}})

    def note(self, text: str) -> None:
        """A grey note in the middle of the plot (e.g. no data yet)."""
        self.annotations.append({"xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                                 "showarrow": False, "text": text,
                                 "font": {"size": 13, "color": palette.GREY}})

    def figure(self) -> go.Figure:
        """The validated figure."""
        layout = dict(self.layout)
        layout["shapes"] = list(layout.get("shapes", [])) + self.shapes
        layout["annotations"] = list(layout.get("annotations", [])) + self.annotations
        # Validation costs more than the rest of a page's figures together; the tests validate
        # every builder's output in full (tests/dashboards/test_figures.py).
        return go.Figure({"data": self.data, "layout": layout}, _validate=VALIDATE)


def _log_menu(layout: dict[str, Any], axes: Sequence[str], *,
              linear_range: Sequence[float] | None = None, x_axis: bool = False
              ) -> dict[str, Any]:
    """An updatemenu of two small buttons switching ``axes`` between linear and log scale,
    placed on the title's row at the right.

    Switching resets the range to auto (a range set for one scale is meaningless in the other),
    except that going back to linear restores ``linear_range`` when the chart was focused.
    """
    linear: dict[str, Any] = {}
    log: dict[str, Any] = {}
    for axis in axes:
        linear[f"{axis}.type"] = "linear"
        log[f"{axis}.type"] = "log"
        log[f"{axis}.autorange"] = True
        if linear_range is not None and axis == "yaxis":
            linear[f"{axis}.range"] = list(linear_range)
        else:
            linear[f"{axis}.autorange"] = True
    name = "x" if x_axis else "y"
    margin = layout["margin"]
    plot_height = max(1, layout["height"] - margin["t"] - margin["b"])
    return {
        "type": "buttons",
        "direction": "right",
        "showactive": True,
        "active": 0,
        "x": 0.8 if x_axis else 1.0,
        "xanchor": "right",
        "y": 1.0 + (margin["t"] - 6) / plot_height,  # 6 px below the top of the figure
        "yanchor": "top",
        "pad": {"t": 0, "b": 0, "l": 0, "r": 0},
        "bgcolor": "#f6f8fa",
        "bordercolor": "#d0d7de",
        "font": {"size": 10},
        "buttons": [
            {"label": f"linear {name}", "method": "relayout", "args": [linear]},
            {"label": f"log {name}", "method": "relayout", "args": [log]},
        ],
        "name": f"log_{name}",
    }


def _trace_type(n_points: int) -> str:
    return "scattergl" if n_points > GL_MIN_POINTS else "scatter"


def add_series(
    fig: FigureBuilder,
    series: SeriesData,
    *,
    name: str,
    colour: str,
    yaxis: str = "y",
    band: bool = True,
    width: float = 1.6,
    dash: str | None = None,
    markers: bool = False,
    hover: str = ".4g",
) -> None:
    """Add a metric series: the min–max band of each bucket (when downsampled) under the line
    through each bucket's last point. Traces are added even when the series is empty, so live
    updates can append to them."""
    steps = series.steps
    kind = _trace_type(len(steps))
    group = series.key
    if band and series.downsampled and series.vmin is not None and series.vmax is not None:
        common: dict[str, Any] = {
            "type": kind, "x": steps, "mode": "lines", "line": {"width": 0, "color": colour},
            "showlegend": False, "hoverinfo": "skip", "legendgroup": group, "yaxis": yaxis,
            "connectgaps": False,
        }
        fig.add_trace({**common, "y": plottable(series.vmin), "name": f"{name} min",
                       "meta": {"key": series.key, "role": "min"}})
        fig.add_trace({**common, "y": plottable(series.vmax), "name": f"{name} range",
                       "fill": "tonexty", "fillcolor": palette.rgba(colour, 0.25),
                       "meta": {"key": series.key, "role": "max"}})
    line: dict[str, Any] = {"width": width, "color": colour}
    if dash:
        line["dash"] = dash
    trace: dict[str, Any] = {
        "type": kind, "x": steps, "y": plottable(series.values), "name": name,
        "mode": "lines+markers" if markers else "lines", "line": line, "legendgroup": group,
        "yaxis": yaxis, "meta": {"key": series.key, "role": "last"},
        "hovertemplate": f"%{{y:{hover}}}", "connectgaps": markers,
    }
    if markers:
        trace["marker"] = {"size": 5, "color": colour}
    fig.add_trace(trace)


def _shade_burn_in(fig: FigureBuilder, config: Mapping[str, Any], first_step: float = 0.0
                   ) -> None:
    steps = burn_in(config)
    if steps is not None and steps > first_step:
        fig.vrect(first_step, steps, _BURN_IN_FILL, "burn-in")


def as_alerts(alerts: Sequence[Mapping[str, Any] | AlertData]) -> list[AlertData]:
    """Accept API dicts or :class:`AlertData`."""
    return [a if isinstance(a, AlertData) else AlertData.from_api(a) for a in alerts]


def add_alert_marks(fig: FigureBuilder, alerts: Sequence[AlertData]) -> None:
    """A dotted vertical line per alert (colour by state) with a hoverable ``!`` at the top."""
    marked = [a for a in alerts if a.step is not None and math.isfinite(a.step)]
    for alert in marked[-MAX_ALERT_MARKS:]:
        assert alert.step is not None
        colour = palette.ALERT_STATE.get(alert.state, palette.GREY)
        fig.shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": alert.step,
                           "x1": alert.step, "y0": 0, "y1": 1, "layer": "above",
                           "line": {"color": colour, "width": 1.5, "dash": "dot"},
                           "name": "alert"})
        fig.annotations.append({  # inside the plot, at its top: clear of titles and legends
            "x": alert.step, "xref": "x", "yref": "paper", "y": 1.0, "yanchor": "top",
            "text": "<b>!</b>", "showarrow": False, "bgcolor": colour, "borderpad": 2,
            "font": {"color": "#ffffff", "size": 11}, "name": "alert",
            "hovertext": fmt.esc(
                f"{alert.rule} — {alert.state} at step {fmt.step(alert.step)}: {alert.summary}"
            ),
        })


def _focus_range(arrays: Sequence[FloatArray], extra: Sequence[float]) -> list[float] | None:
    """A y-range that shows the interesting part: robust quantiles of the data (so the first
    steps' huge losses do not flatten the rest) widened to include ``extra`` values."""
    parts = [a[np.isfinite(a)] for a in arrays if len(a)]
    data = np.concatenate(parts) if parts else np.zeros(0)
    bounds = [x for x in extra if math.isfinite(x)]
    if len(data):
        bounds += [float(np.quantile(data, 0.002)), float(np.quantile(data, 0.995))]
    if not bounds:
        return None
    lo, hi = min(bounds), max(bounds)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
    return [lo - pad, hi + pad]


# --- the loss chart ------------------------------------------------------------------------------


def _parse_forecast(forecast: Mapping[str, Any] | ForecastData | None) -> ForecastData | None:
    return forecast if isinstance(forecast, ForecastData) else ForecastData.from_api(forecast)


def _parse_band(band: Sequence[Mapping[str, Any] | Prediction | None]) -> list[Prediction]:
    parsed = [p if isinstance(p, Prediction) else Prediction.from_api(p) for p in band]
    return sorted((p for p in parsed if p is not None), key=lambda p: p.step)


def _band_traces(fig: FigureBuilder, points: Sequence[Prediction], colour: str, name: str,
                 alpha: float, **extra: Any) -> None:
    xs = np.array([p.step for p in points])
    # A few samples of a smooth interval: splines between them look like the real band.
    common = {"type": "scatter", "x": xs, "mode": "lines",
              "line": {"width": 0, "shape": "spline", "smoothing": 0.8}, "hoverinfo": "skip"}
    fig.add_trace({**common, "y": np.array([p.lo for p in points]), "showlegend": False,
                   "name": f"{name} lower", "meta": {"role": "band_lo", **extra.get("meta", {})},
                   **{k: v for k, v in extra.items() if k != "meta"}})
    fig.add_trace({**common, "y": np.array([p.hi for p in points]), "fill": "tonexty",
                   "fillcolor": palette.rgba(colour, alpha), "name": name,
                   "meta": {"role": "band_hi", **extra.get("meta", {})},
                   **{k: v for k, v in extra.items() if k != "meta"}})


def loss_figure(
    *,
    train: SeriesLike | None,
    evaluation: SeriesLike | None = None,
    forecast: Mapping[str, Any] | ForecastData | None = None,
    band: Sequence[Mapping[str, Any] | Prediction | None] = (),
    config: Mapping[str, Any] | None = None,
    horizon: int | None = None,
    horizon_planned: bool = True,
    alerts: Sequence[Mapping[str, Any] | AlertData] = (),
    x_range: Sequence[float] | None = None,
    title: str = "Loss and where it is going",
) -> go.Figure:
    """Training and evaluation loss with the fitted curve, the forecast band out to the
    horizon, the f* asymptote, the burn-in shaded and alert markers.

    Args:
        train: ``loss`` series (API dict or :class:`SeriesData`), possibly downsampled.
        evaluation: the evaluation-loss series, if the run logs one.
        forecast: ``GET .../forecast`` answer (``None`` or ``status="pending"``: no overlay).
        band: ``PredictionOut`` items at steps between the last fitted step and the horizon
            (``GET .../forecast?horizon=t`` for a few t): the interval band.
        config: the run's config (burn-in: ``c_warmup``, else ``2 × warmup_steps``).
        horizon: where the forecast ends (normally ``total_steps``).
        horizon_planned: whether ``horizon`` is the run's planned ``total_steps`` (else a
            look-ahead chosen by the page, labelled as such).
        alerts: the run's alerts (markers).
        x_range: the visible step range when the user zoomed (kept on redraw).
        title: chart title.
    """
    config = config or {}
    train_s = as_series(train, "loss")
    eval_s = as_series(evaluation, "eval_loss") if evaluation is not None else None
    fit = _parse_forecast(forecast)
    shown = [s for s in (train_s, eval_s) if s is not None]
    keys = [s.key for s in shown]
    layout = _layout("loss", title, 440, keys, y_title="loss")
    # Inside the plot, top right: a loss curve falls, so that corner is empty.
    layout["legend"] = {"orientation": "v", "x": 0.995, "xanchor": "right", "y": 0.99,
                        "yanchor": "top", "bgcolor": "rgba(255,255,255,0.88)",
                        "bordercolor": "#d0d7de", "borderwidth": 1, "font": {"size": 11},
                        "tracegroupgap": 0}
    layout["margin"] = {**layout["margin"], "t": 40}
    fig = FigureBuilder(layout)

    add_series(fig, train_s, name="training loss", colour=palette.BLUE)
    if eval_s is not None:
        add_series(fig, eval_s, name="eval loss", colour=palette.ORANGE,
                   markers=len(eval_s) < 300, width=2.0)

    focus_extra: list[float] = []
    with_data = [s for s in shown if len(s)]
    last_step = max((float(s.steps[-1]) for s in with_data), default=None)
    first_step = min((float(s.steps[0]) for s in with_data), default=0.0)
    end = float(horizon) if horizon is not None else None
    if fit is not None:
        upto = fit.fitted_upto_step if fit.fitted_upto_step is not None else last_step
        start = max(float(burn_in(config) or first_step), first_step)
        fitted_on = "eval loss" if fit.key and fit.key != train_s.key else "training loss"
        if upto is not None and upto > start:
            t = np.linspace(start, upto, CURVE_POINTS)
            fig.add_trace({"type": "scatter", "x": t, "y": fit.curve(t), "mode": "lines",
                           "name": f"fit a/√(t+b)+c to {fitted_on}",
                           "line": {"color": palette.BLACK, "width": 1.6},
                           "meta": {"role": "fit"}, "hovertemplate": "%{y:.4g}"})
        if upto is not None and end is not None and end > upto:
            points = _parse_band(band)
            if points:
                _band_traces(fig, points, palette.VERMILLION,
                             f"{fit.confidence:.0%} forecast interval", 0.16)
                focus_extra += [p.lo for p in points] + [p.hi for p in points]
            t = np.linspace(upto, end, CURVE_POINTS)
            fig.add_trace({"type": "scatter", "x": t, "y": fit.curve(t), "mode": "lines",
                           "name": "forecast",
                           "line": {"color": palette.VERMILLION, "width": 2, "dash": "dash"},
                           "meta": {"role": "forecast"}, "hovertemplate": "%{y:.4g}"})
        if fit.f_star is not None:
            star = fit.f_star
            x_end = end if end is not None else (last_step or 1.0)
            fig.add_trace({
                "type": "scatter", "x": [first_step, x_end], "y": [star.value, star.value],
                "mode": "lines", "line": {"color": palette.GREEN, "width": 1.5, "dash": "dot"},
                "name": f"f* ≈ c = {fmt.loss(star.value)} {fmt.interval(star.lo, star.hi)}",
                "meta": {"role": "f_star"}, "hoverinfo": "skip",
            })
            if math.isfinite(star.lo) and math.isfinite(star.hi):
                fig.hrect(star.lo, star.hi, palette.rgba(palette.GREEN, 0.08))
            focus_extra.append(star.lo if math.isfinite(star.lo) else star.value)
        pred = fit.prediction
        if pred is not None and end is not None and pred.step == end:
            fig.add_trace({
                "type": "scatter", "x": [pred.step], "y": [pred.value], "mode": "markers",
                "marker": {"symbol": "diamond", "size": 11, "color": palette.VERMILLION,
                           "line": {"color": "#ffffff", "width": 1}},
                "error_y": {"type": "data", "symmetric": False, "color": palette.VERMILLION,
                            "array": [_gap(pred.hi, pred.value)],
                            "arrayminus": [_gap(pred.value, pred.lo)],
                            "thickness": 2, "width": 6},
                "name": f"at step {fmt.short_step(pred.step)}: {fmt.loss(pred.value)} "
                        f"{fmt.interval(pred.lo, pred.hi)}",
                "meta": {"role": "prediction"}, "hovertemplate": "%{y:.4g}",
            })
            focus_extra += [pred.lo, pred.hi]
    if end is not None:
        label = "planned end" if horizon_planned else "look-ahead (no total_steps)"
        fig.vline(end, {"color": palette.GREY, "width": 1, "dash": "dashdot"},
                  f"{label}: step {fmt.short_step(end)}")
    _shade_burn_in(fig, config, first_step)
    add_alert_marks(fig, as_alerts(alerts))
    if not with_data:
        fig.note(fmt.esc("no data yet for " + ", ".join(keys)))

    skip = float(max(burn_in(config) or 0, 0.05 * (last_step or 0)))
    arrays = [s.values[s.steps >= skip] for s in with_data]
    focus = _focus_range(arrays, focus_extra) if x_range is None else None
    layout = fig.layout
    if focus is not None:
        layout["yaxis"]["range"] = focus
    if x_range is not None:
        layout["xaxis"].update(range=list(x_range), autorange=False)
    elif end is not None:
        layout["xaxis"].update(range=[first_step, end * 1.02], autorange=False)
    layout["updatemenus"] = [_log_menu(layout, ["yaxis"], linear_range=focus),
                             _log_menu(layout, ["xaxis"], x_axis=True)]
    return fig.figure()


def _gap(a: float, b: float) -> float:
    """``a - b`` for error bars: non-negative, 0 when either end is open."""
    return max(0.0, a - b) if math.isfinite(a) and math.isfinite(b) else 0.0


# --- optimizer telemetry ------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One metric line of a telemetry chart."""

    series: SeriesData
    name: str
    colour: str
    right: bool = False  # on the secondary (right) y-axis
    band: bool = True
    dash: str | None = None
    role: str | None = None  # a derived line (not a stored key): its meta role


def telemetry_figure(
    chart: str,
    title: str,
    lines: Sequence[Line],
    *,
    y_title: str,
    y2_title: str | None = None,
    config: Mapping[str, Any] | None = None,
    alerts: Sequence[Mapping[str, Any] | AlertData] = (),
    log_y: bool = False,
    guide: tuple[float, str] | None = None,
    x_range: Sequence[float] | None = None,
    height: int = 320,
) -> go.Figure:
    """A step chart of a few telemetry series on one or two y-axes (generic builder).

    Args:
        chart: the chart's id (``layout.meta.chart``).
        title: chart title.
        lines: the series, with names, colours and axis.
        y_title: left axis title (with units).
        y2_title: right axis title, when some line is on the right.
        config: the run's config (burn-in shading).
        alerts: alert markers.
        log_y: start with the left y axis log-scaled.
        guide: a horizontal reference line (value, label) on the right axis when there is
            one, e.g. √(2λ).
        x_range: the visible step range after a zoom.
        height: pixels.
    """
    keys = [line.series.key for line in lines if line.role is None]
    layout = _layout(chart, title, height, keys, y_title=y_title)
    has_right = any(line.right for line in lines)
    if has_right:
        layout["yaxis2"] = {"title": {"text": y2_title or ""}, "overlaying": "y",
                            "side": "right", "showgrid": False, "showline": True,
                            "linecolor": "#9aa0a6", "exponentformat": "power",
                            "zeroline": False, "tickmode": "auto"}
        layout["margin"] = {**layout["margin"], "r": 76}
    fig = FigureBuilder(layout)
    for line in lines:
        before = len(fig.data)
        add_series(fig, line.series, name=line.name, colour=line.colour,
                   yaxis="y2" if line.right else "y", band=line.band, dash=line.dash)
        if line.role is not None:  # derived: live updates must not append raw points to it
            for trace in fig.data[before:]:
                trace["meta"] = {"role": line.role}
    if guide is not None:
        value, label = guide
        fig.hline(value, {"color": palette.PURPLE, "width": 1.3, "dash": "dash"}, label,
                  yref="y2" if has_right else "y")
    if log_y:
        layout["yaxis"]["type"] = "log"
    _shade_burn_in(fig, config or {})
    add_alert_marks(fig, as_alerts(alerts))
    if all(not len(line.series) for line in lines):
        fig.note(fmt.esc("no data yet for " + ", ".join(keys)))
    if x_range is not None:
        layout["xaxis"].update(range=list(x_range), autorange=False)
    menu = _log_menu(layout, ["yaxis", "yaxis2"] if has_right else ["yaxis"])
    if log_y:
        menu["active"] = 1
    layout["updatemenus"] = [menu]
    return fig.figure()


def _get(series: Mapping[str, SeriesLike], key: str) -> SeriesData:
    return as_series(series.get(key), key)


def step_size_figure(series: Mapping[str, SeriesLike], *, prefix: str = "sfplus/",
                     **kwargs: Any) -> go.Figure:
    """Polyak step size η (left) and the effective step α = warmup · lr · η (right)."""
    return telemetry_figure(
        "step_size", "Step size: Polyak η and effective α",
        [Line(_get(series, prefix + "eta"), "Polyak η", palette.BLUE),
         Line(_get(series, prefix + "alpha"), "effective α = warmup·lr·η", palette.ORANGE,
              right=True)],
        y_title="η (Polyak step size)", y2_title="α (step applied)", **kwargs,
    )


def gradient_figure(series: Mapping[str, SeriesLike], *, prefix: str = "sfplus/",
                    **kwargs: Any) -> go.Figure:
    """Gradient L1 norm with the Polyak denominator EMA (√(π/2)·‖g‖₁, bias-corrected)."""
    return telemetry_figure(
        "gradient", "Gradient L1 norm and the Polyak denominator",
        [Line(_get(series, prefix + "grad_l1"), "‖g‖₁", palette.BLUE),
         Line(_get(series, prefix + "denom_ema"), "denominator: EMA of √(π/2)·‖g‖₁",
              palette.ORANGE, band=False, dash="dash")],
        y_title="L1 norm (Σ|g|)", **kwargs,
    )


def norms_figure(series: Mapping[str, SeriesLike], *, prefix: str = "sfplus/",
                 config: Mapping[str, Any] | None = None, **kwargs: Any) -> go.Figure:
    """Weight norms of x, y and z; with AdamC's λ (``weight_decay``) and both ‖g‖₂ and ‖z‖₂
    logged, also the ratio ‖g‖₂/‖z‖₂ against its steady state √(2λ)."""
    lines = [
        Line(_get(series, prefix + "x_l2"), "‖x‖₂", palette.BLUE),
        Line(_get(series, prefix + "y_l2"), "‖y‖₂", palette.ORANGE, dash="dot"),
        Line(_get(series, prefix + "z_l2"), "‖z‖₂", palette.GREEN),
    ]
    guide = None
    lam = weight_decay(config or {})
    grad, z = _get(series, prefix + "grad_l2"), _get(series, prefix + "z_l2")
    if lam is not None and len(grad) and len(z):
        common, gi, zi = np.intersect1d(grad.steps, z.steps, return_indices=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = grad.values[gi] / z.values[zi]
        derived = SeriesData(f"{prefix}grad_l2/z_l2", common, ratio, None, None, False,
                             len(common))
        lines.append(Line(derived, "‖g‖₂/‖z‖₂ (right)", palette.PURPLE, right=True,
                          band=False, role="ratio"))
        target = math.sqrt(2 * lam)
        guide = (target, f"√(2λ) = {target:.3g}: AdamC steady state (λ = {lam:g})")
    return telemetry_figure(
        "norms", "Weight norms: x (averaged), y, z",
        lines, y_title="L2 norm", y2_title="‖g‖₂/‖z‖₂" if guide else None, guide=guide,
        config=config, **kwargs,
    )


def averaging_figure(series: Mapping[str, SeriesLike], *, prefix: str = "sfplus/",
                     **kwargs: Any) -> go.Figure:
    """Averaging weight c (1 during burn-in, then ~1/t: log scale) and SF β (right)."""
    fig = telemetry_figure(
        "averaging", "Averaging weight c and SF β",
        [Line(_get(series, prefix + "c"), "averaging weight c", palette.BLUE),
         Line(_get(series, prefix + "sf_beta"), "SF β", palette.ORANGE, right=True)],
        y_title="c (weight of the newest iterate)", y2_title="β (interpolation)",
        log_y=True, **kwargs,
    )
    # c spans decades while β stays near 1: the buttons switch c's axis only.
    menu = fig.layout.updatemenus[0]
    menu.buttons[0].args = [{"yaxis.type": "linear", "yaxis.autorange": True}]
    menu.buttons[1].args = [{"yaxis.type": "log", "yaxis.autorange": True}]
    return fig


# --- forecast evolution --------------------------------------------------------------------------


def evolution_figure(history: Mapping[str, Any], *, observed: float | None = None,
                     horizon_planned: bool = True) -> go.Figure:
    """The forecast of the final loss (with interval) against the step at which it was made,
    so people see it settle. ``history`` is ``GET .../forecast/history``."""
    horizon = history.get("horizon")
    points = [p for p in history.get("points", []) if p.get("final") and
              p["final"].get("value") is not None and p.get("fitted_upto_step") is not None]
    where = f"step {fmt.short_step(horizon)}" if horizon else "the horizon"
    if not horizon_planned and horizon:
        where += " (look-ahead)"
    fig = FigureBuilder(_layout("evolution", f"Forecast evolution: loss at {where}", 330, [],
                                x_title="forecast made with data up to step",
                                y_title=f"forecast loss at {where}"))
    xs = np.array([float(p["fitted_upto_step"]) for p in points])
    finals = [Prediction.from_api(p["final"]) for p in points]
    value = np.array([f.value if f else math.nan for f in finals])
    lo = np.array([f.lo if f else math.nan for f in finals])
    hi = np.array([f.hi if f else math.nan for f in finals])
    common = {"type": "scatter", "x": xs, "mode": "lines", "line": {"width": 0},
              "hoverinfo": "skip"}
    fig.add_trace({**common, "y": lo, "showlegend": False, "name": "lower",
                   "meta": {"role": "band_lo"}})
    fig.add_trace({**common, "y": hi, "fill": "tonexty", "name": "interval",
                   "fillcolor": palette.rgba(palette.VERMILLION, 0.16),
                   "meta": {"role": "band_hi"}})
    fig.add_trace({"type": "scatter", "x": xs, "y": value, "mode": "lines+markers",
                   "name": "forecast of the final loss", "marker": {"size": 5},
                   "line": {"color": palette.VERMILLION, "width": 2},
                   "meta": {"role": "forecast"}, "hovertemplate": "%{y:.4g}"})
    if observed is not None and math.isfinite(observed):
        fig.hline(observed, {"color": palette.BLACK, "width": 1, "dash": "dash"},
                  f"observed {fmt.loss(observed)}")
    if not points:
        fig.note("no forecast yet: the first fit comes seconds after the first points")
    else:
        finite = np.concatenate([value, lo, hi])
        focus = _focus_range([finite], [])
        if focus is not None:
            fig.layout["yaxis"]["range"] = focus
    fig.layout["updatemenus"] = [_log_menu(fig.layout, ["yaxis"])]
    return fig.figure()


# --- comparing runs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareEntry:
    """One run on the compare page: its loss series and its forecast to the common horizon."""

    run: Mapping[str, Any]
    series: SeriesData
    forecast: ForecastData | None
    band: Sequence[Prediction]
    at_horizon: Prediction | None

    @property
    def name(self) -> str:
        """The run's name as typed (or its short id)."""
        return str(self.run.get("name") or str(self.run.get("id", ""))[:8])

    @property
    def label(self) -> str:
        """The run's name, escaped for Plotly."""
        return fmt.esc(self.name)


@dataclass(frozen=True)
class Ranking:
    """Which run the forecasts say will be best at the horizon.

    ``order`` lists entries' indices, best first (runs without a forecast last);
    ``clear`` is true when the best run's interval does not overlap the runner-up's.
    """

    horizon: int | None
    order: list[int]
    best: int | None
    clear: bool
    message: str


def rank_forecasts(entries: Sequence[CompareEntry], horizon: int | None) -> Ranking:
    """Order runs by their forecast loss at ``horizon`` (lower is better)."""
    ranked = sorted((i for i, e in enumerate(entries) if e.at_horizon is not None),
                    key=lambda i: _pred(entries[i]).value)
    without = [i for i, e in enumerate(entries) if e.at_horizon is None]
    if not ranked:
        return Ranking(horizon, without, None, False,
                       "No run has a forecast yet: the first fit comes seconds after a run's "
                       "first points.")
    best = ranked[0]
    best_pred = _pred(entries[best])
    where = f"step {fmt.step(horizon)}" if horizon else "the horizon"
    message = (f"At {where} the forecasts say {entries[best].name} will be best: "
               f"{fmt.loss(best_pred.value)} {fmt.interval(best_pred.lo, best_pred.hi)}.")
    clear = True
    if len(ranked) > 1:
        second = _pred(entries[ranked[1]])
        clear = (math.isfinite(best_pred.hi) and math.isfinite(second.lo)
                 and best_pred.hi < second.lo)
        message += (f" Runner-up {entries[ranked[1]].name}: {fmt.loss(second.value)} "
                    f"{fmt.interval(second.lo, second.hi)}")
        message += (" — the intervals do not overlap." if clear
                    else " — the intervals overlap: not yet a clear winner.")
    if without:
        message += f" {len(without)} run(s) have no forecast yet."
    return Ranking(horizon, ranked + without, best, clear, message)


def _pred(entry: CompareEntry) -> Prediction:
    assert entry.at_horizon is not None
    return entry.at_horizon


def compare_figure(entries: Sequence[CompareEntry], horizon: int | None,
                   *, x_range: Sequence[float] | None = None) -> go.Figure:
    """Several runs' losses overlaid, each with its forecast (and band) to a common horizon."""
    fig = FigureBuilder(_layout(
        "compare", "Loss of each run, with its forecast to a common horizon", 480,
        sorted({e.series.key for e in entries}), y_title="loss"))
    focus_arrays: list[FloatArray] = []
    focus_extra: list[float] = []
    for index, entry in enumerate(entries):
        colour = palette.run_colour(index)
        s = entry.series
        group = f"run{index}"
        kind = _trace_type(len(s))
        run_meta = {"run": index, "run_id": str(entry.run.get("id", ""))}
        if s.downsampled and s.vmin is not None and s.vmax is not None:
            common = {"type": kind, "x": s.steps, "mode": "lines", "line": {"width": 0},
                      "showlegend": False, "hoverinfo": "skip", "legendgroup": group}
            fig.add_trace({**common, "y": plottable(s.vmin), "name": f"{entry.label} min",
                           "meta": {"key": s.key, "role": "min", **run_meta}})
            fig.add_trace({**common, "y": plottable(s.vmax), "name": f"{entry.label} range",
                           "fill": "tonexty", "fillcolor": palette.rgba(colour, 0.15),
                           "meta": {"key": s.key, "role": "max", **run_meta}})
        fig.add_trace({"type": kind, "x": s.steps, "y": plottable(s.values), "mode": "lines",
                       "line": {"color": colour, "width": 1.6}, "name": entry.label,
                       "legendgroup": group, "hovertemplate": "%{y:.4g}",
                       "meta": {"key": s.key, "role": "last", **run_meta}})
        last = s.last
        skip = 0.05 * (last[0] if last else 0)
        focus_arrays.append(s.values[s.steps >= skip])
        fit = entry.forecast
        if fit is None or horizon is None:
            continue
        upto = fit.fitted_upto_step if fit.fitted_upto_step is not None else (
            last[0] if last else None)
        if upto is None or horizon <= upto:
            continue
        points = sorted(entry.band, key=lambda p: p.step)
        if points:
            _band_traces(fig, points, colour, f"{entry.label} interval", 0.12,
                         legendgroup=group, showlegend=False, meta=run_meta)
            focus_extra += [p.lo for p in points] + [p.hi for p in points]
        t = np.linspace(upto, horizon, CURVE_POINTS // 2)
        fig.add_trace({"type": "scatter", "x": t, "y": fit.curve(t), "mode": "lines",
                       "showlegend": False, "legendgroup": group,
                       "line": {"color": colour, "width": 2, "dash": "dash"},
                       "name": f"{entry.label} forecast", "hovertemplate": "%{y:.4g}",
                       "meta": {"role": "forecast", **run_meta}})
        pred = entry.at_horizon
        if pred is not None:
            fig.add_trace({"type": "scatter", "x": [pred.step], "y": [pred.value],
                           "mode": "markers", "showlegend": False, "legendgroup": group,
                           "name": f"{entry.label} at the horizon",
                           "marker": {"symbol": "diamond", "size": 10, "color": colour,
                                      "line": {"color": "#ffffff", "width": 1}},
                           "meta": {"role": "prediction", **run_meta},
                           "hovertemplate": "%{y:.4g}"})
    if horizon is not None:
        fig.vline(horizon, {"color": palette.GREY, "width": 1, "dash": "dashdot"},
                  f"common horizon: step {fmt.short_step(horizon)}")
    layout = fig.layout
    focus = _focus_range(focus_arrays, focus_extra) if x_range is None else None
    if focus is not None:
        layout["yaxis"]["range"] = focus
    if x_range is not None:
        layout["xaxis"].update(range=list(x_range), autorange=False)
    elif horizon is not None:
        layout["xaxis"].update(range=[0, horizon * 1.02], autorange=False)
    layout["hovermode"] = "closest"
    layout["updatemenus"] = [_log_menu(layout, ["yaxis"], linear_range=focus),
                             _log_menu(layout, ["xaxis"], x_axis=True)]
    return fig.figure()


def ranking_figure(entries: Sequence[CompareEntry], ranking: Ranking) -> go.Figure:
    """Each run's forecast loss at the common horizon with its interval, best at the top."""
    ordered = [i for i in ranking.order if entries[i].at_horizon is not None]
    where = f"step {fmt.short_step(ranking.horizon)}" if ranking.horizon else "the horizon"
    layout = _layout("ranking", f"Forecast loss at {where} (lower is better)",
                     130 + 40 * max(1, len(ordered)), [], x_title="forecast loss")
    layout["yaxis"].update(autorange="reversed", type="category")
    layout["xaxis"].update(tickformat=".4g", hoverformat=".4g", rangemode="normal")
    layout["hovermode"] = "closest"
    layout["margin"] = {**layout["margin"], "l": 170, "t": 56}
    fig = FigureBuilder(layout)
    labels, values, plus, minus, colours, texts = [], [], [], [], [], []
    for i in ordered:
        pred = _pred(entries[i])
        labels.append(("★ " if i == ranking.best else "") + entries[i].label)
        values.append(pred.value)
        plus.append(_gap(pred.hi, pred.value))
        minus.append(_gap(pred.value, pred.lo))
        colours.append(palette.run_colour(i))
        texts.append(f"{fmt.loss(pred.value)} {fmt.interval(pred.lo, pred.hi)}")
    fig.add_trace({
        "type": "scatter", "x": values, "y": labels, "mode": "markers", "text": texts,
        "showlegend": False,
        "marker": {"size": 12, "color": colours, "symbol": "diamond"},
        "error_x": {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus,
                    "thickness": 2, "width": 6, "color": "#555555"},
        "meta": {"role": "ranking"}, "hovertemplate": "%{text}<extra></extra>",
    })
    if not ordered:
        fig.note("no forecasts yet")
    return fig.figure()
