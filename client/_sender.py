"""The sender: everything the monitor says to the service, as a step-by-step state machine.

:meth:`Sender.tick` does one unit of work (create the run, send one batch, replay one spooled
line, poll alerts, ...) and returns how long to wait before the next tick. The monitor's
background thread calls it in a loop; tests call it directly with a fake transport and a fake
clock, so retry, backoff and ``Retry-After`` are checked without sockets or sleeps.

Order of work: create the run (idempotent ``PUT``), merge config updates (``PATCH``), replay the
spool (oldest first), send in-memory batches, and when finishing, ``PATCH`` the final status
(with its reason, e.g. "SIGTERM"). With nothing else to say for ``heartbeat_interval`` seconds,
it sends a heartbeat (an empty ``PATCH``): the service marks a run whose client went silent
``lost`` (``service/worker/liveness.py``), and this is how it knows the client is alive.
On any failure that may heal (no answer, 5xx, 429, 401/403) the in-memory batches move to the
spool, the outbox goes offline (new batches are spooled directly) and the next try waits for the
backoff delay; the first success puts everything back online.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curvecast.client._api import Api, Backoff, Outcome, Result
from curvecast.client._batcher import Batch, Outbox, split_batch
from curvecast.client._spool import SegmentReader, Spool

log = logging.getLogger("curvecast.client")

#: Idle ticks wait at most this long (the thread is woken early when there is work).
IDLE_WAIT = 5.0
#: The shortest wait after an authentication failure or a refused run: a human must act.
HUMAN_WAIT = 60.0
#: Default seconds between heartbeats while nothing else reaches the service (far below the
#: service's ``client_gone_after_s``, 30 min by default).
HEARTBEAT_INTERVAL = 60.0


@dataclass
class Counters:
    """What happened so far (read by ``Monitor.stats()``)."""

    #: Points handed to ``log()`` (and the optimizer hook), counted when the batcher takes
    #: them from the buffer (``Monitor.stats()`` adds the ones still buffered).
    points_logged: int = 0
    #: Points encoded into request bodies so far (``points_logged`` minus what is still
    #: buffered, minus unreadable values).
    points_encoded: int = 0
    points_sent: int = 0
    points_spooled: int = 0
    points_dropped: int = 0
    points_rejected: int = 0
    batches_sent: int = 0
    corrupt_lines: int = 0
    failures: int = 0


class Sender:
    """State machine behind the monitor's sender thread.

    Args:
        api: the REST calls.
        run_id: the run.
        run_payload: returns the ``PUT`` body (project, name, config).
        outbox: in-memory batches.
        spool: the run's spool.
        counters: shared counters.
        backoff: delay policy.
        clock: monotonic clock.
        on_alert: called with each newly firing alert (from this thread).
        alert_interval: seconds between alert polls (only when ``on_alert`` is set).
        heartbeat_interval: seconds of silence after which an idle sender says it is alive.
    """

    def __init__(
        self,
        *,
        api: Api,
        run_id: str,
        run_payload: Callable[[], dict[str, Any]],
        outbox: Outbox,
        spool: Spool,
        counters: Counters,
        backoff: Backoff,
        clock: Callable[[], float],
        on_alert: Callable[[dict[str, Any]], None] | None = None,
        alert_interval: float = 10.0,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
    ) -> None:
        self.api = api
        self.run_id = run_id
        self._run_payload = run_payload
        self.outbox = outbox
        self.spool = spool
        self.counters = counters
        self.backoff = backoff
        self.clock = clock
        self.on_alert = on_alert
        self.alert_interval = alert_interval
        self.heartbeat_interval = heartbeat_interval

        # Public state, read by the monitor: whether the run exists on the service, whether the
        # last request got an answer, and how finishing goes.
        self.created: bool = False
        self.online: bool = True
        self.finishing: bool = False
        self.final_status: str | None = None
        self.final_reason: str | None = None
        self.status_sent: bool = False
        #: Set by the monitor when it stops: later ticks only idle.
        self.stopped: bool = False
        #: Round-trip times (seconds) of the last 512 batches sent.
        self.rtts: deque[float] = deque(maxlen=512)
        #: The run's firing alerts, as last received.
        self.last_alerts: list[dict[str, Any]] = []

        self.attempt = 0
        self.next_try = 0.0
        self._retry_after_until = 0.0
        self._config_lock = threading.Lock()
        self._config_patch: dict[str, Any] | None = None
        self._reader: SegmentReader | None = None
        self._line: tuple[bytes, int] | None = None
        self._missing_in_a_row = 0
        self._told: set[str] = set()
        self._next_alert_poll = 0.0
        self._seen_alerts: set[Any] = set()
        # When the service last recorded a request of ours (alert polls are reads: they don't).
        self._last_heard = clock()
        self._heartbeats = True

    # -- inputs from the monitor -----------------------------------------------------------

    def update_config(self, changes: dict[str, Any]) -> None:
        """Queue config keys to merge into the run's stored config."""
        with self._config_lock:
            self._config_patch = {**(self._config_patch or {}), **changes}

    def begin_finish(self, status: str, reason: str | None = None) -> None:
        """Send what is left, then the final status (and why, if ``reason``); retry now rather
        than after the backoff (but never before a server's ``Retry-After``)."""
        self.final_status = status
        self.final_reason = reason
        self.finishing = True
        self.next_try = max(self.clock(), self._retry_after_until)

    @property
    def caught_up(self) -> bool:
        """Whether everything handed over so far reached the service: the run exists, no
        config change waits, and no batch waits in memory or in the spool."""
        return self.created and self._config_patch is None and self._queues_empty()

    @property
    def done(self) -> bool:
        """Whether everything, the final status included, reached the service."""
        return self.finishing and self.status_sent and self._queues_empty()

    def _queues_empty(self) -> bool:
        return (
            self._line is None
            and self._reader is None
            and not len(self.outbox)
            and not self.spool.has_data()
        )

    # -- the state machine -----------------------------------------------------------------

    def tick(self) -> float:
        """Do one unit of work; returns seconds to wait before the next tick (0: call again)."""
        if self.stopped:
            return IDLE_WAIT
        now = self.clock()
        if now < self.next_try:
            return self.next_try - now
        if not self.created:
            return self._create()
        with self._config_lock:
            patch = self._config_patch
        if patch is not None:
            return self._patch_config(patch)
        if self._line is not None or self._reader is not None or self.spool.has_data():
            return self._replay_one()
        batch = self.outbox.peek()
        if batch is not None:
            return self._send(batch)
        if self.finishing:
            if not self.status_sent:
                return self._send_status()
            return IDLE_WAIT
        if self._heartbeats and now - self._last_heard >= self.heartbeat_interval:
            return self._heartbeat(now)
        return min(self._poll_alerts(now), self._until_heartbeat(now))

    def _until_heartbeat(self, now: float) -> float:
        if not self._heartbeats:
            return IDLE_WAIT
        return max(0.0, self._last_heard + self.heartbeat_interval - now)

    def _heartbeat(self, now: float) -> float:
        result = self.api.patch_run(self.run_id, {})
        if result.outcome is Outcome.RUN_MISSING:
            return self._run_missing(result)
        if result.outcome is Outcome.REJECTED:
            # A service that refuses an empty PATCH has no liveness check to feed.
            self._heartbeats = False
            self._tell("heartbeat", f"curvecast: heartbeats refused ({result.message}); "
                       "not sending them")
            return 0.0
        if not result.ok:
            return self._fail(result, "sending a heartbeat")
        self._heard()
        self._success()
        return 0.0

    def _heard(self) -> None:
        self._last_heard = self.clock()

    def _create(self) -> float:
        result = self.api.put_run(self.run_id, self._run_payload())
        if not result.ok:
            return self._fail(result, "creating the run")
        self.created = True
        self._heard()
        self._success()
        return 0.0

    def _patch_config(self, patch: dict[str, Any]) -> float:
        result = self.api.patch_run(self.run_id, {"config": patch})
        if result.outcome is Outcome.RUN_MISSING:
            return self._run_missing(result)
        if result.outcome is Outcome.REJECTED:
            self._tell("config", f"curvecast: the service refused the run config: {result.message}")
        elif not result.ok:
            return self._fail(result, "updating the run config")
        with self._config_lock:
            if self._config_patch is patch:
                self._config_patch = None
        self._heard()
        self._success()
        return 0.0

    def _send_status(self) -> float:
        assert self.final_status is not None
        payload = {"status": self.final_status}
        if self.final_reason is not None:
            payload["status_reason"] = self.final_reason
        result = self.api.patch_run(self.run_id, payload)
        if result.outcome is Outcome.REJECTED and self.final_reason is not None:
            # An older service without status reasons: the status itself matters more.
            self.final_reason = None
            return 0.0
        if result.outcome is Outcome.RUN_MISSING:
            return self._run_missing(result)
        if not result.ok and result.outcome is not Outcome.REJECTED:
            return self._fail(result, "setting the final status")
        self.status_sent = True
        self._success()
        return 0.0

    def _send(self, batch: Batch) -> float:
        result = self.api.post_metrics(self.run_id, batch.body)
        if result.ok:
            self.outbox.ack(batch)
            self._sent(batch.points, result)
            return 0.0
        if result.outcome is Outcome.RUN_MISSING:
            return self._run_missing(result)
        if result.outcome is Outcome.TOO_LARGE:
            parts = split_batch(batch)
            if len(parts) > 1:
                self.outbox.replace_head(batch, parts)
                return 0.0
        if result.outcome in (Outcome.REJECTED, Outcome.TOO_LARGE):
            self._rejected(batch.body, batch.points, result)
            self.outbox.ack(batch)
            return 0.0
        return self._fail(result, "sending points")

    def _replay_one(self) -> float:
        if self._line is None:
            if self._reader is None:
                # Skips segments another live process still appends to (same run_id twice,
                # or a concurrent `curvecast sync` replaying them): their owner replays them.
                self._reader = self.spool.claim_segment(self._corrupt)
                if self._reader is None:
                    return 0.0
            line = self._reader.next()
            if line is None:
                self._reader.close()
                self.spool.remove_segment(self._reader.path)
                self._reader = None
                return 0.0
            self._line = line
        body, points = self._line
        result = self.api.post_metrics(self.run_id, body, replay=True)
        if result.outcome is Outcome.TOO_LARGE:
            result = self._send_split(Batch(body, points))
        if result.ok:
            self._line = None
            self._sent(points, result)
            return 0.0
        if result.outcome is Outcome.RUN_MISSING:
            return self._run_missing(result)
        if result.outcome in (Outcome.REJECTED, Outcome.TOO_LARGE):
            self._rejected(body, points, result)
            self._line = None
            return 0.0
        return self._fail(result, "replaying the spool")

    def _send_split(self, batch: Batch) -> Result:
        parts = split_batch(batch)
        if len(parts) == 1:
            return Result(Outcome.REJECTED, 413, "a single row is larger than the server accepts")
        result = Result(Outcome.OK, 200)
        for part in parts:
            result = self.api.post_metrics(self.run_id, part.body)
            if result.outcome is Outcome.TOO_LARGE:
                result = self._send_split(part)
            if not result.ok:
                return result
        return result

    def _poll_alerts(self, now: float) -> float:
        if self.on_alert is None or not self.online:
            return IDLE_WAIT
        if now < self._next_alert_poll:
            return min(IDLE_WAIT, self._next_alert_poll - now)
        self._next_alert_poll = now + self.alert_interval
        result = self.api.get_alerts(self.run_id)
        if result.ok:
            self.notify_alerts(result.body)
        return min(IDLE_WAIT, self.alert_interval)

    def record_alerts(self, body: Any) -> list[dict[str, Any]]:
        """Keep the firing alerts of a ``GET .../alerts`` answer as :attr:`last_alerts`."""
        alerts = body.get("alerts", []) if isinstance(body, dict) else []
        # Asked with ?state=firing; an alert without a state is taken as firing.
        firing = [a for a in alerts if isinstance(a, dict) and a.get("state", "firing") == "firing"]
        self.last_alerts = firing
        return firing

    def notify_alerts(self, body: Any) -> list[dict[str, Any]]:
        """Record a ``GET .../alerts`` answer; call ``on_alert`` for newly firing alerts."""
        firing = self.record_alerts(body)
        for alert in firing:
            key = alert.get("id", (alert.get("rule"), alert.get("started_at")))
            if key in self._seen_alerts:
                continue
            self._seen_alerts.add(key)
            if self.on_alert is not None:
                try:
                    self.on_alert(alert)
                except Exception:
                    log.exception("curvecast: the on_alert callback raised (ignored)")
        return firing

    # -- outcomes --------------------------------------------------------------------------

    def _sent(self, points: int, result: Result) -> None:
        self.counters.points_sent += points
        self.counters.batches_sent += 1
        self.rtts.append(result.elapsed)
        self._heard()
        self._missing_in_a_row = 0
        self._success()

    def _success(self) -> None:
        if not self.online:
            log.info("curvecast: the service answers again; replaying spooled points")
        self.online = True
        self.outbox.online = True
        self.attempt = 0

    def _run_missing(self, result: Result) -> float:
        # The run vanished (a fresh database?) or was never created: create it, then resend.
        self.created = False
        self._missing_in_a_row += 1
        if self._missing_in_a_row > 2:
            return self._fail(result, "sending points (the run keeps disappearing)")
        return 0.0

    def _rejected(self, body: bytes, points: int, result: Result) -> None:
        self.counters.points_rejected += points
        try:
            where: Path | str = self.spool.reject(body)
        except OSError as exc:
            where = f"nowhere ({exc})"
        log.error(
            "curvecast: the service refused a batch of %d points (%s); it is kept in %s",
            points,
            result.message,
            where,
        )

    def _fail(self, result: Result, what: str) -> float:
        self.attempt += 1
        self.counters.failures += 1
        delay = self.backoff.delay(self.attempt, result.retry_after)
        if result.retry_after is not None:
            self._retry_after_until = self.clock() + result.retry_after
        if result.outcome is Outcome.AUTH:
            self._tell("auth", f"curvecast: the service refused the token ({result.message}); "
                       f"points are kept in {self.spool.path}")
            delay = max(delay, HUMAN_WAIT)
        elif result.outcome in (Outcome.REJECTED, Outcome.TOO_LARGE):
            self._tell(what, f"curvecast: {what} failed: {result.message}")
            delay = max(delay, HUMAN_WAIT)
        if self.online:
            log.warning(
                "curvecast: %s failed (%s); spooling points to %s and retrying in %.2g s",
                what,
                result.message,
                self.spool.path,
                delay,
            )
        self.online = False
        self.outbox.online = False
        self.spill()
        self.next_try = self.clock() + delay
        return delay

    def spill(self) -> None:
        """Move every in-memory batch to the spool."""
        for batch in self.outbox.take_all():
            spool_batch(self.spool, batch, self.counters)

    def _corrupt(self, path: Path, line_no: int, reason: str) -> None:
        self.counters.corrupt_lines += 1
        log.warning("curvecast: skipped corrupted spool line %s:%d (%s)", path, line_no, reason)

    def _tell(self, topic: str, message: str) -> None:
        if topic not in self._told:
            self._told.add(topic)
            log.error(message)


