"""API tokens: create (returned once), list, revoke, authenticate."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from curvecast.service import auth
from curvecast.service.errors import NotFound, Unauthenticated
from curvecast.service.models import ApiToken, Project
from curvecast.service.schemas import Principal, TokenCreated, TokenInfo, TokenScope
from curvecast.service.store._common import as_utc, utcnow, write_connection
from curvecast.service.store.projects import ensure_project

# Compared against when a prefix is unknown, so a miss costs the same as a hit.
_DUMMY_HASH = auth.hash_token("cc_000000000000_" + "0" * 43)


def create_token(session: Session, *, project: str, scope: TokenScope, name: str) -> TokenCreated:
    """Create a token for ``project`` (created if missing). The secret is returned only here."""
    write_connection(session)
    project_id = ensure_project(session, name=project)
    token, prefix = auth.new_token()
    row = ApiToken(
        project_id=project_id,
        name=name,
        scope=scope,
        prefix=prefix,
        token_hash=auth.hash_token(token),
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return TokenCreated(id=row.id, project=project, name=name, scope=scope, token=token)


def list_tokens(session: Session, *, project: str | None = None) -> list[TokenInfo]:
    """Tokens (without secrets), oldest first."""
    stmt = select(ApiToken, Project.name).join(Project).order_by(ApiToken.id)
    if project is not None:
        stmt = stmt.where(Project.name == project)
    return [
        TokenInfo(
            id=t.id,
            project=p,
            name=t.name,
            scope=t.scope,  # type: ignore[arg-type]
            prefix=t.prefix,
            created_at=as_utc(t.created_at),
            revoked_at=as_utc(t.revoked_at) if t.revoked_at else None,
        )
        for t, p in session.execute(stmt).all()
    ]


def revoke_token(session: Session, *, token_id: int) -> None:
    """Revoke a token; it stops working at once."""
    write_connection(session)
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFound(f"token {token_id} not found")
    if row.revoked_at is None:
        row.revoked_at = utcnow()


def authenticate(session: Session, *, token: str) -> Principal:
    """Resolve a presented token to its project and scope, or raise Unauthenticated."""
    prefix = auth.parse_prefix(token)
    if prefix is None:
        raise Unauthenticated("malformed token: expected 'Authorization: Bearer cc_<id>_<secret>'")
    row = session.execute(
        select(ApiToken, Project.name).join(Project).where(ApiToken.prefix == prefix)
    ).first()
    stored = row[0].token_hash if row else _DUMMY_HASH
    if not auth.verify(token, stored) or row is None:
        raise Unauthenticated("invalid token")
    if row[0].revoked_at is not None:
        raise Unauthenticated("this token has been revoked; create a new one")
    return Principal(project=row[1], scope=row[0].scope, token_id=row[0].id)  # type: ignore[arg-type]
