"""The service's CPU per request of each kind a run page and a training job send.

Each request of ``load``'s mix, one at a time, against two servers measured in the same run.

Both servers serve one database; requests alternate between them in blocks, so a slow minute
of the machine costs both the same. The CPU of a block is the serving process's CPU time (and
PostgreSQL's, when the database is PostgreSQL) over the block, divided by its requests.

The baseline server is, by default, this code on uvicorn's pure-Python HTTP parser and event
loop (``--http h11 --loop asyncio``), against uvicorn's defaults, which pick httptools and uvloop
when they are installed (they are dependencies of the server extra). With
``--baseline-checkout DIR`` it is the code in ``DIR`` instead (a ``git worktree`` of an older
commit), on the same uvicorn defaults: what a change of the code saves per request.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench._cli import parser, publish
from bench._db import fresh_database
from bench._paths import REPO
from bench._report import checkout_commit, markdown_table, phase
from bench.service.ingest import hook_bodies
from bench.service.load import postgres_cpu_seconds
from curvecast.contract import TELEMETRY_PREFIX
from curvecast.service.config import Settings
from curvecast.service.db import make_engine, make_sessionmaker
from curvecast.service.worker.alerts import evaluate_alerts
from curvecast.service.worker.refit import refit_due_runs
from tests.support.synthetic import batch, create_run

#: The read run: this many steps of the loss and ScheduleFree+'s telemetry (as the hook names
#: them), fitted and judged once before the requests start.
STEPS, TOTAL_STEPS, PREFIX = 6_000, 20_000, TELEMETRY_PREFIX
#: Requests of each kind per block (figures: a fifth of it), and ingest batches per block.
BLOCK, INGEST_BLOCK = 60, 20


@dataclass
class Server:
    """One uvicorn process serving the app."""

    label: str
    proc: subprocess.Popen[bytes]
    url: str
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=self.url, timeout=60)

    def cpu(self) -> float:
        times = psutil.Process(self.proc.pid).cpu_times()
        return times.user + times.system

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(label: str, database_url: str, *, http: str = "auto", loop: str = "auto",
                 checkout: Path | None = None) -> Server:
    """uvicorn serving ``create_app`` (one process, worker off) from this checkout or
    ``checkout``; returns once it answers ``/healthz``."""
    port = _free_port()
    env = dict(os.environ, CURVECAST_DATABASE_URL=database_url, CURVECAST_WORKER_ENABLED="false")
    if checkout is not None:  # its curvecast package comes first on the path
        env["PYTHONPATH"] = str(checkout)
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "curvecast.service.app:create_app", "--factory",
         "--port", str(port), "--http", http, "--loop", loop, "--log-level", "warning",
         "--no-access-log"],
        env=env, cwd=checkout or REPO, stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return Server(label, proc, url)
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"server {label!r} did not start")


def prepare(url: str, server: Server) -> tuple[str, list[str]]:
    """The read run (stored, fitted, judged); returns its id and the page's chart keys."""
    run_id = str(uuid.uuid4())
    create_run(server.client, run_id, "request_cost", total_steps=TOTAL_STEPS)
    for lo in range(0, STEPS, 1000):
        body = batch(lo, lo + 1000, total_steps=TOTAL_STEPS, seed=0, prefix=PREFIX)
        server.client.post(f"/api/v1/runs/{run_id}/metrics", json=body).raise_for_status()
    settings = Settings(database_url=url, worker_enabled=False, refit_min_interval_s=0,
                        alert_eval_min_interval_s=0)
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    while refit_due_runs(sessions, settings) or evaluate_alerts(sessions, settings):
        pass
    engine.dispose()
    page = server.client.get(f"/dashboards/api/runs/{run_id}/figures").json()
    keys = sorted({k for fig in page["charts"].values()
                   for k in fig["layout"].get("meta", {}).get("keys", [])})
    return run_id, keys


