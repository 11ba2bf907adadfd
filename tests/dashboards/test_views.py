"""Page compositions without HTTP: the run page's forecast card and payload, the compare
page's rows and ranking, the runs list, formatting and escaping, from data shaped like the REST
API's answers."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import plotly.graph_objects as go
import pytest

from curvecast.contract import RunConfig
from curvecast.dashboards import figures, fmt, html, views
from curvecast.dashboards.data import chart_horizon
from curvecast.dashboards.sparkline import sparkline_path
from tests.dashboards._payloads import BAND, CONFIG, FORECAST, by_role, downsampled, raw

pytestmark = pytest.mark.usefixtures("validate_figures")


def test_the_forecast_card_says_what_the_run_reached_at_the_horizon() -> None:
    """The loss reached is the answer's ``prediction.reached`` (the logged point, where the
    page's own series of a long run holds block means)."""
    def card(eval_steps: list[int]) -> str:
        got_there = eval_steps[-1] >= 20_000
        page = views.RunPage(
            run={"id": "r", "config": {"total_steps": 20_000}, "last_step": eval_steps[-1]},
            metrics=[downsampled("loss"), raw("eval_loss", eval_steps,
                                              [2.9 - 2e-5 * s for s in eval_steps])],
            forecast=dict(FORECAST, key="eval_loss", prediction=dict(
                FORECAST["prediction"], reached=2.5 if got_there else None)))
        return next(k.detail for k in views.run_kpis(page) if k.id == "forecast")

    assert card([5000, 20_000]).endswith("; reached 2.5 there")  # the prediction is at 20,000
    # The card names its series: an eval-loss forecast above the training loss on the card
    # beside it read as a loss going up.
    page = views.RunPage(run={"id": "r", "config": {"total_steps": 20_000}, "last_step": 5000},
                         metrics=[downsampled("loss")], forecast=dict(FORECAST, key="eval_loss"))
    labels = {k.id: k.label for k in views.run_kpis(page)}
    assert labels["forecast"] == "Forecast of eval_loss at 20k"
    assert labels["f_star"] == "f* of eval_loss"  # the same series' asymptote
    assert "reached" not in card([5000, 10_000])
    # Before the status's long explanation: the card shows two lines of its detail (a finished
    # 600-step run's "reached" was cut off behind "no asymptote yet: ...").
    page = views.RunPage(
        run={"id": "r", "config": {"total_steps": 20_000}, "last_step": 20_000},
        metrics=[downsampled("loss"), raw("eval_loss", [5000, 20_000], [2.8, 2.5])],
        forecast=dict(FORECAST, key="eval_loss", status="no_asymptote",
                      prediction=dict(FORECAST["prediction"], reached=2.5)))
    detail = next(k.detail for k in views.run_kpis(page) if k.id == "forecast")
    assert detail.startswith("90% interval [2.38, 2.47]; reached 2.5 there; no asymptote yet")


@pytest.mark.parametrize("status", ["crashed", "failed", "finished"])
def test_the_forecast_card_of_a_run_that_ended_early_says_it_will_not_get_there(
        status: str) -> None:
    """A run that ended before the forecast's step (crashed, failed, or finished early) keeps
    its forecast (it may be resumed), named as where it was heading: the compare page leaves
    such a run out of the ranking, and the card showed the number as if the run were going on."""
    def card(run_status: str) -> str:
        page = views.RunPage(
            run={"id": "r", "config": {"total_steps": 20_000}, "last_step": 8_000,
                 "status": run_status},
            metrics=[downsampled("loss"), raw("eval_loss", [4000, 8000], [2.7, 2.6])],
            forecast=dict(FORECAST, key="eval_loss"))
        return next(k.detail for k in views.run_kpis(page) if k.id == "forecast")

    assert card(status).endswith(
        f"; the run {status} at step 8,000: where it was heading, had it gone on")
    assert "heading" not in card("running")
    # A run whose client went silent is not heading anywhere live either.
    assert card("lost").endswith("; the run was lost (its client went silent) at step 8,000: "
                                 "where it was heading, had it gone on")


