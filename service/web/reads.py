"""What the pages show, read one way: the store for data, the forecast answer builder for
forecasts, in the REST API's shapes (:mod:`curvecast.dashboards.views` composes the figures).

Every page, chart route and the live poll read here, never through the app's own routes. A run
page reads its run once (:func:`get_run`) and hands the :class:`RunOut` down: its fits are read
without reading the run again (:mod:`curvecast.service.store.run_fits`), its newest fit once
(:func:`run_fits`), parsed once by the store, its forecast band computed in one call
(:func:`~curvecast.service.forecast.answer.band`).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from curvecast.contract import LOSS_KEYS, RunConfig, fit_candidates
from curvecast.dashboards import lists, views
from curvecast.dashboards.data import Prediction, chart_horizon
from curvecast.service.config import Settings
from curvecast.service.errors import InvalidInput, NotFound
from curvecast.service.forecast.answer import band, forecast_answer, history_answer
from curvecast.service.forecast.decision_answers import ranking_answer
from curvecast.service.schemas import LossReachedOut, MetricsOut, Principal, RunOut, RunStatus
from curvecast.service.schemas.alerts import AlertList, AlertOut
from curvecast.service.schemas.decisions import RankingOut
from curvecast.service.schemas.forecast import ForecastHistory, ForecastOut
from curvecast.service.store import alerts as alert_store
from curvecast.service.store import dashboard as dashboard_store
from curvecast.service.store import decisions as decision_store
from curvecast.service.store import forecasts as forecast_store
from curvecast.service.store import metric_reads
from curvecast.service.store import projects as project_store
from curvecast.service.store import run_fits as fit_store
from curvecast.service.store import runs as run_store
from curvecast.service.store._common import utcnow
from curvecast.service.store.forecasts import StoredFit

#: Runs on one compare page at most.
MAX_COMPARE = 8
#: Runs on one page of the runs list.
RUNS_PER_PAGE = 200
#: Band samples per run on the compare page (several runs share the chart).
COMPARE_BAND_SAMPLES = 6
#: Fits drawn in the forecast evolution (the newest).
HISTORY_FITS = 200
#: Alerts listed on the run page (the newest).
RUN_ALERTS = 100
#: Alerts listed per state on the alerts page (the newest).
ALERTS_PER_STATE = 200


def parse_run_ids(text: str) -> list[uuid.UUID]:
    """The run ids of ``?runs=ID1,ID2`` (deduplicated, in order); InvalidInput says what is
    wrong with the list."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise InvalidInput("runs: give the run ids to compare, e.g. /compare?runs=ID1,ID2")
    if len(parts) > MAX_COMPARE:
        raise InvalidInput(f"runs: at most {MAX_COMPARE} runs per comparison")
    ids = []
    for index, part in enumerate(parts):
        try:
            ids.append(uuid.UUID(part))
        except ValueError:
            raise InvalidInput(f"runs[{index}]: {part[:40]!r} is not a run id") from None
    return list(dict.fromkeys(ids))


def get_run(session: Session, principal: Principal, run_id: uuid.UUID) -> RunOut:
    """One run the caller may see (RunNotFound otherwise)."""
    return run_store.get_run(session, run_id=run_id, allowed_project=principal.project)


def answer_forecast(session: Session, run: RunOut, stored: StoredFit | None,
                    horizon: int | None = None, key: str | None = None) -> ForecastOut:
    """The forecast answer for a run's stored fit, as ``GET .../forecast?horizon&key`` gives it
    (with the loss reached at a horizon the run is past); ``key``: the series asked for, named
    in the answer while it has no fit."""
    return forecast_answer(
        stored.fit if stored else None,
        config=RunConfig.read(run.config),
        last_step=run.last_step,
        horizon=horizon,
        key=stored.key if stored else key,
        fitted_at=stored.created_at if stored else None,
        reached=forecast_store.reached_reader(session, run.id, run.last_step),
    )


