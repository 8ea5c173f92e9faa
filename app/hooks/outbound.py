"""The master's own outbound HTTP (hook deliveries, and anything later).

Every request follows the worker's SSRF rules (``workers.fetch.addresses``,
``workers.fetch.safe_http``): the host is resolved once, any answer in
loopback, private, link-local (cloud metadata), CGNAT, NAT64, 6to4 or other
non-public space refuses the request unless ``FLEETHQ_OUTBOUND_ALLOW``
names its network, and the connection goes to the address that was checked
(no DNS rebinding between the check and the connect). Redirects are not
followed. What the other side answers is kept as a status, never its body:
an answer body shown to admins would make the master a reading proxy for
whatever the URL reaches.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import certifi
import urllib3

from workers.fetch import addresses
from workers.fetch.safe_http import CONNECT_TIMEOUT_S, Target
from workers.fetch.types import Blocked, FetchFailure

USER_AGENT = "FleetHQ-Hooks/1"


@dataclass(frozen=True)
class Answer:
    status: int | None      # the HTTP status, None when there was no answer
    error: str | None       # why it failed (a status outside 2xx, a refusal, a network error)


# Control characters, spaces and backslashes: read differently by different
# URL parsers (and CR/LF would split a request line), never in a hook URL.
_UNSAFE = re.compile(r"[\x00-\x20\x7f\\]")
# A host made of numbers that is not a dotted quad ("2130706433", "0x7f.1",
# "0177.0.0.1"): resolvers read such names as addresses.
_NUMERIC_HOST = re.compile(r"\A(?:0x[0-9a-f]+|[0-9]+)(?:\.(?:0x[0-9a-f]+|[0-9]+)){0,3}\Z", re.IGNORECASE)


def check_url(url: str, allow: tuple = ()) -> str:
    """A consumer URL the policy can accept, or ValueError saying why. The
    address a name resolves to is checked at each delivery, where it counts."""
    if not url.isascii() or _UNSAFE.search(url):
        raise ValueError("url must be plain ASCII without spaces, control characters or backslashes "
                         "(percent-encode them)")
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port
    except ValueError as exc:   # an unclosed "[", a port that is not a number
        raise ValueError(f"url is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError("url must be an http(s) URL with a host")
    if "@" in parts.netloc:
        raise ValueError("url may not carry user:password@ (the signature authenticates deliveries)")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is None and _NUMERIC_HOST.match(host):
        raise ValueError(f"url's host {host!r} is a number: write the address as a.b.c.d")
    if address is None and (host == "localhost" or host.endswith(".localhost")):
        address = ipaddress.ip_address("127.0.0.1")
    if address is not None and (why := addresses.refusal(address, allow)) is not None:
        raise ValueError(f"url's host {host} is not a public address ({why}); "
                         "FLEETHQ_OUTBOUND_ALLOW may name its network")
    return url


def post(url: str, body: bytes, headers: dict, *, timeout_s: float, allow: tuple) -> Answer:
    """POST ``body`` to ``url`` under the policy; never raises for the network.
    Headers go as given (names and case), with ``Host`` the URL's."""
    try:
        target = Target(url)
        ips = addresses.resolve(target.host, target.port, allow)   # Blocked: not public
    except Blocked as exc:
        return Answer(None, f"refused: {exc.message}"[:300])
    except FetchFailure as exc:
        return Answer(None, f"{exc.code}: {exc.message}"[:300])
    common = dict(port=target.port, maxsize=1, block=False, retries=False)
    if target.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(ips[0], server_hostname=target.host, cert_reqs="CERT_REQUIRED",
                                           ca_certs=certifi.where(), **common)
    else:
        pool = urllib3.HTTPConnectionPool(ips[0], **common)
    try:
        response = pool.urlopen("POST", target.request_path, body=body,
                                headers={"Host": target.host_header, **headers}, redirect=False,
                                retries=False, preload_content=False, assert_same_host=False,
                                timeout=urllib3.Timeout(connect=min(timeout_s, CONNECT_TIMEOUT_S),
                                                        read=timeout_s))
        status = response.status
        response.close()   # the body is not read: nothing of it is kept
    except urllib3.exceptions.HTTPError as exc:
        return Answer(None, f"{exc.__class__.__name__}: {exc}"[:300])
    finally:
        pool.close()
    return Answer(status, None if 200 <= status < 300 else f"HTTP {status}")
