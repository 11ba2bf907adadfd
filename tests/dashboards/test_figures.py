"""Figure builders without HTTP: data shaped like the REST API's answers in, figures out
(test_views.py: the pages' compositions of them)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from curvecast.contract import telemetry_prefix
from curvecast.dashboards import figures, palette, views
from curvecast.dashboards.data import SeriesData, series_by_key
from curvecast.dashboards.figures import base as figure_base
from tests.dashboards._payloads import BAND, CONFIG, FORECAST, by_role, downsampled, raw

pytestmark = pytest.mark.usefixtures("validate_figures")

OKABE_ITO = {palette.BLACK, palette.ORANGE, palette.SKY, palette.GREEN, palette.YELLOW,
             palette.BLUE, palette.VERMILLION, palette.PURPLE, palette.GREY}


def trace_colours(fig: go.Figure) -> set[str]:
    colours = set()
    for trace in fig.data:
        line = getattr(trace, "line", None)
        if line is not None and line.color and line.width != 0:
            colours.add(line.color)
    return colours


def test_loss_figure_has_data_fit_forecast_band_fstar_and_burn_in() -> None:
    fig = figures.loss_figure(
        train=downsampled("loss"), evaluation=raw("eval_loss", [1000, 5000, 10_000],
                                                  [3.0, 2.7, 2.55]),
        forecast=FORECAST, band=BAND, config=CONFIG, horizon=20_000,
    ).figure()
    roles = by_role(fig)
    assert {"min", "max", "last", "fit", "band_lo", "band_hi", "forecast", "f_star",
            "prediction"} <= set(roles)
    # The downsampled series is drawn as a min-max band under the last-value line, so the
    # spike inside bucket 20 is visible.
    band_max = roles["max"][0]
    assert band_max.fill == "tonexty" and max(band_max.y) == pytest.approx(9.5)
    assert {t.meta["key"] for t in roles["last"]} == {"loss", "eval_loss"}
    # The forecast runs from the last fitted step to the horizon; the fit from the burn-in on.
    forecast = roles["forecast"][0]
    assert forecast.x[0] == pytest.approx(10_000) and forecast.x[-1] == pytest.approx(20_000)
    assert forecast.y[-1] == pytest.approx(60 / math.sqrt(20_300) + 2)
    assert roles["fit"][0].x[0] == pytest.approx(400)
    assert list(roles["band_hi"][0].y) == pytest.approx([p["hi"] for p in BAND])
    assert list(roles["f_star"][0].y) == [2.0, 2.0]
    assert roles["prediction"][0].x[0] == 20_000
    burn = [s for s in fig.layout.shapes if s.type == "rect" and s.yref == "paper"]
    assert burn and burn[0].x0 == 100 and burn[0].x1 == 400
    assert fig.layout.xaxis.range[1] >= 20_000
    assert fig.layout.meta["chart"] == "loss"
    assert fig.layout.yaxis.title.text == "loss" and fig.layout.xaxis.title.text == "step"
    assert trace_colours(fig) <= OKABE_ITO
    labels = [b.label for m in fig.layout.updatemenus for b in m.buttons]
    assert {"linear y", "log y", "linear x", "log x"} <= set(labels)


def test_a_transient_forecast_line_is_the_forecast_not_the_fitted_curve() -> None:
    """``too_early``: the answers extend the current loss (the band and the diamond), and the
    fitted curve is not the forecast. The dashed line was the fitted curve: on the demo run at
    48% it ended at 1.15 beside the forecast's 1.41 [1.19, 1.68] at the same step. It now runs
    through the band's central values, on the run page and on the compare page; an ``ok`` fit
    keeps its smooth fitted curve."""
    band = [{"step": s, "value": 2.5 - 0.05 * i, "lo": 2.2 - 0.1 * i, "hi": 2.6 - 0.02 * i}
            for i, s in enumerate((10_000, 12_000, 15_000, 20_000))]
    early = dict(FORECAST, status="too_early", prediction={"step": 20_000, "value": 2.35,
                                                          "lo": 1.9, "hi": 2.54})
    for fit, band_mid in ((early, True), (FORECAST, False)):
        fig = figures.loss_figure(train=downsampled("loss"), forecast=fit, band=band,
                                  config=CONFIG, horizon=20_000).figure()
        line = by_role(fig)["forecast"][0]
        if band_mid:
            assert list(line.x) == [10_000, 12_000, 15_000, 20_000]
            assert line.y[-1] == pytest.approx(2.35) == by_role(fig)["prediction"][0].y[0]
        else:
            assert len(line.x) > 100 and line.y[-1] == pytest.approx(60 / math.sqrt(20_300) + 2)
    compare = figures.compare_figure(views.compare_entries([views.CompareRun(
        run={"id": "r", "name": "r", "status": "running", "last_step": 10_000},
        metrics=[downsampled("loss")], forecast=early, band=band,
        at_horizon=early["prediction"])]), 20_000).figure()
    line = by_role(compare)["forecast"][0]
    assert list(line.x)[-1] == 20_000 and line.y[-1] == pytest.approx(2.35)


def test_layout_keeps_buttons_legend_and_title_out_of_the_plot_and_the_toolbar() -> None:
    """Title at the figure's top-left (the toolbar takes the top-right), the linear/log
    buttons in the row under it just above the plot, the legend under the x axis."""
    series = telemetry()
    figs = [figures.loss_figure(train=downsampled("loss"), forecast=FORECAST, band=BAND,
                                config=CONFIG, horizon=20_000).figure(),
            figures.gradient_figure(series, config=CONFIG).figure(),
            figures.compare_figure([entry("a", 2.5, 2.45, 2.55)], 20_000).figure()]
    for fig in figs:
        layout = fig.layout
        assert (layout.title.xref, layout.title.x, layout.title.xanchor) == ("container", 0,
                                                                           "left")
        assert (layout.legend.yref, layout.legend.y, layout.legend.yanchor) == ("container", 0,
                                                                              "bottom")
        assert layout.legend.orientation == "h" and layout.xaxis.automargin
        assert layout.margin.t >= 60  # two rows: title and toolbar, then the buttons
        for menu in layout.updatemenus:
            assert (menu.x, menu.xanchor, menu.y, menu.yanchor) == (0, "left", 1, "bottom")
            assert menu.pad.b > 0
        pads = sorted(menu.pad.l for menu in layout.updatemenus)
        assert pads[0] == 0 and all(b - a >= 110 for a, b in zip(pads, pads[1:], strict=False))


def test_log_y_range_stays_near_the_losses() -> None:
    """Switching to log shows the data's decades, not a bound near zero (f*'s lower edge at
    1e-60 stretched the autoscaled axis over sixty decades)."""
    forecast = dict(FORECAST, f_star={"value": 2.0, "lo": 1e-60, "hi": 2.05})
    fig = figures.loss_figure(train=downsampled("loss"), forecast=forecast, band=BAND,
                              config=CONFIG, horizon=20_000).figure()
    log = fig.layout.updatemenus[0].buttons[1].args[0]
    assert log["yaxis.type"] == "log" and "yaxis.autorange" not in log
    lo, hi = (10 ** v for v in log["yaxis.range"])
    assert 1.5 < lo < 2.0 and 2.5 < hi < 10  # the losses and the forecast, f* (2), no 1e-60
    assert fig.layout.meta["ranges"]["yaxis"]["log"] == log["yaxis.range"]
    linear = fig.layout.updatemenus[0].buttons[0].args[0]
    assert linear["yaxis.range"] == list(fig.layout.yaxis.range)
    assert figure_base.log_range_of(None, [np.array([-1.0, 0.0])], [math.nan]) is None
    assert figure_base.log_range_of([1.0, 10.0], [], []) == pytest.approx([-0.05, 1.05])


def test_loss_figure_without_a_fit_and_with_non_finite_values() -> None:
    train = raw("loss", [0, 1, 2, 3], [5.0, "NaN", "Infinity", 4.0])
    fig = figures.loss_figure(train=train, forecast={"status": "pending", "a": None, "b": None,
                                                     "c": None}, config={}, horizon=None).figure()
    roles = by_role(fig)
    assert set(roles) == {"last"}
    y = list(roles["last"][0].y)
    assert y[0] == 5.0 and math.isnan(y[1]) and math.isnan(y[2]) and y[3] == 4.0


@pytest.mark.parametrize("status", ["running", "finished"])
def test_a_telemetry_chart_without_data_says_where_it_comes_from(status: str) -> None:
    """A run that logs no optimizer telemetry (another optimizer, no watch()): each chart said
    "no data yet", for a finished run too, with nothing on where such data come from."""
    page = views.RunPage(run={"id": "r", "config": {}, "last_step": 2000, "status": status},
                         metrics=[raw("loss", [1, 2000], [3.0, 2.0])], forecast=None)
    fig = views.run_figures(page, ["step_size"])["step_size"].figure()
    (note,) = [a.text for a in fig.layout.annotations if "opt/eta" in (a.text or "")]
    start = "this run logged no" if status == "finished" else "no data yet for"
    # Lines wrapped to fit a phone's chart (FigureBuilder.note); the words are the test's.
    assert note.replace("<br>", " ") == (f"{start} opt/eta, opt/alpha Monitor.watch(optimizer) "
                                         "logs these for ScheduleFreePlus")


def test_loss_figure_with_no_data_says_so() -> None:
    fig = figures.loss_figure(train=None, config={}, horizon=None).figure()
    assert any("no data yet" in a.text for a in fig.layout.annotations)
    assert [t.meta["role"] for t in fig.data] == ["last"]  # live updates can append to it


def test_zoomed_loss_figure_keeps_the_range() -> None:
    fig = figures.loss_figure(train=raw("loss", list(range(500, 600)), [2.5] * 100),
                              config=CONFIG, horizon=20_000, x_range=[500, 599]).figure()
    assert list(fig.layout.xaxis.range) == [500, 599]
    assert fig.layout.uirevision == "loss"


def test_every_trace_is_svg_scatter_whatever_its_length() -> None:
    # The pages load plotly.js's basic bundle, which has no WebGL (scattergl) traces.
    for n_buckets in (50, 1200, 3000):
        fig = figures.loss_figure(train=downsampled("loss", n_buckets=n_buckets), config={},
                                  horizon=None).figure()
        assert {t.type for t in fig.data} == {"scatter"}, n_buckets


def telemetry(prefix: str = "opt/") -> dict[str, SeriesData]:
    steps = list(range(0, 2000, 10))
    items = [raw(prefix + name, steps, [1.0 + i * 0.01 for i in range(len(steps))])
             for name in ("eta", "alpha", "grad_l1", "denom_ema", "x_l2", "y_l2", "z_l2", "c",
                          "sf_beta")]
    items.append(raw(prefix + "grad_l2", steps, [4.0] * len(steps)))
    return series_by_key(items)


def test_telemetry_figures() -> None:
    series = telemetry()
    step = figures.step_size_figure(series, config=CONFIG).figure()
    keys = {t.meta["key"]: t.yaxis for t in step.data}
    assert keys == {"opt/eta": "y", "opt/alpha": "y2"}
    assert step.layout.yaxis2.overlaying == "y"
    grad = figures.gradient_figure(series, config=CONFIG).figure()
    assert {t.meta["key"] for t in grad.data} == {"opt/grad_l1", "opt/denom_ema"}
    avg = figures.averaging_figure(series, config=CONFIG).figure()
    assert avg.layout.yaxis.type == "log"  # c spans decades
    for fig in (step, grad, avg):
        assert fig.layout.yaxis.title.text and fig.layout.title.text
        assert trace_colours(fig) <= OKABE_ITO
        assert any(s.x1 == 400 for s in fig.layout.shapes)  # burn-in shaded everywhere


def test_norms_show_the_gradient_to_weight_ratio_without_a_steady_state_line() -> None:
    """‖g‖₂/‖z‖₂ on the right axis whenever both norms are logged, λ or not; no √(2λ) line:
    the raw ratio sits hundreds of times below it on real runs (docs/alerts.md)."""
    series = telemetry()
    for config in (CONFIG, {}):
        fig = figures.norms_figure(series, config=config).figure()
        ratio = [t for t in fig.data if (t.meta or {}).get("role") == "ratio"]
        assert len(ratio) == 1 and ratio[0].yaxis == "y2"
        assert ratio[0].y[0] == pytest.approx(4.0 / 1.0)
        assert fig.layout.yaxis2.title.text == "‖g‖₂/‖z‖₂"
        assert not [s for s in fig.layout.shapes if s.type == "line" and s.yref == "y2"]
        assert not any("2λ" in (a.text or "") for a in fig.layout.annotations)
        # x = y = z until averaging starts: one line drawn, and the legend says why.
        names = [t.name for t in fig.data if t.showlegend is not False]
        assert "‖x‖₂ (= ‖z‖₂ until averaging)" in names
        assert "‖y‖₂ (= ‖z‖₂ until averaging)" in names
    # No gradient L2 norm logged: no ratio, no right axis.
    spec = figures.norms_figure({k: v for k, v in series.items() if "grad_l2" not in k},
                                config=CONFIG)
    assert not [t for t in spec.data if (t.get("meta") or {}).get("role") == "ratio"]
    assert "yaxis2" not in spec.layout


def test_telemetry_prefix_of_the_client_hook_is_recognised() -> None:
    assert telemetry_prefix(telemetry("opt/")) == "opt/"
    assert telemetry_prefix(telemetry("sfplus/")) == "sfplus/"
    assert telemetry_prefix([]) == "opt/"
    page = views.RunPage(run={"id": "r", "config": CONFIG, "last_step": 2000},
                         metrics=list(_as_api(telemetry("opt/"))))
    figs = views.run_figures(page, ["step_size"])
    assert {t.meta["key"] for t in figs["step_size"].figure().data} == {"opt/eta", "opt/alpha"}


def _as_api(series: dict[str, SeriesData]) -> Iterator[dict[str, Any]]:
    for s in series.values():
        yield raw(s.key, s.steps.astype(int).tolist(), s.values.tolist())


def test_alert_markers_are_escaped_and_coloured_by_state() -> None:
    alerts: list[dict[str, Any]] = [
        {"id": "1", "rule": "grad_norm_drift", "state": "firing", "severity": "warning",
         "summary": "<img src=x onerror=alert(1)>", "step": 5000, "value": 3.0},
        {"id": "2", "rule": "polyak", "state": "resolved", "summary": "ok", "step": 7000},
        {"id": "3", "rule": "no_step", "state": "pending", "summary": "no step", "step": None},
    ]
    fig = figures.loss_figure(train=downsampled("loss"), config={}, horizon=None,
                              alerts=alerts).figure()
    marks = [a for a in fig.layout.annotations if a.name == "alert"]
    assert [m.x for m in marks] == [5000, 7000]
    assert [m.bgcolor for m in marks] == [palette.VERMILLION, palette.GREY]
    assert "<img" not in marks[0].hovertext and "&lt;img" in marks[0].hovertext


def test_evolution_figure() -> None:
    history = {"run_id": "r", "horizon": 20_000, "points": [
        {"fitted_upto_step": s, "n_points": s, "status": "ok",
         "created_at": "2026-01-01T00:00:00Z",
         "final": {"step": 20_000, "value": v, "lo": v - w, "hi": v + w},
         "f_star": {"value": 2.0, "lo": 1.9, "hi": 2.1}}
        for s, v, w in ((1000, 2.6, 0.3), (2000, 2.5, 0.15), (4000, 2.45, 0.06))]}
    fig = figures.evolution_figure(history).figure()
    roles = by_role(fig)
    assert list(roles["forecast"][0].x) == [1000, 2000, 4000]
    assert list(roles["band_hi"][0].y) == pytest.approx([2.9, 2.65, 2.51])
    assert "20k" in fig.layout.title.text
    empty = figures.evolution_figure({"horizon": 20_000, "points": []}).figure()
    assert any("no forecast yet" in a.text for a in empty.layout.annotations)


def test_evolution_keeps_the_series_apart_when_the_default_one_switched() -> None:
    """The run page's history is of the run's default series, which switches from the
    training loss to the eval loss once that has enough points: one line through both rows
    jumped by the gap between the two losses. The history's own series is the forecast; the
    earlier rows are a grey line of their own, named."""
    def row(step: int, key: str, v: float) -> dict[str, Any]:
        return {"fitted_upto_step": step, "n_points": step, "status": "ok", "key": key,
                "created_at": "2026-01-01T00:00:00Z",
                "final": {"step": 20_000, "value": v, "lo": v - 0.1, "hi": v + 0.1},
                "f_star": {"value": 2.0, "lo": 1.9, "hi": 2.1}}

    history = {"run_id": "r", "horizon": 20_000, "key": "eval_loss", "points": [
        row(100, "loss", 2.1), row(200, "loss", 2.05), row(400, "eval_loss", 2.6),
        row(800, "eval_loss", 2.5)]}
    fig = figures.evolution_figure(history).figure()
    roles = by_role(fig)
    (forecast,) = roles["forecast"]
    assert list(forecast.x) == [400, 800] and forecast.name == "forecast of the final eval_loss"
    assert list(roles["band_hi"][0].x) == [400, 800]
    (earlier,) = roles["forecast_earlier"]
    assert list(earlier.x) == [100, 200] and list(earlier.y) == [2.1, 2.05]
    assert earlier.name == "earlier: forecast of the final loss"
    low, high = fig.layout.yaxis.range
    assert low < 2.05 and high > 2.6  # both in view


def entry(name: str, final: float | None, lo: float = 0.0, hi: float = 0.0,
          index: int = 0) -> figures.CompareEntry:
    forecast: dict[str, Any] = dict(FORECAST, prediction=None if final is None else
                    {"step": 20_000, "value": final, "lo": lo, "hi": hi})
    (item,) = views.compare_entries([views.CompareRun(
        run={"id": f"id-{index}", "name": name, "status": "running", "last_step": 10_000},
        metrics=[downsampled("loss")], forecast=forecast if final is not None else None,
        band=BAND, at_horizon=forecast["prediction"])])
    return item


def test_ranking_names_the_best_run_and_whether_it_is_clear() -> None:
    entries = [entry("a", 2.5, 2.45, 2.55, 0), entry("b", 2.3, 2.25, 2.35, 1),
               entry("c", None, index=2)]
    ranking = figures.rank_forecasts(entries, 20_000)
    assert ranking.best == 1 and ranking.order == [1, 0, 2] and ranking.clear
    assert ranking.message.startswith("At step 20,000 the forecasts say b will be best")
    assert "do not overlap" in ranking.message and "1 run(s) have no forecast" in ranking.message
    close = figures.rank_forecasts([entry("a", 2.5, 2.3, 2.7), entry("b", 2.45, 2.3, 2.6, 1)],
                                   20_000)
    assert close.best == 1 and not close.clear and "not yet a clear winner" in close.message
    none = figures.rank_forecasts([entry("a", None)], 20_000)
    assert none.best is None and "No run has a forecast yet" in none.message
    fig = figures.ranking_figure(entries, ranking).figure()
    assert list(fig.data[0].y) == ["★ b", "a"]


def test_ranking_ticks_show_one_number_of_decimals_per_zoom_level() -> None:
    """The ranking's loss ticks take their decimals from the tick spacing (Plotly picks the
    first stop whose ``dtickrange`` holds it): four significant digits showed "0.9990" beside
    "1.000" on a chart that crossed 1."""
    entries = [entry("a", 0.9995, 0.9965, 1.0025)]
    stops = figures.ranking_figure(entries, figures.rank_forecasts(entries, 20_000)).figure(
    ).layout.xaxis.tickformatstops

    def used(dtick: float) -> str:
        return next(s.value for s in stops
                    if (s.dtickrange[0] is None or s.dtickrange[0] <= dtick)
                    and (s.dtickrange[1] is None or dtick <= s.dtickrange[1]))

    assert [used(d) for d in (2.0, 1.0, 0.5, 0.01, 0.005, 0.001, 5e-5, 1e-9)] == [
        ".0f", ".0f", ".1f", ".2f", ".3f", ".3f", ".5f", ".9f"]
    assert format(0.999, used(0.001)) == "0.999" and format(1.0, used(0.001)) == "1.000"


def test_compare_figure_overlays_runs_with_forecasts_to_the_horizon() -> None:
    entries = [entry("<b>bold</b>", 2.5, 2.45, 2.55, 0), entry("b", 2.3, 2.25, 2.35, 1)]
    fig = figures.compare_figure(entries, 20_000).figure()
    lines = [t for t in fig.data if (t.meta or {}).get("role") == "last"]
    assert [t.name for t in lines] == ["&lt;b&gt;bold&lt;/b&gt;", "b"]
    assert [t.line.color for t in lines] == [palette.run_colour(0), palette.run_colour(1)]
    forecasts = [t for t in fig.data if (t.meta or {}).get("role") == "forecast"]
    assert all(t.x[-1] == pytest.approx(20_000) for t in forecasts) and len(forecasts) == 2


def test_every_builder_output_is_valid_plotly() -> None:
    """Rebuilding from the JSON with full validation raises on any invalid property."""
    series = telemetry()
    page = views.RunPage(
        run={"id": "r", "name": "n", "config": CONFIG, "last_step": 10_000, "status": "running"},
        metrics=[downsampled("loss"), *_as_api(series)], forecast=FORECAST, band=BAND,
        history={"horizon": 20_000, "points": []},
        alerts=[{"id": "1", "rule": "r", "state": "firing", "summary": "s", "step": 10}],
    )
    for fig in views.run_figures(page).values():
        go.Figure(json.loads(fig.to_json()))


def test_figure_json_is_what_plotly_sends() -> None:
    """The pages encode the builders' dictionaries themselves (FigureSpec.to_json); the JSON
    must be Plotly's own for every chart: typed arrays with the same bytes (float and int64
    steps), null for a missing or NaN point, lists where Plotly keeps lists, and nothing that
    could close the page's <script>."""
    loss = downsampled("loss", n_buckets=3000)
    loss["values"][5] = None
    loss["steps"] = np.asarray(loss["steps"], dtype=np.int64).tolist()
    history = {"horizon": 20_000, "points": [
        {"fitted_upto_step": s, "n_points": s, "status": "ok", "key": "loss",
         "created_at": "2026-01-01T00:00:00Z",
         "final": {"step": 20_000, "value": 2.4, "lo": 2.3, "hi": 2.5},
         "f_star": {"value": 2.0, "lo": 1.9, "hi": 2.1}} for s in range(1000, 10_000, 500)]}
    page = views.RunPage(
        run={"id": "r", "name": "a/b <c>", "config": CONFIG, "last_step": 10_000,
             "status": "running"},
        metrics=[loss, raw("eval_loss", [5000, 10_000], [2.7, float("nan")]),
                 *_as_api(telemetry())],
        forecast=FORECAST, band=BAND, history=history,
        alerts=[{"id": "1", "rule": "r", "state": "firing", "summary": "</script><b>x</b>",
                 "step": 10}],
    )
    entries = [entry("</script>", 2.5, 2.45, 2.55, 0), entry("b", 2.3, 2.25, 2.35, 1)]
    specs = {**views.run_figures(page),
             "compare": figures.compare_figure(entries, 20_000),
             "ranking": figures.ranking_figure(entries, figures.rank_forecasts(entries, 20_000))}
    for name, spec in specs.items():
        ours = spec.to_json()
        plotlys = pio.to_json(spec.figure(validate=False), validate=False, engine="json")
        assert json.loads(ours) == json.loads(plotlys), name
        assert "</" not in ours and "<b" not in ours, name
    loss_json = json.loads(specs["loss"].to_json())
    typed = [t["y"] for t in loss_json["data"] if isinstance(t.get("y"), dict)]
    assert typed and all(set(y) == {"dtype", "bdata"} for y in typed)  # typed arrays, not lists


