"""Comparing runs: their losses overlaid with forecasts to a common horizon, and which the
forecasts say will be best there."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from curvecast.contract import (
    ENDED_RUN_STATUSES,
    EVAL_LOSS_KEYS,
    LOST_RUN_STATUS,
    TRAIN_LOSS_KEYS,
    ForecastStatus,
)
from curvecast.dashboards import fmt, palette
from curvecast.dashboards.data import FloatArray, ForecastData, Prediction, SeriesData, plottable
from curvecast.dashboards.figures.base import (
    CURVE_POINTS,
    TRACE,
    FigureBuilder,
    band_traces,
    base_layout,
    focus_range,
    forecast_line,
    gap,
    log_menu,
    log_range_of,
    opening_peak,
)
from curvecast.dashboards.figures.spec import FigureSpec

#: Characters of a run's name on the ranking chart's axis (the table has it in full).
RANK_LABEL_CHARS = 36


def run_label(run: Mapping[str, Any], same_name: bool) -> str:
    """A run's name as typed (or its short id), with its short id when another run on the page
    has the same name (a script run twice: "lm (82c063bc)" and "lm (ff21cdab)", not "lm" and
    "lm" in the verdict, the legend and the table)."""
    short = str(run.get("id", ""))[:8]
    name = str(run.get("name") or "")
    if not name:
        return short
    return f"{name} ({short})" if same_name else name


def ended_before(run: Mapping[str, Any], step: float | None) -> bool:
    """Whether ``run`` (``RunOut`` as JSON) ended (finished, failed, crashed, or lost: its
    client went silent) before ``step``: it will never have a loss there unless it is
    resumed."""
    last = run.get("last_step")
    return (step is not None and run.get("status") in ENDED_RUN_STATUSES
            and isinstance(last, int | float) and last < step)


def shared_names(runs: Sequence[Mapping[str, Any]]) -> list[bool]:
    """For each run, whether another of ``runs`` has the same name."""
    counts = Counter(str(run.get("name") or "") for run in runs)
    return [counts[str(run.get("name") or "")] > 1 for run in runs]


@dataclass(frozen=True)
class CompareEntry:
    """One run on the compare page: its loss series and its forecast to the common horizon."""

    run: Mapping[str, Any]
    series: SeriesData
    forecast: ForecastData | None
    band: Sequence[Prediction]
    at_horizon: Prediction | None
    #: Another run on the page has the same name: the name then carries the short id.
    same_name: bool = False
    #: The status of the run's fit (``forecast`` is None for a fit without a curve, e.g.
    #: ``diverged``); None before its first fit.
    status: ForecastStatus | None = None
    #: The series the page compares on (the user's choice), where this run does not log it.
    absent_key: str | None = None

    @property
    def name(self) -> str:
        """The run's name on the page (:func:`run_label`)."""
        return run_label(self.run, self.same_name)

    @property
    def label(self) -> str:
        """The run's name, escaped for Plotly."""
        return fmt.esc(self.name)

    def ended_before(self, horizon: int | None) -> bool:
        """:func:`ended_before` of this entry's run: not forecast past its end."""
        return ended_before(self.run, horizon)

    @property
    def diverged(self) -> bool:
        """Whether the run's fit says its loss is no longer finite (status ``diverged``)."""
        return self.status == ForecastStatus.DIVERGED

    @property
    def reached(self) -> float | None:
        """The loss the run had at the horizon once it got there (the forecast answer's
        ``reached``); None before, or without a forecast there."""
        return self.at_horizon.reached if self.at_horizon is not None else None

    @property
    def rank_value(self) -> float:
        """What the run is ranked by at the horizon: the loss reached there, else the forecast
        (only for an entry with a forecast there)."""
        reached = self.reached
        return _pred(self).value if reached is None else reached


@dataclass(frozen=True)
class Ranking:
    """Which run the forecasts say will be best at the horizon.

    ``order`` lists entries' indices, best first (runs without a forecast, then runs in
    ``ended``, last); ``clear`` is true when the best run's interval does not overlap the
    runner-up's; ``ended``: the runs that ended before the horizon (not ranked there).
    """

    horizon: int | None
    order: list[int]
    best: int | None
    clear: bool
    message: str
    ended: list[int] = field(default_factory=list)


