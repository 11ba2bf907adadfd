"""The optimizer-telemetry charts: a generic builder and the run page's four charts, each
reading its series under the run's telemetry prefix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from curvecast.contract import TELEMETRY_PREFIX
from curvecast.dashboards import fmt, palette
from curvecast.dashboards.data import AlertData, SeriesData, SeriesLike, as_series
from curvecast.dashboards.figures.base import (
    FigureBuilder,
    add_alert_marks,
    add_series,
    as_alerts,
    base_layout,
    log_menu,
    shade_burn_in,
)
from curvecast.dashboards.figures.spec import FigureSpec


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
    x_range: Sequence[float] | None = None,
    height: int = 340,
    ended: bool = False,
    source: str | None = None,
) -> FigureSpec:
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
        x_range: the visible step range after a zoom.
        height: pixels.
        ended: the run has ended: a chart without data says it never got any, not "yet".
        source: where the series come from, for that note (default: ``watch()``'s telemetry).
    """
    keys = [line.series.key for line in lines if line.role is None]
    layout = base_layout(chart, title, height, keys, y_title=y_title)
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
    if log_y:
        layout["yaxis"]["type"] = "log"
    shade_burn_in(fig, config or {})
    add_alert_marks(fig, as_alerts(alerts))
    if all(not len(line.series) for line in lines):
        # Say where the data come from: a run without them (another optimizer, no watch())
        # showed four empty charts "waiting" for data that never come.
        names = ", ".join(keys)
        fig.note(fmt.esc(f"this run logged no {names}" if ended else f"no data yet for {names}")
                 + "<br>" + fmt.esc(source or _SOURCE))
    if x_range is not None:
        layout["xaxis"].update(range=list(x_range), autorange=False)
    menu = log_menu(layout, ["yaxis", "yaxis2"] if has_right else ["yaxis"])
    if log_y:
        menu["active"] = 1
    layout["updatemenus"] = [menu]
    return fig.spec()


#: Where a run's optimizer telemetry comes from (the note of a chart without it).
_SOURCE = "Monitor.watch(optimizer) logs these for ScheduleFreePlus"
#: The norms' own: logged every ``norms_every`` steps, so a new run has none for a while.
_NORMS_SOURCE = ("Monitor.watch(optimizer) logs these for ScheduleFreePlus every 100 steps "
                 "(norms_every)")


def _get(series: Mapping[str, SeriesLike], key: str) -> SeriesData:
    return as_series(series.get(key), key)


def step_size_figure(series: Mapping[str, SeriesLike], *, prefix: str = TELEMETRY_PREFIX,
                     **kwargs: Any) -> FigureSpec:
    """Polyak step size η (left) and the effective step α = warmup · lr · η (right)."""
    return telemetry_figure(
        "step_size", "Step size: Polyak η and effective α",
        [Line(_get(series, prefix + "eta"), "Polyak η", palette.BLUE),
         Line(_get(series, prefix + "alpha"), "effective α = warmup·lr·η", palette.ORANGE,
              right=True)],
        y_title="η (Polyak step size)", y2_title="α (step applied)", **kwargs,
    )


def gradient_figure(series: Mapping[str, SeriesLike], *, prefix: str = TELEMETRY_PREFIX,
                    **kwargs: Any) -> FigureSpec:
    """Gradient L1 norm with the Polyak denominator EMA (√(π/2)·‖g‖₁, bias-corrected)."""
    return telemetry_figure(
        "gradient", "Gradient L1 norm and the Polyak denominator",
        [Line(_get(series, prefix + "grad_l1"), "‖g‖₁", palette.BLUE),
         Line(_get(series, prefix + "denom_ema"), "denominator: EMA of √(π/2)·‖g‖₁",
              palette.ORANGE, band=False, dash="dash")],
        y_title="L1 norm (Σ|g|)", **kwargs,
    )


def norms_figure(series: Mapping[str, SeriesLike], *, prefix: str = TELEMETRY_PREFIX,
                 config: Mapping[str, Any] | None = None, **kwargs: Any) -> FigureSpec:
    """Weight norms of x, y and z; with both ‖g‖₂ and ‖z‖₂ logged, also the ratio ‖g‖₂/‖z‖₂
    (right axis), whose rise is the drift the paper describes.

    No steady-state line: the paper's AdamC balance, √(2λ), is a level for the Adam direction
    ``u`` over ‖z‖, not for the raw gradient, and the raw ratio sits hundreds of times below it on
    real runs (docs/alerts.md, "The AdamC steady state"); drawn here it read as a level the run
    never reaches.
    """
    # Until averaging starts x = y = z exactly, and the three lines are drawn as one (a
    # newcomer looked for the missing two): the legend says so.
    lines = [
        Line(_get(series, prefix + "x_l2"), "‖x‖₂ (= ‖z‖₂ until averaging)", palette.BLUE),
        Line(_get(series, prefix + "y_l2"), "‖y‖₂ (= ‖z‖₂ until averaging)", palette.ORANGE,
             dash="dot"),
        Line(_get(series, prefix + "z_l2"), "‖z‖₂", palette.GREEN),
    ]
    grad, z = _get(series, prefix + "grad_l2"), _get(series, prefix + "z_l2")
    has_ratio = bool(len(grad) and len(z))
    if has_ratio:
        common, gi, zi = np.intersect1d(grad.steps, z.steps, return_indices=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = grad.values[gi] / z.values[zi]
        derived = SeriesData(f"{prefix}grad_l2/z_l2", common, ratio, None, None, False,
                             len(common))
        lines.append(Line(derived, "‖g‖₂/‖z‖₂ (right)", palette.PURPLE, right=True,
                          band=False, role="ratio"))
    return telemetry_figure(
        "norms", "Weight norms: x (averaged), y, z",
        lines, y_title="L2 norm", y2_title="‖g‖₂/‖z‖₂" if has_ratio else None,
        config=config, source=_NORMS_SOURCE, **kwargs,
    )


def averaging_figure(series: Mapping[str, SeriesLike], *, prefix: str = TELEMETRY_PREFIX,
                     **kwargs: Any) -> FigureSpec:
    """Averaging weight c (1 during burn-in, then ~1/t: log scale) and SF β (right)."""
    fig = telemetry_figure(
        "averaging", "Averaging weight c and SF β",
        [Line(_get(series, prefix + "c"), "averaging weight c", palette.BLUE),
         Line(_get(series, prefix + "sf_beta"), "SF β", palette.ORANGE, right=True)],
        y_title="c (weight of the newest iterate)", y2_title="β (interpolation)",
        log_y=True, **kwargs,
    )
    # c spans decades while β stays near 1: the buttons switch c's axis only.
    linear, log = fig.layout["updatemenus"][0]["buttons"]
    linear["args"] = [{"yaxis.type": "linear", "yaxis.autorange": True}]
    log["args"] = [{"yaxis.type": "log", "yaxis.autorange": True}]
    return fig

