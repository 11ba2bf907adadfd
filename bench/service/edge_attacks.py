"""Server memory and other clients' latency under a header flood and slowloris.

Anonymous clients attack the request head: a header flood (four sockets each streaming a
100 MiB header) and slowloris (3,000 connections sending one header line every 5 s).

Run from the repository root::

    python -m bench run edge_attacks                       # this code (about 2 minutes)
    python -m bench run edge_attacks --baseline-checkout DIR   # and DIR's code beside it
    python -m bench run edge_attacks --quick               # smaller attacks, no BENCHMARKS.md

A real ``curvecast serve`` (SQLite, auth on, worker off, the deployment's defaults otherwise)
is attacked in phases: quiet, flood, slowloris. Throughout, a victim client asks
``GET /api/v1/runs`` with a read token every 50 ms, each time on a new connection (as
independent clients do), and the server process's RSS is sampled every 50 ms. Each phase
reports the victim's latency (median, p95, max) and failures, the latency ratio against the
quiet phase of the same server (the baseline measured in the same run), the RSS peak over
quiet, and what the attack achieved.
"""

from __future__ import annotations

import argparse
import http.client
import math
import select
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench._cli import parser, publish
from bench._db import fresh_database
from bench._report import checkout_commit, markdown_table, phase
from tests.support import ServerProcess, create_token, start_server_process

MIB = 1024 * 1024
VICTIM_EVERY_S = 0.05


@dataclass
class Victim:
    """A client asking a small authenticated read every 50 ms, each on a new connection."""

    port: int
    token: str
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                conn.request("GET", "/api/v1/runs?limit=5",
                             headers={"Authorization": f"Bearer {self.token}"})
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    self.latencies.append(time.perf_counter() - started)
                else:
                    self.failures.append(f"HTTP {status}")
            except OSError as exc:
                self.failures.append(type(exc).__name__)
            self.stop.wait(VICTIM_EVERY_S)


@dataclass
class Sampler:
    """The server process's RSS every 50 ms, and its CPU time over the phase."""

    pid: int
    peak_mb: float = 0.0
    cpu_s: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        process = psutil.Process(self.pid)
        first = process.cpu_times()
        while not self.stop.is_set():
            self.peak_mb = max(self.peak_mb, process.memory_info().rss / MIB)
            self.stop.wait(0.05)
        last = process.cpu_times()
        self.cpu_s = (last.user + last.system) - (first.user + first.system)


def _measured(server: ServerProcess, token: str, attack: Callable[[], str]) -> dict[str, Any]:
    """Run ``attack`` while the victim asks and the RSS is sampled."""
    victim, sampler = Victim(server.port, token), Sampler(server.proc.pid)
    threads = [threading.Thread(target=victim.run), threading.Thread(target=sampler.run)]
    for t in threads:
        t.start()
    started = time.perf_counter()
    try:
        outcome = attack()
    finally:
        victim.stop.set()
        sampler.stop.set()
        for t in threads:
            t.join()
    lat = sorted(victim.latencies) or [float("nan")]
    p95 = lat[max(0, math.ceil(0.95 * len(lat)) - 1)]  # nearest rank
    return {"seconds": time.perf_counter() - started, "requests": len(victim.latencies),
            "p50": statistics.median(lat) * 1e3, "p95": p95 * 1e3,
            "max": lat[-1] * 1e3, "failures": len(victim.failures),
            "failure_kinds": sorted(set(victim.failures)), "rss_peak": sampler.peak_mb,
            "cpu": sampler.cpu_s,
            "outcome": outcome}


def quiet(seconds: float) -> Callable[[], str]:
    def attack() -> str:
        time.sleep(seconds)  # the victim's requests are the measurement
        return "-"
    return attack


