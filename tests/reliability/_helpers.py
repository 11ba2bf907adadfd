"""Helpers of the reliability tests: polling through restarts, reading JSON answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests import support as testing


def wait_for(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """:func:`tests.support.wait_for`, where a server that does not answer (it is
    being killed and restarted) means "not yet"."""
    return testing.wait_for(condition, timeout, what, every=every,
                            retry_on=(httpx.TransportError, OSError))


def get_json(url: str, **params: Any) -> Any:
    """GET ``url`` and return its JSON body (raising on non-2xx)."""
    resp = httpx.get(url, params=params, timeout=10)
    resp.raise_for_status()
    return resp.json()
