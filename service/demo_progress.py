"""The demo's progress rows (``curvecast demo``, ``service/demo.py``): what it polls over REST
and how it words it.

Two parts, redrawn every second: progress (step, elapsed and remaining time, the training loss
reached) and forecast (the final loss with its interval, f*, and the ETA to one target loss).

* **Time left** comes from the pace of the recent past (:class:`Pace`: the steps made over the
  last :data:`PACE_WINDOW_S` seconds of polls), never from the average since the start, which
  counts the start-up (imports, data, the first compiled steps): at step 1 that said
  "~423m29s left". Until the window holds enough training it says "estimating...".
* **The training loss** shown is the loss reached: the forecast core's ``reached`` rule
  (:func:`loss_reached_of`), the number the run page, the runs list and REST's ``reached``
  show, named the same ("train loss reached").
* **The ETA row's target** is picked once, at the first ``ok`` forecast (:func:`pick_target`),
  or given with ``--target``; it never changes during the run (it changed six times), and its
  interval is worded plainly ("about 2m10s, between 1m40s and 3m05s").
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

from curvecast.contract import ForecastStatus
from curvecast.service.demo_terminal import Rows
from curvecast.service.forecast.reached import REACHED_WINDOW, loss_reached

#: Seconds of recent polls the pace is measured over.
PACE_WINDOW_S: Final = 20.0
#: The pace needs the window to span this many seconds of training ...
PACE_MIN_SPAN_S: Final = 5.0
#: ... and this many steps made in it (a handful of slow first steps say little).
PACE_MIN_STEPS: Final = 5

# The progress polls go straight to the loopback server, never through a proxy from the
# environment (which would be another server than ours).
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class DemoApi:
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


def fmt_loss(x: float | None, digits: int = 3) -> str:
    """A loss for the rows (``?`` when unknown)."""
    return "?" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def duration(seconds: float | None) -> str:
    """``2m05s``, ``40s`` (``?`` when unknown)."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def series_of(answer: dict[str, Any] | None) -> tuple[list[int], list[Any]]:
    """Steps and values of the first series of a ``GET .../metrics`` answer (empty: none)."""
    series = (answer or {}).get("series") or [{}]
    return list(series[0].get("steps") or []), list(series[0].get("values") or [])


def _as_float(value: Any) -> float:
    """A JSON value of a series as a float (NaN for "NaN", null or anything else)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return {"Infinity": math.inf, "-Infinity": -math.inf}.get(value, math.nan)


def loss_reached_of(steps: Sequence[int], values: Sequence[Any]) -> float | None:
    """The loss a series reached at its last step, by the forecast core's rule
    (``reached.loss_reached``: the median over the last 1% of the steps), from points read over
    REST (at least those of that window). None without points, or where the last is not
    finite."""
    if not steps:
        return None
    return loss_reached(list(steps), [_as_float(v) for v in values], max(steps))


def window_start(step: int) -> int:
    """The first step a read must cover for :func:`loss_reached_of` at ``step``."""
    return max(0, math.floor(step * (1.0 - REACHED_WINDOW)))


class Pace:
    """Steps per second over the recent past, from the steps the polls saw.

    Only samples from the first step's arrival on count (before it, the time is start-up, not
    training), and only the recent ones: at least the last ``window_s`` seconds, and as far
    back as needed for ``min_steps`` steps (a slow run keeps its estimate instead of going
    back to "estimating..." whenever the window held too few steps). The estimate follows the
    current pace, not the average since the start, and a stall lowers it as it goes on.

    Args:
        window_s: the seconds of samples kept (at least).
        min_span_s, min_steps: what the samples must span before there is an estimate.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, window_s: float = PACE_WINDOW_S, min_span_s: float = PACE_MIN_SPAN_S,
                 min_steps: int = PACE_MIN_STEPS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s, self.min_span_s, self.min_steps = window_s, min_span_s, min_steps
        self.clock = clock
        #: (when a step was first seen, that step), one per new step.
        self.samples: deque[tuple[float, int]] = deque()
        self.now = clock()

    def add(self, step: int | None) -> None:
        """Record the run's last step as a poll saw it now."""
        self.now = now = self.clock()
        if step is None or step <= 0:
            return
        if not self.samples or step > self.samples[-1][1]:
            self.samples.append((now, step))
        # Drop the oldest while what is left still spans window_s and min_steps.
        while (len(self.samples) > 2 and self.samples[1][0] <= now - self.window_s
               and self.samples[-1][1] - self.samples[1][1] >= self.min_steps):
            self.samples.popleft()

    def steps_per_second(self) -> float | None:
        """The recent pace, or None while the samples hold too little training."""
        if len(self.samples) < 2:
            return None
        (t0, s0), s1 = self.samples[0], self.samples[-1][1]
        if self.now - t0 < self.min_span_s or s1 - s0 < self.min_steps:
            return None
        return (s1 - s0) / (self.now - t0)

    def seconds_left(self, step: int, total: int) -> float | None:
        """Seconds to ``total`` at the recent pace (None: still estimating)."""
        rate = self.steps_per_second()
        return None if rate is None else max(0, total - step) / rate