_cap_warned: set[str] = set()


def spool_batch(spool: Spool, batch: Batch, counters: Counters) -> bool:
    """Append a batch to the spool; when that is impossible (cap reached, disk error) count the
    points as dropped and say so loudly. Returns whether it was spooled."""
    try:
        ok = spool.append(batch.body)
        reason = f"the spool size cap ({spool.max_bytes:,} bytes) is reached"
    except OSError as exc:
        ok, reason = False, f"writing to the spool failed: {exc}"
    if ok:
        counters.points_spooled += batch.points
        return True
    counters.points_dropped += batch.points
    key = str(spool.path)
    if key not in _cap_warned:
        _cap_warned.add(key)
        log.error(
            "curvecast: POINTS ARE BEING LOST: %s (%s). The service has been unreachable; "
            "raise spool_max_bytes= or free disk space.",
            reason,
            spool.path,
        )
    else:
        log.warning(
            "curvecast: dropped %d points (%d lost so far): %s",
            batch.points,
            counters.points_dropped,
            reason,
        )
    return False


def report_leftovers(counters: Counters, spool_path: Path, *, run_id: str, url: str, done: bool
                     ) -> None:
    """Say, at the end of a run, what did not reach the service and how to upload it.

    Args:
        counters: the run's counters.
        spool_path: the run's spool, where what is unsent was kept.
        run_id: the run.
        url: the service it was sent to.
        done: whether everything, the final status included, reached the service.
    """
    c = counters
    if done:
        if c.points_dropped or c.points_rejected:
            log.warning(
                "curvecast: run %s finished; points dropped: %d, refused by the service: %d",
                run_id,
                c.points_dropped,
                c.points_rejected,
            )
        return
    left = max(0, c.points_encoded - c.points_sent - c.points_dropped - c.points_rejected)
    points = f"{left} point{'' if left == 1 else 's'}"
    what, kept, them = (
        (f"{points} of run {run_id} and its final status", "they are", "them") if left
        else (f"the final status of run {run_id}", "it is", "it")
    )
    log.warning(
        "curvecast: %s could not be sent to %s within the flush timeout; %s kept in "
        "%s. Upload %s with:  curvecast sync %s --url %s",
        what,
        url,
        kept,
        spool_path,
        them,
        spool_path,
        url,  # named, so that sync sends a token there (it never trusts run.json's URL alone)
    )
    if c.points_dropped:
        log.error("curvecast: points lost (spool cap or errors): %d", c.points_dropped)
