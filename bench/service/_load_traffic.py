"""The load bench's traffic: the training clients that write and the pages and scripts that read.

:func:`generator_process` runs simulated training clients (real :class:`client.Monitor` s, one
run each, paced against the wall clock) as threads of one process, its transport timing every
request; :class:`Readers` keeps run pages open as ``dashboards/static/run.js`` does and runs the
scripts that ask forecasts, on fixed schedules. ``bench/service/load.py`` says what is measured.
"""

from __future__ import annotations

import json
import math
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from curvecast.contract import telemetry_key

#: The optimizer statistics each simulated client logs, under the contract's telemetry names.
STATS = ("eta", "alpha", "grad_l1", "numerator", "denom_ema", "c", "sf_beta")
KEYS = ("loss", "lr", *(telemetry_key(stat) for stat in STATS), "grad_norm")


# --------------------------------------------------------------------------------------------
# Generator processes
# --------------------------------------------------------------------------------------------


@dataclass
class GeneratorJob:
    url: str
    run_ids: list[str]
    steps_per_second: float
    duration: float
    start_at: float  # time.time() at which every client starts
    spool_dir: str
    #: Each client's monitor is created at a random moment of this many seconds before
    #: start_at (0: all at once; see _client).
    phase_spread: float = 1.0


def _timed_transport(url: str, records: list[tuple[float, float, int, int]]) -> Any:
    from curvecast.client import HTTPTransport, TransportError

    class TimedTransport(HTTPTransport):
        """Records (sent at, latency, status or 0 for no answer, points accepted)."""

        def request(self, method: str, path: str, **kwargs: Any) -> Any:
            started = time.time()
            t0 = time.perf_counter()
            try:
                resp = super().request(method, path, **kwargs)
            except TransportError:
                if method == "POST":
                    records.append((started, time.perf_counter() - t0, 0, 0))
                raise
            if method == "POST":
                accepted = 0
                if resp.status == 200:
                    accepted = int(json.loads(resp.body).get("accepted", 0))
                records.append((started, time.perf_counter() - t0, resp.status, accepted))
            return resp

    return TimedTransport(url)


def _client(job: GeneratorJob, run_id: str, out: dict[str, Any]) -> None:
    from curvecast.client import Monitor

    records: list[tuple[float, float, int, int]] = []
    steps = int(job.steps_per_second * job.duration)
    # A monitor sends a batch every flush_interval (1 s) from its creation. Independent jobs
    # were started at unrelated moments, so their sends are spread over the second; monitors
    # created in the same few milliseconds would send in lockstep, 32 batches at once every
    # second, for as long as the run lasts (--lockstep measures that case).
    if job.phase_spread:
        phase = random.Random(f"{run_id}/phase").random() * job.phase_spread
        time.sleep(max(0.0, job.start_at - job.phase_spread + phase - time.time()))
    mon = Monitor(url=job.url, project="load", run_name=f"load-{run_id[:8]}", run_id=run_id,
                  total_steps=steps, config={"c_warmup": 100}, spool_dir=job.spool_dir,
                  transport=_timed_transport(job.url, records), flush_timeout=300)
    rng = random.Random(run_id)
    a, b, c = rng.uniform(10, 30), rng.uniform(100, 1000), rng.uniform(1.5, 3.0)
    late = 0.0
    step = 0
    for step in range(1, steps + 1):
        target = job.start_at + step / job.steps_per_second
        delay = target - time.time()
        if delay > 0:
            time.sleep(delay)
        else:
            late = max(late, -delay)
        loss = a / math.sqrt(step + b) + c + rng.gauss(0, 0.01)
        stats = {"eta": 0.1, "alpha": 1e-3, "grad_l1": 100 + rng.random(), "numerator": loss,
                 "denom_ema": 50.0, "c": 1.0 / step, "sf_beta": 0.9}
        mon.log(step, loss=loss, lr=1e-3, grad_norm=1.0 + rng.random(),
                **{telemetry_key(k): v for k, v in stats.items()})
    logged_at = time.time()
    ok = mon.finish(timeout=300)
    out[run_id] = {"steps": step, "records": records, "stats": mon.stats(), "finished": ok,
                   "logged_at": logged_at, "done_at": time.time(), "max_late_s": late}


