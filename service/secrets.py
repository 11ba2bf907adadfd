"""Webhook secrets at rest: sealed with Fernet (AES-128-CBC + HMAC-SHA256) under a key from the
settings, opened only by the worker when it signs a delivery.

The key is ``CURVECAST_SECRET_KEY`` (any string of 32+ random characters; the Fernet key is its
SHA-256). Every replica must have the same one. The embedded SQLite default needs no setting:
a key is generated once into ``<database file>.key`` (mode 0600) beside the database. With
PostgreSQL and no key, a webhook *with* a secret is refused (nothing is stored in clear).

A stored value is ``fernet:v1:<token>``; a value without the prefix is a secret stored in clear
by an older version: it still signs, and ``curvecast migrate`` seals it
(:func:`curvecast.service.store.webhooks.seal_plaintext_secrets`).
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy.engine import make_url

from curvecast.service.config import Settings
from curvecast.service.errors import InvalidInput

__all__ = ["PREFIX", "SecretBox", "SecretUnavailable", "box_for"]

PREFIX = "fernet:v1:"


class SecretUnavailable(InvalidInput):
    """A secret cannot be sealed (no key configured) or opened (wrong or missing key)."""


class SecretBox:
    """Seals and opens webhook secrets with one key (None: this deployment has none)."""

    def __init__(self, key_material: str | None) -> None:
        self._fernet = None
        if key_material:
            digest = hashlib.sha256(key_material.encode()).digest()
            self._fernet = Fernet(base64.urlsafe_b64encode(digest))

    def seal(self, secret: str) -> str:
        """The stored form of ``secret``.

        Raises:
            SecretUnavailable: no key is configured.
        """
        if self._fernet is None:
            raise SecretUnavailable(
                "secret: webhook secrets are stored encrypted and this deployment has no key; "
                "set CURVECAST_SECRET_KEY (32+ random characters, the same on every replica)"
            )
        return PREFIX + self._fernet.encrypt(secret.encode()).decode()

    def open(self, stored: str) -> str:
        """The secret a stored value holds (a legacy clear-text value is returned as it is).

        Raises:
            SecretUnavailable: sealed under another key, or no key is configured.
        """
        if not is_sealed(stored):
            return stored
        if self._fernet is None:
            raise SecretUnavailable("no CURVECAST_SECRET_KEY to open a stored webhook secret")
        try:
            return self._fernet.decrypt(stored[len(PREFIX):].encode()).decode()
        except InvalidToken:
            raise SecretUnavailable(
                "a stored webhook secret does not open with this CURVECAST_SECRET_KEY"
            ) from None


def is_sealed(stored: str) -> bool:
    """Whether a stored value is sealed (not a legacy clear-text secret)."""
    return stored.startswith(PREFIX)


def _sqlite_key_file(database_url: str) -> Path | None:
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(f"{url.database}.key")


def box_for(settings: Settings) -> SecretBox:
    """The deployment's box: ``CURVECAST_SECRET_KEY``, else (embedded SQLite) the key file
    beside the database, created on first use with mode 0600, else no key."""
    if settings.secret_key is not None:
        return SecretBox(settings.secret_key.get_secret_value())
    path = _sqlite_key_file(settings.database_url)
    if path is None:
        return SecretBox(None)
    if not path.exists():
        # Written whole under a temporary name, then linked into place: a process starting at
        # the same time either links first or finds the complete file (never a partial one).
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, secrets.token_urlsafe(48).encode())
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    return SecretBox(path.read_text().strip())
