"""The pages' scripts' read-only way into the REST API when auth is on.

A script cannot read the HttpOnly login cookie, so it cannot send the token itself. GET
``/dashboards/api/v1/{path}`` is routed to ``/api/v1/{path}`` with the cookie's token as the
bearer token: the same routes, checks and answers as any client gets, and the token never
reaches JavaScript. This is a re-route of the browser's own request (one dispatch, the answer
streamed back untouched), not a call the server makes to itself to build a page.
"""

from __future__ import annotations

import re

from fastapi import APIRouter
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from curvecast.service.errors import error_response
from curvecast.service.web.login import cookie_token

router = APIRouter()

#: What may follow ``/dashboards/api/v1/``: a plain API path (``..`` is refused too).
_API_PATH = re.compile(r"^[A-Za-z0-9_.\-/]{1,300}$")


class _ForwardToApi:
    """An ASGI endpoint rather than a request handler: it hands the request on to the REST
    API's routes instead of answering it itself."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer the request as ``GET /api/v1/{path}`` would, with the cookie's token."""
        path = str(scope["path_params"]["path"])
        if not _API_PATH.fullmatch(path) or ".." in path.split("/"):
            await error_response("not_found", "no such API path")(scope, receive, send)
            return
        headers = list(scope["headers"])
        token = cookie_token(Request(scope))
        if token is not None:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        target = f"/api/v1/{path}"

        async def uncached(message: Message) -> None:
            # What a page's script reads changes with every new point: never cache it.
            if message["type"] == "http.response.start":
                kept = [h for h in message.get("headers", []) if h[0].lower() != b"cache-control"]
                message["headers"] = [*kept, (b"cache-control", b"no-store")]
            await send(message)

        api_scope = {**scope, "path": target, "raw_path": target.encode(), "headers": headers}
        await scope["app"](api_scope, receive, uncached)


router.routes.append(Route("/dashboards/api/v1/{path:path}", _ForwardToApi(), methods=["GET"],
                           include_in_schema=False))
