"""``curvecast demo``: the service on the embedded default plus a real training run streaming
into it, with the live forecast in the terminal.

It starts the service (SQLite file, loopback) in this process, runs
``examples/train_charlm.py`` (ScheduleFreePlus on a small character-level transformer, with the
client hook) as a child process, and polls the REST API once a second to draw a progress line:
step, the training loss (mean of the last 50 steps), elapsed and remaining time, the forecast of
the final loss with its interval, f*, and the ETA to a target loss. At the end it compares the
forecast made at 20% of the run, and the first one with status ``ok``, with the loss actually
reached, then keeps serving the dashboard until Ctrl-C.

The demo binds its listening socket itself before anything else and hands that socket to
uvicorn, so the server the training run and the progress line talk to is necessarily this
process's: when the port is taken (another demo, another server) it takes a free port and says
so, rather than finding the other program's ``/healthz`` and streaming into its database. Its
files (the SQLite database and the training log) go to one directory, ``curvecast-demo/`` by
default, which ``.gitignore`` covers.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import math
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import uvicorn

from curvecast.service.app import create_app
from curvecast.service.config import Settings
from curvecast.service.http_guard import protocol_for

TRAIN_SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "train_charlm.py"
# d_model, layers. "small" (0.4M parameters) trains 2,000 steps in 70-105 s on 2 cores
# (BENCHMARKS.md, "demo_run"; up to ~3 min on a busy machine).
SIZES = {"tiny": ("32", "1"), "small": ("128", "2")}
#: Long enough for the eval curve to bend after averaging starts, so the forecast leaves
#: ``too_early`` for ``ok`` (f* identified) before the end; 1,000 steps ended ``no_asymptote``.
DEFAULT_STEPS = 2000
#: The demo's one run is refitted at most every second (the service's default is 5 s, for
#: many runs): a fit lands every 5% of growth, so the summary's "forecast at 20%" is at 20%.
REFIT_MIN_INTERVAL_S = 1.0
DEFAULT_DIR = "curvecast-demo"
# The progress polls go straight to the loopback server, never through a proxy from the
# environment (which would be another server than ours).
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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
        help=f"where the demo's database and training log go (default ./{DEFAULT_DIR}/)",
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


class _Api:
    """Minimal JSON GETs against the local service (standard library only)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def get(self, path: str, **params: Any) -> dict[str, Any] | None:
        """The decoded body of a 200 answer, else None (errors mean "not yet")."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with _DIRECT.open(self.base_url + path + query, timeout=10) as resp:
                body: dict[str, Any] = json.load(resp)
                return body
        except (urllib.error.URLError, OSError, ValueError):
            return None


def _fmt(x: float | None, digits: int = 3) -> str:
    return "?" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _target_text(
    target: float, answer: dict[str, Any] | None, *, finished: bool, last_step: int | None = None
) -> str:
    """The progress line's words for ``GET .../forecast/target``'s answer: reached (where),
    unreachable (why), not reached by a finished run, or an ETA at the current pace.

    A target the fit puts past the run's planned last step (the service marks it
    ``past_planned_end``) is "expected after the run's end"; ``last_step`` (that planned last
    step, when known) keeps the ETA's interval inside the run: one whose pessimistic end is
    past it says so instead of a time the run will not last."""
    tgt = (answer or {}).get("target") or {}
    eta = (answer or {}).get("eta") or {}
    if tgt.get("reached") and tgt.get("step") is not None:
        return f"{target:g} reached at step {int(tgt['step'])}"
    if tgt and not tgt.get("reachable", True):
        return f"{target:g} unreachable ({tgt.get('reason') or 'below the forecast floor'})"
    if finished:
        # The service gives a finished run no "current pace" ETA: say so, not "?".
        return f"{target:g} not reached by the end of the run"
    seconds = eta.get("seconds")
    if seconds is not None and seconds <= 0:
        # The fitted curve is below the target already; the smoothed data are not.
        return f"{target:g} due now by the fit"
    if tgt.get("past_planned_end"):  # the service gives it no ETA: the run will not last
        return f"{target:g} expected after the run's end (step {tgt['step']:,.0f} by the fit)"
    return f"ETA to {target:g}: {_duration(seconds)}{_eta_range(tgt, eta, last_step)}"


def _eta_range(tgt: dict[str, Any], eta: dict[str, Any], last_step: int | None) -> str:
    """The ETA's interval, from the target step's: `` (40s–3m10s)``; `` (40s or later)`` when
    the pessimistic end never reaches it, `` (40s to after the run's end)`` when it does so
    past ``last_step``; "" without the numbers. Early in a run the interval is wide, and a
    bare "2m08s" would say more than the forecast knows."""
    seconds, rate, step = eta.get("seconds"), eta.get("steps_per_second"), tgt.get("step")
    lo, hi = tgt.get("lo"), tgt.get("hi")
    if seconds is None or not rate or step is None or lo is None:
        return ""
    early = _duration(max(0.0, seconds - (step - lo) / rate))
    if last_step is not None and (hi is None or hi > last_step):
        return f" ({early} to after the run's end)"
    if hi is None:
        return f" ({early} or later)"
    return f" ({early}–{_duration(seconds + (hi - step) / rate)})"


class _Progress:
    """Polls the REST API and shows the run's state in two parts: progress (step, time, the
    losses) and forecast (the final loss with its interval, f*, the target). On a terminal they
    are two rows redrawn in place (:class:`_Rows`); elsewhere (a log file, CI) one line joining
    both every 10 s."""

    def __init__(
        self, client: _Api, run_id: str, steps: int, target: float | None, rows: _Rows | None
    ) -> None:
        self.client, self.run_id, self.steps, self.target = client, run_id, steps, target
        self.rows = rows
        self.last_print = 0.0
        self.started = time.monotonic()

    def parts(self) -> tuple[str, str] | None:
        """(progress, forecast), or None when the service did not answer."""
        base = f"/api/v1/runs/{self.run_id}"
        run = self.client.get(base)
        if run is None:
            return None
        step = run.get("last_step") or 0
        recent = self.client.get(f"{base}/metrics", keys="loss", start=max(0, step - 49))
        losses = [v for v in _series(recent)[1] if isinstance(v, float)]
        loss = sum(losses) / len(losses) if losses else None
        width = 12  # the bar: the whole progress row fits about 100 columns
        done = min(width, int(width * step / max(1, self.steps)))
        elapsed = time.monotonic() - self.started
        # Remaining training time at the average pace so far (the first steps include start-up,
        # so it errs long).
        left = elapsed * (self.steps - step) / step if step else None
        progress = (
            f"step {step:>5}/{self.steps} [{'#' * done}{'.' * (width - done)}] "
            f"{_duration(elapsed)} elapsed, ~{_duration(left)} left | train loss {_fmt(loss)}"
            # The mean of the last 50 steps (one step's loss jumps with its batch), named so:
            # the run page's card shows the last point, a different number.
            f"{' (avg 50)' if loss is not None else ''}"
        )
        forecast = self.client.get(f"{base}/forecast", horizon=self.steps)
        if not forecast or (forecast.get("prediction") or {}).get("value") is None:
            return progress, f"forecast: {forecast['status'] if forecast else 'pending'}"
        # Like with like: the forecast is of the fitted series (the eval loss once it has
        # enough points), so its latest value is shown beside it, named.
        key = forecast.get("key") or "loss"
        now, reached = loss, None
        if key != "loss":
            steps, values = _series(self.client.get(f"{base}/metrics", keys=key))
            last = next((i for i in range(len(values) - 1, -1, -1)
                         if isinstance(values[i], float)), None)
            now = values[last] if last is not None else None
            progress += f" | {key} {_fmt(now)}"
            if last is not None and steps[last] >= self.steps:
                reached = now  # the run got to the horizon: its loss there is known
        text = _forecast_text(forecast, key, reached)
        target = self.target
        p = forecast["prediction"]
        if target is None:
            target = math.ceil(p["value"] * 20) / 20  # a round loss the run should reach ...
            if now is not None and target >= now:
                target = math.floor(now * 20) / 20  # ... and has not reached yet
                if target >= now:
                    target -= 0.05
        ans = self.client.get(f"{base}/forecast/target", loss=target)
        text += " | " + _target_text(target, ans, finished=run.get("ended_at") is not None,
                                     last_step=self.steps)
        return progress, text

    def draw(self, final: bool = False) -> None:
        parts = self.parts()
        if parts is None:
            return
        if self.rows is not None:
            self.rows.draw(parts, final=final)
        elif final or time.monotonic() - self.last_print >= 10:
            print(" ".join(parts) if parts[1].startswith("→") else " | ".join(parts), flush=True)
            self.last_print = time.monotonic()


def _series(answer: dict[str, Any] | None) -> tuple[list[int], list[Any]]:
    """Steps and values of the first series of a ``GET .../metrics`` answer (empty: none)."""
    series = (answer or {}).get("series") or [{}]
    return list(series[0].get("steps") or []), list(series[0].get("values") or [])


def _forecast_text(forecast: dict[str, Any], key: str, reached: float | None) -> str:
    """The forecast part: ``→ final <key> value [lo, hi] (status) | f*``. Once the run has
    reached the horizon (``reached``: its loss there), that loss is the final one and the fit
    is named as what it is, so the line never shows two different "final" numbers."""
    p, fs = forecast["prediction"], forecast.get("f_star") or {}
    # [lo, hi], not ±: a too_early or no_asymptote interval is lopsided.
    fit = f"{_fmt(p['value'])} [{_fmt(p['lo'])}, {_fmt(p['hi'])}]"
    if reached is None:
        text = f"→ final {key} {fit}"
    else:
        text = f"→ final {key} {_fmt(reached)} reached; fit {fit}"
    if forecast.get("status") != "ok":
        text += f" ({forecast.get('status')})"
    if fs.get("value") is not None:
        text += f" | f* {_fmt(fs.get('value'))}"
    elif fs.get("hi") is not None:
        text += f" | f* ≤ {_fmt(fs.get('hi'))}"
    return text


class _Rows:
    """Rows of text redrawn in place on a terminal.

    Each row is cut to the terminal's width: a row that wrapped would leave its first screen
    line behind at every redraw (a 160-character line on a 120-column terminal printed a new,
    cut-off line every second). The width is read at every draw, so a resized window works.
    The last draw (``final``) is not cut: nothing redraws it, and its end is the answer.
    Other output (the service's log messages) goes through :meth:`above`, from any thread:
    written straight to the terminal, it would land inside the rows and be half overwritten
    at the next redraw.
    """

    def __init__(self, out: Any, width: Callable[[], int] | None = None) -> None:
        self.out = out
        self.width = width or (lambda: shutil.get_terminal_size((100, 24)).columns)
        self.drawn = 0  # rows on screen from the last draw
        self.rows: Sequence[str] = ()  # what they say (redrawn under a message)
        self.lock = threading.Lock()  # draws and messages come from different threads

    def draw(self, rows: Sequence[str], final: bool = False) -> None:
        """Replace the rows drawn last with ``rows``; ``final`` leaves the cursor below them."""
        with self.lock:
            if final:  # uncut rows may wrap onto the old ones: those are cleared first
                self.out.write(self._cleared() + "\n".join(rows) + "\n")
            else:
                # Up to the first row drawn last (the cursor sits at the end of the last one),
                # then each row cleared and rewritten.
                cols = max(10, self.width())
                self.out.write("\r" + "\x1b[1A" * max(0, self.drawn - 1)
                               + "\n".join("\x1b[2K" + _cut(row, cols - 1) for row in rows))
            self.out.flush()
            self.drawn = 0 if final else len(rows)
            self.rows = () if final else rows

    def above(self, text: str) -> None:
        """Print ``text`` (whole lines) where the rows are, and the rows again below it."""
        with self.lock:
            self.out.write(self._cleared() + text.rstrip("\n") + "\n")
            self.out.flush()
            self.drawn = 0
        if self.rows:
            self.draw(self.rows)

    def _cleared(self) -> str:
        """The escapes that blank the rows drawn last and put the cursor at the first one's
        start (text written there that is shorter than a row would leave that row's tail)."""
        if not self.drawn:
            return ""
        up = "\x1b[1A" * (self.drawn - 1)
        return "\r" + up + "\n".join(["\x1b[2K"] * self.drawn) + up + "\r"


def _log_above(rows: _Rows) -> None:
    """Route log records (and ``warnings``) of this process through ``rows`` from now on."""
    root = logging.getLogger()
    root.addHandler(_AboveRows(rows))
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    logging.captureWarnings(True)


class _AboveRows(logging.Handler):
    """Log records printed above the progress rows (:meth:`_Rows.above`)."""

    def __init__(self, rows: _Rows) -> None:
        super().__init__(logging.WARNING)
        self.rows = rows
        self.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.rows.above(self.format(record))
        except Exception:
            self.handleError(record)


def _cut(row: str, width: int) -> str:
    """``row`` in at most ``width`` characters (an ellipsis where it was cut)."""
    return row if len(row) <= width else row[: width - 1] + "…"


def _wait_for_last_fit(client: _Api, run_id: str, timeout: float) -> bool:
    """Wait until the run's fit covers its last logged step of the fitted series; False after
    ``timeout`` seconds."""
    base = f"/api/v1/runs/{run_id}"
    deadline = time.monotonic() + timeout
    while True:
        forecast = client.get(f"{base}/forecast") or {}
        key, upto = forecast.get("key"), forecast.get("fitted_upto_step")
        if key and upto is not None:
            steps, _ = _series(client.get(f"{base}/metrics", keys=key, start=int(upto)))
            if not steps or steps[-1] <= upto:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)


def _summary(client: _Api, run_id: str, steps: int) -> str:
    base = f"/api/v1/runs/{run_id}"
    values = [v for v in _series(client.get(f"{base}/metrics", keys="eval_loss"))[1]
              if isinstance(v, float)]
    actual = values[-1] if values else None
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
    lines = [f"final eval loss (at the averaged weights x): {_fmt(actual)}"]
    if early is None:
        lines.append("no forecast with a value was made from 20% of the run on")
    else:
        lines += _quoted(early, steps, actual)
    # The first fit that knew (status ok): where a forecast became useful, and how good it was.
    useful = next((p for p in history["points"] if p.get("status") == "ok"
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
        f"{point.get('status')}): {_fmt(f['value'])} [{_fmt(f['lo'])}, {_fmt(f['hi'])}]"
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
    out_dir = Path(args.dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
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
    rows = _Rows(sys.stdout) if sys.stdout.isatty() else None
    server = _Server(settings, sock, own_logging=rows is not None)
    if rows is not None:
        _log_above(rows)
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
    client = _Api(url)
    with log_path.open("w") as log_file:
        train = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
        progress = _Progress(client, run_id, args.steps, args.target, rows)
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
