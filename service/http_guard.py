"""What a connection may cost the server before its request reaches the app.

uvicorn's HTTP protocol on httptools (the C parser the server extra installs) accepts request heads
of any size and any number of header lines, and waits for a head forever: a few sockets sending huge
headers grow the server's memory without bound, and slowloris connections (a header line every few
seconds) stay open until the process runs out of file descriptors (BENCHMARKS.md, "Header flood and
slowloris"). uvicorn offers ``h11_max_incomplete_event_size`` for its pure-Python h11 parser only,
which costs more CPU per request (BENCHMARKS.md, "Service CPU per request"); ``limit_concurrency``
answers 503 per *request* while keeping every connection open, and ``timeout_keep_alive`` only
starts once a response was sent. :class:`GuardedHttpToolsProtocol` is uvicorn's httptools protocol
with four limits more (:class:`HeadLimits`, from the settings), all enforced before the app sees
anything:

- **head size**: a request line and header lines longer than ``max_bytes`` together are
  answered ``431`` and the connection closed. A complete head is measured exactly; an
  incomplete one by the bytes received since it began, so the parser never holds more than
  ``max_bytes`` plus two socket reads of one head;
- **header lines**: more than ``max_fields`` are answered ``431`` (counted as they are parsed);
- **head time**: a head that is not complete ``timeout_s`` after the connection opened, or
  after the previous response ended, closes the connection (slowloris). Time spent in a
  request's body or response does not count;
- **connections**: at most ``max_connections`` open at once. One more evicts the connection
  that has waited longest for its next head (an idle keep-alive or a trickling one), so a flood
  of slow connections cannot keep new clients out; when every connection is busy with a
  request, the new one is answered ``503`` and closed.

``curvecast serve``, the demo and the test servers all serve through it (:func:`protocol_for`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import weakref
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from curvecast.service.config import Settings
from curvecast.service.errors import ERROR_CODE_TO_HTTP_STATUS

__all__ = ["GuardedHttpToolsProtocol", "HeadLimits", "protocol_for"]

log = logging.getLogger(__name__)

#: What one header line costs besides its name and value (": " and CRLF).
_FIELD_OVERHEAD = 4


@dataclass(frozen=True)
class HeadLimits:
    """The limits above (frozen and picklable: ``serve --workers N`` sends it to each
    process)."""

    max_bytes: int
    max_fields: int
    timeout_s: float
    max_connections: int
    retry_after_s: int = 5

    @classmethod
    def from_settings(cls, settings: Settings) -> HeadLimits:
        """The limits the settings give (``CURVECAST_MAX_HEADER_*``, ``..._CONNECTIONS``)."""
        return cls(
            max_bytes=settings.max_header_bytes,
            max_fields=settings.max_header_fields,
            timeout_s=settings.header_timeout_s,
            max_connections=settings.max_connections,
            retry_after_s=settings.retry_after_s,
        )


def protocol_for(settings: Settings) -> Any:
    """The ``http`` argument of ``uvicorn.Config``/``uvicorn.run`` for these settings."""
    return functools.partial(GuardedHttpToolsProtocol, limits=HeadLimits.from_settings(settings))


class _Slots:
    """One server's open connections, and those waiting for a request head, oldest first."""

    def __init__(self) -> None:
        self.open: set[GuardedHttpToolsProtocol] = set()
        self.waiting: dict[GuardedHttpToolsProtocol, None] = {}


#: Per uvicorn server (its ``ServerState`` is shared by all of its connections).
_SLOTS: weakref.WeakKeyDictionary[ServerState, _Slots] = weakref.WeakKeyDictionary()