def test_run_payload_is_json_with_kpis_and_cursor() -> None:
    page = views.RunPage(
        run={"id": "r", "name": "n", "config": CONFIG, "last_step": 10_000, "status": "running"},
        metrics=[downsampled("loss"), raw("eval_loss", [5000, 10_000], [2.7, 2.55])],
        forecast=FORECAST, band=BAND, history={"horizon": 20_000, "points": []},
    )
    body = json.loads(views.run_payload(page, list(views.RUN_CHARTS), None))
    assert set(body["charts"]) == set(views.RUN_CHARTS)
    assert body["state"]["cursor"] == {"loss": 10_000.0, "eval_loss": 10_000.0}
    kpis = {k["id"]: k for k in body["kpis"]}
    assert kpis["forecast"]["value"] == "2.42" and kpis["forecast"]["label"].endswith("20k")
    assert kpis["f_star"]["value"] == "2" and "[1.95, 2.05]" in kpis["f_star"]["detail"]
    assert kpis["progress"]["detail"].startswith("of 20,000 planned (50%)")
    assert kpis["alerts"]["value"] == "0 firing"
    assert kpis["alerts"]["detail"] == "0 pending, 0 resolved"
    pending = views.RunPage(run={"id": "r", "config": {}, "last_step": None}, metrics=[],
                            forecast={"status": "pending", "message": "no fit yet"})
    kpis = {k.id: k for k in views.run_kpis(pending)}
    assert kpis["forecast"].value == "pending" and kpis["last_loss"].value == "—"
    # The headline says which loss it shows, and by which rule (the one the reads supply).
    reached = views.RunPage(run=page.run, metrics=page.metrics,
                            loss_reached={"key": "loss", "step": 10_000, "value": 2.4567})
    kpi = {k.id: k for k in views.run_kpis(reached)}["last_loss"]
    assert (kpi.label, kpi.value) == ("Train loss reached", "2.457")
    assert kpi.detail == ("at step 10,000, median of the last 1% of steps; "
                          "last eval loss 2.55 at step 10,000")
    only_eval = views.RunPage(run={"id": "r", "config": {}, "last_step": 500},
                              metrics=[raw("eval_loss", [250, 500], [3.1, 2.9])],
                              loss_reached={"key": "eval_loss", "step": 500, "value": 2.9})
    kpi = {k.id: k for k in views.run_kpis(only_eval)}["last_loss"]
    assert (kpi.label, kpi.value) == ("eval_loss reached", "2.9")
    assert kpi.detail.endswith("; no training loss logged")
    diverged = views.RunPage(run=page.run, loss_reached={"key": "loss", "step": 9,
                                                         "value": "NaN"})
    assert {k.id: k for k in views.run_kpis(diverged)}["last_loss"].tone == "bad"


def test_compare_rows_name_train_and_eval_losses() -> None:
    runs = [views.CompareRun(run={"id": "a", "name": "a", "status": "running",
                                  "last_step": 10_000},
                             metrics=[downsampled("loss"),
                                      raw("eval_loss", [5000, 10_000], [2.7, 2.55])],
                             forecast=dict(FORECAST, key="eval_loss"), band=BAND,
                             at_horizon={"step": 20_000, "value": 2.42, "lo": 2.38,
                                         "hi": 2.47},
                             loss_reached={"key": "loss", "step": 10_000, "value": 2.61}),
            views.CompareRun(run={"id": "b", "name": "b", "status": "running",
                                  "last_step": 10_000},
                             metrics=[downsampled("loss")], forecast=None, band=[],
                             at_horizon=None)]
    body = json.loads(views.compare_payload(runs, 20_000))
    rows = {r["run_id"]: r for r in body["rows"]}
    assert rows["a"]["last_eval_loss"] == "2.55" and rows["b"]["last_eval_loss"] == "—"
    # The training loss reached is the store's (the run page's card), not the chart's last point.
    assert (rows["a"]["loss_reached"], rows["b"]["loss_reached"]) == (fmt.loss(2.61), "—")
    # Run a draws its eval loss (its forecast's key), b its training loss.
    assert body["charts"]["compare"]["layout"]["yaxis"]["title"]["text"] == (
        "loss (eval or training)")
    assert figures.compare.loss_title(["eval_loss"]) == "eval loss"
    assert figures.compare.loss_title(["loss"]) == "training loss"


