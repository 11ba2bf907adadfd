"""Dashboards on a 10^6-step run: server response times and the first chart in a browser.

Server response times of the run page's data, and the time to the first rendered chart in
headless Chromium.

Starts a real ``curvecast serve`` process on a fresh SQLite file (``--postgres`` adds a fresh
PostgreSQL database), streams a synthetic ScheduleFree+ run of 10^6 steps through the REST API
(every key the run page draws, at the client hook's rates: loss and 11 telemetry keys every step,
4 weight/gradient norms every 10 steps, eval loss every 1,000 steps: ~12.4 million points), waits
for the worker's fit, then measures, with baselines from the same run:

* server: the run page's chart data (``GET /dashboards/api/runs/{id}/figures``, all six charts,
  downsampled on the server), the HTML page, one live-update poll, one zoom re-fetch (p50/p95
  of warm requests, and the first request after start-up);
* browser: time from navigation to the first rendered chart, and to all six: first loads,
  each in a new browser with an empty profile (plotly.js fetched, parsed and run), and warm
  loads (plotly.js cached and compiled), medians;
* baselines: the same page for a 10^4-step run, and fetching the 10^6-point loss series at full
  resolution from the metrics API and drawing it with one WebGL trace (the full plotly.js
  bundle's ``scattergl``; the pages load the basic bundle, which has none).

The browsers bypass the pages' CSP: Playwright polls its waits with eval, which the CSP
forbids.

Usage: ``python -m bench run dashboard [--quick] [--postgres] [--no-write]`` (``--quick``: 10^5
steps, fewer repeats; a smoke run that does not write BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import plotly

from bench._cli import parser, publish
from bench._paths import ARTIFACTS
from bench._report import markdown_table
from curvecast.contract import EVAL_LOSS_KEYS, TELEMETRY_PREFIX, TRAIN_LOSS_KEY, telemetry_key
from tests.support import (
    PostgresUnavailable,
    create_pg_database,
    drop_pg_database,
    start_server_process,
    wait_for,
)
from tests.support import synthetic as syn

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]
CHARTS = 6
FRESH_GOAL_MS = 1000.0
FIGURES_GOAL_MS = 300.0
BATCH_STEPS = 5000  # ~62k points per request, under the 100k limit


@dataclass
class Timings:
    """Milliseconds of repeated measurements."""

    values: list[float] = field(default_factory=list)

    def p(self, q: float) -> float:
        data = sorted(self.values)
        return data[min(len(data) - 1, round(q * (len(data) - 1)))]

    @property
    def median(self) -> float:
        return statistics.median(self.values)


def nodelay_client(url: str) -> httpx.Client:
    transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    return httpx.Client(base_url=url, timeout=600, transport=transport)


def ingest_run(client: httpx.Client, steps: int, name: str, total: int) -> uuid.UUID:
    """Stream a synthetic run of ``steps`` steps through the REST API."""
    run_id = uuid.uuid4()
    syn.create_run(client, run_id, "bench-dashboard", name=name, total_steps=total)
    started = time.perf_counter()
    sent = 0
    for lo in range(0, steps, BATCH_STEPS):
        body = json.dumps(syn.batch(lo, min(steps, lo + BATCH_STEPS), total_steps=total,
                                    eval_every=1000, prefix=TELEMETRY_PREFIX)).encode()
        resp = client.post(f"/api/v1/runs/{run_id}/metrics", content=body,
                           headers={"content-type": "application/json"})
        resp.raise_for_status()
        sent += resp.json()["accepted"]
        if lo and lo % 200_000 == 0:
            rate = sent / (time.perf_counter() - started)
            print(f"  {name}: {lo:,} steps, {sent:,} points ({rate:,.0f} points/s)", flush=True)
    print(f"  {name}: {sent:,} points in {time.perf_counter() - started:.0f} s", flush=True)
    return run_id


def wait_for_fit(client: httpx.Client, run_id: uuid.UUID, last_step: int,
                 timeout: float = 600) -> None:
    def fitted() -> bool:
        body = client.get(f"/api/v1/runs/{run_id}/forecast").json()
        # The fit follows eval_loss (every 1,000 steps): its last point is up to 999 steps back.
        return bool(
            body["status"] != "pending" and (body["fitted_upto_step"] or 0) >= 0.85 * last_step
        )

    wait_for(fitted, timeout, "the worker to fit the run", every=0.5)


def timed(client: httpx.Client, path: str, params: dict[str, Any] | None = None
          ) -> tuple[float, int]:
    started = time.perf_counter()
    resp = client.get(path, params=params)
    elapsed = (time.perf_counter() - started) * 1000
    resp.raise_for_status()
    return elapsed, len(resp.content)


def server_timings(client: httpx.Client, run_id: uuid.UUID, last_step: int, repeats: int
                   ) -> dict[str, Any]:
    """Warm request latencies of what the run page asks for."""
    figures = f"/dashboards/api/runs/{run_id}/figures"
    first_ms, size = timed(client, figures)  # first after start-up: cold caches and imports
    out: dict[str, Any] = {"first_figures_ms": first_ms, "figures_bytes": size}
    zoom_lo = last_step // 2
    requests = {
        "figures": (figures, None),
        "html": (f"/runs/{run_id}", None),
        "zoom": (figures, {"charts": "loss", "start": zoom_lo, "end": zoom_lo + 9_999}),
    }
    for name, (path, params) in requests.items():
        timed(client, path, params)
        out[name] = Timings([timed(client, path, params)[0] for _ in range(repeats)])
    keys = ",".join([TRAIN_LOSS_KEY, EVAL_LOSS_KEYS[0]] + [telemetry_key(k) for k in (
        "eta", "alpha", "grad_l1", "denom_ema", "x_l2", "y_l2", "z_l2", "grad_l2", "c",
        "sf_beta")])
    poll = Timings()
    for _ in range(repeats):
        started = time.perf_counter()
        client.get(f"/api/v1/runs/{run_id}").raise_for_status()
        client.get(f"/api/v1/runs/{run_id}/metrics", params={
            "keys": keys, "start": last_step - 63, "max_points": 2000}).raise_for_status()
        client.get(f"/api/v1/runs/{run_id}/forecast").raise_for_status()
        poll.values.append((time.perf_counter() - started) * 1000)
    out["poll"] = poll
    return out


#: plotly.js's full bundle as the plotly package ships it (for the WebGL baseline only).
FULL_PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


def plotly_mb() -> float:
    """Megabytes of JavaScript in the plotly.js bundle the pages load."""
    from curvecast.service.web.static import PLOTLY_JS, assets

    return len(assets()[PLOTLY_JS].raw) / 1e6


#: The floor of a first interactive chart: a page of this origin that loads plotly.js alone (as
#: the run page does: deferred, from the service, gzipped) and draws a three-point chart.
FLOOR_PATH = "/bench-floor"
FLOOR_PAGE = """<!doctype html><html><head><meta charset="utf-8">
<script src="{plotly}" defer></script>
<script>document.addEventListener("DOMContentLoaded", function () {{
  window.__floorRan = performance.now();
  Plotly.newPlot(document.getElementById("c"), [{{x: [0, 1, 2], y: [3, 1, 2]}}],
                 {{height: 480}}).then(function () {{ window.__floorChart = performance.now(); }});
}});</script></head><body><div id="c" style="width: 1200px; height: 480px"></div></body></html>
"""


def floor_load(pw: Any, url: str) -> tuple[float, float]:
    """One load of the floor page in a new browser with an empty profile (the page's HTML is
    handed over by the browser driver; plotly.js comes from the service): when plotly.js had
    run and when its chart was drawn, ms after navigation."""
    from curvecast.service.web.static import plotly_url

    with tempfile.TemporaryDirectory() as profile:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1280, "height": 800}, bypass_csp=True)
        context.set_default_timeout(120_000)
        page = context.new_page()
        body = FLOOR_PAGE.format(plotly=plotly_url())
        page.route(url + FLOOR_PATH, lambda route: route.fulfill(
            status=200, content_type="text/html; charset=utf-8", body=body))
        page.goto(url + FLOOR_PATH)
        page.wait_for_function("window.__floorChart !== undefined")
        ran, chart = page.evaluate("[window.__floorRan, window.__floorChart]")
        context.close()
    return float(ran), float(chart)


def fresh_profile_loads(pw: Any, url: str, run_id: uuid.UUID, loads: int) -> dict[str, Timings]:
    """First loads of the run page, each in a new browser with an empty profile: nothing
    cached, plotly.js (its basic bundle, 0.4 MB gzipped) fetched, parsed and run.

    Also when plotly.js had arrived and when the page's scripts had run (DOMContentLoaded
    follows the deferred scripts), which says where the time goes; and, alternating with the
    page's loads so both meet the same machine, the floor: plotly.js alone in the same
    browser, loaded and drawing a trivial chart (:func:`floor_load`).
    """
    out = {k: Timings() for k in ("preview", "first", "all", "plotly_loaded", "scripts_run",
                                  "plotly_kb", "floor_ran", "floor_chart")}
    for _ in range(loads):
        ran, chart = floor_load(pw, url)
        out["floor_ran"].values.append(ran)
        out["floor_chart"].values.append(chart)
        with tempfile.TemporaryDirectory() as profile:
            context = pw.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
                viewport={"width": 1280, "height": 800}, bypass_csp=True)
            context.set_default_timeout(120_000)
            page = context.new_page()
            page.goto(f"{url}/runs/{run_id}")
            page.wait_for_function(f"Object.keys(window.__cc.rendered).length === {CHARTS}")
            # The server draws the loss chart into the HTML (static SVG, before any script):
            # the first contentful paint shows it.
            preview, first, rendered, plotly_js, dom = page.evaluate("""() => [
                performance.getEntriesByName('first-contentful-paint')[0].startTime,
                window.__cc.firstChart, window.__cc.rendered,
                performance.getEntriesByType('resource')
                    .filter(e => e.name.includes('/static/plotly'))
                    .map(e => [e.responseEnd, e.encodedBodySize])[0],
                performance.getEntriesByType('navigation')[0].domContentLoadedEventStart]""")
            context.close()
        out["preview"].values.append(float(preview))
        out["first"].values.append(float(first))
        out["all"].values.append(float(max(rendered.values())))
        out["plotly_loaded"].values.append(float(plotly_js[0]))
        out["plotly_kb"].values.append(plotly_js[1] / 1000)
        out["scripts_run"].values.append(float(dom))
    return out


def browser_timings(url: str, runs: dict[str, uuid.UUID], loads: int, fresh: int,
                    full_resolution: uuid.UUID | None, backend: str) -> dict[str, Any]:
    """Time to the first chart and to all charts, per run: warm loads (everything cached) in
    one headless Chromium, and ``fresh`` first loads, each in a new browser profile."""
    from playwright.sync_api import sync_playwright

    out: dict[str, Any] = {"load_average": [os.getloadavg()[0]]}
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1280, "height": 800}, bypass_csp=True)
        context.set_default_timeout(120_000)
        page = context.new_page()

        def load(run_id: uuid.UUID) -> tuple[float, float]:
            page.goto(f"{url}/runs/{run_id}")
            page.wait_for_function(f"Object.keys(window.__cc.rendered).length === {CHARTS}")
            first, rendered = page.evaluate("[window.__cc.firstChart, window.__cc.rendered]")
            return float(first), float(max(rendered.values()))

        for label, run_id in runs.items():
            load(run_id)  # fills the cache: the loads below are warm
            first, every = Timings(), Timings()
            for _ in range(loads):
                a, b = load(run_id)
                first.values.append(a)
                every.values.append(b)
            out[label] = {"first": first, "all": every,
                          "fresh": fresh_profile_loads(pw, url, run_id, fresh)}
            if label == "big":  # what the long run looks like: worth a look
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / f"dashboard-bench-{backend}.png"),
                                full_page=True)
        if full_resolution is not None:
            page.goto(f"{url}/healthz")  # same origin, no page of ours: a blank canvas
            # The pages' basic bundle has no WebGL traces: the full one, from the plotly package.
            page.add_script_tag(path=str(FULL_PLOTLY_JS))
            fetch_ms, render_ms, points = page.evaluate(
                """async (runId) => {
                    const t0 = performance.now();
                    const r = await fetch(`/api/v1/runs/${runId}/metrics?keys=loss`);
                    const s = (await r.json()).series[0];
                    const t1 = performance.now();
                    const div = document.createElement('div');
                    div.style.width = '1200px'; div.style.height = '440px';
                    document.body.appendChild(div);
                    await Plotly.newPlot(div, [{type: 'scattergl', mode: 'lines',
                                                x: s.steps, y: s.values}]);
                    return [t1 - t0, performance.now() - t1, s.steps.length];
                }""", str(full_resolution))
            out["full_resolution"] = {"fetch": fetch_ms, "render": render_ms, "points": points}
        out["load_average"].append(os.getloadavg()[0])
        context.close()
    return out


def bench_backend(backend: str, database_url: str, args: argparse.Namespace, tmp: Path
                  ) -> dict[str, Any]:
    from curvecast.service.migrate import upgrade

    upgrade(database_url)
    # The full-resolution baseline reads the 10^6-point loss series raw: above the default cap
    # on raw reads (CURVECAST_MAX_READ_POINTS), which the pages never come near.
    env = {"CURVECAST_WORKER_INTERVAL_S": "0.2", "CURVECAST_MAX_READ_POINTS": "5000000"}
    server = start_server_process(database_url, tmp, env=env)
    try:
        with nodelay_client(server.url) as client:
            big_steps, small_steps = args.steps, 10_000
            print(f"[{backend}] ingesting {big_steps:,} + {small_steps:,} steps", flush=True)
            big = ingest_run(client, big_steps, f"{big_steps:,} steps", total=2 * big_steps)
            small = ingest_run(client, small_steps, f"{small_steps:,} steps", total=2 * small_steps)
            wait_for_fit(client, big, big_steps - 1)
            wait_for_fit(client, small, small_steps - 1)
        server.stop()  # restart: the first request below meets a freshly started process
        server = start_server_process(database_url, tmp, env=env)
        with nodelay_client(server.url) as client:
            print(f"[{backend}] server timings", flush=True)
            result: dict[str, Any] = {
                "big": server_timings(client, big, big_steps - 1, args.repeats),
                "small": server_timings(client, small, small_steps - 1, args.repeats),
                "steps": big_steps,
            }
        print(f"[{backend}] browser timings", flush=True)
        result["browser"] = browser_timings(
            server.url, {"big": big, "small": small}, args.loads, args.fresh,
            full_resolution=big if args.full_resolution else None, backend=backend)
        return result
    except Exception:
        print(server.log()[-3000:], file=sys.stderr)
        raise
    finally:
        server.stop()


def ms(x: float) -> str:
    return f"{x:,.0f}"


def _goal_note(first: float, floor: float) -> str:
    """Whether the first interactive chart met its goal here, and what stood in the way."""
    goal = f"The ≤ {ms(FRESH_GOAL_MS)} ms goal (for an idle machine)"
    if first <= FRESH_GOAL_MS:
        return f"{goal} is met here."
    if floor >= FRESH_GOAL_MS:
        return (f"{goal} is not met here: plotly.js alone, loaded and run, took longer than "
                "that on this machine at this load.")
    return (f"{goal} is not met here: {ms(first - FRESH_GOAL_MS)} ms over, with the floor "
            f"{ms(FRESH_GOAL_MS - floor)} ms under it.")


def report(results: dict[str, dict[str, Any]]) -> tuple[str, str, str]:
    """The section's body (a table and a note per backend), its one-line result, and the
    other notes (printed)."""
    parts, figures, previews, interactive, details = [], [], [], [], []
    for backend, r in results.items():
        big, small, br = r["big"], r["small"], r["browser"]
        steps = r["steps"]
        rows: list[list[object]] = []

        def row(what: str, a: Timings, b: Timings, goal: str = "",
                rows: list[list[object]] = rows) -> None:
            rows.append([what, f"{ms(a.median)} / {ms(a.p(0.95))}",
                         f"{ms(b.median)} / {ms(b.p(0.95))}", f"{a.median / b.median:.2f}×", goal])

        row("run page's chart data, 6 charts (`/dashboards/api/runs/{id}/figures`)",
            big["figures"], small["figures"], f"≤ {ms(FIGURES_GOAL_MS)} ms")
        row("run page HTML (`/runs/{id}`)", big["html"], small["html"])
        row("live-update poll (run + new points + forecast, 3 requests)", big["poll"],
            small["poll"])
        row("zoom re-fetch: 10,000 steps at full resolution", big["zoom"], small["zoom"])
        fresh, fresh_small = br["big"]["fresh"], br["small"]["fresh"]
        row("browser, fresh profile: navigation → first chart shown (first contentful "
            "paint: the loss chart the server draws into the page, static)", fresh["preview"],
            fresh_small["preview"], f"≤ {ms(FRESH_GOAL_MS)} ms")
        row("browser, fresh profile: navigation → first interactive chart drawn (Plotly)",
            fresh["first"], fresh_small["first"], "≤ 1,000 ms (idle machine)")
        row("floor, same browser: plotly.js alone (a page loading it as the run page does) → "
            "a 3-point chart drawn", fresh["floor_chart"], fresh_small["floor_chart"])
        row("browser, fresh profile: navigation → all 6 charts drawn", fresh["all"],
            fresh_small["all"])
        row("browser, warm (plotly.js cached): navigation → first chart drawn",
            br["big"]["first"], br["small"]["first"], "≤ 1,500 ms")
        row("browser, warm: navigation → all 6 charts drawn", br["big"]["all"],
            br["small"]["all"])
        table = markdown_table(
            ["measurement", f"{steps:,}-step run, p50 / p95 ms", "10,000-step run (baseline)",
             "ratio (p50)", "goal"], rows)
        notes = [
            f"Chart data {big['figures_bytes'] / 1e6:.2f} MB ({steps:,} steps) and "
            f"{small['figures_bytes'] / 1e6:.2f} MB (baseline): buckets, not points; the first "
            f"request after start-up {ms(big['first_figures_ms'])} ms.",
            f"A fresh profile's first interactive chart ({ms(fresh['first'].median)} ms, median "
            f"of {len(fresh['first'].values)} browsers): plotly.js "
            f"({fresh['plotly_kb'].median / 1000:.2f} MB gzipped) arrives after "
            f"{ms(fresh['plotly_loaded'].median)} ms, its {plotly_mb():.1f} MB of JavaScript have "
            "run after "
            f"{ms(fresh['scripts_run'].median)} ms; the loss chart the server draws into the "
            f"HTML shows first, at {ms(fresh['preview'].median)} ms.",
        ]
        floor = fresh["floor_chart"].median
        notes.append(
            f"First interactive chart against the floor of loading plotly.js alone, measured "
            f"alternately in the same browser: {ms(fresh['first'].median)} ms against "
            f"{ms(floor)} ms ({fresh['first'].median / floor:.2f}×). "
            + _goal_note(fresh["first"].median, floor))
        full = br.get("full_resolution")
        if full:
            notes.append(
                f"Without server downsampling: the {full['points']:,}-point loss series fetched "
                f"at full resolution in {ms(full['fetch'])} ms and drawn as one WebGL trace in "
                f"{ms(full['render'])} ms, against {ms(br['big']['all'].median)} ms for all six "
                "charts; load average "
                + " → ".join(f"{x:.1f}" for x in br["load_average"])
                + " during the browser runs.")
        parts.append(f"**{backend}**\n\n{table}" + "".join(f"\n\n{n}" for n in notes[2:]))
        details.append(f"{backend}: " + " ".join(notes[:2]))
        figures.append(f"{ms(big['figures'].median)} ms on {backend} "
                       f"({big['figures'].median / small['figures'].median:.2f}× a 10^4-step "
                       "run's)")
        previews.append(f"{ms(fresh['preview'].median)} ms ({backend})")
        interactive.append(f"{ms(fresh['first'].median)} ms against {ms(floor)} ms for "
                           f"plotly.js alone ({backend})")
    steps = next(iter(results.values()))["steps"]
    result = (f"a {steps:,}-step run's chart data in {', '.join(figures)} at p50 (goal ≤ "
              f"{ms(FIGURES_GOAL_MS)} ms); the first chart in a fresh browser after "
              f"{', '.join(previews)} (goal ≤ {ms(FRESH_GOAL_MS)} ms), the first interactive one "
              f"after {', '.join(interactive)}")
    return "\n\n".join(parts), result, "\n".join(details)


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, quick="10^5 steps, few repeats")
    cli.add_argument("--postgres", action="store_true", help="also on PostgreSQL")
    args = cli.parse_args(argv)
    args.steps = 100_000 if args.quick else 1_000_000
    args.repeats = 5 if args.quick else 15
    args.loads = 2 if args.quick else 5
    args.fresh = 1 if args.quick else 5
    args.full_resolution = True
    if not Path(CHROMIUM).exists():
        print(f"Chromium not found at {CHROMIUM}: apt-get install chromium", file=sys.stderr)
        return 2
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = bench_backend("sqlite", f"sqlite:///{tmp}/bench.db", args, Path(tmp))
        if args.postgres:
            try:
                url = create_pg_database()
            except PostgresUnavailable:
                print("PostgreSQL unreachable: skipped", file=sys.stderr)
            else:
                try:
                    results["postgres"] = bench_backend("postgres", url, args, Path(tmp))
                finally:
                    drop_pg_database(url)
    body, result, details = report(results)
    intro = (
        "A synthetic ScheduleFree+ run streamed through the REST API into a real "
        "`curvecast serve` process: loss and 11 telemetry keys every step, 4 norms every "
        "10 steps, eval loss every 1,000 steps (12.4 points per step). Server times: "
        "request latencies from a client on the same machine (warm process, p50 / p95); "
        "browser times: `performance.now()` at Plotly's first and last `newPlot` in headless "
        "Chromium, first loads with an empty profile and warm loads (plotly.js cached). "
        "The baseline is the same page for a 10,000-step run."
    )
    return publish(args, "dashboard", "Dashboards on a 10^6-step run", intro + "\n\n" + body,
                   result, details=details)
