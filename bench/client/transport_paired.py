"""The client's HTTP transport of this checkout against a git revision's, in one process.

:class:`~curvecast.client.HTTPTransport` sends one request a second from the monitor's sender
thread: what a transport costs a user is its share of the training step. Against a real
``curvecast serve`` (SQLite), both transports in turns, in one process:

1. **Per request**: ``POST /metrics`` of one second's batch (:data:`BATCH_STEPS` steps of the
   bench's 8 metrics), the two transports alternating request by request, each on a keep-alive
   connection of its own; the calling thread's CPU clock around the call (the client's Python:
   building the request, reading the answer; the server is another process), and the wall
   round trip. The CPU caches are written over before each request, as a second of training
   does between two batches.
2. **Whole hook**: ``client_overhead``'s CPU accounting (:func:`~bench.client._loop.
   bench_cost`: its MLP, ``watch()`` and ``log()`` of 8 metrics, 2,000 steps) with a monitor on
   each transport, in pairs whose order alternates; per pair the ratio of the sender thread's
   CPU per step and of the whole hook's share of the training step.
3. **TCP_NODELAY**: round trips of small ``POST /metrics`` over this checkout's transport, and
   over the same transport with ``TCP_NODELAY`` cleared after connecting.

The revision's ``client/_http.py`` and ``client/_transport.py`` are loaded as fresh modules from
``git show`` (its ``TransportError`` replaced by this checkout's, which ``Api`` catches).

Usage: ``python -m bench run transport_paired --base REV [--pairs N] [--requests N] [--no-write]``
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
import uuid
from pathlib import Path
from typing import Any

import torch

from bench._cli import parser, publish
from bench._report import markdown_table, phase, revision_line
from bench.client._loop import Cost, bench_cost, other_metrics, pct, server
from bench.client.client_overhead import NagleHTTPTransport
from bench.client.encode_paired import FLUSH_BYTES, flush_caches
from curvecast.client import HTTPTransport, Transport, _transport
from curvecast.client._api import Api
from curvecast.client._batcher import encode_records

#: Steps in one second's batch: about what ``bench.client_overhead`` sends at its step rate.
BATCH_STEPS = 400


def transport_at(rev: str) -> type[Any]:
    """``HTTPTransport`` as revision ``rev`` had it, from its ``client/_http.py`` (the
    connection it used) and ``client/_transport.py``."""
    def source(path: str) -> str:
        return subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True,
                              check=True).stdout

    def load(name: str, path: str) -> types.ModuleType:
        module = types.ModuleType(name)
        sys.modules[name] = module  # dataclasses look their module up by name
        exec(compile(source(path), f"<{rev}:{path}>", "exec"), module.__dict__)  # noqa: S102
        return module

    connection = load(f"http_at_{rev}", "client/_http.py")
    sys.modules["curvecast.client._http"] = connection  # what the revision's transport imports
    try:
        transport = load(f"transport_at_{rev}", "client/_transport.py")
    finally:
        del sys.modules["curvecast.client._http"]
    transport.TransportError = _transport.TransportError  # the class Api catches
    cls: type[Any] = transport.HTTPTransport
    return cls


def batch_body(first_step: int) -> bytes:
    """One second's ``POST /metrics`` body: :data:`BATCH_STEPS` steps of 8 metrics."""
    records = [(step, time.time(), {"loss": 2.0 / (1 + step / 500), **other_metrics(step)}, None)
               for step in range(first_step, first_step + BATCH_STEPS)]
    [batch], _ = encode_records(records)
    return batch.body


def new_run(api: Api) -> str:
    """A run to post to (learning, as the monitor does, whether the service reads base64)."""
    run_id = str(uuid.uuid4())
    result = api.put_run(run_id, {"project": "bench", "name": "transport"})
    assert result.ok, result.message
    return run_id


