"""Which addresses a worker may connect to (SSRF rules of DESIGN §9).

Only public unicast addresses pass. Refused: loopback, private (RFC 1918,
ULA), link-local (including 169.254.169.254, the cloud metadata service),
CGNAT 100.64/10, multicast, reserved, unspecified, documentation and other
special-purpose ranges (everything ``ipaddress`` does not call global), and
IPv6 forms that embed an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``,
IPv4-compatible, 6to4 ``2002::/16``, Teredo, NAT64 ``64:ff9b::/96``) when the
embedded address is refused: the kernel or a relay would deliver those to
the IPv4 address.

A host name is resolved once (:func:`resolve`); if any of its addresses is
refused the whole name is refused, because an answer mixing public and
private addresses is the classic way to slip past a check that looks at one
address and connects to another.
"""
from __future__ import annotations

import ipaddress
import socket

from .types import Blocked, FetchFailure, NETWORK

# The resolver, looked up at call time so tests can replace it
# (monkeypatch ``workers.fetch.addresses.getaddrinfo``) to fake DNS answers.
getaddrinfo = socket.getaddrinfo

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    found = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)          # (server, client): both are IPv4 addresses
    if ip in _NAT64:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    # IPv4-compatible (::a.b.c.d, deprecated): still routed as IPv4 by some stacks.
    if int(ip) >> 32 == 0 and int(ip) > 1:
        found.append(ipaddress.IPv4Address(int(ip)))
    return found


def refusal(ip, allow: tuple = ()) -> str | None:
    """Why ``ip`` is refused, or None when it may be connected to."""
    ip = ipaddress.ip_address(ip)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:              # "fe80::1%eth0": the zone changes nothing here
            ip = ipaddress.IPv6Address(str(ip).split("%")[0])
        ip = ip.ipv4_mapped or ip        # judged (and allow-listed) as the IPv4 it is
    # The test allow-list is checked first and only matches what it lists.
    if any(ip.version == net.version and ip in net for net in allow):
        return None
    for flag in ("is_loopback", "is_link_local", "is_multicast", "is_unspecified",
                 "is_reserved", "is_private"):
        if getattr(ip, flag):
            return flag[3:]
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "cgnat"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.is_site_local:
            return "site_local"
        for inner in _embedded_ipv4(ip):
            if (why := refusal(inner, allow)) is not None:
                return f"embedded_ipv4_{why}"
    if not ip.is_global:
        return "not_global"
    return None


def resolve(host: str, port: int, allow: tuple = ()) -> list[str]:
    """Resolve ``host`` once; return its addresses if every one is allowed.

    Raises :class:`Blocked` for a refused address and :class:`FetchFailure`
    (``network``) when the name does not resolve.
    """
    try:
        infos = getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise FetchFailure(NETWORK, f"cannot resolve {host!r}: {exc}", reason="dns", host=host) from None
    addresses = []
    for family, _type, _proto, _canon, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and sockaddr[0] not in addresses:
            addresses.append(sockaddr[0])
    if not addresses:
        raise FetchFailure(NETWORK, f"{host!r} has no IPv4/IPv6 address", reason="dns", host=host)
    refused = {a: why for a in addresses if (why := refusal(a, allow)) is not None}
    if refused:
        mixed = len(refused) < len(addresses)
        reason = "mixed_dns_answer" if mixed else next(iter(refused.values()))
        raise Blocked(f"refusing {host!r}: address {', '.join(refused)} is not public"
                      + (" (answer mixes public and non-public addresses)" if mixed else ""),
                      reason=reason, host=host, addresses=addresses)
    return addresses