def _band(stored: StoredFit | None, end: int | None, confidence: float,
          samples: int = views.BAND_SAMPLES) -> list[Prediction]:
    """The forecast interval at a few steps from the last fitted step to ``end``: one
    evaluation of the (already parsed) fit, no round trips."""
    if stored is None:
        return []
    steps = views.band_steps(stored.fit.fitted_upto_step, end, samples)
    edges = band(stored.fit, steps, confidence)
    return [Prediction(float(s), float(mid), float(lo), float(hi))
            for s, lo, mid, hi in zip(edges.steps, edges.lo, edges.mid, edges.hi, strict=True)
            if math.isfinite(mid)]


def _series(session: Session, principal: Principal, run_id: uuid.UUID, keys: Sequence[str],
            span: tuple[int | None, int | None], max_points: int) -> list[dict[str, Any]]:
    """Metric series in ``span`` (``GET .../metrics`` items), at most ``max_points`` buckets."""
    if not keys:
        return []
    answer = metric_reads.read_series(
        session, run_id=run_id, keys=list(keys), start=span[0], end=span[1],
        max_points=max_points, allowed_project=principal.project)
    return [s.model_dump() for s in answer.series]


@dataclass(frozen=True)
class RunFits:
    """The fits a run page draws, each read once: the newest fit of the series it shows (None
    before its first); and, for the forecast evolution, the recent fits, oldest first (the
    newest last: ``latest``)."""

    latest: StoredFit | None
    history: list[StoredFit] | None = None


def run_fits(session: Session, principal: Principal, run: RunOut, key: str | None, *,
             history: bool = False) -> RunFits:
    """``run``'s newest fit of ``key``; with ``history``, its newest :data:`HISTORY_FITS` fits
    (the newest fit among them). One read of the fits either way, none of the run.

    Raises as ``GET .../forecast?key=`` does (without ``history``) or ``.../forecast/history``
    (with): NotFound for a series the run does not log; InvalidInput for one no fit is made of.
    """
    if history:
        fits = fit_store.recent_fits(session, run=run, allowed_project=principal.project,
                                     limit=HISTORY_FITS, key=key)
        return RunFits(fits[-1] if fits else None, fits)
    return RunFits(fit_store.newest_fit(session, run=run, key=key,
                                        allowed_project=principal.project))


def run_page(session: Session, principal: Principal, run: RunOut, charts: Sequence[str],
             span: tuple[int | None, int | None], key: str | None = None,
             fits: RunFits | None = None) -> views.RunPage:
    """Everything the run page's ``charts`` need, for steps in ``span`` (``(None, None)``: all).

    ``run``: read by the caller (:func:`get_run`); ``fits``: its fits of ``key``, when the caller
    read them already (:func:`run_fits`, with the history if the charts draw the evolution),
    else read here when a chart draws a fit.

    The forecast is for the contract's horizon (the number the page prints), of the series
    ``key`` (default: the run's default series); its band reaches the loss chart's horizon
    (further ahead when the run plans no ``total_steps``).
    """
    drawn = "loss" in charts or "evolution" in charts
    if fits is None and drawn:
        fits = run_fits(session, principal, run, key, history="evolution" in charts)
    telemetry = [key for chart in charts if chart != "loss" for key in views.chart_keys(chart)]
    loss_keys = views.chart_keys("loss") if "loss" in charts else []
    if key is not None and loss_keys and key not in loss_keys:
        loss_keys.append(key)
    metrics = [
        *_series(session, principal, run.id, loss_keys, span, views.MAX_POINTS["loss"]),
        *_series(session, principal, run.id, telemetry, span, views.DEFAULT_MAX_POINTS),
    ]
    history = None
    if "evolution" in charts:
        assert fits is not None and fits.history is not None, "the evolution draws the history"
        history = _history(session, run, fits.history, key).model_dump(mode="json")
    latest = fits.latest if fits is not None else None
    forecast = answer_forecast(session, run, latest, key=key) if drawn else None
    end, _planned = chart_horizon(run.config, run.last_step)
    reached = loss_reached(session, run)
    return views.RunPage(
        run=run.model_dump(mode="json"),
        loss_reached=reached.model_dump(mode="json") if reached else None,
        metrics=metrics,
        forecast=forecast.model_dump(mode="json") if forecast else None,
        band=_band(latest, end, forecast.confidence) if forecast and "loss" in charts else [],
        history=history,
        alerts=[a.model_dump(mode="json") for a in run_alerts(session, principal, run).alerts],
    )


