"""FastAPI dependencies: settings, a managed database session, and the caller's identity."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from curvecast.service.config import Settings
from curvecast.service.db import session_scope
from curvecast.service.errors import Forbidden, Unauthenticated
from curvecast.service.schemas import Principal, TokenScope
from curvecast.service.store import tokens


def get_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    """One session per request: committed when the route returns, rolled back on error."""
    with session_scope(request.app.state.sessionmaker) as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
# scope="function": the commit happens before the response is sent, so a client is never told
# "stored" about a transaction that then fails to commit.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]

_HOW_TO_GET_A_TOKEN = (
    "send 'Authorization: Bearer <token>'; create a token with "
    "`curvecast token create --project NAME --scope read|ingest|admin`"
)


def get_principal(request: Request, settings: SettingsDep) -> Principal:
    """Who is calling. With auth off (loopback only) everyone is an admin of every project.

    The token is checked in a short session of its own, so the route's session starts its
    transaction with the route's first statement (a write transaction on SQLite must begin as
    one; see service.db.WRITE_OPTION).
    """
    if not settings.auth_enabled:
        return Principal(project=None, scope="admin")
    header = request.headers.get("authorization")
    if not header:
        raise Unauthenticated(f"missing token: {_HOW_TO_GET_A_TOKEN}")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthenticated(f"malformed Authorization header: {_HOW_TO_GET_A_TOKEN}")
    return principal_of_token(request, value.strip())


def principal_of_token(request: Request, token: str) -> Principal:
    """The owner of ``token`` (however it arrived: header, or the dashboards' cookie), checked
    in a short session of its own (see :func:`get_principal`)."""
    with session_scope(request.app.state.sessionmaker) as session:
        return tokens.authenticate(session, token=token)


def require(scope: TokenScope) -> Callable[[Principal], Principal]:
    """A dependency that admits callers whose token scope includes ``scope``."""

    def _check(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if not principal.can(scope):
            raise Forbidden(f"this token has scope {principal.scope!r}; this needs {scope!r}")
        return principal

    return _check


ReadPrincipal = Annotated[Principal, Depends(require("read"))]
IngestPrincipal = Annotated[Principal, Depends(require("ingest"))]
AdminPrincipal = Annotated[Principal, Depends(require("admin"))]
