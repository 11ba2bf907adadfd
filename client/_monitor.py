"""``Monitor``: the training-loop hook (its construction, the hot path, ``watch()``, the run's
config, alerts and stats).

The background threads and the data flow are in ``_pipeline.py``; flushing and finishing in
``_lifecycle.py``.

``log()`` only validates and appends; both threads are daemons that catch and log every
exception and keep going, so neither can take the training loop down nor block interpreter
exit. ``finish()`` (also run by ``atexit``) flushes for up to ``flush_timeout`` seconds, then
spools what is left and says where. SIGTERM and SIGHUP are exits too (``_signals.py``).
"""

from __future__ import annotations

import atexit
import logging
import os
import statistics
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from curvecast.client._api import Api, Backoff
from curvecast.client._batcher import Outbox, Record, logged_points
from curvecast.client._lifecycle import LIVE, RunLifecycle
from curvecast.client._pipeline import Pipeline
from curvecast.client._sender import HEARTBEAT_INTERVAL, Counters, Sender
from curvecast.client._signals import ExitSignals
from curvecast.client._spool import Spool, default_spool_dir
from curvecast.client._transport import HTTPTransport, Transport
from curvecast.client._validate import (
    NOT_REAL_DTYPES,
    PLAIN_TENSOR_TYPES,
    TENSOR_TYPES,
    check_config,
    check_key,
    check_project,
    check_run_id,
    check_run_name,
    check_step,
    check_value,
)
from curvecast.client._watch import Sink, optimizer_config, watch_optimizer
from curvecast.contract import MAX_STEP, TELEMETRY_PREFIX

log = logging.getLogger("curvecast.client")

DEFAULT_URL = "http://127.0.0.1:8000"