def per_request(url: str, transports: dict[str, Transport], requests: int
                ) -> dict[str, tuple[list[int], list[int]]]:
    """Thread CPU and wall ns of each transport's ``POST /metrics`` of one second's batch, the
    transports alternating request by request (which goes first alternating too)."""
    apis = {name: Api(t) for name, t in transports.items()}
    runs = {name: new_run(api) for name, api in apis.items()}
    scratch = bytearray(FLUSH_BYTES)
    out: dict[str, tuple[list[int], list[int]]] = {name: ([], []) for name in transports}
    names = list(transports)
    for i in range(requests + 5):  # the first 5: warm-up, not counted
        body = batch_body(1 + i * BATCH_STEPS)
        for name in names if i % 2 == 0 else names[::-1]:
            flush_caches(scratch)
            cpu0, wall0 = time.thread_time_ns(), time.perf_counter_ns()
            result = apis[name].post_metrics(runs[name], body)
            cpu, wall = time.thread_time_ns() - cpu0, time.perf_counter_ns() - wall0
            assert result.ok, result.message
            if i >= 5:
                out[name][0].append(cpu)
                out[name][1].append(wall)
    for t in transports.values():
        t.close()
    return out


def small_rtt(transports: dict[str, Transport], n: int, every: dict[str, int]
              ) -> dict[str, float]:
    """Median ms of a one-step ``POST /metrics`` (8 metrics), each transport on its keep-alive
    connection, the transports alternating request by request (``every[name]``: that one only
    every so many rounds)."""
    apis = {name: Api(t) for name, t in transports.items()}
    runs = {name: new_run(api) for name, api in apis.items()}
    samples: dict[str, list[int]] = {name: [] for name in transports}
    names = list(transports)
    for step in range(n):
        [batch], _ = encode_records([(step, time.time(), {f"m{i}": 1.0 for i in range(8)}, None)])
        for name in names if step % 2 == 0 else names[::-1]:
            if step % every.get(name, 1) == 0:
                result = apis[name].post_metrics(runs[name], batch.body)
                assert result.ok, result.message
                samples[name].append(int(result.elapsed * 1e9))
    for t in transports.values():
        t.close()
    return {name: pct(values, 0.5) / 1000 for name, values in samples.items()}