class _Refused(Exception):
    """A head broke a limit: answered with ``headers_too_large`` (431), then closed."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of :class:`HeadLimits` (module doc)."""

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, *, limits: HeadLimits) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits
        slots = _SLOTS.get(server_state)
        if slots is None:
            slots = _SLOTS[server_state] = _Slots()
        self._slots = slots
        self._head_timer: asyncio.TimerHandle | None = None
        self._refusal: _Refused | None = None
        # Whether a message is in progress (its first byte arrived, its end not yet), whether
        # its head is (begun, not complete), the head's bytes and header lines so far, and how
        # many heads began in all (to tell which part of a read a head had).
        self._in_message = False
        self._in_head = False
        self._head_bytes = 0
        self._head_fields = 0
        self._heads_begun = 0

    # --- connections ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        slots = self._slots
        slots.open.add(self)
        if len(slots.open) > self.limits.max_connections:
            oldest = next(iter(slots.waiting), None)
            if oldest is None:  # every other connection is serving a request
                self._answer("unavailable", "too many connections; retry later",
                             {"retry-after": str(self.limits.retry_after_s)})
                return
            log.debug("connection limit (%d) reached: closing the longest waiting one",
                      self.limits.max_connections)
            oldest._drop()
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._drop_slot()
        super().connection_lost(exc)

    def _drop(self) -> None:
        """Close this connection now (evicted, or its head took too long)."""
        self._drop_slot()
        if not self.transport.is_closing():
            self.transport.close()

    def _drop_slot(self) -> None:
        self._slots.open.discard(self)
        self._head_complete()

    def _await_head(self) -> None:
        """From now on, a request head must be complete within ``timeout_s``."""
        self._slots.waiting[self] = None
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.timeout_s, self._head_timed_out)

    def _head_complete(self) -> None:
        self._slots.waiting.pop(self, None)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        log.debug("closing a connection whose request head took over %gs", self.limits.timeout_s)
        self._drop()

    def on_response_complete(self) -> None:
        # A pipelined request whose head is already parsed starts now: no head to wait for.
        awaiting = not self.pipeline
        super().on_response_complete()
        if awaiting and not self.transport.is_closing():
            self._await_head()

    # --- heads ---------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None or self.transport.is_closing():
            return  # answered already; what else arrives is not read
        # Between two messages, a read starts with the next head: all of it counts for that
        # head if the head is still incomplete after it. A read that also held the end of
        # the previous message is not counted (the head's share of it is unknown, and at
        # most one read).
        between = not self._in_message
        heads_before = self._heads_begun
        super().data_received(data)
        if self.transport.is_closing() or not self._in_head:
            return
        began = self._heads_begun - heads_before
        if began == 0 or (began == 1 and between):
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_bytes:
                self._refuse(_too_large(self.limits))

    def on_message_begin(self) -> None:
        self._in_message = self._in_head = True
        self._head_bytes = 0
        self._head_fields = 0
        self._heads_begun += 1
        super().on_message_begin()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += 1
        if self._head_fields > self.limits.max_fields:
            self._raise(_Refused(f"more than {self.limits.max_fields} header lines"))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        size = len(self.url) + sum(len(n) + len(v) + _FIELD_OVERHEAD for n, v in self.headers)
        if size > self.limits.max_bytes:
            self._raise(_too_large(self.limits))
        self._in_head = False
        self._head_complete()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_message = False
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        # The parser stops on an exception a callback raised and uvicorn answers 400; a limit
        # of ours answers its own status instead.
        refusal = self._refusal
        if refusal is None:
            super().send_400_response(msg)
        else:
            self._answer("headers_too_large", refusal.message)

    def _raise(self, refusal: _Refused) -> None:
        """Stop the parser from a callback: httptools raises its own error for it, and uvicorn
        then calls :meth:`send_400_response`, which answers this refusal."""
        self._refusal = refusal
        raise refusal

    def _refuse(self, refusal: _Refused) -> None:
        self._refusal = refusal
        self._answer("headers_too_large", refusal.message)

    def _answer(self, error_code: str, message: str, extra: dict[str, str] | None = None
                ) -> None:
        """Answer with the service's error body and close (nothing more is read)."""
        self._drop_slot()
        status = ERROR_CODE_TO_HTTP_STATUS[error_code]
        body = json.dumps({"error_code": error_code, "message": message}).encode()
        head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode(),
                b"content-type: application/json",
                b"content-length: " + str(len(body)).encode(),
                b"connection: close"]
        head += [f"{k}: {v}".encode("latin-1") for k, v in (extra or {}).items()]
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.transport.close()

    def _should_upgrade(self) -> bool:
        # The app serves no WebSocket. An upgraded connection would be handed to another
        # protocol and never give its slot back: an upgrade request is served as plain HTTP
        # (uvicorn's behaviour without a WebSocket library), whatever is installed.
        return False


def _too_large(limits: HeadLimits) -> _Refused:
    return _Refused(f"request line and headers are larger than {limits.max_bytes} bytes")

