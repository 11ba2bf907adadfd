"""The loss chart (data, fitted curve, forecast band, f*, prediction) and the forecast
evolution chart."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from curvecast.contract import RunConfig
from curvecast.dashboards import fmt, palette
from curvecast.dashboards.data import (
    AlertData,
    ForecastData,
    Prediction,
    SeriesLike,
    as_series,
    to_float,
)
from curvecast.dashboards.figures.base import (
    CURVE_POINTS,
    FigureBuilder,
    add_alert_marks,
    add_series,
    as_alerts,
    band_traces,
    base_layout,
    focus_range,
    forecast_line,
    gap,
    log_menu,
    log_range_of,
    opening_peak,
    parse_band,
    parse_forecast,
    shade_burn_in,
)
from curvecast.dashboards.figures.spec import FigureSpec


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
) -> FigureSpec:
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
    averaging_start = RunConfig.read(config).averaging_start
    train_s = as_series(train, "loss")
    eval_s = as_series(evaluation, "eval_loss") if evaluation is not None else None
    fit = parse_forecast(forecast)
    shown = [s for s in (train_s, eval_s) if s is not None]
    keys = [s.key for s in shown]
    # Taller than before: the legend (one or two rows, below the axis) takes from the height.
    layout = base_layout("loss", title, 480, keys, y_title="loss")
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
        start = max(float(averaging_start or first_step), first_step)
        fitted_on = "eval loss" if fit.key and fit.key != train_s.key else "training loss"
        if upto is not None and upto > start:
            t = np.linspace(start, upto, CURVE_POINTS)
            fig.add_trace({"type": "scatter", "x": t, "y": fit.curve(t), "mode": "lines",
                           "name": f"fit a/√(t+b)+c to {fitted_on}",
                           "line": {"color": palette.BLACK, "width": 1.6},
                           "meta": {"role": "fit"}, "hovertemplate": "%{y:.4g}"})
        if upto is not None and end is not None and end > upto:
            points = parse_band(band)
            if points:
                band_traces(fig, points, palette.VERMILLION,
                             f"{fit.confidence:.0%} forecast interval", 0.16)
                focus_extra += [p.lo for p in points] + [p.hi for p in points]
            t, y = forecast_line(fit, points, upto, end, CURVE_POINTS)
            fig.add_trace({"type": "scatter", "x": t, "y": y, "mode": "lines",
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
            # f* itself too: on a log axis its lower bound may be left out (log_range_of).
            focus_extra += [star.value, star.lo if math.isfinite(star.lo) else star.value]
        pred = fit.prediction
        if pred is not None and end is not None and pred.step == end:
            fig.add_trace({
                "type": "scatter", "x": [pred.step], "y": [pred.value], "mode": "markers",
                "marker": {"symbol": "diamond", "size": 11, "color": palette.VERMILLION,
                           "line": {"color": "#ffffff", "width": 1}},
                "error_y": {"type": "data", "symmetric": False, "color": palette.VERMILLION,
                            "array": [gap(pred.hi, pred.value)],
                            "arrayminus": [gap(pred.value, pred.lo)],
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
    shade_burn_in(fig, config, first_step)
    add_alert_marks(fig, as_alerts(alerts))
    if not with_data:
        fig.note(fmt.esc("no data yet for " + ", ".join(keys)))

    # Every step from the first: the y range shows where the loss started (a lone spike later
    # on is left to the min-max band: the quantiles do not stretch to it).
    arrays = [s.values for s in with_data]
    focus_extra += [peak for s in with_data for peak in opening_peak(s)]
    focus = focus_range(arrays, focus_extra) if x_range is None else None
    layout = fig.layout
    if focus is not None:
        layout["yaxis"]["range"] = focus
    if x_range is not None:
        layout["xaxis"].update(range=list(x_range), autorange=False)
    elif end is not None:
        layout["xaxis"].update(range=[first_step, end * 1.02], autorange=False)
    layout["updatemenus"] = [
        log_menu(layout, ["yaxis"], linear_range=focus,
                 log_range=log_range_of(focus, arrays, focus_extra)),
        log_menu(layout, ["xaxis"], x_axis=True)]
    return fig.spec()



def evolution_figure(history: Mapping[str, Any], *, observed: float | None = None,
                     horizon_planned: bool = True) -> FigureSpec:
    """The forecast of the final loss (with interval) against the step at which it was made,
    so people see it settle. ``history`` is ``GET .../forecast/history``; the loss the run
    reached at the horizon (its rows' ``final.reached``, or ``observed``) is drawn across (how
    good each forecast was).

    The history's rows may be of two series: a run's default one switches from the training
    loss to the eval loss once the eval loss has enough points. The rows of the history's own
    series are the forecast (line and band); earlier rows of another series are a grey line,
    named, not joined to it (one line through both jumped by the gap between the two losses).
    """
    horizon = history.get("horizon")
    every = [p for p in history.get("points", []) if p.get("final") and
             p["final"].get("value") is not None and p.get("fitted_upto_step") is not None]
    key = history.get("key") or (every[-1].get("key") if every else None)
    points = [p for p in every if p.get("key", key) == key]
    if observed is None:  # the answer's own: the loss reached at the horizon, for its series
        observed = next((r for r in (to_float(p["final"].get("reached")) for p in points)
                         if math.isfinite(r)), None)
    where = f"step {fmt.short_step(horizon)}" if horizon else "the horizon"
    if not horizon_planned and horizon:
        where += " (no total_steps)"
    fig = FigureBuilder(base_layout("evolution", f"Forecast evolution: loss at {where}", 340, [],
                                x_title="forecast made with data up to step",
                                y_title=f"forecast loss at {where}"))
    others: dict[str, list[Mapping[str, Any]]] = {}
    for p in every:
        if p.get("key", key) != key:
            others.setdefault(str(p["key"]), []).append(p)
    for other, rows in others.items():
        fig.add_trace({"type": "scatter", "mode": "lines+markers",
                       "x": np.array([float(p["fitted_upto_step"]) for p in rows]),
                       "y": np.array([to_float(p["final"].get("value")) for p in rows]),
                       "name": f"earlier: forecast of the final {other}",
                       "marker": {"size": 4}, "line": {"color": palette.GREY, "width": 1},
                       "meta": {"role": "forecast_earlier", "key": other},
                       "hovertemplate": "%{y:.4g}"})
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
                   "name": (f"forecast of the final {key}" if others and key
                            else "forecast of the final loss"), "marker": {"size": 5},
                   "line": {"color": palette.VERMILLION, "width": 2},
                   "meta": {"role": "forecast"}, "hovertemplate": "%{y:.4g}"})
    if observed is not None and math.isfinite(observed):
        fig.hline(observed, {"color": palette.BLACK, "width": 1, "dash": "dash"},
                  f"observed {fmt.loss(observed)}")
    if not every:
        fig.note("no forecast yet: the first fit comes seconds after the first points")
    else:
        earlier = [to_float(p["final"].get("value")) for rows in others.values() for p in rows]
        finite = np.concatenate([value, lo, hi, np.array(earlier, dtype=float)])
        focus = focus_range([finite], [observed] if observed is not None else [])
        if focus is not None:
            fig.layout["yaxis"]["range"] = focus
    fig.layout["updatemenus"] = [log_menu(fig.layout, ["yaxis"])]
    return fig.spec()

