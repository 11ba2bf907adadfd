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

An IPv6 address can carry an IPv4 one that a gateway, a tunnel or the host's own stack then
reaches: IPv4-mapped (``::ffff:127.0.0.1``), IPv4-compatible (``::7f00:1``), NAT64
(``64:ff9b::7f00:1``), 6to4 (``2002:7f00:1::``) and Teredo (``2001:0::/32``, its server and its
client). Such an address is allowed only if every IPv4 address it carries is.
"""

from __future__ import annotations

import ipaddress
import re
import socket

__all__ = ["TargetNotAllowed", "carried_ipv4", "is_allowed_address", "literal_address",
           "pick_address"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Characters of the legacy IPv4 spellings ``inet_aton`` accepts (decimal, octal, hex parts).
_LEGACY_V4 = re.compile(r"^[0-9a-fA-FxX.]+$")


class TargetNotAllowed(OSError):
    """The webhook's host is (or resolves to) an address webhooks may not reach."""


#: NAT64's well-known prefix (RFC 6052): the IPv4 address is the last 32 bits.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
#: IPv4-compatible addresses (RFC 4291, deprecated): 96 zero bits, then the IPv4 address.
_COMPATIBLE = ipaddress.IPv6Network("::/96")


def carried_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses ``ip`` carries (module doc); empty for a plain IPv6 address."""
    last32 = ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip in _NAT64 or ip in _COMPATIBLE:
        return [last32]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    return []


def is_allowed_address(ip: IPAddress, *, allow_private: bool) -> bool:
    """Whether a webhook may connect to ``ip``: a global unicast address that carries no IPv4
    address that is not one, or any address at all with ``allow_private`` (never the
    unspecified ``0.0.0.0``/``::``, or an IPv6 form of ``0.0.0.0``, which mean "this host")."""
    carried = carried_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else []
    if ip.is_unspecified or any(v4.is_unspecified for v4 in carried):
        return False
    if allow_private:
        return True
    if not all(is_allowed_address(v4, allow_private=False) for v4 in carried):
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return True  # the host connects to the IPv4 address, judged above
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
