"""Dashboards on a 10^6-step run: server response times of the run page's data and the time to
the first rendered chart in headless Chromium.

Starts a real ``curvecast serve`` process on a fresh SQLite file (``--postgres`` adds a fresh
PostgreSQL database), streams a synthetic ScheduleFree+ run of 10^6 steps through the REST API
(every key the run page draws, at the client hook's rates: loss and 11 telemetry keys every step,
4 weight/gradient norms every 10 steps, eval loss every 1,000 steps: ~12.4 million points), waits
for the worker's fit, then measures, with baselines from the same run:

* server: the run page's chart data (``GET /dashboards/api/runs/{id}/figures``, all six charts,
  downsampled on the server), the HTML page, one live-update poll, one zoom re-fetch (p50/p95
  of warm requests, and the first request after start-up);
* browser: time from navigation to the first rendered chart, and to all six (median of warm
  loads; the first load of a fresh profile separately);
* baselines: the same page for a 10^4-step run, and fetching the 10^6-point loss series at full
  resolution from the metrics API and drawing it with one WebGL trace.

Usage: ``python -m bench.dashboard [--quick] [--postgres]`` (``--quick``: 10^5 steps, fewer
repeats; a smoke run that does not write BENCHMARKS.md unless ``--write``).
"""

from __future__ import annotations

import argparse
import json
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
import psycopg

from bench._report import markdown_table, write_section
from curvecast.service.testing import start_server_process
from curvecast.service.testing import synthetic as syn

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]
CHARTS = 6
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
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
                                    eval_every=1000)).encode()
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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/api/v1/runs/{run_id}/forecast").json()
        # The fit follows eval_loss (every 1,000 steps): its last point is up to 999 steps back.
        if body["status"] != "pending" and (body["fitted_upto_step"] or 0) >= 0.85 * last_step:
            return
        time.sleep(0.5)
    raise TimeoutError("the worker did not fit the run in time")


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
    keys = ",".join(["loss", "eval_loss"] + [f"sfplus/{k}" for k in (
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


def browser_timings(url: str, runs: dict[str, uuid.UUID], loads: int,
                    full_resolution: uuid.UUID | None, backend: str) -> dict[str, Any]:
    """Time to the first chart and to all charts, per run, in a fresh headless Chromium."""
    from playwright.sync_api import sync_playwright

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1280, "height": 800})
        context.set_default_timeout(120_000)
        page = context.new_page()

        def load(run_id: uuid.UUID) -> tuple[float, float]:
            page.goto(f"{url}/runs/{run_id}")
            page.wait_for_function(f"Object.keys(window.__cc.rendered).length === {CHARTS}")
            first, rendered = page.evaluate("[window.__cc.firstChart, window.__cc.rendered]")
            return float(first), float(max(rendered.values()))

        for label, run_id in runs.items():
            cold = load(run_id) if not out else None
            first, every = Timings(), Timings()
            for _ in range(loads):
                a, b = load(run_id)
                first.values.append(a)
                every.values.append(b)
            out[label] = {"first": first, "all": every, "cold": cold}
            if label == "big":  # what the long run looks like: worth a look
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / f"dashboard-bench-{backend}.png"),
                                full_page=True)
        if full_resolution is not None:
            page.goto(f"{url}/healthz")  # same origin, no page of ours: a blank canvas
            page.add_script_tag(url=f"{url}/static/plotly.min.js")
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
        context.close()
    return out


def pg_database() -> str | None:
    name = f"curvecast_bench_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError:
        return None
    return f"postgresql://postgres@127.0.0.1:5432/{name}"


def drop_pg(url: str) -> None:
    name = url.rpartition("/")[2]
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def bench_backend(backend: str, database_url: str, args: argparse.Namespace, tmp: Path
                  ) -> dict[str, Any]:
    from curvecast.service.migrate import upgrade

    upgrade(database_url)
    env = {"CURVECAST_WORKER_INTERVAL_S": "0.2"}
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
            server.url, {"big": big, "small": small}, args.loads,
            full_resolution=big if args.full_resolution else None, backend=backend)
        return result
    except Exception:
        print(server.log()[-3000:], file=sys.stderr)
        raise
    finally:
        server.stop()


def ms(x: float) -> str:
    return f"{x:,.0f}"