class Monitor(RunLifecycle):
    """Streams a training run's metrics to a curvecast service, without slowing the loop.

    Example:
        >>> mon = Monitor(project="lm", run_name="gpt-120m", total_steps=20_000)
        >>> mon.watch(optimizer)                 # ScheduleFreePlus telemetry every step
        >>> for step in range(1, 20_001):
        ...     loss = train_step()
        ...     mon.log(step, loss=loss)         # floats or 0-d tensors, never a device sync
        >>> mon.finish()                         # also runs at interpreter exit

    Args:
        url: service base URL (default ``$CURVECAST_URL``, else ``http://127.0.0.1:8000``).
        project: project name (default ``$CURVECAST_PROJECT``, else ``"default"``).
        run_name: display name of the run.
        config: the run's configuration (plain JSON, finite numbers). The service reads
            ``total_steps``, ``warmup_steps``, ``c_warmup``, ``weight_decay``, ``fit_key``,
            ``loss_lower_bound`` and ``lr_schedule``.
        total_steps: planned number of steps (stored as ``config["total_steps"]``).
        token: bearer token (default ``$CURVECAST_TOKEN``; none when the service has auth off).
        run_id: the run's UUID. Pass the id of an earlier run (``mon.run_id``) to resume it after
            a restart; default ``$CURVECAST_RUN_ID``, else a new random UUID.
        spool_dir: where unsent points are kept (default ``$CURVECAST_SPOOL_DIR``, else
            ``<user cache dir>/curvecast/spool``).
        norms_every: ``watch()`` logs weight and gradient L2 norms every this many steps
            (0 disables them). They cost a reduction pass over the parameters and one device
            sync, so they are not computed every step; 100 gives a drift trend hundreds of
            points long on a typical run at a small part of the step time (BENCHMARKS.md,
            "Client hook overhead").
        on_alert: called from the background thread with each newly firing alert of the run
            (a dict as the service returns it). Keep it short: sending waits while it runs.
        alert_interval: seconds between alert polls when ``on_alert`` is set.
        heartbeat_interval: seconds of silence after which a heartbeat tells the service the
            client is alive (it marks runs whose client went silent ``lost``).
        handle_sigterm: on SIGTERM, or SIGHUP (the terminal closed), finish the run ``failed``
            with the signal's name as the reason, then exit with status 128 + the signal's
            number or call the previous Python handler (main thread only; see
            ``curvecast.client._signals``; ``finish()`` restores the previous handlers).
        flush_interval: seconds between batches (a batch also leaves when enough is logged).
        flush_timeout: at ``finish()``/exit, how long to keep trying before spooling the rest.
        timeout: seconds per HTTP request.
        max_buffer: the most ``log()`` calls held in memory before they are batched.
        max_pending_bytes: the most encoded bytes held in memory; beyond, batches are spooled.
        spool_max_bytes: cap on this run's spool; beyond it points are dropped, loudly.
        max_batch_points: the most points per request.
        transport: how requests reach the service (default
            :class:`~curvecast.client.HTTPTransport`).
        clock: monotonic clock of the retry schedule (inject a fake one in tests).
        wall_clock: the source of each point's wall time.
        backoff: the retry delay policy.

    Raises:
        ValueError, TypeError: for an invalid project, run name, run id, url or config.
    """

    def __init__(
        self,
        url: str | None = None,
        project: str | None = None,
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        total_steps: int | None = None,
        token: str | None = None,
        *,
        run_id: str | uuid.UUID | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        norms_every: int = 100,
        on_alert: Callable[[dict[str, Any]], None] | None = None,
        alert_interval: float = 10.0,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        handle_sigterm: bool = True,
        flush_interval: float = 1.0,
        flush_timeout: float = 10.0,
        timeout: float = 15.0,
        max_buffer: int = 20_000,
        max_pending_bytes: int = 16 << 20,
        spool_max_bytes: int = 1 << 30,
        max_batch_points: int = 50_000,
        transport: Transport | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        backoff: Backoff | None = None,
    ) -> None:
        self.url = (url or os.environ.get("CURVECAST_URL") or DEFAULT_URL).rstrip("/")
        self.project = check_project(project or os.environ.get("CURVECAST_PROJECT") or "default")
        self.run_name = check_run_name(run_name)
        self.run_id = check_run_id(run_id or os.environ.get("CURVECAST_RUN_ID") or uuid.uuid4())
        cfg = check_config(config)
        if total_steps is not None:
            cfg["total_steps"] = total_steps
            cfg = check_config(cfg)
        self._config = cfg
        self._user_keys = frozenset(cfg)
        if norms_every < 0:
            raise ValueError(f"norms_every must be >= 0, got {norms_every}")
        for name, value in (("max_buffer", max_buffer), ("max_batch_points", max_batch_points)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.norms_every = norms_every
        self.flush_interval = flush_interval
        self.flush_timeout = flush_timeout
        self.spool_dir = Path(spool_dir).expanduser() if spool_dir else default_spool_dir()
        self._transport = transport if transport is not None else HTTPTransport(self.url)
        self._api = Api(
            self._transport,
            token=token or os.environ.get("CURVECAST_TOKEN") or None,
            timeout=timeout,
            clock=clock,
        )
        self._wall = wall_clock

        # Hot-path state: the buffer; the names of the last log() call and its step (a call
        # with the same names at a later step checks no name); each other name's last step
        # (its presence means the name was validated).
        self._buffer: deque[Record] = deque()
        self._names: tuple[str, ...] = ()
        self._names_step = -1
        self._last_step: dict[str, int] = {}
        self._backwards_warned: set[str] = set()
        self._max_buffer = max_buffer
        self._wake_at = min(max_buffer, 1024)
        self._dropped_calls = 0
        # What watch()'s hooks append to (they keep their own count of points logged).
        self._sink = Sink(self._buffer, self._wall, self._wake_at, self._buffer_filling)

        self._counters = Counters()
        self._outbox = Outbox(max_pending_bytes)
        self._spool = Spool(
            self.spool_dir, self.run_id, max_bytes=spool_max_bytes, meta=self._meta, clock=clock
        )
        self._spool.warn_if_shared()  # another live monitor spooling this run_id: say so now
        self._sender = Sender(
            api=self._api,
            run_id=self.run_id,
            run_payload=self._run_payload,
            outbox=self._outbox,
            spool=self._spool,
            counters=self._counters,
            backoff=backoff or Backoff(),
            clock=clock,
            on_alert=on_alert,
            alert_interval=alert_interval,
            heartbeat_interval=heartbeat_interval,
        )

        self._closing = False
        self._forked = False
        self._finished: bool | None = None
        self._finish_complete = False
        self._finish_thread: threading.Thread | None = None
        # Reentrant: a SIGTERM may interrupt the main thread while it holds the lock, and the
        # handler calls finish() in that same thread.
        self._finish_lock = threading.RLock()
        self._pipe = Pipeline(
            buffer=self._buffer,
            outbox=self._outbox,
            spool=self._spool,
            sender=self._sender,
            counters=self._counters,
            max_batch_points=max_batch_points,
            flush_interval=flush_interval,
            name=self.run_id[:8],
        )
        self._pipe.start()
        LIVE.add(self)
        atexit.register(self._atexit)
        self._signals = (
            ExitSignals(self._finish_on_signal, self._finishing_here) if handle_sigterm else None
        )

    # -- the hot path ----------------------------------------------------------------------

    def log(self, step: int, metrics: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        """Record metrics at ``step``. Returns at once: no I/O, no device sync.

        Args:
            step: the step number, an int ``>= 0``.
            metrics: optionally, a mapping of names to values (for names that are not Python
                identifiers, e.g. ``{"eval/loss": v}``).
            **kwargs: more metrics by name. Values are ints, floats, NaN/inf included, or
                0-d tensors (a CPU tensor is read at once; others in the background thread,
                so don't modify those in place after logging).

        Raises:
            ValueError, TypeError: an invalid name, a value that is not a number, a bad step.
            RuntimeError: after ``finish()``.
        """
        if metrics is not None:
            kwargs = {**metrics, **kwargs}
        if type(step) is not int or step < 0 or step > MAX_STEP:
            step = check_step(step)
        if self._closing:
            raise RuntimeError(f"Monitor.log() after finish() (run {self.run_id})")
        # The names as a tuple: the same call site passes the same interned strings in the same
        # order, so the comparison is one identity test per name. (Comparing key views hashes
        # and looks up each name: after a training step, with cold caches, that was most of the
        # names check's cost; BENCHMARKS.md, "`Monitor.log()` against a revision, paired by
        # step".)
        names = tuple(kwargs)
        if step < self._names_step or names != self._names:
            self._check_names(names, step, kwargs)
        self._names_step = step
        for key, value in kwargs.items():
            kind = type(value)
            if kind is not float and kind is not int:
                if kind in PLAIN_TENSOR_TYPES and value.is_cpu:
                    # A CPU tensor is read now: there is no device to wait for, tolist() is
                    # cheaper than the alias below and spares the batcher a tensor (it also does
                    # not warn about requires_grad, as float() does). A 0-d tensor of a real
                    # dtype reads as a float or an int, so the answer itself is the dtype and
                    # shape check, without two more C calls in the common case.
                    try:
                        number = value.tolist()
                    except RuntimeError:  # e.g. inside a functorch transform
                        number = None
                    if type(number) is float or type(number) is int:
                        kwargs[key] = number
                        continue
                if kind in TENSOR_TYPES and not value.ndim and value.dtype not in NOT_REAL_DTYPES:
                    # check_value's answer for a tensor type it has seen, without the calls:
                    # the value without its autograd graph (.data: an alias that autograd does
                    # not track, as detach() but cheaper), read in the background.
                    kwargs[key] = value.data
                else:
                    kwargs[key] = check_value(key, value)
        # A step's points share one wall time: the watch() hook's, when it recorded this step.
        sink = self._sink
        buf = self._buffer
        buf.append((step, sink.wall_time if step == sink.step else self._wall(), kwargs, None))
        if len(buf) >= self._wake_at:
            self._buffer_filling()

    def _check_names(self, names: tuple[str, ...], step: int, metrics: dict[str, Any]) -> None:
        """A call with other names than the last one, or at an earlier step: validate names
        seen for the first time, warn about a name going back, and remember each one's step;
        and refuse a CPU tensor that is not a scalar before ``log()`` reads it.

        That last check is here, on a call site's first call, because ``log()``'s loop reads
        a CPU tensor with ``tolist()`` before it knows the shape: for a weight matrix logged
        by mistake, a list of every element (seconds and gigabytes for a large one) before the
        error. In the loop itself, one more attribute read per tensor would cost ``log()``
        measurably (BENCHMARKS.md, "`Monitor.log()` against a revision, paired by step")."""
        last = self._last_step
        for key in self._names:  # the last call's names, logged at _names_step since then
            last[key] = self._names_step
        for key in names:
            prev = last.get(key)
            if prev is None:
                check_key(key)
            elif step < prev:
                self._went_backwards(key, step, prev)
            last[key] = step
        for key, value in metrics.items():
            if type(value) in PLAIN_TENSOR_TYPES and value.ndim:
                check_value(key, value)  # raises, naming the shape
        self._names = names

    def _went_backwards(self, key: str, step: int, prev: int) -> None:
        if key in self._backwards_warned:
            return
        self._backwards_warned.add(key)
        warnings.warn(
            f"curvecast: metric {key!r} logged at step {step} after step {prev}. The point is "
            "sent, but where a step is logged twice the service keeps the first value "
            "(warned once per metric).",
            RuntimeWarning,
            stacklevel=3,
        )

    def _buffer_filling(self) -> None:
        self._pipe.wake_batcher()
        if len(self._buffer) < self._max_buffer:
            return
        # The batcher never waits on the network, so it only falls this far behind when
        # starved of CPU: give it a moment (bounded), then drop rather than grow without bound.
        if not self._pipe.stalled:
            room = self._pipe.wait_for(lambda: len(self._buffer) < self._max_buffer,
                                       time.monotonic() + 5.0)
            if room:
                return
            self._pipe.stalled = True
        with self._pipe.progress:  # the lock under which the batcher counts (stats() too)
            dropped = logged_points([self._buffer.pop()])
            self._counters.points_logged += dropped
            self._counters.points_dropped += dropped
        self._dropped_calls += 1
        if self._dropped_calls in (1, 10, 100) or self._dropped_calls % 1000 == 0:
            log.error(
                "curvecast: POINTS ARE BEING LOST: the in-memory buffer is full (%d log() calls) "
                "and the background thread is not draining it; %d points dropped so far",
                self._max_buffer,
                self._counters.points_dropped,
            )

    # -- the optimizer hook ----------------------------------------------------------------

    def watch(
        self,
        optimizer: Any,
        *,
        norms_every: int | None = None,
        prefix: str = TELEMETRY_PREFIX,
        step_fn: Callable[[], int] | None = None,
        log_config: bool = True,
    ) -> Any:
        """Log an optimizer's telemetry after every ``step()``.

        With :class:`curvecast.ScheduleFreePlus` (anything with a ``stats()`` method) each step
        logs ``{prefix}eta``, ``alpha``, ``loss`` (F), ``inner`` (I), ``numerator``, ``grad_l1``,
        ``denom_ema``, ``gamma_max``, ``c``, ``sf_beta`` and ``warmup`` (free: read on the host
        during the step), and every ``norms_every`` steps ``x_l2``, ``y_l2``, ``z_l2`` and
        ``grad_l2``. With any other ``torch.optim.Optimizer`` it logs ``{prefix}lr`` (or
        ``{prefix}lr/{i}`` per parameter group).

        Steps are the optimizer's own count (ScheduleFree+: restored from checkpoints; others:
        steps since ``watch``, from 1) unless ``step_fn`` returns them.

        Args:
            optimizer: a ``torch.optim.Optimizer``.
            norms_every: override the monitor's ``norms_every``.
            prefix: prefix of the metric names (default ``opt/``, where the pages and the
                alert rules look for the optimizer's statistics).
            step_fn: returns the step number to log at (e.g. ``lambda: trainer.global_step``).
            log_config: merge the optimizer's hyper-parameters into the run config (keys given
                in ``config=`` win).

        Returns:
            The hook handle; ``handle.remove()`` stops logging.
        """
        every = self.norms_every if norms_every is None else norms_every
        handle = watch_optimizer(optimizer, self._sink, norms_every=every, prefix=prefix,
                                 step_fn=step_fn)
        if log_config:
            self.update_config(optimizer_config(optimizer))
        return handle

    def update_config(self, changes: Mapping[str, Any]) -> None:
        """Merge keys into the run's config (sent in the background; keys passed to the
        constructor's ``config=`` are never overwritten).

        Raises:
            ValueError, TypeError: if the keys are not valid config (see ``config=``).
        """
        fresh = {k: v for k, v in check_config(changes).items() if k not in self._user_keys}
        if not fresh:
            return
        self._config = check_config({**self._config, **fresh})
        self._sender.update_config(fresh)
        self._pipe.wake_sender()
        if self._spool.path.exists():
            try:
                self._spool.update_meta()
            except OSError:
                log.exception("curvecast: could not update %s", self._spool.path)

    def _run_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"project": self.project, "config": self._config}
        if self.run_name is not None:
            payload["name"] = self.run_name
        return payload

    def _meta(self) -> dict[str, Any]:
        return {
            "version": 1,
            "run_id": self.run_id,
            "url": self.url,
            **self._run_payload(),
            "status": self._sender.final_status if self._sender.finishing else None,
            "status_reason": self._sender.final_reason if self._sender.finishing else None,
        }

    # -- alerts ----------------------------------------------------------------------------

    def alerts(self) -> list[dict[str, Any]]:
        """The run's firing alerts (a short request; on any error, the last known list).

        A service without the alerts endpoint answers "no alerts". Never raises for network
        or server errors.
        """
        result = self._api.get_alerts(self.run_id, timeout=min(2.0, self._api.timeout))
        if result.ok:
            return list(self._sender.record_alerts(result.body))
        return list(self._sender.last_alerts)

    # -- introspection ---------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters and state, for dashboards, tests and benchmarks.

        Keys: ``points_logged`` (every point handed to ``log()`` or logged by ``watch()``,
        counted at once, buffered ones included), ``points_encoded`` (of those, the ones
        already batched: ``points_logged`` minus what is still buffered), ``points_sent``
        (stored by the service), ``points_spooled``, ``points_dropped``, ``points_rejected``,
        ``batches_sent``, ``corrupt_lines``, ``failures``, ``online``, ``run_created``,
        ``buffered`` (``log()`` calls not yet batched), ``pending_bytes`` (in memory),
        ``spool_bytes``, ``rtt_ms_median`` and ``rtt_ms_max`` (of the last 512 batches).
        """
        c = self._counters
        rtts = [r * 1000 for r in self._sender.rtts]
        with self._pipe.progress:  # the batcher counts what it takes under this lock
            buffered = list(self._buffer)
            counted = vars(c).copy()
        return {
            **counted,
            "points_logged": counted["points_logged"] + logged_points(buffered),
            "online": self._sender.online,
            "run_created": self._sender.created,
            "buffered": len(buffered),
            "pending_bytes": self._outbox.nbytes,
            "spool_bytes": self._spool.nbytes,
            "rtt_ms_median": statistics.median(rtts) if rtts else None,
            "rtt_ms_max": max(rtts) if rtts else None,
        }

    @property
    def finished(self) -> bool:
        """Whether ``finish()`` was called (``log()`` raises from then on)."""
        return self._closing

    @property
    def spool_path(self) -> Path:
        """This run's spool directory (it exists only while points are spooled)."""
        return self._spool.path

    def __repr__(self) -> str:
        return f"Monitor(url={self.url!r}, project={self.project!r}, run_id={self.run_id!r})"