def share(cost: Cost) -> float:
    """The whole hook as a share of the training step, %."""
    return cost.total / cost.step * 100


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--base", required=True,
                     help="a revision whose client/_http.py is the hand-written connection")
    cli.add_argument("--pairs", type=int, default=6, help="pairs of whole-hook runs (6)")
    cli.add_argument("--requests", type=int, default=150,
                     help="one-second batches posted by each transport (150)")
    cli.add_argument("--steps", type=int, default=2000, help="measured steps a hook run")
    args = cli.parse_args(argv)
    base_line = revision_line(args.base)
    if base_line is None:
        cli.error(f"--base {args.base!r} is not a revision of this repository")
    base_cls = transport_at(args.base)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    torch.set_num_threads(1)  # as client_overhead: no OpenMP spinning on shared cores
    base, ours = "hand-written", "http.client"
    costs: dict[str, list[Cost]] = {base: [], ours: []}
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, server(Path(tmp)) as srv:
        with phase("transport_paired", f"{args.requests} one-second batches each", 1, 3):
            requests = per_request(srv.url, {base: base_cls(srv.url), ours: HTTPTransport(srv.url)},
                                   args.requests)
        with phase("transport_paired", f"{args.pairs} pairs of whole-hook runs", 2, 3):
            for pair in range(args.pairs):
                for name in (base, ours) if pair % 2 == 0 else (ours, base):
                    cls = base_cls if name == base else HTTPTransport
                    costs[name].append(bench_cost(
                        srv.url, Path(tmp) / f"spool-{pair}-{name}", args.steps, True,
                        transport=cls(srv.url)))
                print(f"pair {pair + 1}: " + ", ".join(
                    f"{n} sender {costs[n][-1].sender:.2f} µs, hook {costs[n][-1].total:.1f} µs "
                    f"({share(costs[n][-1]):.2f}% of {costs[n][-1].step:.0f} µs)" for n in costs),
                    flush=True)
        with phase("transport_paired", "small POSTs, with and without TCP_NODELAY", 3, 3):
            rtt = small_rtt({"base": base_cls(srv.url), "ours": HTTPTransport(srv.url),
                             "nagle": NagleHTTPTransport(srv.url)}, 200, {"nagle": 5})

    load_end = os.getloadavg()[0]

    def med(values: list[int]) -> float:
        return statistics.median(values) / 1e3  # ns -> µs

    cpu = {n: med(requests[n][0]) for n in requests}
    wall = {n: med(requests[n][1]) / 1e3 for n in requests}  # ms
    pairs = list(zip(costs[base], costs[ours], strict=True))
    sender_ratio = [o.sender / b.sender for b, o in pairs]
    share_ratio = [share(o) / share(b) for b, o in pairs]
    extra = cpu[ours] - cpu[base]  # µs of CPU per request
    steps_per_batch = statistics.median(c.steps_per_batch for c in costs[ours])
    step_us = statistics.median(c.step for c in costs[ours])

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"

    def median_of(name: str, field: str) -> float:
        return float(statistics.median(getattr(c, field) for c in costs[name]))

    load_note = (": more runnable jobs than cores, so a second's batch held fewer steps than "
                 "on an idle machine"
                 if max(load_start, load_end) > (os.cpu_count() or 1) else "")
    hook_note = (
        "The whole hook's share of the step moved by less than its pairs' spread (their ratios "
        "span 1)." if min(share_ratio) <= 1 <= max(share_ratio) else
        "The whole hook's share of the step moved in every pair, the same way.")
    rows: list[list[object]] = [
        ["client CPU per one-second batch request, median µs (p90)",
         f"{cpu[base]:.0f} ({pct(requests[base][0], 0.9):.0f})",
         f"{cpu[ours]:.0f} ({pct(requests[ours][0], 0.9):.0f})", f"{cpu[ours] / cpu[base]:.2f}"],
        ["its round trip, median ms", f"{wall[base]:.2f}", f"{wall[ours]:.2f}",
         f"{wall[ours] / wall[base]:.2f}"],
        ["sender thread, µs CPU per training step (median of pairs' ratios)",
         f"{median_of(base, 'sender'):.2f}", f"{median_of(ours, 'sender'):.2f}",
         spread(sender_ratio)],
        ["whole hook, µs CPU per training step", f"{median_of(base, 'total'):.1f}",
         f"{median_of(ours, 'total'):.1f}", ""],
        ["whole hook, share of the training step (median of pairs' ratios)",
         f"{statistics.median(map(share, costs[base])):.2f}%",
         f"{statistics.median(map(share, costs[ours])):.2f}%", spread(share_ratio)],
        ["small `POST /metrics` round trip, median ms", f"{rtt['base']:.2f}",
         f"{rtt['ours']:.2f}", f"{rtt['ours'] / rtt['base']:.2f}"],
    ]
    table = markdown_table(["per request / per step", f"hand-written (`{args.base}`)",
                            "`http.client` (this checkout)", "ratio"], rows)
    base_hash = base_line.split()[0]
    body = f"""`HTTPTransport` on the standard library's `http.client` (this checkout) against the
hand-written HTTP/1.1 connection of `{base_hash}` (loaded from git), in one process against one
`curvecast serve` (SQLite). Per request: {args.requests} `POST /metrics` of one second's batch
({BATCH_STEPS} steps × 8 metrics) each, alternating, CPU caches written over before each; the
client thread's CPU clock. Whole hook: `client_overhead`'s CPU accounting ({args.steps:,} steps),
{args.pairs} pairs of runs, one on each transport, the ratio read pair by pair. Load average
{load_start:.1f} → {load_end:.1f} on {os.cpu_count()} cores{load_note}.

{table}

{hook_note} `http.client` sets `TCP_NODELAY` itself; cleared, a small `POST /metrics` took
{rtt['nagle']:.2f} ms against {rtt['ours']:.2f} ms (Nagle's algorithm holds the body until the
server's delayed ACK of the head)."""
    result = (f"`http.client` costs {extra:.0f} µs more CPU per one-second batch than the "
              f"hand-written connection: {extra / steps_per_batch:.2f} µs per training step, "
              f"{extra / steps_per_batch / step_us * 100:.3f}% of the step, in this run")
    return publish(args, "transport_paired", "Client HTTP transport: http.client against the "
                   "hand-written connection", body, result)