def generator_process(job: GeneratorJob) -> dict[str, Any]:
    """Run ``len(job.run_ids)`` clients as threads; returns their records and counters."""
    out: dict[str, Any] = {}
    threads = [threading.Thread(target=_client, args=(job, r, out)) for r in job.run_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu = psutil.Process().cpu_times()
    return {"clients": out, "cpu_s": cpu.user + cpu.system}


# --------------------------------------------------------------------------------------------
# Readers (threads of the main process)
# --------------------------------------------------------------------------------------------


#: Request kinds of the dashboard viewers, as the report names them.
FIGURES_PAGE = "dashboard figures (page opened)"
FIGURES_FIT = "dashboard figures (new fit: loss, evolution)"
POLL = "page live poll (run, new points, forecast, alerts: one request)"
#: The run page's poll interval (``service/web/pages.py``'s POLL_MS) and how long a viewer keeps
#: a page open.
POLL_S = 2.0
PAGE_S = 30.0
#: Steps the page asks again behind its cursor (``run.js``'s LAG: late points of a step).
LAG = 64
#: Rounds (a forecast, a target and a 2,000-bucket read) per second of each script: about what
#: the scripts' closed loop made before 2026-11-26 (~5 a second each, 3 requests a round).
SCRIPT_ROUNDS_PER_S = 5.0


@dataclass
class Readers:
    url: str
    run_ids: list[str]
    viewers: int = 8
    forecasters: int = 2
    page_reloads: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _get(self, client: httpx.Client, kind: str, path: str, **params: Any) -> Any:
        """GET ``path``, timed under ``kind``; its JSON body, or None after an error."""
        t0 = time.perf_counter()
        body, error = None, ""
        try:
            # As the page's query() does: a parameter without a value is left out.
            resp = client.get(path, params={k: v for k, v in params.items() if v is not None})
            ok = resp.status_code == 200
            body = resp.json() if ok else None
            error = "" if ok else f"{resp.status_code} {resp.text[:300]}"
        except (httpx.HTTPError, ValueError) as exc:
            ok, error = False, repr(exc)
        if error and self.errors.get(kind, 0) < 3:
            print(f"load: {kind}: GET {path} {params}: {error}", file=sys.stderr)
        with self.lock:
            self.latencies.setdefault(kind, []).append(time.perf_counter() - t0)
            if not ok:
                self.errors[kind] = self.errors.get(kind, 0) + 1
        return body

    def _viewer(self, index: int) -> None:
        if self.page_reloads:
            self._reloading_viewer(index)
        else:
            self._page_viewer(index)

    def _reloading_viewer(self, index: int) -> None:
        """The heavier model of earlier runs: a whole page load (every figure) every 2 s."""
        rng = random.Random(index)
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                run = rng.choice(self.run_ids)
                self._get(client, FIGURES_PAGE, f"/dashboards/api/runs/{run}/figures")
                self.stop.wait(max(0.0, POLL_S - (time.monotonic() - started)))

    def _page_viewer(self, index: int) -> None:
        """What an open run page does (``dashboards/static/run.js``): every figure once when
        it opens; then every 2 s the run, the points after its cursor (the keys its charts
        show, at most 2,000 per series), the forecast and the alerts, in one request (its
        ``/live`` poll; four REST requests before 2026-11-26); the loss and evolution
        charts again when the forecast's fit changes. A viewer opens another run's page every
        :data:`PAGE_S` seconds; the viewers' first pages open :data:`PAGE_S` / viewers apart,
        so that page loads are spread evenly rather than all at the start."""
        rng = random.Random(index)
        with httpx.Client(base_url=self.url, timeout=60) as client:
            # Viewers open their first pages one after another, PAGE_S / viewers apart.
            if self.stop.wait(PAGE_S * index / self.viewers):
                return
            while not self.stop.is_set():
                page_end = time.monotonic() + PAGE_S
                run = rng.choice(self.run_ids)
                page = self._get(client, FIGURES_PAGE, f"/dashboards/api/runs/{run}/figures")
                if page is None:
                    self.stop.wait(POLL_S)
                    continue
                keys = sorted({k for fig in page["charts"].values()
                               for k in fig["layout"].get("meta", {}).get("keys", [])})
                cursor = max(page["state"]["cursor"].values(), default=-1)
                fitted_at = page["state"].get("fitted_at")
                while not self.stop.wait(POLL_S) and time.monotonic() < page_end:
                    live = self._get(client, POLL, f"/dashboards/api/runs/{run}/live",
                                     keys=",".join(keys) or None,
                                     start=max(0, cursor - LAG + 1), max_points=2000,
                                     horizon=page["state"]["horizon"]) or {}
                    for series in (live.get("metrics") or {}).get("series", []):
                        cursor = max([cursor, *series["steps"][-1:]])
                    forecast = live.get("forecast")
                    if forecast is not None and forecast.get("fitted_at") != fitted_at:
                        fitted_at = forecast.get("fitted_at")
                        self._get(client, FIGURES_FIT, f"/dashboards/api/runs/{run}/figures",
                                  charts="loss,evolution")

    def _forecaster(self, index: int) -> None:
        """A script asking a forecast, a target and a downsampled series of a random run,
        :data:`SCRIPT_ROUNDS_PER_S` times a second on a fixed schedule (a round that runs late
        is not made up), so a faster service answers the same questions rather than more of
        them, and its CPU per point stays comparable."""
        rng = random.Random(1000 + index)
        period = 1.0 / SCRIPT_ROUNDS_PER_S
        next_at = time.monotonic() + rng.random() * period
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.stop.wait(max(0.0, next_at - time.monotonic())):
                next_at = max(next_at + period, time.monotonic())
                run = rng.choice(self.run_ids)
                self._get(client, "forecast", f"/api/v1/runs/{run}/forecast",
                          horizon=rng.choice([6000, 20_000, 200_000]))
                self._get(client, "forecast target", f"/api/v1/runs/{run}/forecast/target",
                          loss=2.5)
                self._get(client, "metrics read (2,000 buckets)",
                          f"/api/v1/runs/{run}/metrics", keys="loss", max_points=2000)

    def wait_until_logged(self, within_s: float = 60.0) -> None:
        """Return once every run has stored a point: the readers ask about runs that have
        logged, as scripts and viewers do (a run with no points answers its reads with 404)."""
        deadline = time.monotonic() + within_s
        waiting = list(self.run_ids)
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while waiting:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{len(waiting)} runs stored no point in {within_s:.0f} s")
                waiting = [run for run in waiting
                           if not client.get(f"/api/v1/runs/{run}").json().get("n_points")]
                self.stop.wait(0.05)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._viewer, args=(i,)) for i in range(self.viewers)]
        threads += [threading.Thread(target=self._forecaster, args=(i,))
                    for i in range(self.forecasters)]
        for t in threads:
            t.start()
        return threads