def _history(session: Session, run: RunOut, fits: Sequence[StoredFit], key: str | None
             ) -> ForecastHistory:
    """``GET .../forecast/history?key`` of ``fits`` (oldest first)."""
    return history_answer(
        run.id, fits, config=RunConfig.read(run.config), last_step=run.last_step, key=key,
        reached=forecast_store.reached_reader(session, run.id, run.last_step),
    )


def run_metrics(session: Session, settings: Settings, principal: Principal, run: RunOut,
                keys: Sequence[str] | None, start: int | None, max_points: int | None
                ) -> MetricsOut:
    """``GET .../metrics?keys&start&max_points`` as the live poll reads it: every key the
    page's charts draw, logged yet or not (absent: an empty series, where REST answers 404);
    no keys, no points."""
    if not keys:
        return MetricsOut(run_id=run.id, series=[])
    return metric_reads.read_series(
        session, run_id=run.id, keys=list(keys), start=start, end=None, max_points=max_points,
        allowed_project=principal.project, max_raw_points=settings.max_read_points,
        require_keys=False)


def run_alerts(session: Session, principal: Principal, run: RunOut) -> AlertList:
    """``GET .../alerts``: ``run``'s newest :data:`RUN_ALERTS` alerts."""
    return alert_store.list_alerts(session, project=None, run_id=run.id, state=None,
                                   limit=RUN_ALERTS, allowed_project=principal.project)


def loss_reached(session: Session, run: RunOut) -> LossReachedOut | None:
    """The run page's "Train loss reached" card (:func:`store.dashboard.run_loss_reached`)."""
    return dashboard_store.run_loss_reached(session, run.id)


def compare_runs(session: Session, principal: Principal, run_ids: Sequence[uuid.UUID],
                 horizon: int | None, span: tuple[int | None, int | None],
                 key: str | None = None) -> tuple[list[views.CompareRun], int | None]:
    """Each run's loss and its forecast to a common horizon (as asked, else
    :func:`views.common_horizon`), and that horizon.

    With ``key`` every run is compared on that series (a run that does not log it is shown
    as such); without, on the series :func:`_fits_on_one_series` picks.
    """
    runs = [get_run(session, principal, i) for i in run_ids]
    common = views.common_horizon([r.model_dump(mode="json") for r in runs], horizon)
    if key is None:
        fits = _fits_on_one_series(session, principal, runs)
        logged = [True] * len(runs)
    else:
        fits, logged = [], []
        for run in runs:
            try:  # one statement: the run's newest fit of the series, and whether it has one
                fits.append(fit_store.newest_fit(session, run=run, key=key,
                                                 allowed_project=principal.project))
                logged.append(True)
            except NotFound:  # the run does not log this series
                fits.append(None)
                logged.append(False)
    out = []
    for run, stored, logs in zip(runs, fits, logged, strict=True):
        keys = views.chart_keys("loss")
        for wanted in (stored.key if stored is not None else None, key):  # the fit's, the asked
            if wanted is not None and wanted not in keys:
                keys.append(wanted)
        forecast = answer_forecast(session, run, stored, common, key=key)
        out.append(views.CompareRun(
            run=run.model_dump(mode="json"),
            metrics=_series(session, principal, run.id, keys, span, views.MAX_POINTS["compare"]),
            forecast=forecast.model_dump(mode="json"),
            band=_band(stored, common, forecast.confidence, COMPARE_BAND_SAMPLES),
            at_horizon=forecast.prediction.model_dump(mode="json") if forecast.prediction
            else None,
            key=key,
            logs_key=logs,
            loss_reached=reached.model_dump(mode="json")
            if (reached := loss_reached(session, run)) else None,
        ))
    return out, common