def test_runs_of_one_name_are_told_apart_by_their_short_ids() -> None:
    """The reported bug: two runs of one script (both "charlm-stdlib") gave the verdict "At
    step 600 the forecasts say charlm-stdlib will be best ... Ended before step 600:
    charlm-stdlib", and "charlm-stdlib" twice in the legend and the table. A name shared on the
    page carries the run's short id everywhere; a unique one stays as typed."""
    def run(run_id: str, name: str, value: float) -> views.CompareRun:
        return views.CompareRun(
            run={"id": run_id, "name": name, "status": "running", "last_step": 10_000},
            metrics=[downsampled("loss")], forecast=FORECAST, band=BAND,
            at_horizon={"step": 20_000, "value": value, "lo": value - 0.04,
                        "hi": value + 0.04})

    runs = [run("82c063bc-1ae3", "lm", 2.42), run("ff21cdab-43f6", "lm", 2.6),
            run("0a1b2c3d-4e5f", "other", 2.7)]
    body = json.loads(views.compare_payload(runs, 20_000))
    assert [r["name"] for r in body["rows"]] == ["lm (82c063bc)", "lm (ff21cdab)", "other"]
    assert body["verdict"]["message"].startswith(
        "At step 20,000 the forecasts say lm (82c063bc) will be best")
    assert "Runner-up lm (ff21cdab)" in body["verdict"]["message"]
    legend = {t.get("name") for t in body["charts"]["compare"]["data"]}
    assert {"lm (82c063bc)", "lm (ff21cdab)", "other"} <= legend
    assert figures.shared_names([r.run for r in runs]) == [True, True, False]
    assert figures.run_label({"id": "0123456789", "name": ""}, False) == "01234567"


def test_runs_that_got_to_the_horizon_are_ranked_by_the_loss_they_reached() -> None:
    """Two runs compared at a step both got to: each is ranked by the loss it had there (the
    eval loss it is fitted to), not by its fit, which the verdict, the table and the ranking
    chart give beside it; whether the winner is clear is read off the fits' intervals. (The
    verdict said "the forecasts say b will be best" of a step both runs were past, ranking
    by the fits' values against the losses reached, and the table showed the fits, where the
    runs list shows the loss reached.) A run not there yet is ranked by its forecast. The loss
    reached is the forecast answer's ``prediction.reached``, as on the runs list."""
    def run(run_id: str, last_eval: int, value: float, fit: float,
            horizon: int = 10_000) -> views.CompareRun:
        return views.CompareRun(
            run={"id": run_id, "name": run_id, "status": "running", "last_step": last_eval},
            metrics=[downsampled("loss"),
                     raw("eval_loss", [5000, 10_000, 12_000][:2 + (last_eval > 10_000)],
                         [2.7, value, value - 0.05][:2 + (last_eval > 10_000)])],
            forecast=dict(FORECAST, key="eval_loss"), band=BAND,
            at_horizon={"step": horizon, "value": fit, "lo": fit - 0.04, "hi": fit + 0.04,
                        "reached": value if horizon <= last_eval else None})

    # The fits rank b first (2.34 < 2.40); the losses reached rank a first (2.3 < 2.35).
    runs = [run("a", 10_000, 2.3, 2.40), run("b", 12_000, 2.35, 2.34)]
    body = json.loads(views.compare_payload(runs, 10_000))
    verdict = body["verdict"]
    assert verdict["message"] == (
        "At step 10,000 a has the lowest loss: 2.3 reached (fit 2.4 [2.36, 2.44]). Runner-up b: "
        "2.35 reached (fit 2.34 [2.3, 2.38]) — the fits' intervals there overlap: within the "
        "noise.")
    assert verdict["best"] == "a" and not verdict["clear"]
    rows = body["rows"]
    assert [(r["run_id"], r["forecast"], r["interval"]) for r in rows] == [
        ("a", "2.3", "reached @ 10k; fit 2.4"), ("b", "2.35", "reached @ 10k; fit 2.34")]
    (dots,) = go.Figure(body["charts"]["ranking"]).data
    assert list(dots.x) == [2.3, 2.35] and list(dots.marker.symbol) == ["circle", "circle"]
    assert list(dots.error_x.array) == [0, 0]  # data, not a forecast: no error bar
    assert "reached or forecast" in body["charts"]["ranking"]["layout"]["title"]["text"]

    # Losses that show alike in the table (4 significant digits) both get the "best" badge.
    tied = json.loads(views.compare_payload([run("a", 10_000, 2.3, 2.40),
                                             run("b", 12_000, 2.30001, 2.34),
                                             run("c", 12_000, 2.301, 2.35)], 10_000))
    assert {r["run_id"]: r["best"] for r in tied["rows"]} == {"a": True, "b": True, "c": False}
    assert tied["verdict"]["best"] == "a"

    # Far apart, the fits' intervals do not overlap: a clear winner.
    apart = json.loads(views.compare_payload([run("a", 10_000, 2.3, 2.31),
                                              run("b", 12_000, 2.5, 2.51)], 10_000))
    assert apart["verdict"]["clear"]
    assert apart["verdict"]["message"].endswith("the fits' intervals there do not overlap.")

    # At a step neither got to, both are ranked by their forecasts, in the future tense.
    later = json.loads(views.compare_payload([run("a", 10_000, 2.3, 2.40, 15_000),
                                              run("b", 12_000, 2.35, 2.34, 15_000)], 15_000))
    assert later["verdict"]["message"].startswith(
        "At step 15,000 the forecasts say b will be best: 2.34 [2.3, 2.38].")
    assert "reached" not in later["verdict"]["message"]