def pick_target(now: float | None, final: float | None) -> float | None:
    """A round loss between the current loss ``now`` and the forecast ``final`` one: below
    ``now`` (not reached yet), above ``final`` (the run should get there). The midpoint,
    rounded to 0.05, else 0.01, else 0.001; None when they are too close (or unknown)."""
    if now is None or final is None or not (math.isfinite(now) and math.isfinite(final)):
        return None
    middle = (now + final) / 2
    for grid in (0.05, 0.01, 0.001):
        candidate = round(round(middle / grid) * grid, 3)
        if final < candidate < now:
            return candidate
    return None


def target_text(target: float, answer: dict[str, Any] | None, *, finished: bool,
                last_step: int | None = None) -> str:
    """The ETA part's words for ``GET .../forecast/target``'s answer: reached (where),
    unreachable (why), not reached by a finished run, past the run's end, or an ETA at the
    current pace with its interval in plain words (:func:`eta_range`).

    ``last_step``: the run's planned last step, where the interval's late end stops."""
    tgt = (answer or {}).get("target") or {}
    eta = (answer or {}).get("eta") or {}
    if tgt.get("reached") and tgt.get("step") is not None:
        return f"{target:g} reached at step {int(tgt['step']):,}"
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
        return f"{target:g} only after the run's end by the fit (step {tgt['step']:,.0f})"
    if seconds is None:
        return f"ETA to {target:g}: waiting for the run's pace"
    return f"ETA to {target:g}: about {duration(seconds)}{eta_range(tgt, eta, last_step)}"


def eta_range(tgt: dict[str, Any], eta: dict[str, Any], last_step: int | None) -> str:
    """The ETA's interval in words, from the target step's: ``, between 1m40s and 3m05s``;
    ``, 1m40s at the earliest, maybe not before the run ends`` when the late end is past
    ``last_step`` (or never comes); "now" for an early end already here; "" without the
    numbers. Early in a run the interval is wide, and a bare "2m08s" would say more than the
    forecast knows."""
    seconds, rate, step = eta.get("seconds"), eta.get("steps_per_second"), tgt.get("step")
    lo, hi = tgt.get("lo"), tgt.get("hi")
    if seconds is None or not rate or step is None or lo is None:
        return ""
    early_s = max(0.0, seconds - (step - lo) / rate)
    early = "now" if early_s < 1 else duration(early_s)
    if hi is None or (last_step is not None and hi > last_step):
        if last_step is None:
            return f", {early} at the earliest, maybe never"
        if early_s < 1:
            return ", anywhere from now to after the run ends"
        return f", {early} at the earliest, maybe not before the run ends"
    return f", between {early} and {duration(seconds + (hi - step) / rate)}"


def forecast_text(forecast: dict[str, Any], key: str, reached: float | None) -> str:
    """The forecast part: ``→ final <key> value [lo, hi] (status) | f*``. Once the run has
    reached the horizon (``reached``: its loss there, by the ``reached`` rule), that loss is
    the final one and the fit is named as what it is, so the line never shows two different
    "final" numbers."""
    p, fs = forecast["prediction"], forecast.get("f_star") or {}
    # [lo, hi], not ±: a too_early or no_asymptote interval is lopsided.
    fit = f"{fmt_loss(p['value'])} [{fmt_loss(p['lo'])}, {fmt_loss(p['hi'])}]"
    if reached is None:
        text = f"→ final {key} {fit}"
    else:
        text = f"→ final {key} {fmt_loss(reached)} reached; fit {fit}"
    if forecast.get("status") != ForecastStatus.OK:
        text += f" ({forecast.get('status')})"
    if fs.get("value") is not None:
        text += f" | f* {fmt_loss(fs.get('value'))}"
    elif fs.get("hi") is not None:
        text += f" | f* ≤ {fmt_loss(fs.get('hi'))}"
    return text


