"""Checks made at the edge, from a request's headers alone, before any route reads its body.

:class:`EdgeGuard` is the outermost middleware. In order, it refuses:

1. more than one ``Host`` header (this check read the last, Starlette the first: a request
   could pass here under one name and be served under another), and a ``Host`` that is not one
   of this service's names (:meth:`Settings.host_allowed`): a page served under an attacker's
   DNS name (DNS rebinding) would otherwise be same-origin with the attacker's scripts. The
   health probes are exempt from the name check: orchestrators probe by pod address;
2. a state-changing request (POST, PUT, PATCH, DELETE) whose ``Origin`` (or, lacking one,
   ``Referer``) is another site: a browser attaches cookies to a cross-site form POST, and with
   auth off it needs no credentials at all. The one exception is a write to the REST API with
   auth on that carries an ``Authorization`` header: (3) lets it through only with a valid
   token, which a cross-site page does not have. The mere presence of the header proves
   nothing (an attacker chooses the headers of a request it sends), so with auth off, or on
   any other path, it changes nothing;
3. with auth on, a write to the REST API whose token is missing, unknown, revoked, or only
   ``read``: answered 401/403 before the body is read, so an anonymous client cannot make the
   server buffer and parse megabytes of JSON.

The token found by (3) is kept in the request's state, so the route's own dependency
(:func:`curvecast.service.deps.get_principal`) does not look it up a second time.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from curvecast.service import deps
from curvecast.service.config import Settings
from curvecast.service.errors import ERROR_CODE_TO_HTTP_STATUS, Forbidden, ServiceError

#: Methods that change state: the ones a cross-site form can send and that carry a body.
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Probes answer under any Host name (a load balancer or kubelet uses the pod address), and so
#: does /metrics (Prometheus scrapes by address; with auth on it needs a token).
_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
#: How much of a refused request's body is read and discarded before answering, so that a
#: small body (``-d 'not json'``) is consumed and the client reads the answer, not a reset.
#: Larger bodies are not read at all: the connection is closed on them.
DRAIN_BYTES = 64 * 1024
#: Where the request's principal is kept for the route (``request.state``).
PRINCIPAL_STATE = "curvecast_principal"


class EdgeGuard:
    """The header-only checks above, as an ASGI middleware."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        repeated: dict[str, list[str]] = {"host": [], "origin": [], "referer": []}
        for raw_name, raw_value in scope["headers"]:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            headers[name] = value
            if name in repeated:
                repeated[name].append(value)
        method = str(scope["method"]).upper()
        path = str(scope["path"])
        host = headers.get("host", "")
        if len(repeated["host"]) > 1:
            await _refuse(send, receive, scope, "host_not_allowed",
                          f"{len(repeated['host'])} Host headers; send exactly one Host header")
            return
        if path not in _PROBES and not self.settings.host_allowed(host):
            await _refuse(
                send, receive, scope, "host_not_allowed",
                f"Host {host[:100]!r} is not a name of this service; add it to "
                "CURVECAST_ALLOWED_HOSTS",
            )
            return
        api_write = method in UNSAFE_METHODS and path.startswith("/api/")
        token_checked = self.settings.auth_enabled and api_write  # by (3), below
        if (method in UNSAFE_METHODS
                and self._cross_site(repeated["origin"] or repeated["referer"], host)
                and not (token_checked and "authorization" in headers)):
            await _refuse(
                send, receive, scope, "forbidden",
                "cross-site request refused: a state-changing request from another site "
                + ("needs an 'Authorization: Bearer <token>' header" if token_checked else
                   "is not accepted (API clients send no Origin or Referer header)"),
            )
            return
        if self.settings.auth_enabled and api_write:
            error = await run_in_threadpool(self._authenticate, scope, headers)
            if error is not None:
                await _refuse(send, receive, scope, error.error_code, error.message, error.headers)
                return
        await self.app(scope, receive, send)

    def _cross_site(self, sources: list[str], host: str) -> bool:
        """Whether the request says it comes from another site: ``sources`` are its ``Origin``
        headers, or lacking any, its ``Referer`` headers (a browser sends at most one; every
        one given must name this service)."""
        return any(not self._same_site(source, host) for source in sources)

    def _same_site(self, source: str, host: str) -> bool:
        """Whether an ``Origin``/``Referer`` names this service (the ``Host`` it was asked
        under, or the configured public URL: a proxy may rewrite ``Host``)."""
        netloc = urlsplit(source).netloc.lower() if source != "null" else ""
        public = urlsplit(self.settings.public_url).netloc.lower()
        return bool(netloc) and netloc in {host.lower(), public}

    def _authenticate(self, scope: Scope, headers: dict[str, str]) -> ServiceError | None:
        """Check the bearer token of a write; the error to answer with, or None.

        A database failure is not answered here: the route's own dependency meets it again and
        answers the usual 503.
        """
        try:
            token = deps.bearer_token(headers.get("authorization"))
            principal = deps.authenticate_token(scope["app"].state.sessionmaker, token)
        except ServiceError as exc:
            return exc
        except Exception:  # noqa: BLE001 - the route reports it (503) with its own handlers
            return None
        if not principal.can("ingest"):  # every write of the REST API needs ingest or more
            return Forbidden(f"this token has scope {principal.scope!r}; this needs 'ingest'")
        scope.setdefault("state", {})[deps.PRINCIPAL_STATE] = principal
        return None


async def _refuse(send: Send, receive: Receive, scope: Scope, error_code: str, message: str,
                  extra: dict[str, str] | None = None) -> None:
    """Answer ``error_code`` without reading more than :data:`DRAIN_BYTES` of the body; the
    connection is closed (an unread body cannot be skipped to reach the next request)."""
    headers = dict(scope["headers"])
    declared = headers.get(b"content-length", b"")
    if not (declared.isdigit() and int(declared) > DRAIN_BYTES):
        budget = DRAIN_BYTES
        while budget > 0:
            message_in = await receive()
            if message_in["type"] != "http.request":
                break
            budget -= len(message_in.get("body", b""))
            if not message_in.get("more_body", False):
                break
    body = json.dumps({"error_code": error_code, "message": message}).encode()
    out = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
           (b"connection", b"close")]
    out += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": ERROR_CODE_TO_HTTP_STATUS[error_code],
                "headers": out})
    await send({"type": "http.response.body", "body": body})
