"""Who is asking for a page, and the cookie login that lets a browser ask with a token.

The principal logic is the REST API's (:mod:`curvecast.service.deps`): the same header parsing,
the same token check, the same "admin of everything when auth is off". The one addition is
where a browser's token comes from: open any page once with ``?token=<token>``; the token is
checked, kept in an HttpOnly cookie (``SameSite=Lax``, ``Secure`` over HTTPS) and the browser
redirected to the same address without it, so it leaves the address bar, the history and the
``Referer``. Later requests carry the cookie; an ``Authorization`` header works too. A link
with another token does not silently replace a valid cookie: the page asks first (``POST
/login``). Signing out is ``POST /logout`` (the pages' "Sign out" button).
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from curvecast.service.config import Settings
from curvecast.service.deps import SettingsDep, get_principal, principal_of_token, require
from curvecast.service.errors import InvalidInput, ServiceError
from curvecast.service.schemas import Principal
from curvecast.service.web.responses import error_page, page

router = APIRouter()

#: The cookie that holds a browser's token.
COOKIE = "curvecast_token"
#: A token from a ``?token=`` link that would replace a signed-in browser's: kept until the
#: person confirms the switch (``POST /login``), for a few minutes, sent only to ``/login``.
PENDING_COOKIE = "curvecast_pending_token"
PENDING_MAX_AGE_S = 300
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


_can_act = require("ingest")


def page_actor(request: Request, settings: Settings) -> Principal:
    """The caller of a page's action (acknowledge or silence an alert), by the same rules,
    needing what the REST API's same action needs: an ingest token (or auth off)."""
    token = cookie_token(request)
    if settings.auth_enabled and token is not None:
        return _can_act(principal_of_token(request, token))
    return _can_act(get_principal(request, settings))


#: A route's caller (chart data: errors answer as JSON, like the REST API's).
PagePrincipal = Annotated[Principal, Depends(page_principal)]


def token_login(request: Request, settings: Settings) -> Response | None:
    """``?token=...`` with auth on: check it, keep it in the cookie, redirect without it.

    A browser that is already signed in with another valid token is not switched silently (a
    link from anywhere could otherwise sign a victim in as the attacker's project, whose pages
    the victim then trusts): the new token waits in a short-lived cookie of its own and the
    page asks; its "switch" button POSTs ``/login`` from this origin (the edge refuses the
    POST from another site).

    Returns None when there is nothing to do (no ``token`` parameter, or auth is off), else the
    redirect, the question, or the error page of a token that does not check out (no cookie).
    """
    token = request.query_params.get("token")
    if token is None or not settings.auth_enabled:
        return None
    try:
        new = principal_of_token(request, token)
    except ServiceError as exc:
        return error_page(settings, exc)
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
    current = _valid_cookie(request)
    if current is not None and request.cookies.get(COOKIE) != token:
        response: Response = page(
            "login.html", title="Switch token", current=current, new=new,
            action="/login?" + urlencode({"next": target}), target=target,
            config={"page": "login"})
        response.set_cookie(PENDING_COOKIE, token, max_age=PENDING_MAX_AGE_S, httponly=True,
                            samesite="strict", secure=_secure(request, settings), path="/login")
        return response
    return _signed_in(request, settings, token, target)


def _secure(request: Request, settings: Settings) -> bool:
    return request.url.scheme == "https" or settings.public_url.startswith("https")


def _signed_in(request: Request, settings: Settings, token: str, target: str) -> Response:
    """Keep ``token`` in the login cookie and go to ``target``."""
    response = RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})
    response.set_cookie(COOKIE, token, httponly=True, samesite="lax",
                        secure=_secure(request, settings), path="/")
    return response


def _valid_cookie(request: Request) -> Principal | None:
    """The owner of the login cookie's token, if it has one that still checks out."""
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    try:
        return principal_of_token(request, token)
    except ServiceError:
        return None


def local_path(target: str) -> str:
    """``target`` if it is a path of this site, else ``/`` (no open redirect)."""
    if target.startswith("/") and not target.startswith(("//", "/\\")):
        return target
    return "/"


@router.post("/login", response_class=HTMLResponse)
def confirm_login(request: Request, settings: SettingsDep,
                  next: Annotated[str, Query(max_length=2000)] = "/") -> Response:  # noqa: A002
    """Switch to the token waiting in the pending cookie (the "switch" button of the question
    :func:`token_login` asks). Cross-site POSTs never get here (:mod:`curvecast.service.edge`)."""
    token = request.cookies.get(PENDING_COOKIE)
    if not settings.auth_enabled or not token:
        return error_page(settings, InvalidInput(
            "no token is waiting to be used: open a page with ?token=<token> first"))
    try:
        principal_of_token(request, token)
    except ServiceError as exc:
        return error_page(settings, exc)
    response = _signed_in(request, settings, token, local_path(next))
    response.delete_cookie(PENDING_COOKIE, path="/login")
    return response


@router.post("/logout", response_class=HTMLResponse)
def logout() -> Response:
    """Forget the token cookie. A POST (the pages' "Sign out" form), so that a link or an image
    on another site cannot sign a browser out."""
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response