def rank_forecasts(entries: Sequence[CompareEntry], horizon: int | None) -> Ranking:
    """Order runs by their loss at ``horizon`` (lower is better): the loss a run reached there
    once it got there (the data, as the runs list shows it), else its forecast. A run that
    ended before it is not ranked there: the message gives its last loss and step instead.

    Whether the winner is clear is read off the fits' intervals at the horizon, for runs
    that got there too: a single eval point differs from another's by its noise as well, and
    the fit's interval at a step inside its data is that uncertainty."""
    ended = [i for i, e in enumerate(entries) if e.ended_before(horizon)]
    ranked = sorted((i for i, e in enumerate(entries)
                     if e.at_horizon is not None and i not in ended),
                    key=lambda i: entries[i].rank_value)
    without = [i for i, e in enumerate(entries) if e.at_horizon is None and i not in ended]
    # Runs that do not log the series the user chose: named, apart from the runs whose
    # forecast is still to come.
    absent = [i for i in without if entries[i].absent_key]
    without = [i for i in without if not entries[i].absent_key]
    ended_note = _ended_note([entries[i] for i in ended], horizon)
    if absent:
        ended_note = _absent_note([entries[i] for i in absent]) + ended_note
    if not ranked:
        if absent and not without and not ended:
            message = f"No run here logs {entries[absent[0]].absent_key}: choose another series."
            return Ranking(horizon, absent, None, False, message, ended)
        message = ("No run has a forecast yet: the first fit comes seconds after a run's first "
                   "points." if not ended else "No run can be compared at step "
                   f"{fmt.step(horizon)}: choose an earlier horizon.")
        return Ranking(horizon, without + absent + ended, None, False, message + ended_note,
                       ended)
    best = ranked[0]
    best_pred = _pred(entries[best])
    best_reached = entries[best].reached is not None
    where = f"step {fmt.step(horizon)}" if horizon else "the horizon"
    if len(entries) == 1:  # e.g. opened from a run's "Compare with…": nothing to rank yet
        # Not "best": a run alone has nothing to be better than.
        said = "the loss of" if best_reached else "the forecast for"
        return Ranking(horizon, ranked, None, False,
                       f"At {where} {said} {entries[best].name}: "
                       f"{_standing(entries[best])}. Add a run to compare it with.")
    if len(ranked) == 1:
        # The others ended before the horizon or have no forecast yet: nothing to rank this
        # one against, so it is not "best".
        message = (f"At {where} only {entries[best].name} has a forecast: "
                   f"{_standing(entries[best])}; nothing to rank it against.")
        # Only an ended run with a forecast can be compared at an earlier step (a diverged
        # run, say, has none at any step).
        ends = [int(e) for e in (entries[i].run.get("last_step") for i in ended
                                 if entries[i].forecast is not None)
                if isinstance(e, int | float) and e > 0]
        if ends:
            message += (f" To compare them all, forecast to step {fmt.step(min(ends))} or "
                        "earlier.")
        if without:
            message += f" {len(without)} run(s) have no forecast yet."
        return Ranking(horizon, ranked + without + absent + ended, None,
                       False, message + ended_note, ended)
    # A run that got to the horizon is best by the loss it had there, not "will be".
    opening = (f"At {where} {entries[best].name} has the lowest loss: " if best_reached
               else f"At {where} the forecasts say {entries[best].name} will be best: ")
    message = opening + _standing(entries[best]) + "."
    runner = entries[ranked[1]]
    second = _pred(runner)
    clear = (math.isfinite(best_pred.hi) and math.isfinite(second.lo)
             and best_pred.hi < second.lo)
    message += f" Runner-up {runner.name}: {_standing(runner)}"
    if best_reached and runner.reached is not None:
        # Both got there: the ranking is the data's; whether it is more than noise is not.
        message += (" — the fits' intervals there do not overlap." if clear
                    else " — the fits' intervals there overlap: within the noise.")
    else:
        message += (" — the intervals do not overlap." if clear
                    else " — the intervals overlap: not yet a clear winner.")
    mixed = _mixed_series([entries[i] for i in ranked])
    if mixed:
        # The page fits all on one series where it can; where it cannot, the ranking sets
        # unlike losses against each other, and says so rather than name a clear winner.
        clear = False
        message += f" {mixed}"
    if without:
        message += f" {len(without)} run(s) have no forecast yet."
    return Ranking(horizon, ranked + without + absent + ended, best, clear,
                   message + ended_note, ended)


def _mixed_series(ranked: Sequence[CompareEntry]) -> str:
    """A warning when the ranked runs are forecast on different series ("" when one)."""
    keys = {e.forecast.key for e in ranked if e.forecast is not None}
    if len(keys) <= 1:
        return ""
    each = "; ".join(f"{e.name}: {e.forecast.key}" for e in ranked if e.forecast is not None)
    return (f"Not like with like: the runs are forecast on different series ({each}), and no "
            "series has a forecast in every run; an evaluation loss and a training loss are "
            "apart by the generalisation gap.")