def test_figure_json_of_every_kind_of_value_is_plotlys() -> None:
    """Values the builders may hold, each encoded as Plotly encodes it: int64 narrowed to the
    smallest type (or a list when too big), floats of 32 and 64 bits, 2-D arrays, empty and
    bool arrays, arrays under keys Plotly keeps as lists, NumPy scalars, non-finite floats."""
    spec = figures.FigureSpec(
        data=[
            {"type": "scatter", "x": np.arange(5, dtype=np.int64),
             "y": np.array([1.0, np.nan, np.inf, 2.0, 3.0])},
            {"type": "scatter", "x": np.array([0, 40_000], dtype=np.int64),
             "y": np.array([1, 2**40], dtype=np.int64), "customdata": np.ones((2, 3))},
            {"type": "scatter", "x": np.array([1, 300], dtype=np.uint64),
             "y": np.array([0.5, 1.5], dtype=np.float32), "text": np.array([True, False]),
             "selectedpoints": np.array([], dtype=float)},
            {"type": "scatter", "x": [1, 2, 3], "y": [float("nan"), np.float64(2.5), -np.inf]},
        ],
        layout={"xaxis": {"range": np.array([0.0, 10.0])}, "yaxis": {"range": [np.int64(1), 2]},
                "title": {"text": "a/b"}, "meta": {"value": np.float32(0.25)},
                "template": {}},  # none: Plotly would add its default one
    )
    plotlys = pio.to_json(spec.figure(validate=False), validate=False, engine="json")
    assert json.loads(spec.to_json()) == json.loads(plotlys)


