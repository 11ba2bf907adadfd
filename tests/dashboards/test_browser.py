"""The pages in a real browser: Debian's Chromium driven by playwright-python.

Chromium is started with fixed headless flags and a fresh user-data directory. Under
``CI=true`` these tests must run: a missing Chromium or playwright fails them. Screenshots of
every page land in ``artifacts/`` (look at them).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from curvecast.contract import LEVEL_EXTENDING_STATUSES
from curvecast.dashboards import fmt
from tests.dashboards.conftest import (
    TOTAL,
    FakeAlerts,
    Tab,
    app_server,
    live_settings,
    make_run,
    new_app,
    wait_for_fit,
)
from tests.support import create_token
from tests.support import synthetic as syn

pytestmark = pytest.mark.browser

XSS = "<script>alert(1)</script></script><img src=x onerror=alert(2)>"
CHARTS = ("loss", "step_size", "gradient", "norms", "averaging", "evolution")


@pytest.fixture(scope="module")
def alerts() -> FakeAlerts:
    return FakeAlerts()


@pytest.fixture(scope="module")
def live(sqlite_url: str, alerts: FakeAlerts) -> Iterator[str]:
    """A live service (worker refitting every fraction of a second); the tests choose its
    alerts through the stand-in."""
    with app_server(new_app(live_settings(sqlite_url), alerts)) as url:
        yield url


@pytest.fixture(scope="module")
def client(live: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def streaming_run(client: httpx.Client) -> tuple[uuid.UUID, str]:
    """A ScheduleFree+ run 3,000 steps into a planned 20,000, with a fit."""
    project = f"browser-{uuid.uuid4().hex[:8]}"
    run_id = make_run(client, project, name="gpt-120m sfplus", steps=3000, eval_every=250)
    return run_id, project


def shot(tab: Tab, artifacts_dir: Path, name: str, full: bool = False) -> Path:
    path = artifacts_dir / f"dashboard-{name}.png"
    tab.page.screenshot(path=str(path), full_page=full)
    return path


def test_run_page_draws_everything_and_updates_live(
    tab: Tab, live: str, client: httpx.Client, streaming_run: tuple[uuid.UUID, str],
    artifacts_dir: Path,
) -> None:
    run_id, _project = streaming_run
    tab.page.goto(f"{live}/runs/{run_id}")
    tab.wait_for_charts(CHARTS)
    loss = tab.traces("loss")
    roles = {t["meta"].get("role") for t in loss}
    assert {"min", "max", "last", "fit", "forecast", "band_lo", "band_hi", "f_star",
            "prediction"} <= roles
    assert {t["meta"].get("key") for t in loss if t["meta"].get("role") == "last"} == {
        "loss", "eval_loss"}
    for chart, keys in (("step_size", {"sfplus/eta", "sfplus/alpha"}),
                        ("gradient", {"sfplus/grad_l1", "sfplus/denom_ema"}),
                        ("norms", {"sfplus/x_l2", "sfplus/y_l2", "sfplus/z_l2"}),
                        ("averaging", {"sfplus/c", "sfplus/sf_beta"})):
        traces = tab.traces(chart)
        assert keys <= {t["meta"].get("key") for t in traces}, chart
        assert all(t["n"] > 0 for t in traces), chart
    assert any(t["meta"].get("role") == "ratio" for t in tab.traces("norms"))
    assert tab.traces("evolution")[-1]["n"] >= 1
    kpi = tab.page.locator('[data-kpi="forecast"] .kpi-value').inner_text()
    assert kpi.replace(".", "", 1).isdigit(), kpi
    shot(tab, artifacts_dir, "run")
    shot(tab, artifacts_dir, "run-full", full=True)
    tab.no_errors()

    # Live: new points appear without a reload, then the new fit redraws the forecast.
    syn.stream(client, run_id, 3000, 4500, total_steps=20_000, eval_every=250)
    tab.page.wait_for_function(
        """() => document.getElementById('chart-loss').data.some(t => t.meta &&
             t.meta.key === 'loss' && t.meta.role === 'last' && t.x[t.x.length - 1] >= 4499)""")
    tab.page.wait_for_function(
        """() => document.querySelector('[data-kpi="progress"] .kpi-value').textContent
             === '4,499'""")
    # The same poll updated the card in the server's words: the step, and the last eval loss
    # (it wrote "training loss at step 4,499" and dropped the eval loss until the next fit's
    # refresh rewrote the card).
    detail = tab.page.locator('[data-kpi="last_loss"] .kpi-detail').inner_text()
    assert re.fullmatch(r"at step 4,499, median of the last 1% of steps; last eval loss "
                        r"[0-9.]+ at step 4,250", detail), detail
    wait_for_fit(client, run_id, upto=4000)
    tab.page.wait_for_function(
        """() => document.getElementById('chart-loss').data.some(t => t.meta &&
             t.meta.role === 'forecast' && t.x[0] >= 4000)""")
    grad = [t for t in tab.traces("gradient") if t["meta"].get("key") == "sfplus/grad_l1"
            and t["meta"].get("role") == "last"]
    assert grad[0]["x1"] >= 4499  # telemetry charts grow live too
    shot(tab, artifacts_dir, "run-live")
    tab.no_errors()


def test_zoom_refetches_the_visible_range_at_full_resolution(
    tab: Tab, live: str, streaming_run: tuple[uuid.UUID, str],
) -> None:
    run_id, _ = streaming_run
    tab.page.goto(f"{live}/runs/{run_id}")
    tab.wait_for_charts(("loss",))
    overview = [t for t in tab.traces("loss") if t["meta"] == {"key": "loss", "role": "last"}]
    assert any(t["meta"].get("role") == "min" for t in tab.traces("loss"))  # downsampled
    tab.page.evaluate("""() => Plotly.relayout('chart-loss',
        {'xaxis.range[0]': 1000, 'xaxis.range[1]': 1300})""")
    tab.page.wait_for_function(
        """() => { const t = document.getElementById('chart-loss').data.find(t => t.meta &&
             t.meta.key === 'loss' && t.meta.role === 'last');
             return t && t.x.length === 301 && t.x[0] === 1000 && t.x[300] === 1300; }""")
    assert not any(t["meta"].get("role") == "min" for t in tab.traces("loss"))  # raw points
    tab.page.evaluate("() => Plotly.relayout('chart-loss', {'xaxis.autorange': true})")
    tab.page.wait_for_function(
        """() => document.getElementById('chart-loss').data.some(t => t.meta &&
             t.meta.role === 'min')""")
    back = [t for t in tab.traces("loss") if t["meta"] == {"key": "loss", "role": "last"}]
    assert back[0]["x0"] == overview[0]["x0"]
    tab.no_errors()


def test_forecast_box_answers_through_the_rest_api(
    tab: Tab, live: str, streaming_run: tuple[uuid.UUID, str],
) -> None:
    run_id, _ = streaming_run
    page = tab.page
    page.goto(f"{live}/runs/{run_id}")
    tab.wait_for_charts(("loss",))

    ask = tab.ask

    def rest(path: str, **params: float) -> dict[str, Any]:
        answer: dict[str, Any] = httpx.get(f"{live}/api/v1/runs/{run_id}/forecast{path}",
                                           params=params).json()
        return answer

    answer = ask("step", "15000", "interval")
    assert answer.startswith("Loss at step 15,000: 2.") and "90% interval" in answer
    assert "had" not in answer  # ahead of the run: it has no loss there yet
    assert "planned last step" not in answer  # and before its planned end
    # A status whose answer extends the current loss says why (the page's list of them is
    # the contract's, from its config).
    status = rest("", horizon=15000)["status"]
    assert page.evaluate("() => window.cc.CFG.level_extending") == list(
        LEVEL_EXTENDING_STATUSES)
    assert (f"({status.replace('_', ' ')}: " in answer) == (status in LEVEL_EXTENDING_STATUSES)
    assert page.locator("#ask-rest").inner_text() == (
        f"GET /api/v1/runs/{run_id}/forecast?horizon=15000")
    # Past the planned end: a number, and that the run does not get there (as the loss box).
    assert ask("step", str(2 * TOTAL), "interval").endswith(
        f"past the run's planned last step ({TOTAL:,}): where the loss would be had the run "
        "gone on.")
    # A step the run is past: the loss it had there too, the value REST answers.
    behind = ask("step", "1500", "had")
    reached = rest("", horizon=1500)["prediction"]["reached"]
    assert reached is not None
    assert f"the run is past this step and had {fmt.loss(reached)} there" in behind
    # Before the fitted range: no forecast, but the loss it had there (it was an error line).
    early = rest("", horizon=250)["prediction"]
    assert early["value"] is None and early["reached"] is not None
    assert ask("step", "250", "Reached").startswith(
        f"Reached at step 250: {fmt.loss(early['reached'])} (eval_loss, data). "
        "No forecast at step 250: the curve is fitted to eval_loss after the burn-in")
    assert "is forecast at step" in ask("loss", "2.6", "step")
    assert ask("loss", "0.5", "reachable").startswith("Not reachable")
    # A loss the fitted curve reaches only after the planned last step: where, and that it
    # is not in this run, instead of a time at the current pace.
    later = round(rest("", horizon=2 * TOTAL)["prediction"]["value"], 4)
    beyond = rest("/target", loss=later)["target"]
    assert beyond["reachable"] and beyond["past_planned_end"] and beyond["step"] > TOTAL, beyond
    text = ask("loss", str(later), "planned")
    assert f"is forecast at step {beyond['step']:,.0f}" in text
    assert text.endswith(f"after the run's planned last step ({TOTAL:,}): not in this run.")
    assert "current pace" not in text
    # A target the run already passed: answered from the data, the same step as REST's.
    passed = ask("loss", "100", "reached")
    target = rest("/target", loss=100)["target"]
    assert target["reached"] and passed.startswith("Already reached")
    assert f"from step {target['step']:,.0f} on" in passed
    tab.no_errors()


def test_run_page_shows_the_forecast_of_the_series_chosen_in_the_list(
    tab: Tab, live: str, client: httpx.Client, streaming_run: tuple[uuid.UUID, str],
) -> None:
    """The run evaluates, so its forecast is of the eval loss; choosing "loss" in the list
    shows the training loss's forecast, and the ask box asks REST about that series."""
    run_id, _ = streaming_run
    wait_for_fit(client, run_id, key="loss")
    page = tab.page
    page.goto(f"{live}/runs/{run_id}")
    tab.wait_for_charts(("loss",))
    fit_name = """() => document.getElementById('chart-loss').data
        .find(t => t.meta && t.meta.role === 'fit').name"""
    assert page.evaluate(fit_name).endswith("to eval loss")
    page.select_option("#run-key", "loss")
    page.click("#series-form button[type=submit]")
    page.wait_for_url(f"{live}/runs/{run_id}?key=loss")
    tab.wait_for_charts(("loss", "evolution"))
    assert page.evaluate(fit_name).endswith("to training loss")
    answer = tab.ask("step", "15000", "interval")
    assert page.locator("#ask-rest").inner_text() == (
        f"GET /api/v1/runs/{run_id}/forecast?horizon=15000&key=loss")
    value = httpx.get(f"{live}/api/v1/runs/{run_id}/forecast",
                      params={"horizon": 15000, "key": "loss"}).json()["prediction"]["value"]
    assert answer.startswith(f"Loss at step 15,000: {fmt.loss(value)}")
    tab.no_errors()