def request_kinds(run_id: str, keys: list[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """What each kind asks: the page's live poll (run, points after its cursor, forecast,
    alerts), its figures when a fit arrives, and the scripts' forecast, target and read."""
    api = f"/api/v1/runs/{run_id}"
    return {
        "GET /healthz (the framework's floor)": ("/healthz", {}),
        "live poll: the run": (api, {}),
        f"live poll: new points ({len(keys)} keys, 64 steps)": (
            api + "/metrics", {"keys": ",".join(keys), "start": STEPS - 64, "max_points": 2000}),
        "live poll: forecast": (api + "/forecast", {"horizon": TOTAL_STEPS}),
        "live poll: alerts": (api + "/alerts", {}),
        LIVE: (f"/dashboards/api/runs/{run_id}/live", {
            "keys": ",".join(keys), "start": STEPS - 64, "max_points": 2000,
            "horizon": TOTAL_STEPS}),
        "forecast target": (api + "/forecast/target", {"loss": 2.5}),
        "metrics read (loss, 2,000 buckets)": (api + "/metrics",
                                               {"keys": "loss", "max_points": 2000}),
        "figures (new fit: loss, evolution)": (f"/dashboards/api/runs/{run_id}/figures",
                                               {"charts": "loss,evolution"}),
    }


INGEST = "ingest: the hook's batch (100 steps x 10 keys, base64)"
#: The run page's poll: the four "live poll" requests above in one.
LIVE = "live poll in one request (what run.js sends)"


def measure(servers: list[Server], kinds: dict[str, tuple[str, dict[str, Any]]],
            rounds: int, pg: bool) -> dict[tuple[str, str], list[float]]:
    """``(server, kind) -> [service ms per request, PostgreSQL ms per request]``, summed over
    rounds; blocks alternate between the servers, in a different order each round."""
    totals: dict[tuple[str, str], list[float]] = {}
    ingest_runs = {}
    for s in servers:
        ingest_runs[s.label] = run_id = str(uuid.uuid4())
        create_run(s.client, run_id, "request_cost", total_steps=10**6)
    bodies = hook_bodies(rounds * INGEST_BLOCK)

    def block(server: Server, kind: str, send: Any, n: int, warm: Any = None) -> None:
        (warm or send)()  # a first request may connect or fill a cache
        pg0 = postgres_cpu_seconds() if pg else 0.0
        c0 = server.cpu()
        for i in range(n):
            send(i)
        used = (server.cpu() - c0, (postgres_cpu_seconds() - pg0) if pg else 0.0)
        acc = totals.setdefault((server.label, kind), [0.0, 0.0])
        acc[0] += used[0] * 1e3 / n / rounds
        acc[1] += used[1] * 1e3 / n / rounds

    for r in range(rounds):
        with phase("request_cost", f"round {r + 1} of {rounds}", r + 1, rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            for kind, (path, params) in kinds.items():
                n = BLOCK // 5 if "figures" in kind else BLOCK
                for s in order:
                    c = s.client
                    if c.get(path, params=params).status_code == 404:
                        continue  # an older checkout without this route
                    block(s, kind, lambda _i=0, c=c, p=path, q=params:
                          c.get(p, params=q).raise_for_status(), n)
            chunk = bodies[r * INGEST_BLOCK:(r + 1) * INGEST_BLOCK]
            for s in order:
                path = f"/api/v1/runs/{ingest_runs[s.label]}/metrics"
                headers = {"content-type": "application/json"}
                c = s.client
                block(s, INGEST, lambda i, c=c, p=path, b=chunk, h=headers: c.post(
                    p, content=b[i], headers=h).raise_for_status(), len(chunk),
                    warm=lambda c=c: c.get("/healthz"))
    return totals


def run(args: argparse.Namespace) -> dict[str, Any]:
    backend = "sqlite" if args.sqlite else "postgres"
    checkout = Path(args.baseline_checkout).resolve() if args.baseline_checkout else None
    with tempfile.TemporaryDirectory() as tmp, fresh_database(backend, Path(tmp)) as url:
        if checkout is None:
            base = start_server("baseline", url, http="h11", loop="asyncio")
        else:
            base = start_server("baseline", url, checkout=checkout)
        this = start_server("this", url)
        try:
            with phase("request_cost", "storing, fitting and judging the read run"):
                run_id, keys = prepare(url, this)
            totals = measure([base, this], request_kinds(run_id, keys), args.rounds,
                             pg=backend == "postgres")
        finally:
            base.stop()
            this.stop()
    commit = None
    if checkout is not None:
        commit = checkout_commit(checkout)
    return {"backend": backend, "totals": totals, "commit": commit, "rounds": args.rounds,
            "kinds": [*request_kinds("x", keys), INGEST]}


def summarise(out: dict[str, Any]) -> tuple[str, str]:
    """The section's body and its one-line result."""
    totals, pg = out["totals"], out["backend"] == "postgres"
    floor = totals[("this", out["kinds"][0])][0]
    rows = []
    for kind in out["kinds"]:
        t = totals[("this", kind)]
        b = totals.get(("baseline", kind))  # None: the baseline has no such route

        def base(i: int, b: list[float] | None = b) -> str:
            return "-" if b is None else f"{b[i]:.2f}"

        row: list[object] = [kind, base(0), f"{t[0]:.2f}",
                             "-" if b is None else f"**{t[0] / b[0]:.2f}**"]
        if pg:
            row += [base(1), f"{t[1]:.2f}"]
        row.append(f"{t[0] / floor:.1f}x")
        rows.append(row)
    headers = ["request", "service ms/request, baseline", "service ms/request, this",
               "this / baseline"]
    if pg:
        headers += ["PostgreSQL ms, baseline", "PostgreSQL ms, this"]
    headers.append("this / `/healthz`")
    if out["commit"] is None:
        baseline = ("the same code on uvicorn's pure-Python HTTP parser and event loop "
                    "(`--http h11 --loop asyncio`); this: uvicorn's defaults (httptools and "
                    "uvloop, installed with the server extra)")
    else:
        baseline = (f"the code of `{out['commit']}` (a checkout of it); this: the working "
                    "tree; both on uvicorn's defaults")
    body = (
        f"One `uvicorn` process per server (worker off) on one {out['backend']} database, "
        f"{out['rounds']} rounds of blocks alternating between the servers ({BLOCK} requests a "
        f"block, figures {BLOCK // 5}, ingest {INGEST_BLOCK} batches). The read run has "
        f"{STEPS:,} steps of the loss and ScheduleFree+'s telemetry, a stored fit and judged "
        "alerts. CPU time of the serving process (and of the PostgreSQL cluster) over each "
        f"block, per request. Baseline: {baseline}.\n\n"
        + markdown_table(headers, rows)
    )
    ratios = [float(str(r[3]).strip("*")) for r in rows if r[3] != "-"]
    against = ("pure Python's" if out["commit"] is None
               else f"`{out['commit'].split()[0]}`'s")
    result = (f"service CPU per request {min(ratios):.2f}–{max(ratios):.2f}× {against} "
              f"(median {statistics.median(ratios):.2f}×)")
    return body, result


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, quick="2 rounds")
    cli.add_argument("--baseline-checkout", metavar="DIR",
                     help="the baseline server runs the code in DIR (a git worktree)")
    cli.add_argument("--rounds", type=int, default=8)
    cli.add_argument("--sqlite", action="store_true", help="SQLite instead of PostgreSQL")
    args = cli.parse_args(argv)
    if args.quick:
        args.rounds = 2
    out = run(args)
    body, result = summarise(out)
    name = "request_cost" + ("_vs_checkout" if args.baseline_checkout else "")
    name += "_sqlite" if args.sqlite else ""
    title = ("Service CPU per request" + (" against a checkout" if
             args.baseline_checkout else ", uvicorn's C parser and loop against pure Python")
             + f", {out['backend']}")
    return publish(args, name, title, body, result)
