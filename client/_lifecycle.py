"""How a :class:`~curvecast.client.Monitor` ends: ``flush()``, ``finish()`` (called by the
code, at interpreter exit through ``atexit``, on SIGTERM and SIGHUP through ``_signals.py``, or
as a context manager), and what a forked child must not do.

``finish()`` flushes for up to ``flush_timeout`` seconds, then spools what is left and says
where (``curvecast sync`` uploads it). The monitor's hot path is in ``_monitor.py``, the
background threads in ``_pipeline.py``.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any, Self

from curvecast.client._batcher import Outbox, Record
from curvecast.client._pipeline import Pipeline
from curvecast.client._sender import Counters, Sender, report_leftovers, spool_batch
from curvecast.client._signals import ExitSignals, exit_reason
from curvecast.client._spool import Spool
from curvecast.client._transport import Transport
from curvecast.client._watch import Sink
from curvecast.contract import FINAL_RUN_STATUSES

__all__ = ["LIVE", "RunLifecycle", "RunStatus"]

log = logging.getLogger("curvecast.client")

RunStatus = str  # one of FINAL_RUN_STATUSES
#: The monitors of this process that have not finished.
LIVE: weakref.WeakSet[RunLifecycle] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker) inherits the monitor but not its threads: make sure
    # it never flushes or spools the parent's points at its own exit.
    for monitor in list(LIVE):
        monitor._forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class RunLifecycle:
    """The flushing and finishing half of :class:`~curvecast.client.Monitor`, whose
    constructor sets the attributes declared here (and adds the monitor to :data:`LIVE` and
    its ``_atexit`` to the interpreter's exit handlers)."""

    run_id: str
    url: str
    flush_timeout: float
    _buffer: deque[Record]
    _outbox: Outbox
    _spool: Spool
    _sender: Sender
    _counters: Counters
    _pipe: Pipeline
    _sink: Sink
    _transport: Transport
    _signals: ExitSignals | None
    _closing: bool
    _forked: bool
    _finished: bool | None
    _finish_complete: bool
    _finish_thread: threading.Thread | None
    _finish_lock: Any  # a threading.RLock

    def _all_sent(self) -> bool:
        return self._pipe.idle_batcher() and self._sender.caught_up

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything logged so far is stored by the service.

        Args:
            timeout: seconds to wait at most (default ``flush_timeout``).

        Returns:
            True if everything was acknowledged, False on timeout (nothing is lost: what is not
            sent yet stays queued or spooled).
        """
        deadline = time.monotonic() + (self.flush_timeout if timeout is None else timeout)
        self._pipe.wake_batcher()
        if not self._pipe.wait_for(self._pipe.idle_batcher, deadline):
            return False
        self._pipe.wake_sender()
        return self._pipe.wait_for(self._all_sent, deadline)

    def finish(
        self, status: RunStatus = "finished", *, timeout: float | None = None,
        reason: str | None = None,
    ) -> bool:
        """Send everything, mark the run ``status``, and stop the background threads.

        Keeps trying for up to ``timeout`` seconds (default ``flush_timeout``); whatever is
        still unsent then is written to the spool, and a warning says where and how to upload
        it (``curvecast sync``). Idempotent; runs automatically at interpreter exit.

        Args:
            status: ``"finished"``, ``"failed"`` or ``"crashed"``.
            timeout: seconds to keep trying.
            reason: why the run ends so (at most 200 characters; shown with the status). None,
                for a run that did not finish, in an ``except`` block: the exception, named.

        Returns:
            True if everything, the status included, reached the service.
        """
        if status not in FINAL_RUN_STATUSES:
            raise ValueError(f"status must be one of {FINAL_RUN_STATUSES}, got {status!r}")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 200):
            raise ValueError(f"reason must be a string of at most 200 characters, got {reason!r}")
        if reason is None and status != "finished":
            reason = exit_reason(sys.exc_info()[1])
        with self._finish_lock:
            if self._finished is not None:
                return self._finished
            self._finished = False
            self._finish_thread = threading.current_thread()
        try:
            return self._finish(status, timeout, reason)
        finally:
            self._finish_complete = True
            if self._signals is not None:
                self._signals.finished()  # exits if a signal arrived while finishing

    def _finish(self, status: str, timeout: float | None, reason: str | None) -> bool:
        atexit.unregister(self._atexit)
        LIVE.discard(self)
        if self._forked:
            return False
        deadline = time.monotonic() + (self.flush_timeout if timeout is None else timeout)
        self._closing = True
        self._sink.open = False
        self._pipe.wake_batcher()
        self._pipe.wait_for(self._pipe.idle_batcher, deadline)
        self._sender.begin_finish(status, reason)
        self._pipe.wake_sender()
        done = self._pipe.wait_for(lambda: self._pipe.idle_batcher() and self._sender.done,
                                   deadline)
        self._sender.stopped = True
        self._pipe.stop()
        try:
            self._spool_leftovers(status, done)
        except Exception:
            log.exception("curvecast: could not spool the remaining points of run %s", self.run_id)
        self._transport.close()
        self._finished = done
        return done

    def _spool_leftovers(self, status: str, done: bool) -> None:
        records = self._pipe.take(len(self._buffer))
        for batch in [*self._pipe.encode(records), *self._outbox.take_all()]:
            spool_batch(self._spool, batch, self._counters)
        if done:
            self._spool.cleanup()
        else:
            self._spool.update_meta(status=status)
        self._spool.close()
        report_leftovers(self._counters, self._spool.path, run_id=self.run_id, url=self.url,
                         done=done)

    def _atexit(self) -> None:
        # The exception that ended the program, if one did (KeyboardInterrupt for Ctrl-C).
        uncaught = getattr(sys, "last_value", None)
        try:
            self.finish("finished" if uncaught is None else "failed", reason=exit_reason(uncaught))
        except Exception:
            log.exception("curvecast: finishing run %s at exit failed", self.run_id)

    def _finishing_here(self) -> bool:
        """Whether this thread is inside finish() (a signal interrupted it)."""
        return not self._finish_complete and self._finish_thread is threading.current_thread()

    def _finish_on_signal(self, name: str) -> None:
        if self._finished is None:
            log.warning("curvecast: %s: finishing run %s as failed", name, self.run_id)
        self.finish("failed", reason=name)
        # finish() may be running in another thread (called from on_alert): let it complete.
        self._pipe.wait_for(lambda: self._finish_complete,
                            time.monotonic() + self.flush_timeout + 5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish("finished" if exc_type is None else "failed", reason=exit_reason(exc))
