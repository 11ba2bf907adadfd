"""``curvecast demo``: the service on the embedded default plus a real training run streaming
into it, with the live forecast in the terminal.

It starts the service (SQLite file, loopback) in this process, runs
``examples/train_charlm.py`` (ScheduleFreePlus on a small character-level transformer, with the
client hook) as a child process, and polls the REST API once a second to draw two progress rows
(``demo_progress.py``): step, elapsed time and the time left at the recent pace, the training
loss reached, the forecast of the final loss with its interval, f*, and the ETA to one target
loss. At the end it compares the forecast made at 20% of the run, and the first one with status
``ok``, with the loss actually reached, then keeps serving the dashboard until Ctrl-C.

The demo binds its listening socket itself before anything else and hands that socket to
uvicorn, so the server the training run and the progress line talk to is necessarily this
process's: when the port is taken (another demo, another server) it takes a free port and says
so, rather than finding the other program's ``/healthz`` and streaming into its database. Its
files (the SQLite database and the training log, which the training script writes a line to
every 5% of the run) go to one directory, ``curvecast-demo/`` by default, which ``.gitignore``
covers; a second demo while one runs takes ``curvecast-demo-2/`` (:func:`claim_dir`).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import uvicorn
from filelock import FileLock, Timeout

from curvecast.contract import ForecastStatus
from curvecast.service.app import create_app
from curvecast.service.config import Settings
from curvecast.service.demo_progress import (
    DemoApi,
    Progress,
    fmt_loss,
    loss_reached_of,
    series_of,
)
from curvecast.service.demo_terminal import Rows, log_above
from curvecast.service.http_guard import protocol_for

TRAIN_SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "train_charlm.py"
# d_model, layers. "small" (0.4M parameters) trains 2,000 steps in a few minutes on 2 cores
# (BENCHMARKS.md, "The demo run").
SIZES = {"tiny": ("32", "1"), "small": ("128", "2")}
#: Long enough for the eval curve to bend after averaging starts, so the forecast leaves
#: ``too_early`` for ``ok`` (f* identified) before the end; 1,000 steps ended ``no_asymptote``.
DEFAULT_STEPS = 2000
#: The demo's one run is refitted at most every second (the service's default is 5 s, for
#: many runs): a fit lands every 5% of growth, so the summary's "forecast at 20%" is at 20%.
REFIT_MIN_INTERVAL_S = 1.0
DEFAULT_DIR = "curvecast-demo"


def add_demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``curvecast demo``."""
    demo = sub.add_parser(
        "demo", help="serve and train a real model, forecasting live",
        description="Serve curvecast on 127.0.0.1 (a SQLite file in --dir), train a small "
        "character-level transformer with ScheduleFree+ on the CPU, streaming to it, and show "
        "the live forecast of its final eval loss; at the end, compare the forecasts made "
        "early with the loss reached, then keep serving the dashboards until Ctrl-C.")
    demo.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                      help=f"training steps (default {DEFAULT_STEPS})")
    demo.add_argument(
        "--port",
        type=int,
        default=8000,
        help="port on 127.0.0.1 (default 8000); if it is taken, a free port is used instead",
    )
    demo.add_argument(
        "--dir",
        default=DEFAULT_DIR,
        help=f"where the demo's database and training log go (default ./{DEFAULT_DIR}/; "
        "taken by a demo still running: DIR-2, DIR-3, ...)",
    )
    demo.add_argument(
        "--database-url", help="database (default: SQLite file curvecast.db in --dir)"
    )
    demo.add_argument("--project", default="demo", help="the run's project (default demo)")
    demo.add_argument("--target", type=float, help="target loss for the ETA (default: chosen)")
    demo.add_argument("--size", choices=sorted(SIZES), default="small",
                      help="model size: small (width 128, 2 layers; default) or tiny (width 32, "
                      "1 layer: a 200-step run takes seconds)")
    demo.add_argument(
        "--exit-when-done",
        action="store_true",
        help="stop serving when training ends (default: serve until Ctrl-C)",
    )
    demo.set_defaults(func=run_demo)


