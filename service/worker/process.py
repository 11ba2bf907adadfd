"""The background worker as a child process of ``curvecast serve --workers N``.

With several serve processes, the worker runs once, in a ``curvecast worker`` process of its own
that the serving parent starts, restarts if it dies, and stops when it stops (the child also
stops by itself when its parent is gone, so a killed server leaves no worker behind). Each serve
process then only serves requests: refits and alert rounds no longer share a GIL with ingest,
which lowers ingest latency and the service's CPU per point under load (BENCHMARKS.md, "Load on
PostgreSQL"), and N processes no longer poll and race for the same leases.
One serve process (the embedded default) keeps the worker in its own threads.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Mapping

log = logging.getLogger(__name__)

#: Seconds to wait before restarting a worker process that exited on its own.
RESTART_DELAY_S = 5.0


class WorkerProcess:
    """A supervised ``curvecast worker`` child.

    Args:
        env: the child's environment (the parent's settings, worker enabled).
        restart_delay_s: pause before a restart after an unexpected exit.
    """

    def __init__(self, env: Mapping[str, str], restart_delay_s: float = RESTART_DELAY_S) -> None:
        self._env = dict(env)
        self._delay = restart_delay_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._supervise, name="curvecast-worker-process",
                                        daemon=True)

    @property
    def pid(self) -> int | None:
        """The current child's pid (None between a crash and its restart)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        """Start the child and the thread that restarts it."""
        self._spawn()
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the child (SIGTERM: it finishes its task's round), then kill it if it hangs."""
        self._stop.set()
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._thread.join(timeout=5.0)

    def _spawn(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "curvecast.service.cli", "worker",
                 "--parent-pid", str(os.getpid())],
                env=self._env,
            )

    def _supervise(self) -> None:
        while not self._stop.is_set():
            proc = self._proc
            if proc is None:
                return
            code = proc.wait()
            if self._stop.is_set():
                return
            log.error("curvecast: the worker process exited with status %s; restarting it in "
                      "%.0f s", code, self._delay)
            if self._stop.wait(self._delay):
                return
            self._spawn()