def _absent_note(absent: Sequence[CompareEntry]) -> str:
    """Names the runs that do not log the series the page compares on."""
    key = absent[0].absent_key
    names = ", ".join(e.name for e in absent)
    verb = "logs" if len(absent) == 1 else "log"
    return f" Not compared: {names} {verb} no {key}."


def _standing(entry: CompareEntry) -> str:
    """A ranked run's loss at the horizon in words: the forecast with its interval, or, once
    the run got there, the loss it reached with the fit beside it."""
    pred = _pred(entry)
    forecast = f"{fmt.loss(pred.value)} {fmt.interval(pred.lo, pred.hi)}"
    reached = entry.reached
    return forecast if reached is None else f"{fmt.loss(reached)} reached (fit {forecast})"


def _ended_note(ended: Sequence[CompareEntry], horizon: int | None) -> str:
    """Names the runs that ended before ``horizon``, each with its last loss and step."""
    if not ended:
        return ""
    parts = []
    for entry in ended:
        last = entry.series.last
        where = (f"{entry.series.key} {fmt.loss(last[1])} at step {fmt.step(last[0])}"
                 if last else f"at step {fmt.step(entry.run.get('last_step'))}")
        if entry.diverged:
            where += ": diverged"
        elif entry.run.get("status") == LOST_RUN_STATUS:
            where += ": lost, its client went silent"
        parts.append(f"{entry.name} ({where})")
    return (f" Ended before step {fmt.step(horizon)}, so not forecast past their end: "
            + ", ".join(parts) + ".")


def _pred(entry: CompareEntry) -> Prediction:
    assert entry.at_horizon is not None
    return entry.at_horizon


def loss_title(keys: Sequence[str]) -> str:
    """Which loss a chart of ``keys`` shows (each run draws the series its forecast is
    fitted to: the eval loss where the run logs enough of it, else the training loss)."""
    if keys and all(k in EVAL_LOSS_KEYS for k in keys):
        return "eval loss"
    if keys and all(k in TRAIN_LOSS_KEYS for k in keys):
        return "training loss"
    return "loss (eval or training)"


