"""The few REST calls the client makes, each answer classified into what to do next.

Shared by the monitor's sender thread and ``curvecast sync``. Nothing here sleeps or retries:
:class:`Backoff` computes delays, the callers decide when to wait (with an injectable clock).
"""

from __future__ import annotations

import enum
import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

from curvecast.client._batcher import plain_body
from curvecast.client._transport import Response, Transport, TransportError
from curvecast.contract import BASE64_COLUMNS, INGEST_ENCODINGS_HEADER, REPLAY_HEADER

API = "/api/v1/runs"


class Outcome(enum.Enum):
    """What a caller should do with an answer."""

    OK = "ok"  #: 2xx
    RETRY = "retry"  #: no answer, 408, 425, 429 or 5xx: try again later (spool meanwhile)
    RUN_MISSING = "run_missing"  #: 404 run_not_found: create the run, then resend
    TOO_LARGE = "too_large"  #: 413: split the batch
    AUTH = "auth"  #: 401/403: the token is missing, wrong or lacks the scope
    REJECTED = "rejected"  #: any other 4xx: resending the same request will never work


@dataclass(frozen=True)
class Result:
    """A classified answer.

    Attributes:
        outcome: what to do next.
        status: HTTP status, or None when no answer came back.
        message: the server's ``message`` (or the transport error), for logs.
        retry_after: seconds the server asked us to wait (``Retry-After``), if any.
        body: the parsed JSON body of a 2xx answer (None otherwise).
        elapsed: seconds the request took (round trip, including connecting).
        headers: the headers of a 2xx answer, names in lower case.
    """

    outcome: Outcome
    status: int | None
    message: str = ""
    retry_after: float | None = None
    body: Any = None
    elapsed: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the request succeeded."""
        return self.outcome is Outcome.OK


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date).

    Args:
        value: the header value.
        now: the current wall-clock time (seconds since the epoch), for HTTP dates.

    Returns:
        A delay ``>= 0``, or None when the header is absent or unparseable.
    """
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def classify(resp: Response, elapsed: float = 0.0) -> Result:
    """Map an HTTP answer to an :class:`Outcome`."""
    status = resp.status
    if 200 <= status < 300:
        try:
            body = resp.json() if resp.body else None
        except ValueError:
            body = None
        return Result(Outcome.OK, status, body=body, elapsed=elapsed, headers=resp.headers)
    code, message = "", resp.body[:300].decode("utf-8", "replace")
    try:
        err = resp.json()
        if isinstance(err, dict):
            code = str(err.get("error_code", ""))
            message = str(err.get("message", message))
    except ValueError:
        pass
    message = f"HTTP {status} {code}: {message}".replace(" :", ":")
    retry_after = parse_retry_after(resp.headers.get("retry-after"))
    if status in (408, 425, 429) or status >= 500:
        outcome = Outcome.RETRY
    elif status == 404 and code == "run_not_found":
        outcome = Outcome.RUN_MISSING
    elif status == 413:
        outcome = Outcome.TOO_LARGE
    elif status in (401, 403):
        outcome = Outcome.AUTH
    else:
        outcome = Outcome.REJECTED
    return Result(outcome, status, message, retry_after=retry_after, elapsed=elapsed)


class Api:
    """The REST calls, over any :class:`~curvecast.client.Transport`.

    Args:
        transport: where requests go.
        token: bearer token, or None when the service runs without auth.
        timeout: seconds per request.
        clock: monotonic clock used to time round trips.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        token: str | None = None,
        timeout: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.transport = transport
        self.timeout = timeout
        self._clock = clock
        #: Whether the service reads base64 columns (it said so when the run was created);
        #: until then, and for an older service, batches are sent as plain JSON arrays.
        self.base64_columns = False
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._replay_headers = {**self._headers, REPLAY_HEADER: "1"}

    def call(
        self, method: str, path: str, body: bytes | None = None, timeout: float | None = None,
        *, replay: bool = False,
    ) -> Result:
        """One request, classified. Never raises for network or server errors. ``replay``: a
        batch sent from the spool (marked with the contract's ``REPLAY_HEADER``)."""
        start = self._clock()
        try:
            resp = self.transport.request(
                method,
                path,
                body=body,
                headers=self._replay_headers if replay else self._headers,
                timeout=self.timeout if timeout is None else timeout,
            )
        except TransportError as exc:
            return Result(Outcome.RETRY, None, str(exc), elapsed=self._clock() - start)
        return classify(resp, self._clock() - start)

    def put_run(self, run_id: str, payload: Mapping[str, Any]) -> Result:
        """``PUT /api/v1/runs/{id}``: create the run or get it (idempotent); learns whether the
        service reads base64 columns."""
        result = self.call("PUT", f"{API}/{run_id}", _dumps(payload))
        if result.ok:
            said = result.headers.get(INGEST_ENCODINGS_HEADER.lower(), "")
            self.base64_columns = BASE64_COLUMNS in (e.strip() for e in said.split(","))
        return result

    def patch_run(self, run_id: str, payload: Mapping[str, Any]) -> Result:
        """``PATCH /api/v1/runs/{id}``: status and/or config keys to merge."""
        return self.call("PATCH", f"{API}/{run_id}", _dumps(payload))

    def post_metrics(self, run_id: str, body: bytes, *, replay: bool = False) -> Result:
        """``POST /api/v1/runs/{id}/metrics`` with an encoded columnar batch (its base64 columns
        turned into JSON arrays for a service that does not read them); ``replay``: from the
        spool."""
        if not self.base64_columns:
            body = plain_body(body)
        return self.call("POST", f"{API}/{run_id}/metrics", body, replay=replay)

    def get_alerts(self, run_id: str, timeout: float | None = None) -> Result:
        """``GET /api/v1/runs/{id}/alerts?state=firing``.

        A service without the alerts endpoint (404 ``not_found``) and a run the service does not
        know yet both read as "no alerts".
        """
        result = self.call("GET", f"{API}/{run_id}/alerts?state=firing", timeout=timeout)
        if result.status == 404:
            return Result(Outcome.OK, 404, body={"alerts": []}, elapsed=result.elapsed)
        return result


def _dumps(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


class Backoff:
    """Exponential backoff with "equal jitter", honouring ``Retry-After``.

    The n-th consecutive failure waits a uniformly random time in ``[d/2, d]`` with
    ``d = min(cap, base * 2**(n-1))``: the jitter keeps many clients that lost the same server
    from retrying in lock step. A server's ``Retry-After`` is a floor (up to ``max_retry_after``).

    Args:
        base: delay scale of the first retry, seconds.
        cap: the largest exponential delay, seconds.
        max_retry_after: the largest ``Retry-After`` obeyed, seconds (protects against a
            misconfigured server asking for hours).
        rng: random source (seed it in tests).
    """

    def __init__(
        self,
        base: float = 0.5,
        cap: float = 30.0,
        max_retry_after: float = 300.0,
        rng: random.Random | None = None,
    ) -> None:
        self.base = base
        self.cap = cap
        self.max_retry_after = max_retry_after
        self._rng = rng or random.Random()

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after the ``attempt``-th consecutive failure (``attempt >= 1``)."""
        full = min(self.cap, self.base * 2.0 ** max(0, attempt - 1))
        wait = full / 2 + self._rng.random() * full / 2
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_retry_after))
        return wait