def report(results: dict[str, dict[str, Any]]) -> str:
    parts = []
    for backend, r in results.items():
        big, small, br = r["big"], r["small"], r["browser"]
        steps = r["steps"]
        rows: list[list[object]] = []

        def row(what: str, a: Timings, b: Timings, goal: str = "",
                rows: list[list[object]] = rows) -> None:
            rows.append([what, f"{ms(a.median)} / {ms(a.p(0.95))}",
                         f"{ms(b.median)} / {ms(b.p(0.95))}", f"{a.median / b.median:.2f}×", goal])

        row("run page's chart data, 6 charts (`/dashboards/api/runs/{id}/figures`)",
            big["figures"], small["figures"], "≤ 300 ms")
        row("run page HTML (`/runs/{id}`)", big["html"], small["html"])
        row("live-update poll (run + new points + forecast, 3 requests)", big["poll"],
            small["poll"])
        row("zoom re-fetch: 10,000 steps at full resolution", big["zoom"], small["zoom"])
        row("browser: navigation → first chart drawn", br["big"]["first"], br["small"]["first"],
            "≤ 1,500 ms")
        row("browser: navigation → all 6 charts drawn", br["big"]["all"], br["small"]["all"])
        table = markdown_table(
            ["measurement", f"{steps:,}-step run, p50 / p95 ms", "10,000-step run (baseline)",
             "ratio (p50)", "goal"], rows)
        cold = br["big"]["cold"]
        notes = [
            f"Chart data size: {big['figures_bytes'] / 1e6:.2f} MB for the {steps:,}-step run, "
            f"{small['figures_bytes'] / 1e6:.2f} MB for the baseline (buckets, not points).",
            f"First request after a fresh start of the process: "
            f"{ms(big['first_figures_ms'])} ms (imports and caches warm up once).",
        ]
        if cold:
            notes.append(f"First load in a fresh browser profile (plotly.js, 4.8 MB, not yet "
                         f"cached or compiled): first chart after {ms(cold[0])} ms, all charts "
                         f"after {ms(cold[1])} ms.")
        full = br.get("full_resolution")
        if full:
            notes.append(
                f"Baseline without server downsampling: fetching the {full['points']:,}-point "
                f"loss series at full resolution took {ms(full['fetch'])} ms and drawing it as "
                f"one WebGL trace {ms(full['render'])} ms — {ms(full['fetch'] + full['render'])} "
                f"ms for one series, against {ms(br['big']['all'].median)} ms for all six charts "
                f"of the page.")
        parts.append(f"**{backend}**\n\n{table}\n\n" + "\n".join(f"- {n}" for n in notes))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10^5 steps, few repeats (smoke)")
    parser.add_argument("--postgres", action="store_true", help="also on PostgreSQL")
    parser.add_argument("--write", action="store_true", help="write BENCHMARKS.md even if quick")
    args = parser.parse_args(argv)
    args.steps = 100_000 if args.quick else 1_000_000
    args.repeats = 5 if args.quick else 15
    args.loads = 2 if args.quick else 5
    args.full_resolution = True
    if not Path(CHROMIUM).exists():
        print(f"Chromium not found at {CHROMIUM}: apt-get install chromium", file=sys.stderr)
        return 2
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = bench_backend("sqlite", f"sqlite:///{tmp}/bench.db", args, Path(tmp))
        if args.postgres:
            url = pg_database()
            if url is None:
                print("PostgreSQL unreachable: skipped", file=sys.stderr)
            else:
                try:
                    results["postgres"] = bench_backend("postgres", url, args, Path(tmp))
                finally:
                    drop_pg(url)
    body = report(results)
    print(body)
    if not args.quick or args.write:
        intro = (
            "A synthetic ScheduleFree+ run streamed through the REST API into a real "
            "`curvecast serve` process: loss and 11 telemetry keys every step, 4 norms every "
            "10 steps, eval loss every 1,000 steps (12.4 points per step). Server times are "
            "wall-clock request latencies from a client on the same machine (warm process, "
            "p50 / p95); browser times are `performance.now()` at Plotly's first and last "
            "`newPlot` in headless Chromium (flags of the browser tests), median of warm "
            "loads (plotly.js cached). The baseline is the same page for a 10,000-step run."
        )
        write_section("dashboard", "Dashboards on a 10^6-step run (`bench/dashboard.py`)",
                      intro + "\n\n" + body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