def test_a_target_the_fit_passed_but_the_data_did_not_reads_due_now(
    tab: Tab, live: str, client: httpx.Client, streaming_run: tuple[uuid.UUID, str],
) -> None:
    """A loss between the fitted curve at the last step and the data above it: REST answers
    not reached, with an ETA of 0 s; the page says it is due now, not "already reached"."""
    run_id, _ = streaming_run
    base = f"{live}/api/v1/runs/{run_id}"
    last = httpx.get(base).json()["last_step"]
    # The fit of every eval point there is: no refit can move the curve during the test.
    evals = httpx.get(f"{base}/metrics", params={"keys": "eval_loss"}).json()["series"][0]
    wait_for_fit(client, run_id, upto=int(evals["steps"][-1]))
    fitted = httpx.get(f"{base}/forecast", params={"horizon": last}).json()["prediction"]
    due = None
    for k in range(1, 101):  # the first loss above the curve that the data have not reached
        loss = round(fitted["value"] + 0.001 * k, 4)
        answer = httpx.get(f"{base}/forecast/target", params={"loss": loss}).json()
        if answer["target"]["reached"]:
            break
        if (answer["eta"] or {}).get("seconds") == 0:
            due = loss
            break
    assert due is not None, "the run's data end above its fitted curve (seeded data)"
    page = tab.page
    page.goto(f"{live}/runs/{run_id}")
    tab.wait_for_charts(("loss",))
    text = tab.ask("loss", str(due), "step")
    assert "due now by the fitted curve" in text and "already reached" not in text
    tab.no_errors()