def _fits_on_one_series(session: Session, principal: Principal, runs: Sequence[RunOut]
                        ) -> list[StoredFit | None]:
    """Each run's latest fit, all of one series where the runs' own defaults differ.

    Runs are compared on the loss each is forecast on by default (an eval loss with enough
    points, else the training loss). Where those differ (one run evaluates rarely), the
    ranking would set one run's eval loss against another's training loss: the first series
    every run has a forecast on (the contract's order: eval losses, then ``loss``) is used
    instead.
    Where there is none, the defaults stay, and the verdict says the series differ.
    """
    fits = [fit_store.newest_fit(session, run=run, allowed_project=principal.project)
            for run in runs]
    if len({f.key for f in fits if f is not None}) <= 1:
        return fits
    for key in LOSS_KEYS:
        shared: list[StoredFit | None] = []
        for run in runs:
            try:
                stored = fit_store.newest_fit(session, run=run, key=key,
                                              allowed_project=principal.project)
            except NotFound:  # the run does not log this series
                break
            if stored is None or not stored.fit.has_forecast:  # e.g. 5 eval points
                break
            shared.append(stored)
        else:
            return shared
    return fits


def default_fit_key(session: Session, principal: Principal, run: RunOut) -> str | None:
    """The series ``run``'s forecast is of when nobody chose one (None before its first fit)."""
    stored = fit_store.newest_fit(session, run=run, allowed_project=principal.project)
    return stored.key if stored is not None else None


def loss_series(session: Session, runs: Sequence[RunOut]) -> list[tuple[str, int]]:
    """The series the pages offer to forecast ``runs`` on (the run page's and the compare
    page's "Series" lists): every series a forecast may fit (the contract's loss names, and
    the runs' own ``fit_key``) that one of the runs logs, in the contract's order, each with
    how many of the runs log it."""
    candidates = list(LOSS_KEYS)
    for run in runs:
        for key in fit_candidates(RunConfig.read(run.config)):
            if key not in candidates:
                candidates.append(key)
    has = metric_reads.logged_keys(session, run_ids=[r.id for r in runs], keys=candidates)
    counts = [(key, sum(key in keys for keys in has.values())) for key in candidates]
    return [(key, n) for key, n in counts if n]


def runs_rows(session: Session, principal: Principal, project: str | None,
              status: RunStatus | None, page_token: str | None
              ) -> tuple[list[dict[str, Any]], str | None]:
    """The runs list's rows (newest runs first) and the next page's token."""
    summaries, next_token = dashboard_store.run_summaries(
        session, project=project, status=status, limit=RUNS_PER_PAGE, page_token=page_token,
        allowed_project=principal.project)
    items = []
    for s in summaries:
        forecast = (answer_forecast(session, s.run, s.latest_fit) if s.latest_fit is not None
                    else None)
        items.append({
            "run": s.run.model_dump(mode="json"),
            "last_loss": s.last_loss,
            "loss_key": s.loss_key,
            "spark_steps": s.spark_steps,
            "spark_values": s.spark_values,
            "forecast": forecast.model_dump(mode="json") if forecast is not None else None,
            "firing": s.firing_alerts,
        })
    return views.runs_rows(items), next_token


def alerts_rows(session: Session, principal: Principal, project: str | None,
                state: str | None) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The alerts page's rows across the runs the caller may see (of ``project``, in
    ``state``, when given; the newest :data:`ALERTS_PER_STATE` of each state), and how many
    of them are in each state."""
    found: list[AlertOut] = []
    for wanted in [state] if state else lists.ALERT_STATES:
        found += alert_store.list_alerts(session, project=project, run_id=None, state=wanted,
                                         limit=ALERTS_PER_STATE,
                                         allowed_project=principal.project).alerts
    names = dashboard_store.run_names(session, list({a.run_id for a in found}))
    alerts = [a.model_dump(mode="json") for a in found]
    rows = lists.alert_rows(alerts, {str(k): v for k, v in names.items()}, utcnow())
    return rows, lists.alert_counts(alerts)


def project_rows(session: Session, principal: Principal, name: str | None = None
                 ) -> list[dict[str, Any]]:
    """The projects page's rows (every project the caller may see, or only ``name``: NotFound
    when it does not exist or is not the caller's), from ``GET /api/v1/projects``'s answer."""
    overviews = project_store.project_overviews(session, allowed_project=principal.project,
                                                name=name)
    return lists.project_rows([p.model_dump() for p in overviews], utcnow())


def project_ranking(session: Session, principal: Principal, project: str) -> RankingOut:
    """A project page's leaderboard: ``GET /api/v1/projects/{project}/ranking``'s answer."""
    return ranking_answer(project, decision_store.project_runs(
        session, project=project, allowed_project=principal.project))
