"""Which addresses a webhook may reach. Pure (the caller resolves names).

A webhook URL is chosen by anyone with an admin token, and the service POSTs to it from inside
the deployment: without a filter it reaches loopback, the private network, the cloud metadata
address and the database's port, and the delivery log (readable with a read token) tells an
open port from a closed one. By default only *global* unicast addresses are allowed;
``CURVECAST_WEBHOOK_ALLOW_PRIVATE=true`` lifts that for the embedded case (a receiver on the same
machine or network). The check runs twice: on the URL's host at registration when it is a
literal address (in any spelling ``inet_aton`` accepts: ``2130706433``, ``0x7f.1``, ``127.1``),
and at delivery on every address the name resolves to, the connection then going to the address
checked, so DNS cannot answer differently between the check and the connect.
"""

from __future__ import annotations

import ipaddress
import re
import socket

__all__ = ["TargetNotAllowed", "is_allowed_address", "literal_address", "pick_address"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Characters of the legacy IPv4 spellings ``inet_aton`` accepts (decimal, octal, hex parts).
_LEGACY_V4 = re.compile(r"^[0-9a-fA-FxX.]+$")


class TargetNotAllowed(OSError):
    """The webhook's host is (or resolves to) an address webhooks may not reach."""


def is_allowed_address(ip: IPAddress, *, allow_private: bool) -> bool:
    """Whether a webhook may connect to ``ip``: a global unicast address, or any address at all
    with ``allow_private`` (never the unspecified ``0.0.0.0``/``::``, which means "this host")."""
    if ip.is_unspecified:
        return False
    if allow_private:
        return True
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return is_allowed_address(ip.ipv4_mapped, allow_private=False)
    return ip.is_global and not ip.is_multicast


def literal_address(host: str) -> IPAddress | None:
    """``host`` as an address if it is one (brackets of IPv6 URLs stripped; legacy IPv4
    spellings included), else None (a name)."""
    bare = host.strip("[]")
    try:
        return ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        pass
    if _LEGACY_V4.match(bare):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(bare))
        except OSError:
            return None
    return None


def pick_address(addresses: list[str], *, host: str, allow_private: bool) -> str:
    """The address to connect to among those ``host`` resolved to: the first one, if every one
    is allowed (a name with one private answer among public ones is refused: which answer a
    client gets is the resolver's choice, and an attacker's).

    Raises:
        TargetNotAllowed: none resolved, or one of them is not allowed.
    """
    if not addresses:
        raise TargetNotAllowed(f"{host} did not resolve")
    for text in addresses:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
        if not is_allowed_address(ip, allow_private=allow_private):
            raise TargetNotAllowed(
                f"{host} resolves to a private, loopback, link-local or reserved address; "
                "set CURVECAST_WEBHOOK_ALLOW_PRIVATE=true to allow it"
            )
    return addresses[0]