def test_runs_left_on_different_series_are_not_called_a_clear_win() -> None:
    """Where no series has a forecast in every run (the page tries one first), the ranking sets
    an eval loss against a training loss: it says so, and names no clear winner."""
    def run(run_id: str, key: str, fit: float) -> views.CompareRun:
        return views.CompareRun(
            run={"id": run_id, "name": run_id, "status": "running", "last_step": 5000},
            metrics=[downsampled("loss"), raw("eval_loss", [2500, 5000], [2.9, 2.8])],
            forecast=dict(FORECAST, key=key), band=BAND,
            at_horizon={"step": 20_000, "value": fit, "lo": fit - 0.01, "hi": fit + 0.01})

    verdict = json.loads(views.compare_payload(
        [run("a", "eval_loss", 2.6), run("b", "loss", 2.2)], 20_000))["verdict"]
    assert verdict["best"] == "b" and not verdict["clear"]  # the intervals do not overlap
    assert ("Not like with like: the runs are forecast on different series (b: loss; a: "
            "eval_loss)") in verdict["message"]
    same = json.loads(views.compare_payload(
        [run("a", "loss", 2.6), run("b", "loss", 2.2)], 20_000))["verdict"]
    assert same["clear"] and "like with like" not in same["message"]


def test_a_run_that_ended_before_the_horizon_is_not_forecast_past_its_end() -> None:
    """Comparing at step 20,000 a run that finished at 10,000 (it will never have a loss
    there) with one still running: the ended run keeps its line, gets no forecast curve, band
    or diamond, is not ranked, and the verdict names its last loss and step instead."""
    at = {"step": 20_000, "value": 2.1, "lo": 2.05, "hi": 2.15}

    def run(name: str, status: str) -> views.CompareRun:
        return views.CompareRun(
            run={"id": name, "name": name, "status": status, "last_step": 10_000},
            metrics=[downsampled("loss"), raw("eval_loss", [5000, 10_000], [2.7, 2.55])],
            forecast=dict(FORECAST, key="eval_loss"), band=BAND, at_horizon=at)

    runs = [run("done", "finished"), run("live", "running")]
    body = json.loads(views.compare_payload(runs, 20_000))
    verdict = body["verdict"]
    assert ("Ended before step 20,000, so not forecast past their end: done (eval_loss 2.55 "
            "at step 10,000).") in verdict["message"]
    # The one run left is not "best": there is nothing to rank it against (it said "live
    # will be best"); the verdict says at which step all can be compared.
    assert verdict["best"] is None
    assert verdict["message"].startswith(
        "At step 20,000 only live has a forecast: 2.1 [2.05, 2.15]; nothing to rank it against. "
        "To compare them all, forecast to step 10,000 or earlier.")
    rows = {r["run_id"]: r for r in body["rows"]}
    assert rows["done"]["forecast"] == "—" and rows["done"]["interval"] == "ended at step 10,000"
    assert rows["live"]["forecast"] == fmt.loss(2.1)
    entries = views.compare_entries(runs)
    compare = figures.compare_figure(entries, 20_000).figure()
    derived = {(t.meta["run"], t.meta["role"]) for t in compare.data
               if t.meta.get("role") in ("forecast", "prediction", "band_hi")}
    assert derived == {(1, "forecast"), (1, "prediction"), (1, "band_hi")}
    ranking = figures.rank_forecasts(entries, 20_000)
    assert ranking.ended == [0] and ranking.order == [1, 0]
    # An ended run without a forecast at any step (its loss went NaN: diverged) gets no advice
    # to forecast to its end: it would have none there either.
    nan_run = views.CompareRun(
        run={"id": "nan", "name": "nan", "status": "finished", "last_step": 10_000},
        metrics=[downsampled("loss")], forecast=dict(FORECAST, status="diverged", a=None,
                                                     b=None, c=None, prediction=None),
        band=[], at_horizon=None)
    nan_body = json.loads(views.compare_payload([nan_run, runs[1]], 20_000))
    verdict = nan_body["verdict"]
    assert verdict["message"].startswith("At step 20,000 only live has a forecast")
    assert "To compare them all" not in verdict["message"]
    # It is named as diverged, in the verdict and on its row (it said "loss NaN at step …"
    # and "ended at step …", with nothing to tell a crash from a divergence).
    assert re.search(r"nan \(loss \S+ at step [\d,]+: diverged\)", verdict["message"])
    assert {r["run_id"]: r["interval"] for r in nan_body["rows"]}["nan"] == (
        "diverged; ended at step 10,000")
    (dots,) = figures.ranking_figure(entries, ranking).figure().data
    assert list(dots.y) == ["live"]
    # At a horizon both reached, both are compared as before.
    assert figures.rank_forecasts(entries, 10_000).order == [0, 1]
    # Every run ended before the horizon: nothing ranked, the verdict says what to do.
    alone = figures.rank_forecasts(entries[:1], 20_000)
    assert alone.best is None and "choose an earlier horizon" in alone.message


