"""SSRF-safe HTTP client: every hop vetted, connection pinned to the vetted address.

For each request and each redirect hop the host is resolved once
(:func:`addresses.resolve`, which refuses non-public answers) and the TCP
connection is opened to that address, not to the name: the urllib3 pool is
created with the IP as its host while the ``Host`` header, TLS SNI and the
certificate check use the name (``server_hostname``). So a DNS answer that
changes between the check and the connect (rebinding) cannot redirect us.

urllib3 is used directly, not requests: it reads no proxy settings from the
environment (nothing like ``trust_env`` to forget), follows no redirects by
itself (``retries=False``), and exposes the stream so bodies are read in
chunks under a deadline, never whole into memory.
"""
from __future__ import annotations

import http.cookiejar
import time
import urllib.request
from urllib.parse import quote, urljoin, urlsplit

import certifi
import idna
import urllib3
from urllib3.exceptions import HTTPError, LocationParseError, NewConnectionError, SSLError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from . import addresses
from .types import FetchFailure, NETWORK, TIMEOUT

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
DEFAULT_PORTS = {"http": 80, "https": 443}
CHUNK = 64 * 1024
CONNECT_TIMEOUT_S = 15


class Target:
    """One URL taken apart: where to connect and what to say in Host/SNI."""

    def __init__(self, url: str):
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise FetchFailure(NETWORK, f"bad URL {url!r}: {exc}", reason="bad_url", url=url) from None
        self.scheme = parts.scheme.lower()
        if self.scheme not in DEFAULT_PORTS:
            raise FetchFailure(NETWORK, f"refusing {self.scheme or 'relative'} URL {url[:200]!r}",
                               reason="bad_scheme", url=url)
        if parts.username is not None or parts.password is not None:
            raise FetchFailure(NETWORK, "refusing a URL with user:password@", reason="bad_url", url=url)
        host = parts.hostname or ""
        if not host:
            raise FetchFailure(NETWORK, f"URL has no host: {url[:200]!r}", reason="bad_url", url=url)
        if not host.isascii():
            try:
                host = idna.encode(host, uts46=True).decode("ascii")
            except idna.IDNAError as exc:
                raise FetchFailure(NETWORK, f"bad host name: {exc}", reason="bad_url", url=url) from None
        self.host = host.split("%")[0]            # no IPv6 zone ids from the network
        self.port = port or DEFAULT_PORTS[self.scheme]
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = shown if self.port == DEFAULT_PORTS[self.scheme] else f"{shown}:{self.port}"
        # Locations in the wild carry spaces and non-ASCII; http.client refuses them raw.
        path = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
        query = quote(parts.query, safe="/%:@!$&'()*+,;=-._~?")
        self.request_path = path + (f"?{query}" if query else "")
        self.url = f"{self.scheme}://{self.host_header}{self.request_path}"


class Response:
    """A streamed response; read it with :meth:`peek`, :meth:`chunks`, :meth:`read_capped`."""

    def __init__(self, raw, url: str, redirects: list[str], deadline: float):
        self.raw, self.url, self.redirects, self.deadline = raw, url, redirects, deadline
        self.status = raw.status
        self.headers = raw.headers
        self._buf = b""
        self._eof = False

    def content_type(self) -> str:
        return (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()

    def _read(self) -> bytes:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise FetchFailure(TIMEOUT, f"time budget exhausted while reading {self.url}", url=self.url)
        # Shrink the socket timeout to what is left, so one slow read cannot overrun the budget.
        sock = getattr(getattr(self.raw, "connection", None), "sock", None)
        if sock is not None:
            sock.settimeout(min(remaining, sock.gettimeout() or remaining))
        with _mapped_errors(self.url):
            # read1: whatever has arrived (up to CHUNK). read() would wait for
            # a full CHUNK, so a server dripping bytes could outlast the budget.
            data = self.raw.read1(CHUNK, decode_content=True)
        if not data:
            self._eof = True
        return data

    def peek(self, n: int = 1024) -> bytes:
        while len(self._buf) < n and not self._eof:
            self._buf += self._read()
        return self._buf[:n]

    def chunks(self):
        if self._buf:
            yield self._buf
            self._buf = b""
        while not self._eof:
            if data := self._read():
                yield data

    def read_capped(self, limit: int) -> tuple[bytes, bool]:
        """Up to ``limit`` bytes of the body, and whether it was cut."""
        out = bytearray()
        for data in self.chunks():
            out += data
            if len(out) > limit:
                return bytes(out[:limit]), True
        return bytes(out), False

    def close(self) -> None:
        # A fully read body lets the connection be reused; otherwise drop it.
        if self._eof:
            self.raw.release_conn()
        else:
            self.raw.close()


class _mapped_errors:
    """Turn urllib3/socket errors into classified failures."""

    def __init__(self, url: str):
        self.url = url

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, FetchFailure) or not isinstance(exc, (HTTPError, OSError)):
            return False
        # NewConnectionError subclasses ConnectTimeoutError (urllib3 compatibility):
        # a refused connection is not a timeout.
        if isinstance(exc, (Urllib3Timeout, TimeoutError)) and not isinstance(exc, NewConnectionError):
            raise FetchFailure(TIMEOUT, f"timed out talking to {self.url}: {exc}", url=self.url) from None
        reason = "tls" if isinstance(exc, SSLError) else "connection"
        raise FetchFailure(NETWORK, f"{type(exc).__name__} on {self.url}: {exc}"[:500],
                           reason=reason, url=self.url) from None


