"""SIGTERM as an exit: what a monitor does when a scheduler, ``kill`` or a container stop
terminates the training process.

Without a handler, SIGTERM kills the interpreter outright: no ``atexit``, so the run stays
``running`` and the points still in memory are lost. :class:`SigtermExit` finishes the run
first (points flushed or spooled, status ``failed``, reason "SIGTERM"), then lets the process
die as it would have (``SystemExit(143)``, the status a shell reports for SIGTERM), or hands
the signal to the Python handler that was installed before it.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("curvecast.client")


class SigtermExit:
    """The SIGTERM handler of one monitor, installed at construction when possible.

    Installed only in the main thread (the only one that may set handlers), and only over the
    default action or a Python handler (then chained to): SIG_IGN, or a handler set outside
    Python, says someone else decided what SIGTERM does.

    Args:
        finish: finishes the run ``failed`` with reason "SIGTERM" (idempotent).
        finishing: whether ``finish()`` is running in this (the main) thread: the signal
            interrupted it, so it is left to complete and :meth:`finished` exits afterwards.
    """

    def __init__(self, finish: Callable[[], object], finishing: Callable[[], bool]) -> None:
        self._finish = finish
        self._finishing = finishing
        self._prev: Any = None
        self._pending: tuple[int, FrameType | None] | None = None
        self.installed = False
        if threading.current_thread() is not threading.main_thread():
            return
        prev = signal.getsignal(signal.SIGTERM)
        if prev is not signal.SIG_DFL and not callable(prev):
            return
        signal.signal(signal.SIGTERM, self._handle)
        self._prev, self.installed = prev, True

    def restore(self) -> None:
        """Put the previous handler back, if ours is still the one installed (a handler set
        after ours, perhaps chaining to it, stays). From another thread: nothing (ours stays,
        harmless once the run is finished)."""
        if not self.installed or threading.current_thread() is not threading.main_thread():
            return
        self.installed = False
        if signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, self._prev)

    def finished(self) -> None:
        """Called at the end of ``finish()``: restore the handler, and exit now if a SIGTERM
        arrived while it ran."""
        self.restore()
        pending, self._pending = self._pending, None
        if pending is not None:
            self._exit(*pending)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.restore()  # a second SIGTERM while flushing kills at once, as usual
        if self._finishing():
            self._pending = (signum, frame)
            return
        try:
            self._finish()
        except Exception:
            log.exception("curvecast: finishing the run on SIGTERM failed")
        self._exit(signum, frame)

    def _exit(self, signum: int, frame: FrameType | None) -> None:
        if callable(self._prev):
            self._prev(signum, frame)
            return
        # SystemExit rather than re-sending the signal: finally blocks and other atexit
        # handlers still run, and the exit status is the one a shell reports for SIGTERM.
        raise SystemExit(128 + signum)