def test_burn_in_and_horizon_come_from_the_config() -> None:
    def burn_in(config: dict[str, Any]) -> int | None:
        return RunConfig.read(config).averaging_start

    assert burn_in({"c_warmup": 400, "warmup_steps": 100}) == 400
    assert burn_in({"warmup_steps": 100}) == 200
    assert burn_in({}) is None and burn_in({"c_warmup": True}) is None
    assert chart_horizon({"total_steps": 5000}, 100) == (5000, True)
    assert chart_horizon({}, 100) == (200, False)
    assert chart_horizon({}, None) == (None, False)
    assert views.band_steps(1000.0, 2000)[0] == 1000 and views.band_steps(1000.0, 2000)[-1] == 2000
    assert views.band_steps(3000.0, 2000) == [] and views.band_steps(None, 2000) == []


def test_script_json_cannot_close_the_script_element() -> None:
    name = "</script><script>alert(1)</script>&<!--"
    text = str(html.script_json({"name": name, "line": "\u2028"}))
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"name": name, "line": "\u2028"}
    with pytest.raises(ValueError):
        html.script_json({"x": math.nan})


def test_templates_escape_user_text() -> None:
    body = html.render("error.html", title="<t>", status=404, message="<script>x</script>",
                       auth=False, config={"page": "error"})
    assert "<script>x</script>" not in body and "&lt;script&gt;x&lt;/script&gt;" in body


def test_sparkline_is_numbers_only() -> None:
    steps = list(range(40))
    values = [10.0] + [3 - i * 0.01 for i in range(1, 40)]
    values[5] = math.nan
    path = sparkline_path(steps, values)
    assert re.fullmatch(r"[ML0-9. ]+", path)
    assert path.count("M") == 2  # the NaN breaks the line
    ys = [float(p.split()[1]) for p in re.findall(r"[ML]([0-9.]+ [0-9.]+)", path)]
    assert min(ys) >= 2.0 and max(ys) <= 26.0
    assert sparkline_path([1], [1.0]) == "" and sparkline_path([1, 2], [math.inf, 1.0]) == ""


