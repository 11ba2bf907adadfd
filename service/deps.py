"""FastAPI dependencies: settings, a managed database session, and the caller's identity."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from curvecast.service.config import Settings
from curvecast.service.db import SESSION_ENDED, end_session, session_scope
from curvecast.service.errors import Forbidden, Unauthenticated
from curvecast.service.schemas import Principal, TokenScope
from curvecast.service.store import tokens

#: Where :class:`curvecast.service.edge.EdgeGuard` keeps a write's already checked principal.
PRINCIPAL_STATE = "curvecast_principal"


async def get_settings(request: Request) -> Settings:
    """The settings the app was created with. (The dependencies that do no I/O are ``async``:
    FastAPI runs a plain ``def`` dependency in the thread pool, a hand-over that cost more than
    the check itself, several times per request.)"""
    settings: Settings = request.app.state.settings
    return settings


async def get_session(request: Request) -> AsyncIterator[Session]:
    """One session per request: committed when the route returns, rolled back on error (or
    already ended by a read route in its endpoint's thread: ``routing.py``).

    ``async``, although committing does I/O: a plain generator dependency is entered and left
    in the thread pool, two hand-overs per request on top of the route's own (a tenth of a
    small read's CPU). Creating a session does no I/O (it connects at its first statement, in
    the route's thread), so only the commit, or the rollback, goes to the thread pool.
    """
    session = request.app.state.sessionmaker()
    try:
        yield session
    except BaseException:
        if not session.info.get(SESSION_ENDED):
            await run_in_threadpool(end_session, session, commit=False)
        raise
    # A read route (routing.py) ended it already, in its endpoint's thread.
    if not session.info.get(SESSION_ENDED):
        await run_in_threadpool(end_session, session, commit=True)


SettingsDep = Annotated[Settings, Depends(get_settings)]
# scope="function": the commit happens before the response is sent, so a client is never told
# "stored" about a transaction that then fails to commit.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]

_HOW_TO_GET_A_TOKEN = (
    "send 'Authorization: Bearer <token>'; create a token with "
    "`curvecast token create --project NAME --scope read|ingest|admin`"
)


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header.

    Raises:
        Unauthenticated: the header is missing or not a bearer token.
    """
    if not header:
        raise Unauthenticated(f"missing token: {_HOW_TO_GET_A_TOKEN}")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthenticated(f"malformed Authorization header: {_HOW_TO_GET_A_TOKEN}")
    return value.strip()


def _known_principal(request: Request, settings: Settings) -> Principal | None:
    """The caller, when no token needs looking up: everyone with auth off, or a write's token
    that :class:`curvecast.service.edge.EdgeGuard` already checked."""
    if not settings.auth_enabled:
        return Principal(project=None, scope="admin")
    checked = getattr(request.state, PRINCIPAL_STATE, None)
    return checked if isinstance(checked, Principal) else None


def get_principal(request: Request, settings: Settings) -> Principal:
    """Who is calling. With auth off (loopback only) everyone is an admin of every project.

    The token is checked in a short session of its own, so the route's session starts its
    transaction with the route's first statement (a write transaction on SQLite must begin as
    one; see service.db.WRITE_OPTION). A write's token was already checked from the headers,
    before its body was read (:class:`curvecast.service.edge.EdgeGuard`): that answer is reused.
    """
    known = _known_principal(request, settings)
    if known is not None:
        return known
    return principal_of_token(request, bearer_token(request.headers.get("authorization")))


async def current_principal(request: Request, settings: SettingsDep) -> Principal:
    """:func:`get_principal` as a dependency: the database is asked (in the thread pool) only
    when a token needs looking up."""
    known = _known_principal(request, settings)
    if known is not None:
        return known
    token = bearer_token(request.headers.get("authorization"))
    return await run_in_threadpool(principal_of_token, request, token)


def authenticate_token(sessions: sessionmaker[Session], token: str) -> Principal:
    """The owner of ``token``, checked in a short session of its own."""
    with session_scope(sessions) as session:
        return tokens.authenticate(session, token=token)


def principal_of_token(request: Request, token: str) -> Principal:
    """The owner of ``token`` (however it arrived: header, or the dashboards' cookie), checked
    in a short session of its own (see :func:`get_principal`)."""
    return authenticate_token(request.app.state.sessionmaker, token)


def require(scope: TokenScope) -> Callable[[Principal], Principal]:
    """A check that admits principals whose token scope includes ``scope`` (the pages call it
    on the principal they found)."""

    def _check(principal: Principal) -> Principal:
        if not principal.can(scope):
            raise Forbidden(f"this token has scope {principal.scope!r}; this needs {scope!r}")
        return principal

    return _check


def _requirement(scope: TokenScope) -> Callable[[Principal], Awaitable[Principal]]:
    """A dependency that admits callers whose token scope includes ``scope``."""
    check = require(scope)

    async def _dependency(principal: Annotated[Principal, Depends(current_principal)]
                          ) -> Principal:
        return check(principal)

    return _dependency


ReadPrincipal = Annotated[Principal, Depends(_requirement("read"))]
IngestPrincipal = Annotated[Principal, Depends(_requirement("ingest"))]
AdminPrincipal = Annotated[Principal, Depends(_requirement("admin"))]
