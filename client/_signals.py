"""Signals that end a process, as exits: what a monitor does when a scheduler, ``kill`` or a
container stop terminates the training process (SIGTERM), or the terminal it runs in closes
(SIGHUP).

Without a handler, either signal kills the interpreter outright: no ``atexit``, so the run
stays ``running`` and the points still in memory are lost. :class:`ExitSignals` finishes the
run first (points flushed or spooled, status ``failed``, the signal's name as the reason), then
lets the process die as it would have (``SystemExit(128 + signum)``, the status a shell reports
for the signal), or hands the signal to the Python handler that was installed before it.

Ctrl-C needs no handler here: Python turns SIGINT into ``KeyboardInterrupt``, and the monitor
names the exception that ended the run (:func:`exit_reason`) when it finishes.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("curvecast.client")

#: The signals handled, by name: SIGHUP does not exist on Windows.
EXIT_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def exit_reason(exc: BaseException | None) -> str | None:
    """The reason a run that ``exc`` ended is stored with: the exception's type, and its
    message when it has one (``"KeyboardInterrupt"``, ``"RuntimeError: CUDA out of memory"``),
    at most 200 characters (the service's limit). None without an exception."""
    if exc is None:
        return None
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not stop the run from finishing
        text = ""
    reason = f"{name}: {text}" if text else name
    return reason if len(reason) <= 200 else reason[:199] + "…"


class ExitSignals:
    """The SIGTERM and SIGHUP handlers of one monitor, installed at construction when possible.

    Installed only in the main thread (the only one that may set handlers), and for each signal
    only over the default action or a Python handler (then chained to): SIG_IGN (``nohup``
    ignores SIGHUP), or a handler set outside Python, says someone else decided what it does.

    Args:
        finish: finishes the run ``failed`` with the given reason, the signal's name
            (idempotent).
        finishing: whether ``finish()`` is running in this (the main) thread: the signal
            interrupted it, so it is left to complete and :meth:`finished` exits afterwards.
    """

    def __init__(self, finish: Callable[[str], object], finishing: Callable[[], bool]) -> None:
        self._finish = finish
        self._finishing = finishing
        #: The handler each signal had before ours (where ours chains to), by signal number.
        self._prev: dict[int, Any] = {}
        self._installed: set[int] = set()
        self._pending: tuple[int, FrameType | None] | None = None
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in EXIT_SIGNALS:
            prev = signal.getsignal(signum)
            if prev is not signal.SIG_DFL and not callable(prev):
                continue
            signal.signal(signum, self._handle)
            self._prev[signum] = prev
            self._installed.add(signum)

    @property
    def installed(self) -> bool:
        """Whether any of the handlers is installed."""
        return bool(self._installed)

    def restore(self) -> None:
        """Put the previous handlers back, where ours is still the one installed (a handler set
        after ours, perhaps chaining to it, stays). From another thread: nothing (ours stay,
        harmless once the run is finished)."""
        if not self._installed or threading.current_thread() is not threading.main_thread():
            return
        installed, self._installed = self._installed, set()
        for signum in installed:
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, self._prev[signum])

    def finished(self) -> None:
        """Called at the end of ``finish()``: restore the handlers, and exit now if a signal
        arrived while it ran."""
        self.restore()
        pending, self._pending = self._pending, None
        if pending is not None:
            self._exit(*pending)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.restore()  # a second signal while flushing kills at once, as usual
        if self._finishing():
            self._pending = (signum, frame)
            return
        name = signal.Signals(signum).name
        try:
            self._finish(name)
        except Exception:
            log.exception("curvecast: finishing the run on %s failed", name)
        self._exit(signum, frame)

    def _exit(self, signum: int, frame: FrameType | None) -> None:
        prev = self._prev.get(signum)
        if callable(prev):
            prev(signum, frame)
            return
        # SystemExit rather than re-sending the signal: finally blocks and other atexit
        # handlers still run, and the exit status is the one a shell reports for the signal.
        raise SystemExit(128 + signum)
