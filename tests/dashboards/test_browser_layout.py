"""Every page in a real browser at several window sizes, a phone's among them, and across
window resizes: charts keep their height and their width follows the window, nothing overlaps
or is cut, and nothing overflows the screen sideways. Also what the first hour showed on these
pages: the loss chart's start, a one-point telemetry chart, the compare page's default horizon,
the ask box's sentences, the alerts and projects pages, and the one 404 page.

Debian's Chromium driven by playwright-python (the ``browser`` fixture of ``conftest.py``);
under ``CI=true`` these tests must run.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.dashboards.conftest import (
    FakeAlerts,
    Tab,
    app_server,
    live_settings,
    new_app,
    wait_for_fit,
)
from tests.support import synthetic as syn

pytestmark = pytest.mark.browser

#: Window sizes every page is checked at: laptop, a 1100 -> 1250 widening, a wide
#: screen, a narrow window (one column), and a phone.
SIZES = ((1100, 800), (1250, 800), (1600, 900), (900, 800), (390, 844), (1280, 800))
PHONE = {"width": 390, "height": 844}
RUN_CHARTS = ("loss", "step_size", "gradient", "norms", "averaging", "evolution")
#: Plotly's complaint when a chart collapsed under its own margins.
AXIS_SCALING = "Something went wrong with axis scaling"
READABLE_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


@dataclass(frozen=True)
class Runs:
    """The module's runs: three finished 500-step runs and one that failed at step 300 of a
    planned 3,000 (a compare page with no common planned end), a running run with everything,
    a run whose loss is flat early in a long plan (``too_early``)."""

    project: str
    finished: tuple[uuid.UUID, uuid.UUID, uuid.UUID]
    failed: uuid.UUID
    running: uuid.UUID
    flat: uuid.UUID


@pytest.fixture(scope="module")
def alerts() -> FakeAlerts:
    return FakeAlerts()


@pytest.fixture(scope="module")
def live(sqlite_url: str, alerts: FakeAlerts) -> Iterator[str]:
    with app_server(new_app(live_settings(sqlite_url), alerts)) as url:
        yield url


@pytest.fixture(scope="module")
def runs(live: str) -> Runs:
    project = f"layout-{uuid.uuid4().hex[:8]}"
    short = {"warmup_steps": 50, "c_warmup": 100}
    with httpx.Client(base_url=live, timeout=60) as client:
        finished = []
        for i in range(3):
            run_id = uuid.uuid4()
            syn.create_run(client, run_id, project, name=f"short {i}", total_steps=500, **short)
            # Weight norms logged once (every 1,000 steps of a 500-step run).
            syn.stream(client, run_id, 0, 501, total_steps=500, seed=i, norms_every=1000,
                       curve=(60.0 - 5 * i, 300.0, 2.0))
            wait_for_fit(client, run_id, upto=400)
            assert client.patch(f"/api/v1/runs/{run_id}",
                                json={"status": "finished"}).status_code == 200
            finished.append(run_id)
        failed = uuid.uuid4()
        syn.create_run(client, failed, project, name="long, failed", total_steps=3000, **short)
        syn.stream(client, failed, 0, 301, total_steps=3000, seed=7)
        assert client.patch(f"/api/v1/runs/{failed}", json={"status": "failed"}).status_code == 200
        running = uuid.uuid4()
        syn.create_run(client, running, project, name="gpt-120m sfplus", total_steps=20_000)
        syn.stream(client, running, 0, 3000, total_steps=20_000, eval_every=250)
        wait_for_fit(client, running)
        flat = uuid.uuid4()
        syn.create_run(client, flat, project, name="flat early", total_steps=20_000)
        syn.stream(client, flat, 0, 1500, total_steps=20_000, curve=(0.0, 300.0, 2.3),
                   spikes=False)
        assert wait_for_fit(client, flat, upto=1400)["status"] == "too_early"
    return Runs(project, (finished[0], finished[1], finished[2]), failed, running, flat)


@pytest.fixture
def watched(tab: Tab) -> Tab:
    """The tab, also failing on Plotly's axis-scaling message (a console warning)."""
    tab.page.on("console", lambda msg: tab.errors.append(msg.text)
                if AXIS_SCALING in msg.text else None)
    return tab


