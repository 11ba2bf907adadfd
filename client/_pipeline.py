"""The monitor's two background threads, and how the training thread waits on them.

::

    training thread          batcher thread                    sender thread
    ---------------          --------------                    -------------
    log() -> buffer  ----->  drain, read tensors, encode  -->  outbox (memory, bounded) --> HTTP
                                          |  offline or full                    ^
                                          v                                     |
                                       spool (disk, per run, capped) --- replay-+

The batcher never touches the network, so a hung request cannot stop memory from being
drained; the sender does every network call through :meth:`Sender.tick`. Both are daemons that
log every exception and keep their schedule: neither can take the training loop down nor block
interpreter exit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import islice

from curvecast.client._batcher import Batch, Outbox, Record, encode_records, logged_points
from curvecast.client._sender import Counters, Sender, spool_batch
from curvecast.client._spool import Spool

log = logging.getLogger("curvecast.client")

#: Records encoded per pass of the batcher (bounded, so a waiting ``log()`` gets room soon).
DRAIN_CHUNK = 16_384


class Pipeline:
    """Buffer → batches → outbox or spool → service, on two daemon threads."""

    def __init__(
        self,
        *,
        buffer: deque[Record],
        outbox: Outbox,
        spool: Spool,
        sender: Sender,
        counters: Counters,
        max_batch_points: int,
        flush_interval: float,
        name: str,
    ) -> None:
        self.buffer = buffer
        self.stalled = False  # the batcher fell a whole buffer behind (starved of CPU)
        self.progress = threading.Condition()  # notified whenever either thread made progress
        self._outbox = outbox
        self._spool = spool
        self._sender = sender
        self._counters = counters
        self._max_batch_points = max_batch_points
        self._flush_interval = flush_interval
        self._batching = False
        self._stopping = False
        self._batch_wake = threading.Event()
        self._send_wake = threading.Event()
        self.batcher = threading.Thread(target=self._batcher_loop,
                                        name=f"curvecast-batcher-{name}", daemon=True)
        self.sender_thread = threading.Thread(target=self._sender_loop,
                                              name=f"curvecast-sender-{name}", daemon=True)

    def start(self) -> None:
        """Start both threads."""
        self.batcher.start()
        self.sender_thread.start()

    def wake_batcher(self) -> None:
        """Drain the buffer now rather than at the next ``flush_interval``."""
        self._batch_wake.set()

    def wake_sender(self) -> None:
        """Send now rather than after the sender's current wait."""
        self._send_wake.set()

    def idle_batcher(self) -> bool:
        """Nothing is buffered and no batch is being encoded."""
        return not self.buffer and not self._batching

    def wait_for(self, condition: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``condition()`` holds (re-checked whenever a thread makes progress) or the
        monotonic ``deadline`` passes; returns whether it holds."""
        with self.progress:
            while not condition():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.progress.wait(min(left, 0.1))
        return True

    def stop(self) -> None:
        """Stop both threads and wait a little for them (not from one of them)."""
        self._stopping = True
        self._batch_wake.set()
        self._send_wake.set()
        current = threading.current_thread()  # finish() may be called from on_alert
        if current is not self.batcher:
            self.batcher.join(timeout=2.0)
        if current is not self.sender_thread:
            self.sender_thread.join(timeout=0.5)

    def encode(self, records: list[Record]) -> list[Batch]:
        """Batches of ``records``; their points count as encoded (unreadable values: dropped)."""
        batches, unreadable = encode_records(records, max_points=self._max_batch_points)
        self._counters.points_dropped += unreadable
        self._counters.points_encoded += sum(batch.points for batch in batches)
        return batches

    # -- the threads -----------------------------------------------------------------------

    def _batcher_loop(self) -> None:
        while True:
            self._batch_wake.wait(self._flush_interval)
            self._batch_wake.clear()
            try:
                self._drain()
                self._spool.sync_if_due()
            except Exception:
                log.exception("curvecast: batcher error (continuing)")
            finally:
                self._batching = False
                with self.progress:
                    self.progress.notify_all()
            if self._stopping:
                return

    def take(self, n: int) -> list[Record]:
        """Take up to ``n`` records from the buffer and count their points as logged (under
        the lock ``Monitor.stats()`` takes: a point is counted in the buffer or here, never in
        neither), and tell a waiting ``log()`` there is room."""
        buf = self.buffer
        with self.progress:
            records = list(islice(iter(buf.popleft, None), min(len(buf), n)))  # a C loop
            self._counters.points_logged += logged_points(records)
            self.progress.notify_all()
        return records

    def _drain(self) -> None:
        while self.buffer:
            self._batching = True
            records = self.take(DRAIN_CHUNK)
            self.stalled = False
            for batch in self.encode(records):
                self._dispatch(batch)

    def _dispatch(self, batch: Batch) -> None:
        if self._outbox.offer(batch):
            self._send_wake.set()
        else:
            spool_batch(self._spool, batch, self._counters)
            if self._sender.online:
                self._send_wake.set()  # the outbox was full: the sender replays the spool

    def _sender_loop(self) -> None:
        while not self._stopping:
            self._send_wake.clear()
            try:
                delay = self._sender.tick()
            except Exception:
                log.exception("curvecast: sender error (continuing)")
                delay = 1.0
            with self.progress:
                self.progress.notify_all()
            if delay > 0 and not self._stopping:
                self._send_wake.wait(delay)