def test_evolution_shows_the_loss_reached_at_the_horizon_once_reached() -> None:
    """Once the fitted series has a point at the horizon, the forecast evolution draws it
    across, so each forecast can be judged against it; before that, nothing is drawn. The
    value is the history's own (``final.reached``, the logged point), not the page's series
    (block means on a long run)."""
    def observed_lines(reached: float | None) -> list[Any]:
        history = {"horizon": 10_000, "key": "eval_loss", "points": [
            {"fitted_upto_step": s, "n_points": s, "status": "ok", "key": "eval_loss",
             "created_at": "2026-01-01T00:00:00Z",
             "final": {"step": 10_000, "value": 2.4, "lo": 2.3, "hi": 2.5, "reached": reached},
             "f_star": {"value": 2.0, "lo": 1.9, "hi": 2.1}} for s in (2000, 4000, 6000)]}
        page = views.RunPage(
            run={"id": "r", "config": {"total_steps": 10_000}, "last_step": 10_000},
            metrics=[downsampled("loss")], forecast=dict(FORECAST, key="eval_loss"),
            history=history)
        fig = views.run_figures(page, ["loss", "evolution"])["evolution"].figure()
        return [a for a in fig.layout.annotations if (a.text or "").startswith("observed")]

    (line,) = observed_lines(2.4)
    assert line.y == pytest.approx(2.4) and line.text == "observed 2.4"
    assert observed_lines(None) == []  # the run has not got there yet