# --- geometry, read from the page ----------------------------------------------------------

#: Per chart: its box, the figure's own size, and the height the server gave the figure.
_CHARTS_JS = """() => [...document.querySelectorAll('.chart[data-rendered]')].map(gd => {
  const r = gd.getBoundingClientRect();
  return {id: gd.id, box: [r.width, r.height], figure: [gd._fullLayout.width,
          gd._fullLayout.height]};
})"""

#: Boxes that must not overlap each other: the cards and headline numbers, and the page's
#: sections; with how far the page scrolls sideways.
_LAYOUT_JS = """() => {
  const box = e => { const r = e.getBoundingClientRect();
    return [r.left, r.top, r.right, r.bottom, e.id || e.className]; };
  return {
    cards: [...document.querySelectorAll('main .card, main .kpi, main .verdict')].map(box),
    width: document.documentElement.scrollWidth, viewport: window.innerWidth,
  };
}"""

#: Text cut short: an element whose content is wider or taller than its box, or that is set
#: to end in an ellipsis.
_CUT_JS = """selector => [...document.querySelectorAll(selector)].filter(e =>
  e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1 ||
  getComputedStyle(e).textOverflow === 'ellipsis').map(e => e.className + ': ' + e.textContent)"""


def _overlap(a: list[Any], b: list[Any]) -> bool:
    return a[0] < b[2] - 1 and b[0] < a[2] - 1 and a[1] < b[3] - 1 and b[1] < a[3] - 1


def _check_layout(tab: Tab, heights: dict[str, float], where: str) -> None:
    """Charts at their own height with the box's width, no overlapping boxes, nothing
    overflowing sideways."""
    page = tab.page
    # Plotly follows a window resize on its own (responsive): wait until every chart has.
    page.wait_for_function("""() => [...document.querySelectorAll('.chart[data-rendered]')]
        .every(gd => Math.abs(gd._fullLayout.width - gd.getBoundingClientRect().width) < 2)""")
    for chart in page.evaluate(_CHARTS_JS):
        box_h, fig_h = chart["box"][1], chart["figure"][1]
        assert abs(box_h - heights[chart["id"]]) < 1 and abs(fig_h - box_h) < 1, (where, chart)
    layout = page.evaluate(_LAYOUT_JS)
    cards = layout["cards"]
    for i, a in enumerate(cards):
        for b in cards[i + 1:]:
            assert not _overlap(a, b), (where, "overlapping", a, b)
    assert layout["width"] <= layout["viewport"], (where, "scrolls sideways", layout)


def _open(tab: Tab, url: str) -> None:
    """Open ``url``; the 404 page's own load is not an error of the page."""
    response = tab.page.goto(url)
    if response is not None and response.status == 404:
        tab.errors.clear()


def _pages(runs: Runs) -> list[tuple[str, tuple[str, ...]]]:
    """Every page, with the charts it draws."""
    every = ",".join(str(r) for r in (*runs.finished, runs.failed))
    return [
        ("/", ()),
        (f"/runs/{runs.running}", RUN_CHARTS),
        (f"/runs/{runs.flat}", RUN_CHARTS),
        (f"/runs/{runs.finished[0]}", RUN_CHARTS),
        (f"/compare?runs={runs.running},{runs.flat}", ("compare", "ranking")),
        (f"/compare?runs={every}", ("compare", "ranking")),
        ("/alerts", ()),
        ("/projects", ()),
        (f"/projects/{runs.project}", ()),
        ("/no/such/page", ()),
    ]