def compare_figure(entries: Sequence[CompareEntry], horizon: int | None,
                   *, x_range: Sequence[float] | None = None) -> FigureSpec:
    """Several runs' losses overlaid, each with its forecast (and band) to a common horizon."""
    keys = sorted({e.series.key for e in entries})
    fig = FigureBuilder(base_layout(
        "compare", "Loss of each run, with its forecast to a common horizon", 480,
        keys, y_title=loss_title(keys)))
    focus_arrays: list[FloatArray] = []
    focus_extra: list[float] = []
    for index, entry in enumerate(entries):
        colour = palette.run_colour(index)
        s = entry.series
        group = f"run{index}"
        run_meta = {"run": index, "run_id": str(entry.run.get("id", ""))}
        if s.downsampled and s.vmin is not None and s.vmax is not None:
            common = {"type": TRACE, "x": s.steps, "mode": "lines", "line": {"width": 0},
                      "showlegend": False, "hoverinfo": "skip", "legendgroup": group}
            fig.add_trace({**common, "y": plottable(s.vmin), "name": f"{entry.label} min",
                           "meta": {"key": s.key, "role": "min", **run_meta}})
            fig.add_trace({**common, "y": plottable(s.vmax), "name": f"{entry.label} range",
                           "fill": "tonexty", "fillcolor": palette.rgba(colour, 0.15),
                           "meta": {"key": s.key, "role": "max", **run_meta}})
        fig.add_trace({"type": TRACE, "x": s.steps, "y": plottable(s.values), "mode": "lines",
                       "line": {"color": colour, "width": 1.6}, "name": entry.label,
                       "legendgroup": group, "hovertemplate": "%{y:.4g}",
                       "meta": {"key": s.key, "role": "last", **run_meta}})
        last = s.last
        focus_arrays.append(s.values)  # from the first step: where each loss started
        focus_extra += opening_peak(s)
        fit = entry.forecast
        if fit is None or horizon is None or entry.ended_before(horizon):
            continue
        upto = fit.fitted_upto_step if fit.fitted_upto_step is not None else (
            last[0] if last else None)
        if upto is None or horizon <= upto:
            continue
        points = sorted(entry.band, key=lambda p: p.step)
        if points:
            band_traces(fig, points, colour, f"{entry.label} interval", 0.12,
                         legendgroup=group, showlegend=False, meta=run_meta)
            focus_extra += [p.lo for p in points] + [p.hi for p in points]
        t, y = forecast_line(fit, points, upto, horizon, CURVE_POINTS // 2)
        fig.add_trace({"type": "scatter", "x": t, "y": y, "mode": "lines",
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
    focus = focus_range(focus_arrays, focus_extra) if x_range is None else None
    if focus is not None:
        layout["yaxis"]["range"] = focus
    if x_range is not None:
        layout["xaxis"].update(range=list(x_range), autorange=False)
    elif horizon is not None:
        layout["xaxis"].update(range=[0, horizon * 1.02], autorange=False)
    layout["hovermode"] = "closest"
    layout["updatemenus"] = [
        log_menu(layout, ["yaxis"], linear_range=focus,
                 log_range=log_range_of(focus, focus_arrays, focus_extra)),
        log_menu(layout, ["xaxis"], x_axis=True)]
    return fig.spec()


#: The ranking's loss ticks with as many decimals as the tick spacing needs, the same on every
#: tick at a zoom level: "0.999, 1.000, 1.001", where four significant digits gave "0.9990,
#: 1.000". One stop per decade of the spacing (``dtick``), from 1 down to 1e-8.
_FIXED_DECIMALS: Final = [
    {"dtickrange": [None if d == 9 else 10.0 ** -d, None if d == 0 else 10.0 ** -(d - 1)],
     "value": f".{d}f"}
    for d in range(10)
]


def ranking_figure(entries: Sequence[CompareEntry], ranking: Ranking) -> FigureSpec:
    """Each run's loss at the common horizon, best at the top: its forecast with the interval
    (a diamond), or, once the run got there, the loss it reached (a dot, the fit in its
    hover text)."""
    ordered = [i for i in ranking.order
               if entries[i].at_horizon is not None and i not in ranking.ended]
    horizon = ranking.horizon
    any_reached = any(entries[i].reached is not None for i in ordered)
    where = f"step {fmt.short_step(horizon)}" if horizon else "the horizon"
    title = (f"Loss at {where}, reached or forecast (lower is better)" if any_reached
             else f"Forecast loss at {where} (lower is better)")
    layout = base_layout("ranking", title, 130 + 40 * max(1, len(ordered)), [],
                         x_title="loss" if any_reached else "forecast loss")
    # The run names are the y axis's labels: the left margin grows to fit them (shortened).
    layout["yaxis"].update(autorange="reversed", type="category", automargin=True)
    layout["xaxis"].update(tickformatstops=_FIXED_DECIMALS, hoverformat=".4g",
                           rangemode="normal")
    layout["hovermode"] = "closest"
    layout["margin"] = {**layout["margin"], "l": 40, "t": 56}
    fig = FigureBuilder(layout)
    labels, values, plus, minus, colours, texts, symbols = [], [], [], [], [], [], []
    for i in ordered:
        pred = _pred(entries[i])
        name = entries[i].name
        short = name if len(name) <= RANK_LABEL_CHARS else name[:RANK_LABEL_CHARS - 1] + "…"
        labels.append(("★ " if i == ranking.best else "") + fmt.esc(short))
        reached = entries[i].reached
        value = entries[i].rank_value
        values.append(value)
        # A loss reached is data: no error bar (its fit's interval is in the hover text).
        plus.append(gap(pred.hi, value) if reached is None else 0.0)
        minus.append(gap(value, pred.lo) if reached is None else 0.0)
        colours.append(palette.run_colour(i))
        texts.append(_standing(entries[i]))
        symbols.append("diamond" if reached is None else "circle")
    fig.add_trace({
        "type": "scatter", "x": values, "y": labels, "mode": "markers", "text": texts,
        "showlegend": False,
        "marker": {"size": 12, "color": colours, "symbol": symbols},
        "error_x": {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus,
                    "thickness": 2, "width": 6, "color": "#555555"},
        "meta": {"role": "ranking"}, "hovertemplate": "%{text}<extra></extra>",
    })
    if not ordered:
        # No axes around nothing (Plotly's default range of an empty axis is -1 to 6).
        layout["xaxis"]["visible"] = False
        layout["yaxis"]["visible"] = False
        fig.note("no run has a loss or a forecast at this horizon" if ranking.ended
                 else "no forecasts yet")
    return fig.spec()
