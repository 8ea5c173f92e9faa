"""The one HTTP layer under every worker-side client: the SDK's transport,
the worker program's ``Master`` and the admin CLIs' ``Client``.

- One ``requests.Session`` per thread: sessions are not documented as
  thread-safe, and a thread's keep-alive connection is reused across its
  calls. A session whose connection broke is dropped, not reused.
- ``trust_env`` off: ~/.netrc credentials would replace the bearer header,
  and a proxy from the environment would be a surprise. Proxies (and a CA
  bundle) are passed explicitly by whoever wants them.
- Redirects are never followed: the bearer token would be re-sent to
  wherever ``Location`` points. The caller gets the 3xx answer and words
  the error for its own users.
- A caller's own session (the SDK's ``session=``) is used as given and never
  mutated.
- Error answers are read by :func:`error_from` (the envelope of DESIGN §6, or
  a proxy's page); uploads stream through :class:`BlockReader`.
"""
from __future__ import annotations

import threading
from urllib.parse import quote

import requests
from urllib3.exceptions import NewConnectionError

from workers.wire.protocol import master_base_url
from workers.sdk._errors import APIError, ProtocolError, TransportError, api_error_class
from workers.sdk._retry import retry_after_s

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
UPLOAD_BLOCK = 1024 * 1024
HTTP_HINT = "pass allow_http=True on a trusted network"

# Failures after which the request may be sent again. Other requests
# exceptions (invalid URL, bad headers) would only fail the same way again.
NETWORK_ERRORS = (requests.ConnectionError, requests.Timeout,
                  requests.exceptions.ChunkedEncodingError)


def base_url(url: str, *, allow_http: bool, http_hint: str = HTTP_HINT) -> str:
    """The master's base URL without a trailing slash; ``http_hint`` says how
    the caller allows plain http.

    Raises:
        ProtocolError: not http(s), credentials or a query in the URL, or plain
            http without ``allow_http`` (the bearer token would travel in clear).
    """
    try:
        return master_base_url(url, allow_http=allow_http, http_hint=http_hint)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None


def segment(value: str) -> str:
    """One path segment; ``.``/``..`` are valid identifiers but would be
    resolved as dot segments, so they are escaped too."""
    quoted = quote(str(value), safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


class BlockReader:
    """A file body that hands out 1 MiB per read() whatever size is asked for,
    and whose len() gives requests the Content-Length. http.client and urllib3
    read a file body 8–16 KiB at a time, which caps a loopback upload at a few
    hundred MB/s of Python overhead; this ignores the small block size.
    ``size`` 0 means unknown: iterate it for a chunked body."""

    def __init__(self, f, size: int):
        self._f, self._size = f, size

    def __len__(self) -> int:
        return self._size

    def read(self, _n: int = -1) -> bytes:
        return self._f.read(UPLOAD_BLOCK)

    def __iter__(self):
        while chunk := self.read():
            yield chunk


class Sessions:
    """Per-thread sessions (or the caller's one) and the request that never
    follows a redirect.

    ``headers`` are set on every session made here; ``proxies`` and ``verify``
    are the only environment-like settings a session gets.
    """

    def __init__(self, *, headers: dict | None = None, proxies: dict | None = None,
                 verify=True, session: requests.Session | None = None):
        self._given = session
        self._headers = dict(headers or {})
        self._proxies = dict(proxies or {})
        self._verify = verify
        self._local = threading.local()
        self._made: list[requests.Session] = []
        self._lock = threading.Lock()

    def get(self) -> requests.Session:
        if self._given is not None:
            return self._given
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.trust_env = False
            session.headers.update(self._headers)
            session.proxies.update(self._proxies)
            session.verify = self._verify
            self._local.session = session
            with self._lock:
                self._made.append(session)
        return session

    def discard(self) -> None:
        """Drop this thread's session: its connection broke and is not reused."""
        session = getattr(self._local, "session", None)
        if session is not None:
            self._local.session = None
            with self._lock:
                if session in self._made:
                    self._made.remove(session)
            session.close()

    def close(self) -> None:
        """Close the sessions made here (never the caller's)."""
        with self._lock:
            made, self._made = self._made, []
        for session in made:
            session.close()

    def request(self, method: str, url: str, *, timeout, **kwargs) -> requests.Response:
        """One request, redirects not followed.

        Raises (each with the requests exception as ``__cause__``):
            TransportError: no answer (refused, reset, timed out); not
                retryable for a TLS failure, which would repeat.
            ProtocolError: a request that could not be sent at all.
        """
        try:
            return self.get().request(method, url, timeout=timeout, allow_redirects=False, **kwargs)
        except requests.exceptions.SSLError as exc:
            self.discard()
            raise TransportError(f"{method} {url}: {exc}", retryable=False) from exc
        except NETWORK_ERRORS as exc:
            self.discard()
            raise TransportError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        except requests.RequestException as exc:
            self.discard()
            raise ProtocolError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc


def environment_settings(url: str) -> dict:
    """The proxies and CA bundle the environment names for ``url``
    (HTTPS_PROXY, NO_PROXY, REQUESTS_CA_BUNDLE, ...), as ``Sessions`` keywords:
    for command-line tools, which are expected to honour them."""
    with requests.Session() as probe:
        found = probe.merge_environment_settings(url, {}, None, None, None)
    return {"proxies": found["proxies"], "verify": found["verify"]}


def reached(exc: BaseException | None) -> bool:
    """False when a failed request surely never reached the server (no
    connection was made), so it cannot have been applied."""
    if isinstance(exc, (requests.exceptions.ConnectTimeout, requests.exceptions.SSLError)):
        return False
    if isinstance(exc, requests.exceptions.ConnectionError) and exc.args:
        reason = getattr(exc.args[0], "reason", exc.args[0])
        return not isinstance(reason, NewConnectionError)
    return True


def describe(exc: BaseException | None) -> str:
    """A failed request in a line for a person: requests nests urllib3's
    error, whose last clause ("[Errno 111] Connection refused") is the part
    that helps."""
    reason = getattr(exc.args[0], "reason", None) if exc is not None and exc.args else None
    text = str(reason).rsplit(": ", 1)[-1] if reason is not None else str(exc)
    return f"{type(exc).__name__}: {text}"[:400]


def error_from(response) -> APIError:
    """The error answer as an ``APIError`` (a subclass by status): the
    envelope's fields, or ``http_<status>`` and the start of the body when a
    proxy or load balancer answered. ``envelope`` is None for the latter.
    ``retry_after_ms`` is the envelope's, else the Retry-After header's."""
    try:
        body = response.json()
    except ValueError:
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    hint = retry_after_s(err.get("retry_after_ms") if isinstance(err, dict) else None,
                         response.headers.get("Retry-After"))
    hint_ms = None if hint is None else int(hint * 1000)
    cls = api_error_class(response.status_code)
    if isinstance(err, dict) and isinstance(err.get("code"), str):
        return cls(str(err.get("message") or ""), code=err["code"], status=response.status_code,
                   retryable=bool(err.get("retryable")), retry_after_ms=hint_ms,
                   details=err.get("details"), envelope=err)
    text = (response.text or "").strip()[:200] or response.reason or "error without a body"
    return cls(text, code=f"http_{response.status_code}", status=response.status_code,
               retryable=response.status_code == 429 or response.status_code >= 500,
               retry_after_ms=hint_ms)
