"""One HTTP call to the master: bearer auth, the client version, retries,
and the checks that keep the token and the answers trustworthy.

Sessions, redirects and error answers are handled by ``workers.sdk._http``,
the layer the worker program and the admin CLIs share; a caller may hand in
its own ``requests.Session`` (for proxies, custom CA bundles or a test
adapter) and it is never mutated.
"""
from __future__ import annotations

import random
import threading
import time
from email.utils import parsedate_to_datetime

import requests

from workers.wire.protocol import CLIENT_VERSION_HEADER_ALIAS
from workers.sdk._errors import APIError, ProtocolError, TransportError
from workers.sdk._http import (CONNECT_TIMEOUT_S, HTTP_HINT, READ_TIMEOUT_S, Sessions, base_url,
                               error_from, segment)
from workers.sdk._retry import DEFAULT, RetryPolicy

__all__ = ["CONNECT_TIMEOUT_S", "HTTP_HINT", "READ_TIMEOUT_S", "BearerAuth", "Transport",
           "base_url", "check_not_cacheable", "segment"]

USER_AGENT = "fleethq-sdk/1"

# Cache-Control directives that let a cache store or reuse an answer.
_CACHEABLE = ("public", "immutable", "max-age", "s-maxage", "stale-while-revalidate",
              "stale-if-error")


def check_not_cacheable(response) -> None:
    """Every /api/ answer must say ``no-store``; one that does not, or that a
    cache admits to having served (``Age``), may be stale or someone else's."""
    directives = {}
    for part in response.headers.get("Cache-Control", "").split(","):
        name, _, value = part.strip().partition("=")
        if name:
            directives[name.lower()] = value.strip().strip('"')
    if "no-store" not in directives:
        raise ProtocolError(f"answer {response.status_code} lacks Cache-Control: no-store; "
                            "refusing a possibly cached response")
    cacheable = [d for d in _CACHEABLE if d in directives
                 and (d in ("public", "immutable") or directives[d] != "0")]
    if cacheable or "Age" in response.headers:
        raise ProtocolError(f"answer {response.status_code} is cacheable "
                            f"({', '.join(cacheable) or 'Age header'}); refusing it")


class BearerAuth(requests.auth.AuthBase):
    """The bearer token as requests auth (also used by hqctl and the source
    CLI). Set as the auth, requests never swaps in ~/.netrc credentials; the
    SDK passes it per request so a caller's session is left untouched."""
    def __init__(self, token: str):
        self._token = token

    def __call__(self, request):
        request.headers["Authorization"] = f"Bearer {self._token}"
        return request

    def __repr__(self) -> str:  # never print the token
        return "<Bearer ***>"


class Transport:
    """Sends JSON calls to ``{base}/api/v1/...`` with retries.

    ``interrupt`` (a threading.Event) cuts a retry pause short: the renewal
    thread passes its stop event so that ``close()`` never waits out a backoff.
    """

    def __init__(self, url: str, token: str, client_version: str, *, allow_http: bool = False,
                 session: requests.Session | None = None, retry: RetryPolicy | None = None,
                 timeout_s: float = READ_TIMEOUT_S, rng: random.Random | None = None,
                 http_hint: str = HTTP_HINT):
        token = (token or "").strip()
        if not token or not token.isascii() or not token.isprintable() or " " in token:
            raise ValueError("token must be a non-empty printable ASCII string")
        if not client_version or not str(client_version).isprintable():
            raise ValueError("client_version is required")
        self.base = base_url(url, allow_http=allow_http, http_hint=http_hint)
        self.retry = retry or DEFAULT
        self.timeout_s = timeout_s
        self._auth = BearerAuth(token)
        self._sessions = Sessions(session=session)
        # SavewebHQ's header name: FleetHQ accepts it, and a SavewebHQ
        # master accepts no other.
        self._headers = {CLIENT_VERSION_HEADER_ALIAS: str(client_version), "Accept": "application/json",
                         "User-Agent": f"{USER_AGENT} {client_version}"}
        self._rng = rng or random.Random()
        self._never = threading.Event()
        # The master's clock minus ours, from the last Date header: lease
        # times are the master's UNIX seconds.
        self.server_offset_s: float | None = None

    def close(self) -> None:
        self._sessions.close()

    def call(self, method: str, path: str, body: dict | None = None, *,
             extra_read_s: float = 0.0, interrupt: threading.Event | None = None,
             deadline: float | None = None) -> dict:
        """Send one call, retrying what may be retried; return the JSON object.

        ``deadline`` (monotonic) ends the retries early: a renewal is useless
        once the lease it would renew is gone.

        Raises:
            APIError (a subclass by status), TransportError, ProtocolError.
        """
        url = f"{self.base}/api/v1/{path}"
        for attempt in range(self.retry.attempts):
            last = attempt + 1 == self.retry.attempts
            try:
                return self._once(method, url, body, extra_read_s)
            except (APIError, TransportError) as exc:
                pause = None if last else self._pause(exc, attempt)
                if pause is None or (deadline is not None and time.monotonic() + pause > deadline):
                    raise
            if (interrupt or self._never).wait(pause):
                raise TransportError(f"{method} {path}: interrupted while waiting to retry")
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def _pause(self, exc: APIError | TransportError, attempt: int) -> float | None:
        """Seconds to wait before trying again, or None: do not retry."""
        if isinstance(exc, TransportError):
            return self.retry.backoff(attempt, self._rng) if exc.retryable else None
        if not (exc.status == 429 or exc.status >= 500):
            return None  # any other 4xx would only be refused again
        hint = None if exc.retry_after_ms is None else exc.retry_after_ms / 1000.0
        return self.retry.pause(attempt, hint, server_error=exc.status >= 500, rng=self._rng)

    def _once(self, method: str, url: str, body: dict | None, extra_read_s: float) -> dict:
        response = self._sessions.request(
            method, url, json=body, headers=self._headers, auth=self._auth,
            timeout=(CONNECT_TIMEOUT_S, self.timeout_s + extra_read_s))
        self._note_date(response.headers.get("Date"))
        status = response.status_code
        if status == 429 or status >= 500:
            # Retryable answers often come from a proxy that knows nothing of
            # no-store; nothing in them is used but the pause hint.
            raise error_from(response)
        if 300 <= status < 400:
            raise ProtocolError(f"master answered {status} redirect to "
                                f"{response.headers.get('Location', '?')!r}; not following it "
                                "with the token (point the SDK at the final URL)")
        check_not_cacheable(response)
        if status >= 400:
            raise error_from(response)
        try:
            data = response.json()
        except ValueError:
            raise ProtocolError(f"{method} {url}: answer {status} is not JSON") from None
        if not isinstance(data, dict):
            raise ProtocolError(f"{method} {url}: answer is not a JSON object")
        return data

    def _note_date(self, header: str | None) -> None:
        if not header:
            return
        try:
            self.server_offset_s = parsedate_to_datetime(header).timestamp() - time.time()
        except (TypeError, ValueError):
            pass