def test_every_page_keeps_its_layout_across_window_sizes_and_resizes(
    watched: Tab, live: str, runs: Runs, artifacts_dir: Path,
) -> None:
    """Loaded at 1100x800, then widened to 1250 (charts must keep their height, not fall to
    the box's minimum over the cards below), wider, narrower, a phone's width and back."""
    page = watched.page
    for path, charts in _pages(runs):
        page.set_viewport_size({"width": SIZES[0][0], "height": SIZES[0][1]})
        _open(watched, live + path)
        if charts:
            watched.wait_for_charts(charts)
        heights = {c["id"]: c["box"][1] for c in page.evaluate(_CHARTS_JS)}
        assert all(h >= 150 for h in heights.values()), (path, heights)
        for width, height in SIZES:
            page.set_viewport_size({"width": width, "height": height})
            _check_layout(watched, heights, f"{path} at {width}x{height}")
        watched.no_errors()
    page.set_viewport_size(PHONE)
    page.goto(f"{live}/runs/{runs.running}")
    watched.wait_for_charts(RUN_CHARTS)
    page.screenshot(path=str(artifacts_dir / "dashboard-run-phone.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})
    watched.no_errors()


def test_pages_opened_on_a_phone_fit_its_screen(watched: Tab, live: str, runs: Runs) -> None:
    """A fresh load at 390x844: one column, nothing wider than the screen, charts at their
    height."""
    page = watched.page
    page.set_viewport_size(PHONE)
    try:
        for path, charts in _pages(runs):
            _open(watched, live + path)
            if charts:
                watched.wait_for_charts(charts)
            heights = {c["id"]: c["figure"][1] for c in page.evaluate(_CHARTS_JS)}
            _check_layout(watched, heights, f"{path} on a phone")
            nav = page.locator("header nav a").all_inner_texts()
            assert nav == ["Runs", "Projects", "Alerts", "API docs"], (path, nav)
        watched.no_errors()
    finally:
        page.set_viewport_size({"width": 1280, "height": 800})


def test_card_text_is_never_cut(watched: Tab, live: str, runs: Runs) -> None:
    """The headline cards and the verdict show all their words at every width (labels and
    values ended in "…", details after two lines)."""
    page = watched.page
    for path, charts in _pages(runs):
        if not charts:
            continue
        for width, height in SIZES:
            page.set_viewport_size({"width": width, "height": height})
            page.goto(live + path)
            watched.wait_for_charts(charts[:1])
            cut = page.evaluate(_CUT_JS, ".kpi-label, .kpi-value, .kpi-detail, .verdict")
            assert not cut, (path, width, cut)
    page.set_viewport_size({"width": 1280, "height": 800})
    watched.no_errors()


# --- the loss chart and a sparse telemetry chart ------------------------------------------

_Y_RANGE_JS = """chart => { const gd = document.getElementById('chart-' + chart);
  const a = gd._fullLayout.yaxis;
  return a.type === 'log' ? a.range.map(v => 10 ** v) : a.range; }"""


def test_the_loss_chart_shows_where_the_loss_started(watched: Tab, live: str,
                                                     runs: Runs) -> None:
    """The y range takes in the first steps (it cut off the steps before the burn-in), and
    on a log x axis the curve fills the plot instead of leaving most of it empty."""
    page = watched.page
    page.goto(f"{live}/runs/{runs.finished[0]}")
    watched.wait_for_charts(("loss",))
    first = page.evaluate("""() => { const d = document.getElementById('chart-loss').data
        .filter(t => t.meta && t.meta.key === 'loss' && ['last', 'max'].includes(t.meta.role));
        return Math.max(...d.map(t => Math.max(...Array.from(t.y).slice(0, 5)
          .filter(v => isFinite(v))))); }""")
    lo, hi = page.evaluate(_Y_RANGE_JS, "loss")
    assert lo < first < hi, (first, lo, hi)
    page.locator("#chart-loss .updatemenu-button", has_text="log x").click()
    page.wait_for_function(
        "() => document.getElementById('chart-loss')._fullLayout.xaxis.type === 'log'")
    # Every logged point (step >= 1) lies inside the plot.
    outside = page.evaluate("""() => { const gd = document.getElementById('chart-loss');
        const fl = gd._fullLayout, xa = fl.xaxis, ya = fl.yaxis;
        const t = gd.data.find(t => t.meta && t.meta.key === 'loss' && t.meta.role === 'last');
        let out = 0;
        for (let i = 0; i < t.x.length; i++) {
          if (t.x[i] < 1 || !isFinite(t.y[i])) continue;
          const px = xa.c2p(t.x[i]), py = ya.c2p(t.y[i]);
          if (!(px >= -1 && px <= xa._length + 1 && py >= -1 && py <= ya._length + 1)) out++;
        }
        return out; }""")
    assert outside == 0
    watched.no_errors()


def test_a_telemetry_chart_with_one_point_shows_it(watched: Tab, live: str, runs: Runs) -> None:
    page = watched.page
    page.goto(f"{live}/runs/{runs.finished[0]}")
    watched.wait_for_charts(("norms",))
    norms = page.evaluate("""() => document.getElementById('chart-norms').data
        .filter(t => t.meta && t.meta.role === 'last')
        .map(t => [t.meta.key, t.x.length, t.mode])""")
    assert norms and all(n == 1 and "markers" in mode for _key, n, mode in norms), norms
    assert page.locator("#chart-norms .scatterlayer .point").count() >= len(norms)
    watched.no_errors()


# --- the compare page's defaults -----------------------------------------------------------


def test_compare_defaults_to_a_horizon_every_run_can_be_compared_at(
    watched: Tab, live: str, runs: Runs, artifacts_dir: Path,
) -> None:
    """Three finished 500-step runs and a failed one planned for 3,000: compared at step 500
    (it was 3,000: "No run can be compared", an empty chart with an x axis from -1 to 6)."""
    page = watched.page
    every = ",".join(str(r) for r in (*runs.finished, runs.failed))
    page.goto(f"{live}/compare?runs={every}")
    watched.wait_for_charts(("compare", "ranking"))
    verdict = page.locator("#verdict").inner_text()
    assert verdict.startswith("At step 500 "), verdict
    assert "long, failed" in verdict and "Ended before step 500" in verdict
    assert page.locator("#compare-body tr.best").count() == 1
    assert page.get_attribute("input[name=horizon]", "placeholder") == "default: 500"
    ranked = page.evaluate("""() => document.getElementById('chart-ranking').data[0].x
        .filter(v => isFinite(v)).length""")
    assert ranked == 3
    x0, x1 = page.evaluate(
        "() => document.getElementById('chart-ranking')._fullLayout.xaxis.range")
    assert 3 < x0 < x1 < 6, (x0, x1)  # losses, not Plotly's empty -1..6
    page.screenshot(path=str(artifacts_dir / "dashboard-compare-defaults.png"), full_page=True)
    # One run alone: nothing to be best against.
    page.goto(f"{live}/compare?runs={runs.finished[0]}")
    watched.wait_for_charts(("compare", "ranking"))
    assert page.locator("#compare-body tr").count() == 1
    assert page.locator("#compare-body tr.best").count() == 0
    assert "best" not in page.locator("#compare-body").inner_text()
    labels = page.evaluate("() => document.getElementById('chart-ranking').data[0].y")
    assert not any("★" in label for label in labels), labels
    watched.no_errors()


# --- the ask box ---------------------------------------------------------------------------


def test_the_ask_box_writes_sentences_without_field_names(watched: Tab, live: str,
                                                          runs: Runs) -> None:
    """A step before the fitted range of a ``too_early`` fit: REST's message is two messages
    joined ("... with a wide interval step 50 is before ...") ending in a field name
    ("prediction.reached"); the box writes its own sentences from REST's fields."""
    rest = httpx.get(f"{live}/api/v1/runs/{runs.flat}/forecast", params={"horizon": 50}).json()
    assert rest["status"] == "too_early" and rest["prediction"]["value"] is None
    assert "interval step 50" in rest["message"]  # what the page used to show
    page = watched.page
    page.goto(f"{live}/runs/{runs.flat}")
    watched.wait_for_charts(("loss",))
    text = watched.ask("step", "50", "before")
    assert "prediction." not in text and "GET ." not in text and "interval step" not in text
    assert re.fullmatch(r"Reached at step 50: [0-9.]+ \(loss, data\)\. No forecast at step 50: "
                        r"the curve is fitted to loss after the burn-in \(step [0-9,]+\) up to "
                        r"step [0-9,]+ and describes the loss from there on, not before "
                        r"\(fit status: too early\)\.", text), text
    # Ahead of the run: the status's message is one sentence in brackets, not run on.
    ahead = watched.ask("step", "15000", "interval")
    assert "prediction." not in ahead and re.search(r"\(too early: [^()]+\.\)$", ahead), ahead
    watched.no_errors()


# --- alerts: the run page's table and the alerts page -------------------------------------


def test_alerts_show_restful_steps_and_readable_times_and_can_be_acknowledged(
    watched: Tab, live: str, runs: Runs, alerts: FakeAlerts, artifacts_dir: Path,
) -> None:
    alerts.add(runs.running, runs.project, rule="grad_l1_drift", fired_step=2600, step=2900,
               summary="gradient L1 norm 2.1x its post-burn-in baseline")
    alerts.add(runs.flat, runs.project, rule="loss_plateau", state="pending", since_step=1100,
               step=1450, summary="no decay for 300 steps")
    alerts.add(runs.finished[1], runs.project, rule="non_finite", state="resolved",
               severity="critical", fired_step=300, step=310, summary="NaN loss",
               resolved_at="2026-01-01T00:05:00Z")
    listed = httpx.get(f"{live}/api/v1/alerts", params={"project": runs.project}).json()
    steps = {a["rule"]: a["step"] for a in listed["alerts"]}
    page = watched.page
    # The run page's table: REST's step, a readable time (it showed 2,600 and an ISO string).
    page.goto(f"{live}/runs/{runs.running}")
    page.wait_for_function("() => document.querySelectorAll('#alerts-body tr td').length === 6")
    cells = page.locator("#alerts-body tr td").all_inner_texts()
    assert cells[3] == f"{steps['grad_l1_drift']:,}" and re.fullmatch(READABLE_TIME, cells[5])
    # The alerts page: every state, across runs, firing first.
    page.goto(f"{live}/alerts?project={runs.project}")
    rows = page.locator("#alerts-body tr")
    assert rows.count() == 3
    assert page.locator("#alerts-body .badge").all_inner_texts() == [
        "firing", "pending", "resolved"]
    first = rows.nth(0).locator("td").all_inner_texts()
    assert first[1].startswith("gpt-120m sfplus") and first[4] == "2,900"
    assert re.match(READABLE_TIME, first[6]), first
    assert page.locator("#alert-counts").inner_text().split() == [
        "1", "firing", "1", "pending", "1", "resolved"]
    page.screenshot(path=str(artifacts_dir / "dashboard-alerts.png"), full_page=True)
    # Acknowledge the firing one, silence the pending one: the REST API's actions.
    rows.nth(0).locator("button.ack").click()
    page.wait_for_url(f"{live}/alerts?project={runs.project}")
    assert "acknowledged" in rows.nth(0).locator("td.actions").inner_text()
    rows.nth(1).locator("button.silence", has_text="1 h").click()
    page.wait_for_url(f"{live}/alerts?project={runs.project}")
    assert "silenced until" in rows.nth(1).locator("td.actions").inner_text()
    after = {a["rule"]: a for a in httpx.get(
        f"{live}/api/v1/alerts", params={"project": runs.project}).json()["alerts"]}
    assert after["grad_l1_drift"]["acknowledged_at"] is not None
    assert after["loss_plateau"]["silenced_until"] is not None
    assert rows.nth(2).locator("button").count() == 0  # resolved: nothing to act on
    # A state filter.
    page.select_option("select[name=state]", "resolved")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/alerts?*state=resolved*")
    assert page.locator("#alerts-body .badge").all_inner_texts() == ["resolved"]
    watched.no_errors()


# --- projects, navigation, the 404 page ------------------------------------------------------


def test_projects_and_navigation_and_one_404_page(watched: Tab, live: str, runs: Runs) -> None:
    page = watched.page
    page.goto(f"{live}/projects")
    row = page.locator(f"#projects-table tr[data-project='{runs.project}']")
    assert row.locator("td").nth(1).inner_text() == "6"
    assert "2 running" in row.locator("td").nth(2).inner_text()
    row.locator("a").first.click()
    page.wait_for_url(f"{live}/projects/{runs.project}")
    assert page.locator("#runs-body tr").count() == 6
    for link, url in (("Alerts", "/alerts"), ("Runs", "/"), ("Projects", "/projects"),
                      ("API docs", "/docs")):  # the API docs last: Swagger UI's page
        page.click(f"header nav a:has-text('{link}')")
        page.wait_for_url(live + url)
    # Every unknown page: the same HTML 404 (two of these answered the API's JSON).
    for path in ("/nope", "/alerts/nope", "/projects/no-such-project", "/runs/nope",
                 f"/runs/{uuid.uuid4()}", "/compare/x"):
        response = page.goto(live + path)
        assert response is not None and response.status == 404, path
        assert page.locator("h1").inner_text() == "404 · Not found", path
        assert page.locator("header nav a").count() == 4, path
    watched.errors.clear()  # the browser logs each 404 document as a failed load
    api = page.goto(f"{live}/api/v1/nope")
    assert api is not None and api.status == 404 and api.json()["error_code"] == "not_found"
    watched.errors.clear()


# --- a NaN in a long loss, a run without the optimizer's telemetry --------------------------

#: Per chart: the annotations (notes, labels) whose text runs past the chart's own box.
_CUT_NOTES_JS = """() => [...document.querySelectorAll('.chart[data-rendered]')].flatMap(gd => {
  const box = gd.getBoundingClientRect();
  return [...gd.querySelectorAll('g.annotation-text-g')].filter(a => {
    const r = a.getBoundingClientRect();
    return r.width > 0 && (r.left < box.left - 1 || r.right > box.right + 1);
  }).map(a => gd.id + ': ' + a.textContent); })"""

#: Points on the straight line from the loss band's first bucket to the last one before its
#: gap (a NaN), and how many of them the band's fill covers: Plotly filled a sliver along
#: that chord, over the curve, when the band broke at the gap.
_CHORD_JS = """() => { const gd = document.getElementById('chart-loss');
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const max = gd.data.find(t => t.meta && t.meta.key === 'loss' && t.meta.role === 'max');
  const y = Array.from(max.y), gap = y.findIndex(v => !isFinite(v));
  const x0 = max.x[0], y0 = y[0], x1 = max.x[gap - 1], y1 = y[gap - 1];
  const fills = [...gd.querySelectorAll('.scatterlayer path.js-fill')];
  let covered = 0;
  for (let k = 1; k < 20; k++) {
    const pt = new DOMPoint(xa.c2p(x0 + (x1 - x0) * k / 20), ya.c2p(y0 + (y1 - y0) * k / 20));
    if (fills.some(p => p.isPointInFill(pt))) covered++;
  }
  return {gap: gap, fills: fills.length, covered: covered}; }"""


def test_a_nan_and_missing_telemetry_draw_no_stray_band_and_no_cut_notes(
    watched: Tab, live: str,
) -> None:
    """A 1,500-step loss (drawn downsampled, with its min-max band) with one NaN at step
    400, and no optimizer telemetry: the band breaks at the NaN without a stray fill from
    the first step to the gap, and the empty charts' notes ("no data yet for ...",
    "Monitor.watch(optimizer) logs these ...") fit their charts at a laptop's and a phone's
    width (they ran past both edges of the half-width norms chart and of every phone chart)."""
    run_id = uuid.uuid4()
    steps = list(range(1, 1501))
    loss: list[float | str] = [8.0 / (t + 50) ** 0.5 + 1.0 + 0.01 * ((t * 7919) % 13 - 6) / 6
                               for t in steps]
    loss[399] = "NaN"
    with httpx.Client(base_url=live, timeout=60) as client:
        assert client.put(f"/api/v1/runs/{run_id}", json={
            "project": "no-telemetry", "name": "nan at 400",
            "config": {"total_steps": 2000}}).status_code == 201
        for lo in range(0, 1500, 500):
            client.post(f"/api/v1/runs/{run_id}/metrics", json={
                "steps": steps[lo:lo + 500], "values": {"loss": loss[lo:lo + 500]},
            }).raise_for_status()
    page = watched.page
    try:
        for size in ({"width": 1100, "height": 800}, PHONE):
            page.set_viewport_size(size)
            page.goto(f"{live}/runs/{run_id}")
            watched.wait_for_charts(RUN_CHARTS)
            chord = page.evaluate(_CHORD_JS)
            assert chord["gap"] > 0 and chord["fills"] >= 1, chord
            assert chord["covered"] == 0, (size, chord)
            assert page.locator("#chart-norms g.annotation-text-g",
                                has_text="Monitor.watch").count() == 1
            assert page.evaluate(_CUT_NOTES_JS) == [], size
    finally:
        page.set_viewport_size({"width": 1280, "height": 800})
    watched.no_errors()


#: Per name cell of the page's tables: the line boxes of each of its links (a word broken
#: into fragments takes one per fragment).
_NAME_LINES_JS = """() => [...document.querySelectorAll('td.name a')].map(a =>
  [a.textContent, a.getClientRects().length])"""


def test_names_in_tables_keep_their_words_on_a_phone(
    watched: Tab, live: str, alerts: FakeAlerts,
) -> None:
    """On a phone the runs, projects and alerts tables squeezed the name column to a few
    letters ("char / rlm- / stdl / ib", project "de / mo"): a name of one word stays on one
    line, and the table scrolls sideways inside its card if it must."""
    project = f"phone{uuid.uuid4().hex[:6]}"
    run_id = uuid.uuid4()
    with httpx.Client(base_url=live, timeout=60) as client:
        assert client.put(f"/api/v1/runs/{run_id}", json={
            "project": project, "name": "transformer12",
            "config": {"total_steps": 1000}}).status_code == 201
        client.post(f"/api/v1/runs/{run_id}/metrics", json={
            "steps": [1, 2, 3], "values": {"loss": [3.0, 2.9, 2.8]}}).raise_for_status()
    alerts.add(run_id, project, rule="loss_plateau", step=3, summary="no decay for 300 steps")
    page = watched.page
    page.set_viewport_size(PHONE)
    try:
        for path in (f"/?project={project}", f"/projects/{project}", "/projects",
                     f"/alerts?project={project}"):
            page.goto(live + path)
            names = dict(page.evaluate(_NAME_LINES_JS))
            wanted = project if path == "/projects" else "transformer12"
            assert names.get(wanted) == 1, (path, names)
            layout = page.evaluate(_LAYOUT_JS)
            assert layout["width"] <= layout["viewport"], (path, "scrolls sideways", layout)
    finally:
        page.set_viewport_size({"width": 1280, "height": 800})
    watched.no_errors()