def test_a_target_a_finished_run_did_not_reach_reads_not_reached(
    tab: Tab, live: str, client: httpx.Client,
) -> None:
    """A run that ended above a target: REST's answer keeps the fitted curve's step, with a
    reason; the page says the run did not get there (it said "is forecast at step 1,500" of a
    run that ended at 1,500)."""
    run_id = make_run(client, f"ended-{uuid.uuid4().hex[:6]}", name="ended", steps=1501,
                      total=1500, eval_every=None)
    wait_for_fit(client, run_id, upto=1496)  # the last refit (binned: up to a bin's centre)
    base = f"{live}/api/v1/runs/{run_id}"
    assert client.patch(f"/api/v1/runs/{run_id}", json={"status": "finished"}).status_code == 200
    reached = httpx.get(f"{base}/forecast").json()["prediction"]["reached"]
    loss = round(reached * 0.9, 3)  # below where the run ended: not reached
    answer = httpx.get(f"{base}/forecast/target", params={"loss": loss}).json()
    target = answer["target"]
    assert target["reachable"] and not target["reached"] and answer["eta"] is None
    assert target["reason"].startswith("not reached: the run ended at step 1,500")
    page = tab.page
    page.goto(f"{live}/runs/{run_id}")
    tab.wait_for_charts(("loss",))
    text = tab.ask("loss", str(loss), "step")
    assert text.startswith(f"Not reached: the run ended before its smoothed loss got to "
                           f"{fmt.loss(loss)}. Had it gone on, the fitted curve puts it at step "
                           f"{target['step']:,.0f} (interval ")
    assert "is forecast" not in text
    tab.no_errors()