def test_runs_rows() -> None:
    rows = views.runs_rows([
        {"run": {"id": "a", "name": "<b>x</b>", "project": "p", "status": "running",
                 "last_step": 1234, "updated_at": "2026-01-01T00:00:00+00:00",
                 "config": {"total_steps": 20_000}},
         "last_loss": 2.5, "spark_steps": [0, 1, 2], "spark_values": [3.0, 2.8, 2.5],
         "forecast": FORECAST, "firing": 2},
        {"run": {"id": "b", "name": "y", "project": "p", "status": "finished",
                 "last_step": None}, "last_loss": None, "forecast": None, "firing": None},
    ])
    assert rows[0]["forecast"] == "2.42" and rows[0]["forecast_detail"] == "[2.38, 2.47] @ 20k"
    assert rows[0]["f_star"] == "2" and rows[0]["firing"] == "2" and rows[0]["spark"]
    assert rows[0]["last_step"] == "1,234" and float(rows[0]["last_loss_sort"]) == 2.5
    assert rows[1]["forecast"] == "pending" and rows[1]["firing"] == "—"
    assert rows[1]["last_loss_sort"] == "" and rows[1]["spark"] == ""
    assert rows[0]["last_loss_key"] == ""  # the training loss: the column's own
    # A run that got to the forecast's step: the loss it reached there, the fit beside it.
    (done,) = views.runs_rows([{"run": {"id": "d", "name": "d", "status": "finished",
                                        "last_step": 20_000},
                                "forecast": dict(FORECAST, prediction=dict(
                                    FORECAST["prediction"], reached=2.451))}])
    assert done["forecast"] == "2.451" and done["forecast_detail"] == "reached @ 20k; fit 2.42"
    assert float(done["forecast_sort"]) == 2.451
    # Forecasts of different series on one page (one run evaluates, one does not): each cell
    # names its series; where they are all of one, none does (as above).
    mixed = views.runs_rows([{"run": {"id": i, "name": i, "last_step": 10,
                                      "config": {"total_steps": 20_000}},
                              "forecast": dict(FORECAST, key=key)}
                             for i, key in (("e", "eval_loss"), ("t", "loss"))])
    assert [r["forecast_detail"] for r in mixed] == ["[2.38, 2.47] @ 20k · eval_loss",
                                                     "[2.38, 2.47] @ 20k · loss"]
    # ... and a forecast of an eval loss is named beside the training loss column even alone
    # (the demo's finished run: "1.359 reached" next to a last train loss of 1.233).
    (evaluated,) = views.runs_rows([{"run": {"id": "v", "name": "v", "status": "finished",
                                             "last_step": 20_000},
                                     "last_loss": 2.3,
                                     "forecast": dict(FORECAST, key="eval_loss", prediction=dict(
                                         FORECAST["prediction"], reached=2.451))}])
    assert evaluated["forecast_detail"] == "reached @ 20k; fit 2.42 · eval_loss"
    # A running run with no planned end: its forecast's horizon is the step just logged, so
    # there is no final to show (the cell showed the loss just logged as "reached"); once it
    # has ended, its last step is its end.
    at_last = dict(FORECAST, prediction=dict(FORECAST["prediction"], step=1234, reached=2.5))
    (open_ended,) = views.runs_rows([{"run": {"id": "o", "name": "o", "status": "running",
                                              "last_step": 1234, "config": {}},
                                      "forecast": at_last}])
    assert (open_ended["forecast"], open_ended["forecast_detail"]) == (
        "—", "no planned end (total_steps)")
    (ended,) = views.runs_rows([{"run": {"id": "o", "name": "o", "status": "finished",
                                         "last_step": 1234, "config": {}},
                                 "forecast": at_last}])
    assert ended["forecast"] == "2.5" and ended["forecast_detail"] == "reached @ 1.23k; fit 2.42"
    # A run that stopped short of the forecast's step (failed, crashed, lost): no final, and
    # why; one that failed after getting there keeps the loss it reached.
    for status in ("failed", "crashed", "lost"):
        (stopped,) = views.runs_rows([{"run": {"id": "s", "name": "s", "status": status,
                                               "last_step": 284,
                                               "config": {"total_steps": 20_000}},
                                       "forecast": FORECAST}])
        assert (stopped["forecast"], stopped["forecast_detail"]) == ("—", f"{status} at step 284")
    (late,) = views.runs_rows([{"run": {"id": "f", "name": "f", "status": "failed",
                                        "last_step": 20_000},
                                "forecast": dict(FORECAST, prediction=dict(
                                    FORECAST["prediction"], reached=2.451))}])
    assert late["forecast"] == "2.451"
    (nan,) = views.runs_rows([{"run": {"id": "n", "name": "n", "last_step": 2_000},
                               "forecast": dict(FORECAST, status="diverged", a=None, b=None,
                                                c=None, prediction=None)}])
    assert nan["forecast"] == "—" and nan["forecast_detail"] == "diverged"
    (only_eval,) = views.runs_rows([{"run": {"id": "c", "name": "c", "last_step": 10},
                                     "last_loss": 2.9, "loss_key": "val_loss"}])
    assert only_eval["last_loss"] == "2.9" and only_eval["last_loss_key"] == "val_loss"
    # A script run twice: the rows of one name carry their short ids (a nameless row, which the
    # service never stores, would show its short id).
    twice = views.runs_rows([{"run": {"id": i, "name": name, "last_step": 10}}
                             for i, name in (("82c063bc-1", "lm"), ("ff21cdab-2", "lm"),
                                             ("0a1b2c3d-3", "x"), ("9f8e7d6c-4", None))])
    assert [r["name"] for r in twice] == ["lm (82c063bc)", "lm (ff21cdab)", "x", "9f8e7d6c"]


