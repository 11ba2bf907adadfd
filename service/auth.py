"""Bearer tokens: generation, hashing and constant-time verification (pure functions).

A token looks like ``cc_<prefix>_<secret>``. The prefix is stored in clear to find the row;
only the SHA-256 digest of the whole token is stored. Tokens carry 256 bits of randomness, so a
fast hash is enough (slow password hashes exist for low-entropy secrets).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

TOKEN_RE = re.compile(r"^cc_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


def new_token() -> tuple[str, str]:
    """Generate a token; returns (token, prefix)."""
    prefix = secrets.token_hex(6)
    return f"cc_{prefix}_{secrets.token_urlsafe(32)}", prefix


def hash_token(token: str) -> str:
    """Hex SHA-256 digest of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def parse_prefix(token: str) -> str | None:
    """The lookup prefix of a well-formed token, or None when it is malformed."""
    match = TOKEN_RE.match(token)
    return match.group(1) if match else None


def verify(token: str, stored_hash: str) -> bool:
    """Compare in constant time."""
    return hmac.compare_digest(hash_token(token), stored_hash)