def test_names_render_as_text_everywhere(
    tab: Tab, live: str, client: httpx.Client, artifacts_dir: Path,
) -> None:
    project = f"xss-{uuid.uuid4().hex[:8]}"
    evil = make_run(client, project, name=XSS, steps=1500, eval_every=None)
    page = tab.page
    page.goto(f"{live}/runs/{evil}")
    tab.wait_for_charts(("loss",))
    assert page.locator("#run-name").inner_text() == XSS
    assert page.title() == f"{XSS} · curvecast"
    page.goto(f"{live}/?project={project}")
    assert page.locator("td.name a").inner_text() == XSS
    page.goto(f"{live}/compare?runs={evil}")
    tab.wait_for_charts(("compare", "ranking"))
    legend = page.evaluate(
        "() => [...document.querySelectorAll('#chart-compare .legendtext')]"
        ".map(e => e.textContent)")
    assert legend == [XSS]
    assert XSS in page.locator("#verdict").inner_text()
    assert page.evaluate("() => document.querySelectorAll('img[src=x]').length") == 0
    shot(tab, artifacts_dir, "xss")
    tab.no_errors()


def test_runs_list_sorts_and_opens_a_comparison(
    tab: Tab, live: str, client: httpx.Client, artifacts_dir: Path,
) -> None:
    project = f"list-{uuid.uuid4().hex[:8]}"
    names = {"baseline lr=1": (60.0, 300.0, 2.25), "lr=2 wd=10": (55.0, 250.0, 2.05),
             "lr=0.5": (65.0, 400.0, 2.4)}
    ids = {name: make_run(client, project, name=name, steps=2500, eval_every=None, curve=c,
                          seed=i) for i, (name, c) in enumerate(names.items())}
    page = tab.page
    page.goto(f"{live}/?project={project}")
    assert page.locator("#runs-body tr").count() == 3
    page.click("th button[data-col='5']")  # forecast of the final loss, ascending
    order = page.locator("td.name a").all_inner_texts()
    assert order == ["lr=2 wd=10", "baseline lr=1", "lr=0.5"]
    assert page.locator("td.spark svg path").count() == 3
    shot(tab, artifacts_dir, "runs")
    tab.no_errors()
    for name in names:
        page.check(f".pick-run[value='{ids[name]}']")
    page.click("#compare-selected")
    page.wait_for_url("**/compare?runs=*")
    # The format every link to the page uses (the picker's too), in the table's order.
    assert page.url == f"{live}/compare?runs=" + ",".join(str(ids[name]) for name in order)
    tab.wait_for_charts(("compare", "ranking"))
    verdict = page.locator("#verdict").inner_text()
    assert verdict.startswith("At step 20,000 the forecasts say lr=2 wd=10 will be best")
    assert page.locator("#compare-body tr.best a").inner_text() == "lr=2 wd=10"
    runs_drawn = tab.page.evaluate(
        """() => new Set(document.getElementById('chart-compare').data
             .filter(t => t.meta && t.meta.role === 'forecast').map(t => t.meta.run)).size""")
    assert runs_drawn == 3
    shot(tab, artifacts_dir, "compare")
    tab.no_errors()