def header_flood(port: int, sockets: int, header_mib: int, seconds: float, deadline_s: float
                 ) -> Callable[[], str]:
    """Rounds of ``sockets`` connections each streaming one header of ``header_mib`` MiB,
    one round after the other for ``seconds`` (at least one round; a round that the server
    lets run ends after ``deadline_s``)."""
    def one_round() -> tuple[list[str], int]:
        socks = [socket.create_connection(("127.0.0.1", port), timeout=60)
                 for _ in range(sockets)]
        head = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Big: ".encode()
        sent = [0] * sockets
        live = set(range(sockets))
        for s in socks:
            s.sendall(head)
        piece = b"a" * (256 * 1024)
        ends = time.monotonic() + deadline_s
        while live and time.monotonic() < ends:
            for i in list(live):
                readable, _, _ = select.select([socks[i]], [], [], 0)
                if readable or sent[i] >= header_mib * MIB:
                    live.discard(i)
                    continue
                try:
                    socks[i].sendall(piece)
                    sent[i] += len(piece)
                except OSError:
                    live.discard(i)
        for s in socks:  # a server that read it all answers only after the end of the head
            try:
                s.sendall(b"\r\n\r\n")
            except OSError:
                pass
        answers = []
        for s in socks:
            s.settimeout(max(1.0, ends - time.monotonic()))
            try:
                answers.append(s.recv(64)[9:12].decode() or "closed")
            except OSError:
                answers.append("closed")
            s.close()
        return answers, max(sent)

    def attack() -> str:
        ends = time.monotonic() + seconds
        answers: list[str] = []
        most = rounds = 0
        while rounds == 0 or time.monotonic() < ends:
            got, sent = one_round()
            answers += got
            most, rounds = max(most, sent), rounds + 1
        counts = {a: answers.count(a) for a in sorted(set(answers))}
        return (f"{rounds} rounds; answers: " + ", ".join(f"{n}x {a}" for a, n in counts.items())
                + f"; at most {most / MIB:.1f} MiB written to a socket before its answer was "
                "seen (the kernels' socket buffers included)")
    return attack


def slowloris(port: int, connections: int, every_s: float, seconds: float,
              server_pid: int) -> Callable[[], str]:
    """``connections`` connections each sending one header line every ``every_s``; the
    connections the server closed are opened again at each round of lines, as the common
    slowloris tool does."""
    def attack() -> str:
        head = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()
        socks: dict[int, socket.socket] = {}
        poller = select.poll()
        closed = opened = 0
        peak_held = 0

        def open_one() -> None:
            nonlocal opened
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(head)
            except OSError:
                return
            s.setblocking(False)
            socks[s.fileno()] = s
            poller.register(s, select.POLLIN)
            opened += 1

        for _ in range(connections):
            open_one()
        ends = time.monotonic() + seconds
        next_line = time.monotonic() + every_s
        next_count = time.monotonic()
        while time.monotonic() < ends:
            for fd, _ in poller.poll(100):
                s = socks.pop(fd)
                poller.unregister(fd)
                s.close()
                closed += 1
            if time.monotonic() >= next_line:
                next_line += every_s
                for s in list(socks.values()):
                    try:
                        s.send(b"X-Slow: 1\r\n")
                    except OSError:
                        pass
                while len(socks) < connections and time.monotonic() < ends:
                    open_one()
            if time.monotonic() >= next_count:  # once a second: reading them costs CPU
                next_count += 1.0
                held = sum(1 for c in psutil.Process(server_pid).net_connections("tcp")
                           if c.laddr and c.laddr.port == port and c.status == "ESTABLISHED")
                peak_held = max(peak_held, held)
        for s in socks.values():
            s.close()
        return (f"{opened:,} opened, {closed:,} closed by the server; at most {peak_held:,} "
                "held open by it at once")
    return attack


def attack_server(label: str, url: str, workdir: Path, args: argparse.Namespace,
                  checkout: Path | None) -> list[dict[str, Any]]:
    """The three phases against one server (``checkout``: its code; ``url``: its database,
    which an older checkout's server migrates itself)."""
    env = {"CURVECAST_AUTH_ENABLED": "true", "CURVECAST_WORKER_ENABLED": "false"}
    if checkout is not None:
        # Its curvecast first; not the working directory's (``python -m`` puts it first).
        env.update(PYTHONPATH=str(checkout), PYTHONSAFEPATH="1")
    server = start_server_process(url, workdir, env=env)
    token = create_token(url, "bench", "read")
    rows = []
    try:
        plan: list[tuple[str, Callable[[], str]]] = [
            ("quiet", quiet(args.quiet_s)),
            (f"header flood: {args.flood_sockets} sockets x {args.header_mib} MiB header",
             header_flood(server.port, args.flood_sockets, args.header_mib, args.flood_s,
                          args.flood_deadline_s)),
            (f"slowloris: {args.slow_connections:,} connections, a header line every "
             f"{args.slow_every_s:g} s, for {args.slow_s:g} s",
             slowloris(server.port, args.slow_connections, args.slow_every_s, args.slow_s,
                       server.proc.pid)),
        ]
        for what, attack in plan:
            with phase("edge_attacks", f"{label}: {what}"):
                rows.append({"server": label, "phase": what, **_measured(server, token, attack)})
    finally:
        server.stop()
    return rows