class Progress:
    """Polls the REST API and shows the run's state in two parts: progress and forecast. On a
    terminal they are two rows redrawn in place (:class:`~.demo_terminal.Rows`); elsewhere (a
    log file, CI) one line joining both every 10 s.

    Args:
        client: the service.
        run_id: the demo's run.
        steps: its planned steps.
        target: the ETA's target loss (``--target``); None: picked at the first ok forecast.
        rows: the terminal's rows, or None off a terminal.
        clock: monotonic seconds (the pace and the elapsed time).
    """

    def __init__(self, client: DemoApi, run_id: str, steps: int, target: float | None,
                 rows: Rows | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.run_id, self.steps, self.target = client, run_id, steps, target
        self.rows = rows
        self.clock = clock
        self.pace = Pace(clock=clock)
        self.last_print = -math.inf
        self.started = clock()

    def progress_text(self, step: int, loss: float | None) -> str:
        """The progress part: step, bar, elapsed, time left at the recent pace, loss reached."""
        width = 12  # the bar: the whole progress row fits about 100 columns
        done = min(width, int(width * step / max(1, self.steps)))
        left = self.pace.seconds_left(step, self.steps)
        when = ("done" if step >= self.steps else  # not "estimating..." at the end of a run
                f"~{duration(left)} left" if left is not None else "estimating...")
        return (f"step {step:>5}/{self.steps} [{'#' * done}{'.' * (width - done)}] "
                f"{duration(self.clock() - self.started)} elapsed, {when} "
                f"| train loss reached {fmt_loss(loss)}")

    def parts(self) -> tuple[str, str] | None:
        """(progress, forecast), or None when the service did not answer."""
        base = f"/api/v1/runs/{self.run_id}"
        run = self.client.get(base)
        if run is None:
            return None
        step = int(run.get("last_step") or 0)
        self.pace.add(step)
        recent = self.client.get(f"{base}/metrics", keys="loss", start=window_start(step))
        progress = self.progress_text(step, loss_reached_of(*series_of(recent)))
        forecast = self.client.get(f"{base}/forecast", horizon=self.steps)
        if not forecast or (forecast.get("prediction") or {}).get("value") is None:
            return progress, f"forecast: {forecast['status'] if forecast else 'pending'}"
        # Like with like: the forecast is of the fitted series (the eval loss once it has
        # enough points), so the loss it reached is shown beside it, named.
        key = forecast.get("key") or "loss"
        steps, values = series_of(self.client.get(f"{base}/metrics", keys=key))
        now = loss_reached_of(steps, values)
        if key != "loss":
            progress += f" | {key} reached {fmt_loss(now)}"
        # The run got to the horizon: the loss it reached there is the final one.
        reached = now if steps and steps[-1] >= self.steps else None
        text = forecast_text(forecast, key, reached)
        target = self._target(forecast, now)
        if target is not None:
            ans = self.client.get(f"{base}/forecast/target", loss=target, key=key)
            text += " | " + target_text(target, ans, finished=run.get("ended_at") is not None,
                                        last_step=self.steps)
        return progress, text

    def _target(self, forecast: dict[str, Any], now: float | None) -> float | None:
        """The ETA's target: the user's, else the one picked at the first ok forecast (then
        kept: a target that moves with every fit answers no question)."""
        if self.target is None and forecast.get("status") == ForecastStatus.OK:
            self.target = pick_target(now, forecast["prediction"]["value"])
        return self.target

    def draw(self, final: bool = False) -> None:
        """Poll and show (on a terminal every call; elsewhere every 10 s, and the last)."""
        parts = self.parts()
        if parts is None:
            return
        if self.rows is not None:
            self.rows.draw(parts, final=final)
        elif final or self.clock() - self.last_print >= 10:
            print(" ".join(parts) if parts[1].startswith("→") else " | ".join(parts), flush=True)
            self.last_print = self.clock()
