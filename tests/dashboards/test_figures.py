"""Figure builders and page compositions, without HTTP: data shaped like the REST API's answers
in, figures out."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from curvecast.contract import RunConfig, telemetry_prefix
from curvecast.dashboards import figures, fmt, html, palette, views
from curvecast.dashboards.data import SeriesData, chart_horizon, series_by_key
from curvecast.dashboards.figures import base as figure_base
from curvecast.dashboards.sparkline import sparkline_path

OKABE_ITO = {palette.BLACK, palette.ORANGE, palette.SKY, palette.GREEN, palette.YELLOW,
             palette.BLUE, palette.VERMILLION, palette.PURPLE, palette.GREY}


@pytest.fixture(autouse=True)
def _validate_figures() -> Iterator[None]:
    """Validate every figure in full here (the service skips validation for speed)."""
    figure_base.VALIDATE = True
    yield
    figure_base.VALIDATE = False


def downsampled(key: str, n_buckets: int = 50, spike_at: int | None = 20) -> dict[str, Any]:
    """A downsampled ``SeriesOut`` as the metrics API returns it."""
    steps = np.linspace(100, 10_000, n_buckets).round().astype(int)
    values = 60 / np.sqrt(steps + 300.0) + 2.0
    vmax = values + 0.05
    if spike_at is not None:
        vmax[spike_at] = 9.5  # a one-step spike inside a bucket
    return {"key": key, "total_points": 10_000, "downsampled": True, "steps": steps.tolist(),
            "values": values.tolist(), "min": (values - 0.05).tolist(), "max": vmax.tolist(),
            "count": [200] * n_buckets}


def raw(key: str, steps: list[int], values: list[Any]) -> dict[str, Any]:
    return {"key": key, "total_points": len(steps), "downsampled": False, "steps": steps,
            "values": values}


FORECAST = {
    "status": "ok", "n_points": 10_000, "fitted_upto_step": 10_000.0, "a": 60.0, "b": 300.0,
    "c": 2.0, "f_star": {"value": 2.0, "lo": 1.95, "hi": 2.05},
    "prediction": {"step": 20_000, "value": 2.42, "lo": 2.38, "hi": 2.47}, "target": None,
    "key": "loss", "fitted_at": "2026-01-01T00:00:00Z", "confidence": 0.9, "off_model": False,
    "message": "",
}
BAND = [{"step": s, "value": 60 / math.sqrt(s + 300) + 2, "lo": 60 / math.sqrt(s + 300) + 1.97,
         "hi": 60 / math.sqrt(s + 300) + 2.04} for s in (10_000, 12_000, 15_000, 20_000)]
CONFIG = {"total_steps": 20_000, "warmup_steps": 200, "c_warmup": 400, "weight_decay": 5.0}


def by_role(fig: go.Figure) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for trace in fig.data:
        meta = trace.meta or {}
        out.setdefault(meta.get("role", "?"), []).append(trace)
    return out


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