def test_alert_markers_and_list(
    tab: Tab, live: str, client: httpx.Client, alerts: FakeAlerts,
    streaming_run: tuple[uuid.UUID, str], artifacts_dir: Path,
) -> None:
    run_id, project = streaming_run
    alerts.add(run_id, project, rule="grad_l1_drift", fired_step=2600, step=2900,
               summary="gradient L1 norm 2.1x its post-burn-in baseline")
    alerts.add(run_id, project, rule="polyak_negative_numerator", state="resolved",
               fired_step=1200, step=1500, summary="Polyak numerator below 0 for 50 steps",
               resolved_at="2026-01-01T00:05:00Z")
    page = tab.page
    page.goto(f"{live}/runs/{run_id}")
    tab.wait_for_charts(CHARTS)
    page.wait_for_function("() => document.querySelectorAll('#alerts-body tr').length === 2")
    states = page.locator("#alerts-body .badge").all_inner_texts()
    assert states == ["firing", "resolved"]
    marks = page.evaluate("""() => (document.getElementById('chart-loss').layout.annotations
        || []).filter(a => a.name === 'alert').map(a => a.x)""")
    assert sorted(marks) == [1200, 2600]
    assert page.locator('[data-kpi="alerts"] .kpi-value').inner_text() == "1 firing"
    # A new alert appears without a reload, in the list and as a marker.
    alerts.add(run_id, project, rule="weight_norm_shrink", state="pending", since_step=2950,
               fired_step=None, summary="‖x‖₂ falling")
    page.wait_for_function("() => document.querySelectorAll('#alerts-body tr').length === 3")
    page.wait_for_function("""() => (document.getElementById('chart-gradient').layout
        .annotations || []).filter(a => a.name === 'alert').length === 3""")
    shot(tab, artifacts_dir, "run-alerts", full=True)
    tab.no_errors()