def test_formatting() -> None:
    assert fmt.loss(2.345678) == "2.346" and fmt.loss(math.nan) == "NaN"
    assert fmt.loss(math.inf) == "∞" and fmt.loss(None) == "—"
    assert fmt.interval(1.0, math.inf) == "[1, …]"
    assert fmt.short_step(20_000) == "20k" and fmt.short_step(1_500_000) == "1.5M"
    assert fmt.step(1234567) == "1,234,567"
    assert fmt.duration(30) == "30 s" and fmt.duration(3 * 3600 + 600) == "3 h 10 min"
    assert fmt.esc("<a & b>") == "&lt;a &amp; b&gt;"


def test_headline_and_chart_tell_the_statuses_truth() -> None:
    """A fit whose f* is not identifiable: no f* line on the chart, the card says "at most";
    a flat fit (b null) is a fit, not "no fit yet"; too_early names the useful step."""
    metrics = [downsampled("loss")]
    no_asym = dict(FORECAST, status="no_asymptote", c=0.0,
                   f_star={"value": None, "lo": 0.0, "hi": 2.5})
    page = views.RunPage(run={"id": "r", "config": CONFIG, "last_step": 10_000},
                         metrics=metrics, forecast=no_asym, band=BAND)
    kpis = {k.id: k for k in views.run_kpis(page)}
    assert kpis["f_star"].value == "—" and "at most 2.5" in kpis["f_star"].detail
    assert kpis["f_star"].label == f"f* of {no_asym['key']}"
    assert "no asymptote" in kpis["fit"].value and kpis["forecast"].value == "2.42"
    roles = by_role(views.run_figures(page, ["loss"])["loss"].figure())
    assert "f_star" not in roles and "forecast" in roles
    flat = dict(FORECAST, status="flat", a=0.0, b=None, c=2.5,
                f_star={"value": 2.5, "lo": 2.4, "hi": 2.6},
                prediction={"step": 20_000, "value": 2.5, "lo": 2.4, "hi": 2.6})
    page = views.RunPage(run={"id": "r", "config": CONFIG, "last_step": 10_000},
                         metrics=metrics, forecast=flat, band=BAND)
    kpis = {k.id: k for k in views.run_kpis(page)}
    assert kpis["forecast"].value == "2.5" and kpis["f_star"].value == "2.5"
    early = dict(FORECAST, status="too_early", useful_from_step=800.0,
                 f_star={"value": None, "lo": 0.0, "hi": 3.0})
    page = views.RunPage(run={"id": "r", "config": CONFIG, "last_step": 10_000},
                         metrics=metrics, forecast=early, band=BAND)
    kpis = {k.id: k for k in views.run_kpis(page)}
    assert kpis["forecast"].detail.endswith("; useful from step 800")
    assert kpis["forecast"].tone == "warn" and "too early" in kpis["f_star"].detail


def test_the_norms_chart_says_they_come_every_hundred_steps() -> None:
    """A ScheduleFree+ run 80 steps in has its step-size telemetry but no norms yet: the
    norms chart said only that watch() logs them, which a newcomer read as "not logged"."""
    page = views.RunPage(run={"id": "r", "config": {}, "last_step": 80, "status": "running"},
                         metrics=[raw("loss", [1, 80], [3.0, 2.0])], forecast=None)
    fig = views.run_figures(page, ["norms"])["norms"].figure()
    (note,) = [a.text for a in fig.layout.annotations if "no data yet" in (a.text or "")]
    assert note.replace("<br>", " ").endswith(
        "logs these for ScheduleFreePlus every 100 steps (norms_every)")