def summarise(rows: list[dict[str, Any]], baseline: str | None) -> tuple[str, str]:
    """The section's body, and its one-line result: this server's RSS growth and the
    victim's p95 against quiet under each attack."""
    table = []
    for row in rows:
        quiet_row = next(r for r in rows if r["server"] == row["server"] and r["phase"] == "quiet")
        failures = (f"{row['failures']} ({', '.join(row['failure_kinds'])})"
                    if row["failures"] else "0")
        table.append([
            row["server"], row["phase"], f"{row['seconds']:.0f}", row["requests"],
            f"{row['p50']:.1f}", f"{row['p95']:.1f}", f"{row['max']:.0f}",
            f"**{row['p95'] / quiet_row['p95']:.1f}x**", failures,
            f"{100 * row['cpu'] / row['seconds']:.0f}%",
            f"{row['rss_peak']:.0f} (+{row['rss_peak'] - quiet_row['rss_peak']:.0f})",
            row["outcome"],
        ])
    headers = ["server", "phase", "s", "victim requests", "p50 ms", "p95 ms", "max ms",
               "p95 / quiet", "victim failures", "server CPU (of a core)",
               "RSS peak MB (over quiet)", "the attack"]
    note = (f"Baseline server: `{baseline}` (same database, same machine, same run). "
            if baseline else "")
    quiet = {r["server"]: r for r in rows if r["phase"] == "quiet"}
    result = "; ".join(
        f"{r['phase']}: RSS +{r['rss_peak'] - quiet[r['server']]['rss_peak']:.0f} MB, victim p95 "
        f"{r['p95'] / quiet[r['server']]['p95']:.1f}× quiet"
        for r in rows if r["server"] == "this" and r["phase"] != "quiet")
    return (
        "A `curvecast serve` process (SQLite, auth on, worker off, every other setting at its "
        "default: 32 KiB and 100 header lines per head, a 10 s head deadline, 1,000 "
        "connections) attacked by anonymous clients from the same machine, while a victim "
        "client asks `GET /api/v1/runs` with a read token every 50 ms on a new connection. "
        "The ratio is the victim's p95 latency in the phase against the quiet phase of the same "
        "server. The attackers run on the same two cores as the server and the victim: part of "
        "the victim's wait is their CPU, not the server's (its own CPU is a column). "
        + note + "\n\n" + markdown_table(headers, table)
    ), result


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__, quick="smaller attacks")
    cli.add_argument("--baseline-checkout", metavar="DIR",
                        help="also attack a server running the code in DIR")
    cli.add_argument("--quiet-s", type=float, default=10.0)
    cli.add_argument("--flood-sockets", type=int, default=4)
    cli.add_argument("--header-mib", type=int, default=100)
    cli.add_argument("--flood-s", type=float, default=30.0,
                        help="seconds of flood rounds (at least one round)")
    cli.add_argument("--flood-deadline-s", type=float, default=180.0,
                        help="most seconds one round goes on (a server that reads it all)")
    cli.add_argument("--slow-connections", type=int, default=3000)
    cli.add_argument("--slow-every-s", type=float, default=5.0)
    cli.add_argument("--slow-s", type=float, default=30.0)
    args = cli.parse_args(argv)
    if args.quick:
        args.quiet_s, args.header_mib, args.slow_connections, args.slow_s = 3.0, 8, 300, 12.0
        args.flood_s = 3.0
    checkout = Path(args.baseline_checkout).resolve() if args.baseline_checkout else None
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        with fresh_database("sqlite", workdir) as url:
            rows += attack_server("this", url, workdir, args, None)
        if checkout is not None:
            rows += attack_server("baseline", f"sqlite:///{workdir / 'baseline.db'}", workdir,
                                  args, checkout)
    text, result = summarise(rows, checkout_commit(checkout) if checkout else None)
    return publish(args, "edge_attacks", "Header flood and slowloris: server memory and other "
                   "clients' latency", text, result)