def test_pages_with_auth_on(browser: Any, tab: Tab, sqlite_url: str) -> None:
    project = f"auth-{uuid.uuid4().hex[:8]}"
    read = create_token(sqlite_url, project, "read")
    ingest = create_token(sqlite_url, project, "ingest")
    settings = live_settings(sqlite_url, auth_enabled=True)
    with app_server(new_app(settings)) as url:
        headers = {"authorization": f"Bearer {ingest}"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
            run_id = uuid.uuid4()
            syn.create_run(c, run_id, project, name="private run")
            syn.stream(c, run_id, 0, 2000, total_steps=20_000)
            wait_for_fit(c, run_id)
        page = tab.page
        denied = page.goto(f"{url}/runs/{run_id}")
        assert denied is not None and denied.status == 401
        assert "?token=" in page.locator("main").inner_text()
        tab.errors.clear()  # the browser reports the 401 document itself as an error
        page.goto(f"{url}/runs/{run_id}?token={read}")
        assert page.url == f"{url}/runs/{run_id}"  # the token left the address bar
        tab.wait_for_charts(CHARTS)
        cookies = {c["name"]: c for c in browser.cookies(url)}
        assert cookies["curvecast_token"]["httpOnly"] is True
        assert page.evaluate("() => document.cookie") == ""
        tab.ask("step", "10000", "interval")
        page.goto(f"{url}/compare?runs={run_id}")  # the picker lists runs through the proxy
        page.focus("#picker-search")  # (with nothing to offer it does not open by itself)
        page.wait_for_function("""() => document.getElementById('picker-results')
            .textContent === 'No other runs yet.'""")
        page.goto(f"{url}/")
        assert page.locator("td.name a").inner_text() == "private run"
        tab.no_errors()
        # "Sign out" is a form: a same-origin POST that the edge lets through.
        page.click("form.logout button")
        page.wait_for_url(f"{url}/")
        assert "curvecast_token" not in {c["name"] for c in browser.cookies(url)}
        browser.clear_cookies()


def test_time_to_first_chart_is_recorded(tab: Tab, live: str,
                                         streaming_run: tuple[uuid.UUID, str]) -> None:
    """The page exposes when its first chart was drawn (the benchmark reads it)."""
    run_id, _ = streaming_run
    tab.page.goto(f"{live}/runs/{run_id}")
    tab.wait_for_charts(("loss",))
    first = tab.page.evaluate("() => window.__cc.firstChart")
    assert isinstance(first, int | float) and first > 0
    tab.no_errors()



# --- layout: buttons, toolbar, title and legend keep out of each other's way ----------------

#: Each chart's boxes in page pixels: Plotly's toolbar (modebar), the title, the linear/log
#: buttons (per menu), the legend, the plot area.
_BOXES_JS = """chart => {
  const gd = document.getElementById('chart-' + chart);
  const box = e => { if (!e) return null; const r = e.getBoundingClientRect();
    return r.width && r.height ? [r.left, r.top, r.right, r.bottom] : null; };
  const g = gd.getBoundingClientRect(), s = gd._fullLayout._size;
  return {
    modebar: box(gd.querySelector('.modebar')),
    title: box(gd.querySelector('.gtitle')),
    menus: [...gd.querySelectorAll('.updatemenu-header-group')].map(box).filter(Boolean),
    buttons: [...gd.querySelectorAll('.updatemenu-button')].map(box).filter(Boolean),
    legend: box(gd.querySelector('.legend .bg')),
    plot: [g.left + s.l, g.top + s.t, g.left + s.l + s.w, g.top + s.t + s.h],
  };
}"""

#: A trace's point in page pixels (Plotly's own axis mapping), with the chart's plot area.
_POINT_JS = """([chart, x, y]) => {
  const gd = document.getElementById('chart-' + chart), fl = gd._fullLayout;
  const g = gd.getBoundingClientRect(), xa = fl.xaxis, ya = fl.yaxis;
  return [g.left + xa._offset + xa.c2p(x), g.top + ya._offset + ya.c2p(y)];
}"""


def _overlap(a: list[float] | None, b: list[float] | None) -> bool:
    """Whether two boxes [left, top, right, bottom] share any area."""
    if a is None or b is None:
        return False
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _inside(point: list[float], box: list[float] | None) -> bool:
    return box is not None and box[0] <= point[0] <= box[2] and box[1] <= point[1] <= box[3]


def _check_layout(tab: Tab, chart: str) -> dict[str, Any]:
    tab.page.hover(f"#chart-{chart} .main-svg")  # the toolbar shows while hovered
    boxes: dict[str, Any] = tab.page.evaluate(_BOXES_JS, chart)
    assert boxes["modebar"] is not None and boxes["title"] is not None, (chart, boxes)
    assert not _overlap(boxes["modebar"], boxes["title"]), (chart, "toolbar over the title")
    for menu in boxes["menus"]:
        assert not _overlap(menu, boxes["modebar"]), (chart, "buttons under the toolbar")
        assert not _overlap(menu, boxes["title"]), (chart, "buttons over the title")
        assert not _overlap(menu, boxes["legend"]), (chart, "buttons over the legend")
        assert menu[3] <= boxes["plot"][1], (chart, "buttons inside the plot")
    menus = boxes["menus"]
    assert all(not _overlap(a, b) for i, a in enumerate(menus) for b in menus[i + 1:]), chart
    assert not _overlap(boxes["legend"], boxes["plot"]), (chart, "legend over the plot")
    return boxes


def test_buttons_toolbar_titles_and_legends_do_not_overlap(
    tab: Tab, live: str, client: httpx.Client, streaming_run: tuple[uuid.UUID, str],
    artifacts_dir: Path,
) -> None:
    run_id, project = streaming_run
    tab.page.goto(f"{live}/runs/{run_id}")
    tab.wait_for_charts(CHARTS)
    for chart in CHARTS:
        boxes = _check_layout(tab, chart)
        assert len(boxes["menus"]) == (2 if chart == "loss" else 1), chart
        assert len(boxes["buttons"]) == 2 * len(boxes["menus"]), chart
    other = make_run(client, project, name="a second run with a rather long name", steps=2000,
                     eval_every=None)
    tab.page.goto(f"{live}/compare?runs={run_id},{other}")
    tab.wait_for_charts(("compare", "ranking"))
    assert len(_check_layout(tab, "compare")["menus"]) == 2
    ranking = _check_layout(tab, "ranking")
    assert ranking["menus"] == []
    tab.page.hover("#chart-ranking .main-svg")
    shot(tab, artifacts_dir, "compare-toolbar", full=True)
    tab.no_errors()


def test_legend_leaves_the_newest_points_and_the_forecast_visible(
    tab: Tab, live: str, streaming_run: tuple[uuid.UUID, str],
) -> None:
    run_id, _ = streaming_run
    tab.page.goto(f"{live}/runs/{run_id}")
    tab.wait_for_charts(("loss",))
    boxes = tab.page.evaluate(_BOXES_JS, "loss")
    ends = tab.page.evaluate("""() => document.getElementById('chart-loss').data
        .filter(t => t.meta && ['last', 'forecast', 'prediction'].includes(t.meta.role))
        .map(t => [t.meta.role, t.x[t.x.length - 1], t.y[t.y.length - 1]])""")
    assert {role for role, _x, _y in ends} == {"last", "forecast", "prediction"}
    for role, x, y in ends:
        point = tab.page.evaluate(_POINT_JS, ["loss", x, y])
        assert _inside(point, boxes["plot"]), (role, point, boxes["plot"])
        assert not _inside(point, boxes["legend"]), (role, point, boxes["legend"])
    tab.no_errors()


def test_log_y_on_a_run_with_a_forecast_shows_the_losses(
    tab: Tab, live: str, streaming_run: tuple[uuid.UUID, str], artifacts_dir: Path,
) -> None:
    run_id, _ = streaming_run
    page = tab.page
    page.goto(f"{live}/runs/{run_id}")
    tab.wait_for_charts(("loss",))

    def drawn_and_range() -> tuple[list[float], list[float]]:
        """What is drawn (the losses, the prediction, f* and its band) and the log axis's
        range, read together: the run is still streaming, so the live poll may add lower
        losses between two reads."""
        ys_min, ys_max, kind, r0, r1 = page.evaluate("""() => {
            const el = document.getElementById('chart-loss');
            const of = roles => el.data.filter(t => t.meta && roles.includes(t.meta.role))
              .flatMap(t => Array.from(t.y)).filter(v => isFinite(v) && v > 0);
            const losses = of(['last', 'prediction']);
            const floor = Math.min(...losses) / 10;  // f* or its band a decade below: left out
            const ys = losses.concat(of(['f_star']), (el.layout.shapes || [])
                .filter(s => s.yref === 'y').flatMap(s => [s.y0, s.y1]))
              .filter(v => isFinite(v) && v >= floor);
            const a = el._fullLayout.yaxis;
            return [Math.min(...ys), Math.max(...ys), a.type, a.range[0], a.range[1]]; }""")
        assert kind == "log", kind
        return [ys_min, ys_max], [10 ** r0, 10 ** r1]

    page.locator("#chart-loss .updatemenu-button", has_text="log y").click()
    page.wait_for_function(
        "() => document.getElementById('chart-loss')._fullLayout.yaxis.type === 'log'")
    drawn, (lo, hi) = drawn_and_range()
    # Within a factor of two of what is drawn, not dozens of decades below it.
    assert drawn[0] / 2 < lo <= drawn[0] * 1.02 and hi < 2 * drawn[1], (lo, hi, drawn)
    shot(tab, artifacts_dir, "run-log-y")
    # A redraw (here a zoom's re-fetch) keeps the log scale the user chose, with a sane range.
    page.evaluate("""() => Plotly.relayout('chart-loss',
        {'xaxis.range[0]': 1000, 'xaxis.range[1]': 2000})""")
    page.wait_for_function(
        """() => { const t = document.getElementById('chart-loss').data.find(t => t.meta &&
             t.meta.key === 'loss' && t.meta.role === 'last');
             return t && t.x[0] === 1000 && t.x[t.x.length - 1] === 2000; }""")
    drawn, (lo, hi) = drawn_and_range()
    assert drawn[0] / 2 < lo and hi < 2 * drawn[1], (lo, hi, drawn)
    tab.no_errors()


# --- compare: the picker -------------------------------------------------------------------


def test_compare_on_the_series_chosen_in_the_list(
    tab: Tab, live: str, client: httpx.Client,
) -> None:
    """Two runs that both evaluate open compared on their eval losses; choosing "loss" in the
    "Series" list compares their training losses, and adding a run keeps the choice."""
    project = f"series-{uuid.uuid4().hex[:8]}"
    runs = [make_run(client, project, name=name, steps=1500, eval_every=150, seed=i)
            for i, name in enumerate(("alpha", "beta", "gamma"))]
    for run in runs:
        wait_for_fit(client, run, key="loss")
    page = tab.page
    page.goto(f"{live}/compare?runs={runs[0]},{runs[1]}")
    tab.wait_for_charts(("compare", "ranking"))
    drawn = """() => [...new Set(document.getElementById('chart-compare').data
        .filter(t => t.meta && t.meta.role === 'last').map(t => t.meta.key))]"""
    assert page.evaluate(drawn) == ["eval_loss"]
    page.select_option("#compare-key", "loss")
    page.click("form.filters button[type=submit]")
    page.wait_for_url(f"{live}/compare?runs={runs[0]}%2C{runs[1]}&horizon=&key=loss")
    tab.wait_for_charts(("compare", "ranking"))
    assert page.evaluate(drawn) == ["loss"]
    assert page.locator("#compare-key").input_value() == "loss"
    page.fill("#picker-search", "gamma")
    page.wait_for_function("() => document.querySelectorAll('.picker-item').length === 1")
    page.click(".picker-item")
    page.wait_for_url(f"{live}/compare?runs={runs[0]},{runs[1]},{runs[2]}&key=loss")
    tab.wait_for_charts(("compare", "ranking"))
    assert page.evaluate(drawn) == ["loss"]
    tab.no_errors()


def test_compare_picker_adds_a_run_of_the_same_project_first(
    tab: Tab, live: str, client: httpx.Client, artifacts_dir: Path,
) -> None:
    project = f"pick-{uuid.uuid4().hex[:8]}"
    base = make_run(client, project, name="picker base", steps=1500, eval_every=None)
    other = make_run(client, project, name="picker lr=2", steps=1500, eval_every=None,
                     curve=(55.0, 250.0, 2.05), seed=3)
    elsewhere = make_run(client, f"{project}-x", name="picker elsewhere", steps=300,
                         eval_every=None, fit=False)
    page = tab.page
    page.goto(f"{live}/runs/{base}")
    page.click("#compare-link")
    page.wait_for_url(f"{live}/compare?runs={base}")
    assert page.locator("h1").inner_text() == "Compare 1 run"
    # Opened from a run: the other runs are offered at once, that run's project first.
    page.wait_for_function("() => document.querySelectorAll('.picker-item').length >= 2")
    offered = page.evaluate("""() => [...document.querySelectorAll('.picker-item')]
        .map(b => b.getAttribute('data-run-id'))""")
    assert str(base) not in offered and offered[0] == str(other)
    assert str(elsewhere) in offered
    page.fill("#picker-search", "PICKER")  # case-insensitive, every word must match
    page.wait_for_function("() => document.querySelectorAll('.picker-item').length === 2")
    page.fill("#picker-search", "picker lr")
    page.wait_for_function("() => document.querySelectorAll('.picker-item').length === 1")
    tab.wait_for_charts(("compare", "ranking"))
    shot(tab, artifacts_dir, "compare-picker")
    page.click(".picker-item")
    page.wait_for_url(f"{live}/compare?runs={base},{other}")
    tab.wait_for_charts(("compare", "ranking"))
    assert page.locator("h1").inner_text() == "Compare 2 runs"
    runs_drawn = page.evaluate("""() => [...new Set(document.getElementById('chart-compare')
        .data.filter(t => t.meta && t.meta.role === 'last').map(t => t.meta.run_id))]""")
    assert runs_drawn == [str(base), str(other)]
    page.wait_for_function("() => document.querySelectorAll('#compare-body tr').length === 2")
    # Removing a run is a link to the same address without it.
    page.click(f".chip[data-run-id='{base}'] .chip-remove")
    page.wait_for_url(f"{live}/compare?runs={other}")
    assert page.locator(".chip-remove").count() == 0  # the last run stays
    tab.no_errors()


# --- the first chart before plotly.js -------------------------------------------------------


def test_the_loss_chart_shows_before_plotly_and_gives_way_to_it(
    tab: Tab, live: str, streaming_run: tuple[uuid.UUID, str], artifacts_dir: Path
) -> None:
    """With plotly.js never arriving, the run page still shows the loss chart the server drew
    (axes, ticks, the curves); with it, the interactive chart replaces it in the same box."""
    run_id, _ = streaming_run
    tab.page.route("**/static/plotly-basic.min.js*", lambda route: route.abort())
    tab.page.goto(f"{live}/runs/{run_id}")
    preview = tab.page.locator("#chart-loss svg.static-preview")
    box = preview.bounding_box()
    assert box is not None and box["width"] > 600 and box["height"] > 300
    assert preview.locator("path[stroke]").count() >= 2  # training and eval loss
    labels = preview.locator("text").all_text_contents()
    assert len(labels) >= 6 and any("static preview" in t for t in labels)
    assert not any(t.startswith("-") for t in labels), labels  # no negative loss axis
    shot(tab, artifacts_dir, "run-static-preview")
    tab.page.unroute("**/static/plotly-basic.min.js*")
    tab.errors.clear()  # the aborted script's error was the point of the first half
    tab.page.goto(f"{live}/runs/{run_id}")
    tab.wait_for_charts(("loss",))
    assert tab.page.locator("#chart-loss svg.static-preview").count() == 0
    assert tab.page.locator("#chart-loss .main-svg").count() >= 1
    tab.no_errors()
