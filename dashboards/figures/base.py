"""What every figure shares: the layout and template, a fast figure builder, the log-scale
buttons, metric series with their min-max band, burn-in shading, alert markers and the y-range
that focuses on the interesting part (pure, like every builder)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from curvecast.contract import RunConfig
from curvecast.dashboards import fmt, palette
from curvecast.dashboards.data import (
    AlertData,
    FloatArray,
    ForecastData,
    Prediction,
    SeriesData,
    plottable,
)
from curvecast.dashboards.figures.spec import FigureSpec

#: The one trace type the pages draw: SVG ``scatter``. Pages ask for at most 1,200 buckets a
#: trace, which SVG draws as fast as WebGL and sharper, and the pages load plotly.js's basic
#: bundle (scatter, bar, pie), which has no WebGL traces (``service/web/static.py``).
TRACE = "scatter"
#: Alert markers per chart at most (the newest); the alert list on the page has all of them.
MAX_ALERT_MARKS = 60
#: Series of at most this many points are drawn with markers too (a line needs two points).
SPARSE_POINTS = 20
#: The longest line of a chart's note, in characters: about 300 px at its 13 px, which fits a
#: phone's chart (368 px wide) with its margins.
NOTE_CHARS = 40
#: Points of the fitted curve drawn per chart.
CURVE_POINTS = 400
#: Validate figures as they are built (tests switch this on; see FigureBuilder.spec).
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


#: The figure's top margin holds two rows: the title (left) beside Plotly's toolbar (the
#: modebar, drawn over the figure's top-right corner on hover), then the linear/log buttons
#: just above the plot. Nothing of ours sits in the toolbar's row at the right.
TOP_MARGIN = 66
#: Pixels between the buttons' row and the top of the plot.
MENU_GAP = 6
#: Where the x-axis buttons start, right of the y-axis ones (pixels from the plot's left).
X_MENU_OFFSET = 124


def base_layout(chart: str, title: str, height: int, keys: Sequence[str], *, x_title: str = "step",
           y_title: str = "") -> dict[str, Any]:
    """The layout every chart starts from (``chart`` names it in ``meta`` and ``uirevision``).

    The title sits at the figure's top-left, the legend (when there is one) below the x axis:
    inside or above the plot it covered the newest points and the forecast, and beside the
    title it met the toolbar.
    """
    return {
        "template": TEMPLATE,
        "title": {"text": title, "x": 0.0, "xanchor": "left", "xref": "container", "y": 1.0,
                  "yref": "container", "yanchor": "top", "pad": {"t": 8, "l": 12},
                  "font": {"size": 15}},
        "height": height,
        "margin": {"l": 70, "r": 24, "t": TOP_MARGIN, "b": 50},
        "font": {"family": _FONT, "size": 12, "color": "#1f2328"},
        # Anchored to the figure's bottom edge (container), so Plotly reserves room for it
        # under the x axis however many rows it wraps into.
        "legend": {"orientation": "h", "x": 0.0, "xanchor": "left", "xref": "paper",
                   "y": 0.0, "yanchor": "bottom", "yref": "container",
                   "bgcolor": "rgba(255,255,255,0)", "font": {"size": 11},
                   "tracegroupgap": 0},
        "hovermode": "x unified",
        "hoverlabel": {"namelength": -1},
        "uirevision": chart,
        # A standoff with automargin keeps the axis title under the tick labels when the
        # legend below takes room from the bottom margin.
        "xaxis": {"title": {"text": x_title, "standoff": 6}, "automargin": True,
                  "tickformat": "~s", "hoverformat": ",d",
                  "showline": True, "linecolor": "#9aa0a6", "zeroline": False,
                  "rangemode": "tozero"},
        "yaxis": {"title": {"text": y_title}, "showline": True, "linecolor": "#9aa0a6",
                  "exponentformat": "power", "zeroline": False},
        "meta": {"chart": chart, "keys": list(keys)},
    }


class FigureBuilder:
    """Collects traces, shapes and annotations as plain dictionaries and hands them back as one
    :class:`FigureSpec` at the end (adding them one by one to a Plotly Figure validates and
    copies the whole figure each time; the pages never need the Figure at all)."""

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
        """A grey note in the middle of the plot (e.g. no data yet), its lines (``<br>``)
        wrapped at :data:`NOTE_CHARS` characters: Plotly does not wrap an annotation, and a
        longer line ran past both edges of a half-width chart or a phone's."""
        lines = [wrapped for line in text.split("<br>")
                 for wrapped in textwrap.wrap(line, NOTE_CHARS, break_long_words=False,
                                              break_on_hyphens=False) or [""]]
        self.annotations.append({"xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                                 "showarrow": False, "text": "<br>".join(lines),
                                 "font": {"size": 13, "color": palette.GREY}})

    def spec(self) -> FigureSpec:
        """The figure (validated in full by Plotly when :data:`VALIDATE` is on)."""
        layout = dict(self.layout)
        layout["shapes"] = list(layout.get("shapes", [])) + self.shapes
        layout["annotations"] = list(layout.get("annotations", [])) + self.annotations
        spec = FigureSpec(self.data, layout)
        # Validation costs more than the rest of a page's figures together; the tests switch it
        # on to check every builder's output in full (tests/dashboards/test_figures.py).
        if VALIDATE:
            spec.figure(validate=True)
        return spec