class _CookieResponse:
    """The little of a urllib response that ``CookieJar.extract_cookies`` reads."""

    def __init__(self, headers):
        self._headers = headers

    def info(self):
        return self

    def get_all(self, name, default=None):
        return self._headers.getlist(name) or default


class SafeClient:
    """One per fetch (or per browser lane): pools and cookies live as long as it does."""

    def __init__(self, cfg, *, cookies: bool = True):
        self.cfg = cfg
        self.allow = cfg.allowed_networks()
        self.jar = http.cookiejar.CookieJar() if cookies else None
        self._pools: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    def _pool(self, target: Target, ip: str):
        key = (target.scheme, ip, target.port, target.host)
        if key not in self._pools:
            common = dict(port=target.port, maxsize=1, block=False, retries=False)
            if target.scheme == "https":
                self._pools[key] = urllib3.HTTPSConnectionPool(
                    ip, server_hostname=target.host, cert_reqs="CERT_REQUIRED",
                    ca_certs=self.cfg.ca_bundle or certifi.where(), **common)
            else:
                self._pools[key] = urllib3.HTTPConnectionPool(ip, **common)
        return self._pools[key]

    def request(self, url: str, *, deadline: float, method: str = "GET", headers=None,
                body: bytes | None = None, follow: bool = True) -> Response:
        """Send one request, following redirects (each re-vetted) when ``follow``."""
        redirects: list[str] = []
        extra = {k.lower(): v for k, v in (headers or {}).items()
                 if k.lower() not in ("host", "content-length", "connection", "accept-encoding")}
        origin = None
        while True:
            target = Target(url)
            if origin is not None and (target.scheme, target.host, target.port) != origin:
                # Never carry caller-supplied credentials to another origin.
                extra.pop("cookie", None)
                extra.pop("authorization", None)
            origin = (target.scheme, target.host, target.port)
            response = self._send(target, method, extra, body, deadline, redirects)
            location = response.headers.get("Location")
            if not follow or response.status not in REDIRECT_STATUSES or not location:
                return response
            response.read_capped(64 * 1024)   # small redirect bodies: drain to reuse the connection
            response.close()
            if len(redirects) >= self.cfg.max_redirects:
                raise FetchFailure(NETWORK, f"more than {self.cfg.max_redirects} redirects",
                                   reason="too_many_redirects", url=url, redirects=redirects)
            redirects.append(url)
            url = urljoin(target.url, location.strip())
            if response.status == 303 or (response.status in (301, 302) and method == "POST"):
                method, body = "GET", None
                extra.pop("content-type", None)

    def _send(self, target: Target, method, extra, body, deadline, redirects) -> Response:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise FetchFailure(TIMEOUT, f"time budget exhausted before {target.url}", url=target.url)
        ips = addresses.resolve(target.host, target.port, self.allow)   # raises Blocked
        headers = {"host": target.host_header, "user-agent": self.cfg.user_agent,
                   "accept": "application/pdf,text/html;q=0.9,*/*;q=0.8",
                   "accept-encoding": "gzip, deflate", **extra}
        if self.jar is not None:
            probe = urllib.request.Request(target.url)
            self.jar.add_cookie_header(probe)
            if cookie := probe.unredirected_hdrs.get("Cookie"):
                headers["cookie"] = cookie
        timeout = urllib3.Timeout(connect=min(remaining, CONNECT_TIMEOUT_S), read=remaining)
        with _mapped_errors(target.url):
            try:
                raw = self._pool(target, ips[0]).urlopen(
                    method, target.request_path, body=body, headers=headers, redirect=False,
                    retries=False, preload_content=False, decode_content=True, timeout=timeout,
                    assert_same_host=False)
            except LocationParseError as exc:
                raise FetchFailure(NETWORK, f"bad URL {target.url}: {exc}", reason="bad_url") from None
        if self.jar is not None:
            self.jar.extract_cookies(_CookieResponse(raw.headers), urllib.request.Request(target.url))
        return Response(raw, target.url, redirects, deadline)