def bind_loopback(port: int) -> tuple[socket.socket, str | None]:
    """A listening-ready socket on 127.0.0.1: ``port`` if it is free, else a free port.

    Returns:
        The bound socket and, when ``port`` was taken, a sentence saying which port was used
        instead (None otherwise).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    # Lets a demo restart on the port its previous run just left (TIME_WAIT); on Linux it does
    # not let two sockets listen on one port, so a live server there still makes bind() fail.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        return sock, None
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            sock.close()
            raise
    sock.bind(("127.0.0.1", 0))
    used = sock.getsockname()[1]
    return sock, (
        f"port {port} is in use by another program (another demo or server?); "
        f"this demo serves on port {used} instead and talks only to its own server"
    )


class _Server:
    """uvicorn serving the app in a background thread of this process, on a socket this
    process bound (so nothing else can be answering on it)."""

    def __init__(self, settings: Settings, sock: socket.socket, *, own_logging: bool) -> None:
        # ``own_logging``: uvicorn's messages go to the root logger's handlers (the demo's,
        # printed above its progress rows), not to uvicorn's own stderr handler.
        kwargs: dict[str, Any] = {"log_config": None} if own_logging else {}
        config = uvicorn.Config(create_app(settings), log_level="warning", lifespan="on",
                                http=protocol_for(settings), **kwargs)
        self.server = uvicorn.Server(config)
        self.sock = sock
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )

    def start(self, timeout: float = 60.0) -> None:
        """Start serving; returns once uvicorn has run the app's start-up (database ready).

        Raises:
            RuntimeError: the server stopped during start-up or did not start in time.
        """
        self.thread.start()
        deadline = time.monotonic() + timeout
        # uvicorn sets `started` after the lifespan start-up (migrations) has completed.
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server stopped during start-up (see the error above)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start within {timeout:.0f}s")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


def claim_dir(base: Path, tries: int = 20) -> tuple[Path, FileLock, str | None]:
    """A directory for this demo's files, held (a lock file in it) until the demo exits:
    ``base`` if no other demo holds it, else ``base-2``, ``base-3``, ...: two demos at once
    never share a database or a log (the second's run appeared on the first's dashboard).
    A demo run after another has ended uses ``base`` again, with the earlier runs in it.

    Returns:
        The directory, its held lock (release it at exit) and, when ``base`` was taken, a
        sentence saying which directory was used instead (None otherwise).

    Raises:
        RuntimeError: ``tries`` directories are all held.
    """
    for n in range(1, tries + 1):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        path.mkdir(parents=True, exist_ok=True)
        lock = FileLock(path / ".demo.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue
        moved = None if n == 1 else (
            f"{base} is in use by another demo; this demo keeps its database and log in {path}")
        return path, lock, moved
    raise RuntimeError(f"{tries} demo directories next to {base} are in use")


def _wait_for_last_fit(client: DemoApi, run_id: str, timeout: float) -> bool:
    """Wait until the run's fit covers its last logged step of the fitted series; False after
    ``timeout`` seconds."""
    base = f"/api/v1/runs/{run_id}"
    deadline = time.monotonic() + timeout
    while True:
        forecast = client.get(f"{base}/forecast") or {}
        key, upto = forecast.get("key"), forecast.get("fitted_upto_step")
        if key and upto is not None:
            steps, _ = series_of(client.get(f"{base}/metrics", keys=key, start=int(upto)))
            if not steps or steps[-1] <= upto:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)


def _summary(client: DemoApi, run_id: str, steps: int) -> str:
    base = f"/api/v1/runs/{run_id}"
    # The loss reached at the end, by the rule every page uses (an eval every 20 steps: the
    # last evaluation alone).
    actual = loss_reached_of(*series_of(client.get(f"{base}/metrics", keys="eval_loss")))
    history = client.get(f"{base}/forecast/history", horizon=steps) or {"points": []}
    early = next(
        (
            p
            for p in history["points"]
            # The first fit from 20% of the run on that gave a number (fits still in the
            # optimizer's burn-in have a status but no value).
            if (p.get("final") or {}).get("value") is not None
            and (p.get("fitted_upto_step") or 0) >= 0.2 * steps
        ),
        None,
    )
    lines = [f"final eval_loss reached (at the averaged weights x): {fmt_loss(actual)}"]
    if early is None:
        lines.append("no forecast with a value was made from 20% of the run on")
    else:
        lines += _quoted(early, steps, actual)
    # The first fit that knew (status ok): where a forecast became useful, and how good it was.
    useful = next((p for p in history["points"] if p.get("status") == ForecastStatus.OK
                   and (p.get("final") or {}).get("value") is not None), None)
    if useful is None:
        lines.append("no forecast reached status ok (still in the transient, or no asymptote)")
    elif useful is not early:
        lines += _quoted(useful, steps, actual)
    return "\n".join(lines)


def _quoted(point: dict[str, Any], steps: int, actual: float | None) -> list[str]:
    """A history point's forecast of the final loss, named by step and status, and its error."""
    f = point["final"]
    out = [
        f"forecast made at step {int(point['fitted_upto_step'])} "
        f"({100 * point['fitted_upto_step'] / steps:.0f}% of the run, status "
        f"{point.get('status')}): {fmt_loss(f['value'])} [{fmt_loss(f['lo'])}, "
        f"{fmt_loss(f['hi'])}]"
    ]
    if actual is not None and f["value"] is not None:
        err = 100 * (f["value"] - actual) / actual
        inside = f["lo"] is not None and f["hi"] is not None and f["lo"] <= actual <= f["hi"]
        out.append(f"  error {err:+.2f}%; the loss reached is "
                   f"{'inside' if inside else 'outside'} the 90% interval")
    return out


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo; returns the exit code."""
    if not TRAIN_SCRIPT.exists():
        print(
            f"curvecast demo needs a source checkout ({TRAIN_SCRIPT} is missing)", file=sys.stderr
        )
        return 2
    try:
        out_dir, dir_lock, elsewhere = claim_dir(Path(args.dir).resolve())
    except (RuntimeError, OSError) as exc:
        print(f"curvecast demo: {exc}", file=sys.stderr)
        return 2
    try:
        return _serve_and_train(args, out_dir, elsewhere)
    finally:
        dir_lock.release()


def _serve_and_train(args: argparse.Namespace, out_dir: Path, elsewhere: str | None) -> int:
    """The demo in its own directory (:func:`claim_dir`)."""
    if elsewhere:
        print(f"curvecast demo: {elsewhere}", flush=True)
    try:
        sock, moved = bind_loopback(args.port)
    except OSError as exc:
        print(f"curvecast demo: cannot listen on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        return 2
    if moved:
        print(f"curvecast demo: {moved}", flush=True)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    database_url = args.database_url or f"sqlite:///{out_dir / 'curvecast.db'}"
    settings = Settings(database_url=database_url, public_url=url, auth_enabled=False,
                        refit_min_interval_s=REFIT_MIN_INTERVAL_S)
    # On a terminal, two progress rows are redrawn in place, and log messages (the service's
    # warnings) are printed above them instead of into them.
    rows = Rows(sys.stdout) if sys.stdout.isatty() else None
    server = _Server(settings, sock, own_logging=rows is not None)
    if rows is not None:
        log_above(rows)
    try:
        server.start()
    except RuntimeError as exc:
        print(f"curvecast demo: {exc}", file=sys.stderr)
        server.stop()
        return 2
    run_id = str(uuid.uuid4())
    log_path = out_dir / f"train-{run_id[:8]}.log"
    print(f"curvecast is serving at {url} (database: {settings.database_url})")
    print(f"dashboard of this run: {url}/runs/{run_id}")
    print(
        f"training a {args.size} character-level transformer on the Python standard library "
        f"for {args.steps} steps with ScheduleFreePlus (log: {log_path})",
        flush=True,
    )
    d_model, layers = SIZES[args.size]
    cmd = [
        sys.executable,
        str(TRAIN_SCRIPT),
        "--url",
        url,
        "--project",
        args.project,
        "--run-id",
        run_id,
        "--steps",
        str(args.steps),
        "--d-model",
        d_model,
        "--layers",
        layers,
    ]
    interrupted = False
    client = DemoApi(url)
    with log_path.open("w") as log_file:
        # Unbuffered: the log shows how far training got even if the demo is cut short.
        train = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
        progress = Progress(client, run_id, args.steps, args.target, rows)
        try:
            while train.poll() is None:
                progress.draw()
                time.sleep(1.0)  # redraw cadence of the progress line
        except KeyboardInterrupt:
            interrupted = True
            train.send_signal(signal.SIGINT)
            train.wait(timeout=60)
        # The worker refits an ended run with its last points at once: wait for that fit, so
        # the last row and the summary quote it (bounded: a failed run may get none).
        _wait_for_last_fit(client, run_id, timeout=2.0 if interrupted else 15.0)
        progress.draw(final=True)
        if train.returncode != 0 and not interrupted:
            print(f"training failed (exit {train.returncode}); see {log_path}", file=sys.stderr)
        else:
            print(_summary(client, run_id, args.steps), flush=True)
    if args.exit_when_done or interrupted:
        server.stop()
        return 0 if not interrupted and train.returncode == 0 else 1
    print(f"still serving at {url}/runs/{run_id} — press Ctrl-C to stop", flush=True)
    try:
        while server.thread.is_alive():
            server.thread.join(timeout=1.0)
    except KeyboardInterrupt:
        pass
    server.stop()
    return 0