def log_menu(layout: dict[str, Any], axes: Sequence[str], *,
             linear_range: Sequence[float] | None = None,
             log_range: Sequence[float] | None = None, x_axis: bool = False
             ) -> dict[str, Any]:
    """An updatemenu of two small buttons switching ``axes`` between linear and log scale,
    placed just above the plot at its left (the y axis's buttons first, the x axis's beside
    them), in the row below the title and Plotly's toolbar.

    Going to log autoscales, unless ``log_range`` (log10 units of the first axis) gives the
    range to show: autoscaling a log axis takes in every positive value drawn, so a forecast
    band's lower edge near zero would stretch it over dozens of decades. Going back to linear
    restores ``linear_range`` when the chart was focused. Both ranges travel in
    ``layout.meta.ranges`` too, so a redraw keeps the scale the user chose with its range.
    """
    linear: dict[str, Any] = {}
    log: dict[str, Any] = {}
    for index, axis in enumerate(axes):
        linear[f"{axis}.type"] = "linear"
        log[f"{axis}.type"] = "log"
        if log_range is not None and index == 0:
            log[f"{axis}.range"] = list(log_range)
        else:
            log[f"{axis}.autorange"] = True
        if linear_range is not None and index == 0:
            linear[f"{axis}.range"] = list(linear_range)
        else:
            linear[f"{axis}.autorange"] = True
    ranges = layout["meta"].setdefault("ranges", {})
    ranges[axes[0]] = {"linear": list(linear_range) if linear_range is not None else None,
                       "log": list(log_range) if log_range is not None else None}
    name = "x" if x_axis else "y"
    return {
        "type": "buttons",
        "direction": "right",
        "showactive": True,
        "active": 0,
        # Paper coordinates with pixel pads: the same place whatever the plot's size.
        "x": 0.0,
        "xanchor": "left",
        "y": 1.0,
        "yanchor": "bottom",
        "pad": {"t": 0, "b": MENU_GAP, "l": X_MENU_OFFSET if x_axis else 0, "r": 0},
        "bgcolor": "#f6f8fa",
        "bordercolor": "#d0d7de",
        "font": {"size": 10},
        "buttons": [
            {"label": f"linear {name}", "method": "relayout", "args": [linear]},
            {"label": f"log {name}", "method": "relayout", "args": [log]},
        ],
        "name": f"log_{name}",
    }


