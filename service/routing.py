"""``OneHopRoute``: a read route whose sync endpoint costs one thread-pool hand-over, not three.

FastAPI runs a plain ``def`` endpoint in the thread pool; because the endpoint is not ``async``,
it also validates the endpoint's answer in the thread pool, a second hand-over; and the request's
session (``deps.get_session``) is committed and closed in a third, since both do I/O. Each
hand-over is a measurable share of a small read's CPU; this class and :mod:`._json` are kept
for what they save against FastAPI's own route class (BENCHMARKS.md, "Service CPU per request
against a checkout").

For ``GET`` (and ``HEAD``) routes this class hands FastAPI an ``async`` wrapper of the endpoint
instead. The wrapper runs the endpoint in the thread pool and, in that same thread, ends the
request's session: committed when the endpoint returns, rolled back when it raises, closed
either way (:func:`curvecast.service.db.end_session`, which marks the session ended so that the
dependency leaves it alone). FastAPI then validates the answer, a pydantic model the endpoint
already built, in the event loop. Routes that write keep FastAPI's order: their session is
committed only after the answer validated.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from fastapi.routing import APIRoute
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from curvecast.service.db import end_session

_READ_METHODS = frozenset({"GET", "HEAD"})


class OneHopRoute(APIRoute):
    """An ``APIRoute`` whose sync read endpoints run in one thread-pool hand-over (module doc)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        methods = {m.upper() for m in kwargs.get("methods") or ("GET",)}
        if methods <= _READ_METHODS and not inspect.iscoroutinefunction(endpoint):
            endpoint = _in_one_hop(endpoint)
        super().__init__(path, endpoint, **kwargs)


def _in_one_hop(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    # functools.wraps keeps the endpoint's signature, annotations and name (FastAPI reads the
    # parameters, the return type and the module's globals through __wrapped__).
    @functools.wraps(endpoint)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        return await run_in_threadpool(_call_and_end_sessions, endpoint, args, kwargs)

    return wrapper


def _call_and_end_sessions(
    endpoint: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    sessions = [value for value in kwargs.values() if isinstance(value, Session)]
    try:
        result = endpoint(*args, **kwargs)
    except BaseException:
        for session in sessions:
            end_session(session, commit=False)
        raise
    for session in sessions:
        end_session(session, commit=True)
    return result
