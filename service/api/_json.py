"""Request bodies decoded by pydantic-core's JSON parser, with the standard library's answer
wherever the two could differ.

FastAPI decodes a JSON body with ``json.loads``, a noticeable share of an ingest request's CPU
(a 1,000-point batch is ~20 kB of numbers; BENCHMARKS.md, "Service CPU per request against a
checkout", the ingest row): it builds a Python float from a decimal string one
number at a time. ``pydantic_core.from_json`` (Rust, already installed with pydantic) decodes
the same body several times faster and agrees with ``json.loads`` on what it
accepts, bare ``NaN``/``Infinity`` literals (which Python's ``json`` writes and the client hook
sends), ``1e400`` and integers of any size included. It is stricter about text: lone surrogates,
non-UTF-8 encodings. Whenever it refuses a body, ``json.loads`` decodes it instead, so every body
decodes to what it did before, and a malformed one fails with the same error as before.
(Not orjson: it turns integers beyond 64 bits into floats, so it would change what some
bodies mean, and it is one more dependency.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic_core import from_json
from starlette.requests import Request
from starlette.responses import Response

from curvecast.service.routing import OneHopRoute


def loads(body: bytes) -> Any:
    """``json.loads(body)``, faster (see the module's docstring)."""
    try:
        return from_json(body, allow_inf_nan=True)
    except ValueError:
        return json.loads(body)


class _Request(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body())
        return self._json


class FastJSONRoute(OneHopRoute):
    """A :class:`OneHopRoute` whose request bodies :func:`loads` decodes; everything else
    (validation, error answers, the OpenAPI description) is FastAPI's own."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route_handler(request: Request) -> Response:
            return await handler(_Request(request.scope, request.receive))

        return route_handler