def log_range_of(linear: Sequence[float] | None, arrays: Sequence[FloatArray],
                 extra: Sequence[float]) -> list[float] | None:
    """The log10 range matching a focused linear range ``linear``: its positive part, else
    the positive values of ``arrays`` (the data) and ``extra`` (forecast band, f*, ...).

    Extra values more than a decade beyond the data are left out: an interval's lower edge
    can be a positive number far below anything drawn (a fitted asymptote's bound clipped
    near 0, 1e-60), which on a log axis would squash the losses into a sliver. None when
    nothing is positive.
    """
    positive = [a[np.isfinite(a) & (a > 0)] for a in arrays if len(a)]
    values = np.concatenate(positive) if positive else np.zeros(0)
    bounds = [x for x in extra if math.isfinite(x) and x > 0]
    if len(values):
        data_lo, data_hi = float(np.quantile(values, 0.002)), float(np.quantile(values, 0.995))
        bounds = [x for x in bounds if data_lo / 10 <= x <= data_hi * 10] + [data_lo, data_hi]
    lo = linear[0] if linear is not None and linear[0] > 0 else min(bounds, default=None)
    hi = linear[1] if linear is not None and linear[1] > 0 else max(bounds, default=None)
    if lo is None or hi is None or hi <= lo:
        return None
    pad = (math.log10(hi) - math.log10(lo)) * 0.05 or 0.05
    return [math.log10(lo) - pad, math.log10(hi) + pad]


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
    group = series.key
    # A line through one point draws nothing: a chart of a series logged every few hundred
    # steps looked empty. Few points get their markers (the page drops them as it grows).
    sparse = not markers and 0 < len(steps) <= SPARSE_POINTS
    markers = markers or sparse
    if band and series.downsampled and series.vmin is not None and series.vmax is not None:
        common: dict[str, Any] = {
            "type": TRACE, "x": steps, "mode": "lines", "line": {"width": 0, "color": colour},
            "showlegend": False, "hoverinfo": "skip", "legendgroup": group, "yaxis": yaxis,
            # The band bridges a non-finite bucket (the line above it shows the gap): broken
            # there, Plotly's "tonexty" fill drew a sliver from the first step to the gap.
            "connectgaps": True,
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
        "type": TRACE, "x": steps, "y": plottable(series.values), "name": name,
        "mode": "lines+markers" if markers else "lines", "line": line, "legendgroup": group,
        "yaxis": yaxis,
        "meta": {"key": series.key, "role": "last", **({"sparse": True} if sparse else {})},
        "hovertemplate": f"%{{y:{hover}}}", "connectgaps": markers,
    }
    if markers:
        trace["marker"] = {"size": 5, "color": colour}
    fig.add_trace(trace)


def shade_burn_in(fig: FigureBuilder, config: Mapping[str, Any], first_step: float = 0.0
                  ) -> None:
    """Shade the steps before averaging starts (the forecast's burn-in, from the contract)."""
    steps = RunConfig.read(config).averaging_start
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


def opening_peak(series: SeriesData, fraction: float = 0.02) -> list[float]:
    """The highest value of a series' first points (its first 2%, at least 3; each bucket's
    maximum when downsampled, so the very first step counts): where a loss curve starts.

    A chart's y range takes it in as an extra bound: quantiles of the whole series alone left
    the first steps' fall above the top of the loss chart (and, on a log x axis, most of the
    plot empty)."""
    values = series.vmax if series.downsampled and series.vmax is not None else series.values
    head = values[:max(3, math.ceil(fraction * len(values)))]
    finite = head[np.isfinite(head)]
    return [float(finite.max())] if len(finite) else []


def focus_range(arrays: Sequence[FloatArray], extra: Sequence[float]) -> list[float] | None:
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



def parse_forecast(forecast: Mapping[str, Any] | ForecastData | None) -> ForecastData | None:
    """Accept a ``ForecastOut`` dict or :class:`ForecastData`."""
    return forecast if isinstance(forecast, ForecastData) else ForecastData.from_api(forecast)


def parse_band(band: Sequence[Mapping[str, Any] | Prediction | None]) -> list[Prediction]:
    """The band's samples (``PredictionOut`` dicts or :class:`Prediction`), sorted by step."""
    parsed = [p if isinstance(p, Prediction) else Prediction.from_api(p) for p in band]
    return sorted((p for p in parsed if p is not None), key=lambda p: p.step)

def band_traces(fig: FigureBuilder, points: Sequence[Prediction], colour: str, name: str,
                alpha: float, **extra: Any) -> None:
    """The forecast interval as two traces (lower edge, then upper edge filled down to it)."""
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

def forecast_line(fit: ForecastData, band: Sequence[Prediction], start: float, end: float,
                  n: int) -> tuple[FloatArray, FloatArray]:
    """The dashed forecast line from ``start`` (the last fitted step) to ``end``: the fitted
    curve at ``n`` steps; for a fit whose answers extend the current loss
    (:attr:`ForecastData.extends_level`), the band's central values, which are those answers
    (the fitted curve there can end far below the forecast at the same step)."""
    if fit.extends_level and band:
        points = sorted(band, key=lambda p: p.step)
        return (np.array([p.step for p in points], dtype=float),
                np.array([p.value for p in points], dtype=float))
    t = np.linspace(start, end, n)
    return t, fit.curve(t)


def gap(a: float, b: float) -> float:
    """``a - b`` for error bars: non-negative, 0 when either end is open."""
    return max(0.0, a - b) if math.isfinite(a) and math.isfinite(b) else 0.0

