"""Webhook URLs that are credentials: what of them may be shown. Pure (no I/O).

Many receivers authenticate the sender by a token in the URL itself: a Slack incoming webhook
(``https://hooks.slack.com/services/T…/B…/<token>``), a Discord one
(``https://discord.com/api/webhooks/<id>/<token>``), Teams, Mattermost, Google Chat
(``?key=…&token=…``), and any receiver that takes ``?token=`` or a random path. Whoever knows
the URL can post to the channel. :func:`masked_url` is the URL with those parts replaced by
``***``: what every read shows. A URL it changes :func:`bears_secret`; such a URL is stored
sealed (:mod:`curvecast.service.secrets`) beside its masked form, and shown whole only in the
answer to the admin who registers it.

What is masked: every query value; the last path segment on Slack's and Discord's webhook
hosts; and any path segment that looks generated — 16 characters or more, letters and digits
mixed (tokens, UUIDs, hex keys). Words and numeric ids stay readable.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

__all__ = ["MASK", "bears_secret", "masked_url"]

MASK = "***"
#: Hosts whose webhook URLs end with their token, whatever it looks like.
_TOKEN_LAST_HOSTS = frozenset({
    "hooks.slack.com", "hooks.slack-gov.com", "discord.com", "discordapp.com",
    "canary.discord.com", "ptb.discord.com",
})
_GENERATED = re.compile(r"^(?=.*[0-9])(?=.*[A-Za-z])[A-Za-z0-9._~=+%@:-]{16,}$")


def _masked_query(query: str) -> str:
    items = []
    for item in query.split("&"):
        name, equals, value = item.partition("=")
        if equals:
            items.append(f"{name}={MASK if value else ''}")
        else:
            items.append(MASK if _GENERATED.match(name) else name)
    return "&".join(items)


def masked_url(url: str) -> str:
    """``url`` with its secret-looking parts replaced by ``***`` (module doc); scheme, host,
    port and the readable path segments are kept, so a person can tell webhooks apart."""
    parts = urlsplit(url)
    segments = parts.path.split("/")
    host = (parts.hostname or "").lower()
    last = max((i for i, s in enumerate(segments) if s), default=None)
    for i, segment in enumerate(segments):
        if _GENERATED.match(segment) or (i == last and host in _TOKEN_LAST_HOSTS
                                         and i > 1):
            segments[i] = MASK
    query = _masked_query(parts.query) if parts.query else ""
    return urlunsplit((parts.scheme, parts.netloc, "/".join(segments), query, ""))


def bears_secret(url: str) -> bool:
    """Whether ``url`` carries something :func:`masked_url` hides."""
    return masked_url(url) != url
