"""Page compositions (pure): a run's (or several runs') data in the REST API's shapes in, the
page's figures, headline numbers and verdicts out.

The web layer (``service/web``) reads the data from the store and the forecast answer builder
(the same shapes ``GET /api/v1/runs/{id}``, ``.../metrics``, ``.../forecast``,
``.../forecast/history`` and ``.../alerts`` answer) and hands them here; the tests do the same
with dictionaries of their own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from curvecast.contract import (
    ENDED_RUN_STATUSES,
    EVAL_LOSS_KEYS,
    LOST_RUN_STATUS,
    STOPPED_RUN_STATUSES,
    TRAIN_LOSS_KEY,
    TRAIN_LOSS_KEYS,
    ForecastStatus,
    RunConfig,
    telemetry_keys,
    telemetry_prefix,
)
from curvecast.dashboards import figures, fmt, palette
from curvecast.dashboards.data import (
    AlertData,
    ForecastData,
    Prediction,
    SeriesData,
    alerts_list,
    chart_horizon,
    eval_key,
    forecast_status,
    series_by_key,
)
from curvecast.dashboards.figures.base import parse_band
from curvecast.dashboards.figures.spec import FigureSpec

#: The run page's charts, in page order.
RUN_CHARTS = ("loss", "step_size", "gradient", "norms", "averaging", "evolution")
#: Charts drawn from metric series (the forecast evolution is drawn from the fit history).
SERIES_CHARTS = RUN_CHARTS[:-1]
#: Telemetry names per telemetry chart (stored under the run's telemetry prefix).
_TELEMETRY_OF = {
    "step_size": ("eta", "alpha"), "gradient": ("grad_l1", "denom_ema"),
    "norms": ("x_l2", "y_l2", "z_l2", "grad_l2"), "averaging": ("c", "sf_beta"),
}
#: The builder of each telemetry chart.
_TELEMETRY_FIGURES: dict[str, Callable[..., FigureSpec]] = {
    "step_size": figures.step_size_figure,
    "gradient": figures.gradient_figure,
    "norms": figures.norms_figure,
    "averaging": figures.averaging_figure,
}
#: Steps at which the forecast band is sampled between the last fit and the horizon.
BAND_SAMPLES = 7
#: Buckets requested per chart: about one per horizontal pixel of the chart at 1280 px wide.
MAX_POINTS = {"loss": 1200, "compare": 1000}
DEFAULT_MAX_POINTS = 600


def chart_keys(chart: str) -> list[str]:
    """The metric keys to request for ``chart``: for telemetry, every name the contract reads
    it under (missing keys come back empty and cost nothing)."""
    if chart == "loss":
        return [TRAIN_LOSS_KEY, *EVAL_LOSS_KEYS]
    return [key for name in _TELEMETRY_OF.get(chart, ()) for key in telemetry_keys(name)]


def band_steps(fitted_upto: float | None, end: int | None, n: int = BAND_SAMPLES) -> list[int]:
    """Steps at which to ask for the forecast interval to draw its band to ``end``.

    Denser near the last fitted step, where the band's width changes fastest; the figures
    draw the band's edges as splines through these samples.
    """
    if fitted_upto is None or end is None or end <= fitted_upto:
        return []
    frac = np.linspace(0.0, 1.0, n) ** 1.5
    steps = np.unique(np.round(fitted_upto + (end - fitted_upto) * frac).astype(np.int64))
    return [int(s) for s in steps]


@dataclass(frozen=True)
class Kpi:
    """One headline number of the run page."""

    id: str
    label: str
    value: str
    detail: str
    tone: str = "neutral"  # neutral | good | warn | bad


@dataclass
class RunPage:
    """Everything the run page shows, in the REST API's shapes.

    Attributes:
        run: ``GET /api/v1/runs/{id}``.
        metrics: ``GET .../metrics`` answer(s): the ``series`` items of every requested key.
        forecast: ``GET .../forecast`` (the contract's horizon).
        band: the forecast interval at :func:`band_steps` up to the chart's horizon
            (``PredictionOut`` items or :class:`Prediction`).
        history: ``GET .../forecast/history``.
        alerts: ``GET .../alerts`` items.
        loss_reached: the loss the run reached (``LossReachedOut``: key, step, value), the
            one number its card, the runs list and the demo show.
    """

    run: Mapping[str, Any]
    metrics: Sequence[Mapping[str, Any]] = ()
    forecast: Mapping[str, Any] | None = None
    band: Sequence[Mapping[str, Any] | Prediction | None] = ()
    history: Mapping[str, Any] | None = None
    alerts: Sequence[Mapping[str, Any]] = ()
    loss_reached: Mapping[str, Any] | None = None
    _series: dict[str, SeriesData] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._series = series_by_key(self.metrics)

    @property
    def series(self) -> dict[str, SeriesData]:
        """The metric series by key."""
        return self._series

    @property
    def config(self) -> Mapping[str, Any]:
        """The run's config."""
        config = self.run.get("config") or {}
        return config if isinstance(config, Mapping) else {}

    @property
    def prefix(self) -> str:
        """The run's telemetry prefix."""
        return telemetry_prefix(k for k, s in self._series.items() if len(s))

    @property
    def horizon(self) -> int | None:
        """The step the page's numbers are for: the contract's horizon (as GET /forecast)."""
        return RunConfig.read(self.config).horizon(self.run.get("last_step"))

    @property
    def chart_horizon(self) -> tuple[int | None, bool]:
        """How far the loss chart draws the forecast, and whether it is the planned end."""
        return chart_horizon(self.config, self.run.get("last_step"))

    @property
    def alert_items(self) -> list[AlertData]:
        """Parsed alerts."""
        return alerts_list(self.alerts)

    def eval_series(self) -> SeriesData | None:
        """The evaluation-loss series, if the run logs one: the forecast's, where it is of one
        (a run may log two, e.g. ``eval_loss`` and ``val_loss``, and the user pick either)."""
        fitted = (self.forecast or {}).get("key")
        if fitted in EVAL_LOSS_KEYS and len(self._series.get(fitted, ())):
            return self._series[fitted]
        key = eval_key(k for k, s in self._series.items() if len(s))
        return self._series.get(key) if key else None

    def cursor(self) -> dict[str, float]:
        """The last step drawn per key: live updates ask for points after it."""
        return {k: float(s.steps[-1]) for k, s in self._series.items() if len(s)}


def run_figures(page: RunPage, charts: Iterable[str] = RUN_CHARTS,
                x_range: Sequence[float] | None = None) -> dict[str, FigureSpec]:
    """Build the run page's figures (only ``charts``)."""
    out: dict[str, FigureSpec] = {}
    prefix = page.prefix
    config = page.config
    alerts = page.alert_items
    end, planned = page.chart_horizon
    ended = page.run.get("status") in ENDED_RUN_STATUSES
    for chart in charts:
        if chart == "loss":
            out[chart] = figures.loss_figure(
                train=page.series.get(TRAIN_LOSS_KEY) or SeriesData.empty(TRAIN_LOSS_KEY),
                evaluation=page.eval_series(),
                forecast=page.forecast,
                band=page.band,
                config=config,
                horizon=end,
                horizon_planned=planned,
                alerts=alerts,
                x_range=x_range,
            )
        elif chart in _TELEMETRY_FIGURES:
            out[chart] = _TELEMETRY_FIGURES[chart](page.series, prefix=prefix, config=config,
                                                   alerts=alerts, x_range=x_range,
                                                   ended=ended)
        elif chart == "evolution":
            history = page.history or {"points": []}
            out[chart] = figures.evolution_figure(history, horizon_planned=planned)
        else:
            raise ValueError(f"unknown chart {chart!r}; choose from {', '.join(RUN_CHARTS)}")
    return out


#: How the one "loss reached" number is named on the pages (the runs list's column, the run
#: page's card), in the demo's terminal and in the REST docs; its rule, in a card's words.
LOSS_REACHED_LABEL = "Train loss reached"
LOSS_REACHED_RULE = "median of the last 1% of steps"


def _loss_reached_kpi(page: RunPage) -> Kpi:
    """The card of the loss the run reached (``RunPage.loss_reached``: the forecast's
    ``reached`` rule at the run's newest step), with the last eval loss beside it."""
    reached = page.loss_reached
    if reached is None:
        return Kpi("last_loss", LOSS_REACHED_LABEL, "—", "no loss logged yet")
    key = str(reached.get("key"))
    value = _as_float(reached.get("value"))
    detail = f"at step {fmt.step(reached.get('step'))}, {LOSS_REACHED_RULE}"
    ev = page.eval_series()
    ev_last = ev.last if ev is not None else None
    if key not in TRAIN_LOSS_KEYS:
        detail += "; no training loss logged"
    elif ev_last is not None:
        detail += f"; last eval loss {fmt.loss(ev_last[1])} at step {fmt.step(ev_last[0])}"
    label = LOSS_REACHED_LABEL if key in TRAIN_LOSS_KEYS else f"{key} reached"
    return Kpi("last_loss", label, fmt.loss(value), detail,
               "bad" if not math.isfinite(value) else "neutral")


def _as_float(value: Any) -> float:
    """A JSON number, or a non-finite one as the API writes it ("NaN", "Infinity")."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def run_kpis(page: RunPage) -> list[Kpi]:
    """The run page's headline numbers: progress, last loss, forecast, f*, fit, alerts."""
    run = page.run
    config = page.config
    last_step = run.get("last_step")
    end = page.horizon
    kpis: list[Kpi] = []
    total = RunConfig.read(config).total_steps
    if total is not None and last_step is not None:
        detail = f"of {fmt.step(total)} planned ({min(1.0, last_step / total):.0%})"
    else:
        detail = "no total_steps in the config"
    kpis.append(Kpi("progress", "Step", fmt.step(last_step), detail))

    kpis.append(_loss_reached_kpi(page))

    fit = ForecastData.from_api(page.forecast)
    status = forecast_status((page.forecast or {}).get("status", ForecastStatus.PENDING))
    where = f"step {fmt.short_step(end)}" if end is not None else "the horizon"
    if fit is not None and fit.prediction is not None:
        pred = fit.prediction
        detail = f"{fit.confidence:.0%} interval {fmt.interval(pred.lo, pred.hi)}"
        if total is None:
            detail += " (no total_steps: at the last step logged)"
        # What the run did at that step comes before the status's explanation: the card shows
        # two lines of it (the whole text is in its tooltip).
        if pred.reached is not None:  # the run got there: the forecast beside what it was
            detail += f"; reached {fmt.loss(pred.reached)} there"
        elif figures.ended_before(run, pred.step):
            # It will not get there unless resumed: the number is where it was heading.
            ended = run.get("status")
            ended = "was lost (its client went silent)" if ended == LOST_RUN_STATUS else ended
            detail += (f"; the run {ended} at step {fmt.step(last_step)}: where it "
                       "was heading, had it gone on")
        if fit.useful_from_step is not None:
            # Short: the card shows two lines, and "too early" is the Fit card's (the step was
            # cut off at 1,400 px: "too early: a useful forecast from…").
            detail += f"; useful from step {fmt.step(fit.useful_from_step)}"
        elif status == ForecastStatus.NO_ASYMPTOTE:
            detail += ("; no asymptote yet: the current loss extended at the pace runs like "
                       "this one kept")
        tone = "good" if status == ForecastStatus.OK and not fit.off_model else "warn"
        # Named: beside the "Train loss reached" card, an eval-loss forecast above the training
        # loss read as a forecast that the loss will rise.
        label = (f"Forecast of {fit.key} at {fmt.short_step(end)}" if fit.key and end is not None
                 else f"Forecast at {where}")
        kpis.append(Kpi("forecast", label, fmt.loss(pred.value), detail, tone))
    else:
        message = (page.forecast or {}).get("message") or "waiting for the first fit"
        kpis.append(Kpi("forecast", f"Forecast at {where}",
                        "pending" if status == ForecastStatus.PENDING else "—", str(message)))
    # Named as the forecast card is: f* is the asymptote of the series that card forecasts.
    # (The label fits a card; "asymptote c" goes to the detail.)
    star = f"f* of {fit.key}" if fit is not None and fit.key else "f* (asymptote c)"
    if fit is not None and fit.f_star is not None:
        kpis.append(Kpi("f_star", star, fmt.loss(fit.f_star.value),
                        f"the asymptote c, {fit.confidence:.0%} interval "
                        f"{fmt.interval(fit.f_star.lo, fit.f_star.hi)}"))
    elif fit is not None:
        # The same truth as REST's f_star (value null, hi = at most): not identifiable yet.
        detail = f"not identifiable yet ({str(status).replace('_', ' ')})"
        if fit.f_star_at_most is not None:
            detail += f": at most {fmt.loss(fit.f_star_at_most)}"
        kpis.append(Kpi("f_star", star, "—", detail, "warn"))
    else:
        waiting = ("no fit yet" if status == ForecastStatus.PENDING
                   else str(status).replace("_", " "))
        kpis.append(Kpi("f_star", star, "—", waiting))

    if page.forecast and status != ForecastStatus.PENDING:
        fitted_on = page.forecast.get("key") or "?"
        upto = page.forecast.get("fitted_upto_step")
        when = fmt.ago(page.forecast.get("fitted_at"))
        detail = f"{fitted_on} up to step {fmt.step(upto)}, {when}"
        if page.forecast.get("assumes_constant_lr"):
            # The status's reason, as REST's message gives it: nothing told it the schedule.
            detail += "; assumes the learning rate does not decay (no lr_schedule, no opt/lr)"
        tone = ("good" if status == ForecastStatus.OK and not page.forecast.get("off_model")
                else "warn")
        label = "off model" if page.forecast.get("off_model") else str(status).replace("_", " ")
        kpis.append(Kpi("fit", "Fit", label, detail, tone))
    else:
        kpis.append(Kpi("fit", "Fit", "pending", "no fit stored yet"))

    alerts = page.alert_items
    firing = sum(a.state == "firing" for a in alerts)
    pending = sum(a.state == "pending" for a in alerts)
    resolved = sum(a.state == "resolved" for a in alerts)
    kpis.append(Kpi("alerts", "Alerts", f"{firing} firing",
                    f"{pending} pending, {resolved} resolved", "bad" if firing else "good"))
    return kpis


def charts_payload(figs: Mapping[str, FigureSpec], **extra: Any) -> str:
    """The JSON body of a figures answer: ``{"charts": {id: figure}, **extra}``.

    Figures are encoded as Plotly would (typed arrays: :meth:`FigureSpec.to_json`); the rest
    with the standard encoder.
    """
    charts = ",".join(f"{json.dumps(name)}:{fig.to_json()}" for name, fig in figs.items())
    rest = "".join(f",{json.dumps(k)}:{json.dumps(v, allow_nan=False)}" for k, v in extra.items())
    return "{" + f'"charts":{{{charts}}}' + rest + "}"


def run_payload(page: RunPage, charts: Sequence[str], x_range: Sequence[float] | None) -> str:
    """The run page's figures answer: figures, headline numbers and live-update state."""
    figs = run_figures(page, charts, x_range)
    state: dict[str, Any] = {
        "cursor": page.cursor(),
        "prefix": page.prefix,
        "horizon": page.horizon,
        # The planned last step (null: not planned): the ask box says when a target is past it.
        "total_steps": RunConfig.read(page.config).total_steps,
        "run_status": page.run.get("status"),
        "last_step": page.run.get("last_step"),
    }
    if page.forecast is not None:  # only when this answer carries the forecast
        state["fitted_at"] = page.forecast.get("fitted_at")
        state["fit_status"] = page.forecast.get("status", ForecastStatus.PENDING)
        state["fit_key"] = page.forecast.get("key")
        state["burn_in"] = page.forecast.get("burn_in")
    if "loss" not in charts:  # headline numbers need the loss and the forecast
        return charts_payload(figs, state=state)
    return charts_payload(figs, kpis=[asdict(k) for k in run_kpis(page)], state=state)


# --- compare ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareRun:
    """One run's answers for the compare page (REST shapes; the band as for :class:`RunPage`)."""

    run: Mapping[str, Any]
    metrics: Sequence[Mapping[str, Any]]
    forecast: Mapping[str, Any] | None
    band: Sequence[Mapping[str, Any] | Prediction | None]
    at_horizon: Mapping[str, Any] | None  # ``prediction`` at the common horizon
    #: The series the page compares on when the user chose one (``?key=``), and whether this
    #: run logs it.
    key: str | None = None
    logs_key: bool = True
    #: The loss the run reached (``LossReachedOut``: key, step, value), as on its run page's
    #: card and in the runs list; None before it logged a loss.
    loss_reached: Mapping[str, Any] | None = None


def common_horizon(runs: Sequence[Mapping[str, Any]], requested: int | None = None) -> int | None:
    """The horizon the compare page forecasts to: as requested, else the furthest step at
    which every run can be compared.

    A running run can be compared up to its planned end (``total_steps``); a finished one up
    to where it got (past its end it has no loss and no forecast): the default is the
    earliest of those. Runs with no planned end do not bound it (the furthest of their last
    steps is used when no run has one). A run that failed, crashed or stopped reporting does
    not set it either (its end was not planned): it is compared when it got that far, and
    named as ended before the horizon otherwise; only when every run is such a run, the
    earliest of their ends is used.
    """
    if requested is not None:
        return requested
    planned: list[int] = []
    open_ended: list[int] = []
    broken_off: list[int] = []
    for run in runs:
        last = run.get("last_step")
        last = int(last) if isinstance(last, int | float) else None
        status = run.get("status")
        total = RunConfig.read(run.get("config")).total_steps
        if status == "running":
            if total is not None:
                planned.append(total)
            elif last is not None:
                open_ended.append(last)
        elif status == "finished":
            if last is not None:
                planned.append(last)
        elif last is not None:
            broken_off.append(last)
    if planned:
        return min(planned)
    if open_ended:
        return max(open_ended)
    return min(broken_off) if broken_off else None


def compare_entries(runs: Sequence[CompareRun]) -> list[figures.CompareEntry]:
    """Parse each run's answers for the compare figures."""
    entries = []
    shared = figures.shared_names([item.run for item in runs])
    for item, same_name in zip(runs, shared, strict=True):
        fit = ForecastData.from_api(item.forecast)
        series = series_by_key(item.metrics)
        # The series the run is compared on: the one asked for, else its fit's, else a loss.
        key = item.key or (fit.key if fit and fit.key in series else None) or (
            TRAIN_LOSS_KEY if TRAIN_LOSS_KEY in series else next(iter(series), TRAIN_LOSS_KEY))
        entries.append(figures.CompareEntry(
            run=item.run,
            series=series.get(key) or SeriesData.empty(key),
            forecast=fit,
            band=parse_band(item.band),
            at_horizon=Prediction.from_api(item.at_horizon) if fit is not None else None,
            same_name=same_name,
            status=forecast_status((item.forecast or {}).get("status")),
            absent_key=None if item.logs_key else item.key,
        ))
    return entries


def compare_payload(runs: Sequence[CompareRun], horizon_step: int | None,
                    x_range: Sequence[float] | None = None) -> str:
    """The compare page's figures answer: overlay, ranking and the verdict sentence."""
    entries = compare_entries(runs)
    ranking = figures.rank_forecasts(entries, horizon_step)
    evals = [_last_eval_loss(series_by_key(item.metrics)) for item in runs]
    figs = {
        "compare": figures.compare_figure(entries, horizon_step, x_range=x_range),
        "ranking": figures.ranking_figure(entries, ranking),
    }
    # The badge marks every ranked run whose loss at the horizon shows as the best's: runs that
    # tie to the digits the table shows are not told apart by it (the verdict says which is
    # lower).
    badged = set() if ranking.best is None else {
        i for i in ranking.order if i not in ranking.ended and entries[i].at_horizon is not None
        and fmt.loss(entries[i].rank_value) == fmt.loss(entries[ranking.best].rank_value)}
    rows = []
    for index in ranking.order:
        entry = entries[index]
        ended = index in ranking.ended
        eval_last = evals[index]
        reached = runs[index].loss_reached
        # As the runs list's cell: the forecast, or the loss reached once the run got there.
        cell = ({"forecast": "—", "forecast_detail": f"logs no {entry.absent_key}"}
                if entry.absent_key else
                _forecast_cell(entry.at_horizon, entry.reached, entry.status))
        rows.append({
            "run_id": str(entry.run.get("id")),
            "name": entry.name,
            "status": str(entry.run.get("status") or ""),
            "last_step": fmt.step(entry.run.get("last_step")),
            "loss_reached": fmt.loss(_as_float(reached.get("value"))) if reached else "—",
            "last_eval_loss": fmt.loss(eval_last[1]) if eval_last else "—",
            "forecast": "—" if ended else cell["forecast"],
            "interval": _ended_cell(entry) if ended else cell["forecast_detail"],
            "f_star": fmt.loss(entry.forecast.f_star.value)
            if entry.forecast and entry.forecast.f_star else "—",
            "best": index in badged,
            "colour": palette.run_colour(index),
        })
    verdict = {"message": ranking.message, "clear": ranking.clear,
               "best": str(entries[ranking.best].run.get("id")) if ranking.best is not None
               else None, "horizon": horizon_step}
    return charts_payload(figs, verdict=verdict, rows=rows)


def _ended_cell(entry: figures.CompareEntry) -> str:
    """The compare table's note for a run that ended before the horizon, and whether it
    diverged (its fit says so; nothing else on the row would)."""
    return (("diverged; " if entry.diverged else "")
            + f"ended at step {fmt.step(entry.run.get('last_step'))}")


def _last_eval_loss(series: Mapping[str, SeriesData]) -> tuple[float, float] | None:
    """The last (step, value) of the evaluation loss, None when the run does not log one (the
    run page's card shows the same beside the loss reached)."""
    key = eval_key(k for k, s in series.items() if len(s))
    evaluation = series.get(key) if key else None
    return evaluation.last if evaluation is not None else None


# --- runs list ----------------------------------------------------------------------------------


def _sort_value(value: float | None) -> str:
    """A numeric sort key for a table cell ("" sorts last)."""
    return "" if value is None or not math.isfinite(value) else repr(float(value))


def _forecast_cell(pred: Prediction | None, reached: float | None,
                   status: ForecastStatus | None,
                   key: str | None = None) -> dict[str, str]:
    """The runs list's "Forecast (final)" cell: the forecast of the loss at the planned end
    with its interval, or, once the run got there, the loss it reached (the fit beside it);
    with ``key``, the series it is of, named in the detail."""
    if pred is None:
        if status in (None, ForecastStatus.PENDING):
            return {"forecast": "pending", "forecast_detail": "", "forecast_sort": ""}
        # A fit without a forecast says why in one word ("diverged", "insufficient data").
        return {"forecast": "—", "forecast_detail": str(status).replace("_", " "),
                "forecast_sort": ""}
    where = fmt.short_step(pred.step)
    of = f" · {key}" if key else ""
    if reached is not None:
        return {"forecast": fmt.loss(reached),
                "forecast_detail": f"reached @ {where}; fit {fmt.loss(pred.value)}{of}",
                "forecast_sort": _sort_value(reached)}
    return {"forecast": fmt.loss(pred.value),
            "forecast_detail": f"{fmt.interval(pred.lo, pred.hi)} @ {where}{of}",
            "forecast_sort": _sort_value(pred.value)}


def runs_rows(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the runs list.

    Args:
        items: per run ``{"run": RunOut dict, "last_loss": float | None, "loss_key": str |
            None, "last_loss_step": int | None, "spark_steps": [...], "spark_values": [...],
            "forecast": ForecastOut dict | None, "firing": int | None}`` (``last_loss`` is the
            loss reached, ``store.dashboard.reached_now``, of the training loss, else of the
            eval loss ``loss_key`` names; ``firing`` None: no alerts API).

    Returns:
        Display strings and sort keys per row (the template escapes every string).
    """
    from curvecast.dashboards.sparkline import sparkline_path

    rows = []
    # Runs of one name on the page (a script run again) carry their short ids, as on the
    # compare page.
    shared = figures.shared_names([item["run"] for item in items])
    # Where the page's forecasts are of different series (one run evaluates, another does
    # not), each forecast cell names its own: the column would set unlike losses side by side.
    # A forecast of another series than the training loss is named anyway: beside the "Last
    # train loss" column, an eval loss reached above it read as a loss that went up.
    fitted = {(item.get("forecast") or {}).get("key") for item in items} - {None}
    named = len(fitted) > 1 or bool(fitted - set(TRAIN_LOSS_KEYS))
    for item, same_name in zip(items, shared, strict=True):
        run = item["run"]
        fit = ForecastData.from_api(item.get("forecast"))
        pred = fit.prediction if fit else None
        star = fit.f_star if fit else None
        last_loss = item.get("last_loss")
        loss_key = item.get("loss_key")
        firing = item.get("firing")
        status = forecast_status((item.get("forecast") or {}).get("status"))
        cell = _forecast_cell(pred, pred.reached if pred else None, status,
                              key=fit.key if fit and named else None)
        if (pred is not None and RunConfig.read(run.get("config")).total_steps is None
                and run.get("status") not in ENDED_RUN_STATUSES):
            # No planned end: the contract's horizon is the last step logged, where the cell
            # would show the loss just logged as "reached", a final that is not one.
            cell = {"forecast": "—", "forecast_detail": "no planned end (total_steps)",
                    "forecast_sort": ""}
        if run.get("status") in STOPPED_RUN_STATUSES and not (pred and pred.reached is not None):
            # It stopped short of the forecast's step: no final to show, as the leaderboard and
            # the compare page say (the forecast of a run that will not get there read as live).
            cell = {"forecast": "—",
                    "forecast_detail": f"{run['status']} at step {fmt.step(run.get('last_step'))}",
                    "forecast_sort": ""}
        rows.append({
            "id": str(run["id"]),
            "name": figures.run_label(run, same_name),
            "project": str(run.get("project") or ""),
            "status": str(run.get("status") or ""),
            "last_step": fmt.step(run.get("last_step")),
            "last_step_sort": _sort_value(run.get("last_step")),
            "last_loss": fmt.loss(last_loss) if last_loss is not None else "—",
            "last_loss_sort": _sort_value(last_loss),
            # The column is the training loss; a run that logs only an eval loss says so.
            "last_loss_key": "" if loss_key in (None, *TRAIN_LOSS_KEYS) else str(loss_key),
            **cell,
            "off_model": bool(fit and fit.off_model),
            "f_star": fmt.loss(star.value) if star else "—",
            "f_star_sort": _sort_value(star.value if star else None),
            "firing": "—" if firing is None else str(firing),
            "firing_sort": _sort_value(None if firing is None else float(firing)),
            "spark": sparkline_path(item.get("spark_steps") or [], item.get("spark_values") or []),
            "updated": fmt.ago(run.get("updated_at")),
            "updated_sort": str(run.get("updated_at") or ""),
        })
    return rows
