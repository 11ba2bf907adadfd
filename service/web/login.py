"""Who is asking for a page, and the cookie login that lets a browser ask with a token.

The principal logic is the REST API's (:mod:`curvecast.service.deps`): the same header parsing,
the same token check, the same "admin of everything when auth is off". The one addition is
where a browser's token comes from: open any page once with ``?token=<token>``; the token is
checked, kept in an HttpOnly cookie (``SameSite=Lax``, ``Secure`` over HTTPS) and the browser
redirected to the same address without it, so it leaves the address bar, the history and the
``Referer``. Later requests carry the cookie; an ``Authorization`` header works too.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from curvecast.service.config import Settings
from curvecast.service.deps import SettingsDep, get_principal, principal_of_token, require
from curvecast.service.errors import ServiceError
from curvecast.service.schemas import Principal
from curvecast.service.web.responses import error_page

router = APIRouter()

#: The cookie that holds a browser's token.
COOKIE = "curvecast_token"
#: Pages only read: any token of the project will do (scopes nest, read is the smallest).
_can_read = require("read")


def cookie_token(request: Request) -> str | None:
    """The login cookie's token, when the request has no ``Authorization`` header of its own."""
    if request.headers.get("authorization"):
        return None
    return request.cookies.get(COOKIE) or None


def page_principal(request: Request, settings: SettingsDep) -> Principal:
    """The caller of a page or of chart data, by the REST API's rules, with the login cookie
    standing in for a missing ``Authorization`` header."""
    token = cookie_token(request)
    if settings.auth_enabled and token is not None:
        return _can_read(principal_of_token(request, token))
    return _can_read(get_principal(request, settings))


#: A route's caller (chart data: errors answer as JSON, like the REST API's).
PagePrincipal = Annotated[Principal, Depends(page_principal)]


def token_login(request: Request, settings: Settings) -> Response | None:
    """``?token=...`` with auth on: check it, keep it in the cookie, redirect without it.

    Returns None when there is nothing to do (no ``token`` parameter, or auth is off), else the
    redirect, or the error page of a token that does not check out (and no cookie).
    """
    token = request.query_params.get("token")
    if token is None or not settings.auth_enabled:
        return None
    try:
        principal_of_token(request, token)
    except ServiceError as exc:
        return error_page(settings, exc)
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
    response = RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})
    secure = request.url.scheme == "https" or settings.public_url.startswith("https")
    response.set_cookie(COOKIE, token, httponly=True, samesite="lax", secure=secure, path="/")
    return response


@router.get("/logout", response_class=HTMLResponse)
def logout() -> Response:
    """Forget the token cookie."""
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response
