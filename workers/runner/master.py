"""HTTP to the master: bearer token, client version, error envelope.

- HTTPS only unless ``allow_http`` (the bearer token would travel in clear).
- Redirects are never followed: a 3xx is an error, so the token is never
  re-sent to wherever a redirect points.
- No proxies or ~/.netrc from the environment (``trust_env`` off): netrc
  credentials would replace the bearer header. A proxy can be set explicitly.
- Uploads stream the file with 1 MiB reads: http.client/urllib3 read a file
  body 8–16 KiB at a time, which caps a loopback upload at a few hundred MB/s
  of Python overhead; :class:`BlockReader` ignores the small block size.
- One ``requests.Session`` per thread: sessions are not documented as
  thread-safe, and a thread's keep-alive connection is reused across its calls.
"""
from __future__ import annotations

import json
import os
import threading
from urllib.parse import quote

import requests

from workers.protocol import CLIENT_VERSION_HEADER, master_base_url

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
UPLOAD_BLOCK = 1024 * 1024


class MasterError(Exception):
    """An error answer (``status`` set) or no answer at all (``status`` None)."""

    def __init__(self, status: int | None, code: str, message: str, *, retryable: bool = False,
                 retry_after_s: float | None = None, details: dict | None = None):
        super().__init__(f"{status or 'no answer'} {code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.details = details if isinstance(details, dict) else {}


class Unreachable(MasterError):
    def __init__(self, message: str):
        super().__init__(None, "unreachable", message, retryable=True)


class Refused(MasterError):
    """401: the master does not accept this secret (revoked or rejected node)."""


def base_url(url: str, *, allow_http: bool) -> str:
    """The master's base URL; ``ValueError`` for a URL the worker refuses."""
    return master_base_url(url, allow_http=allow_http, http_hint="--allow-http on a trusted network")


class BlockReader:
    """A file body for requests that hands out 1 MiB per read() whatever size
    is asked for, and whose len() gives requests the Content-Length."""

    def __init__(self, f, size: int):
        self._f, self._size = f, size

    def __len__(self) -> int:
        return self._size

    def read(self, _n: int = -1) -> bytes:
        return self._f.read(UPLOAD_BLOCK)


def _retry_after(envelope_ms, header) -> float | None:
    if isinstance(envelope_ms, int) and not isinstance(envelope_ms, bool) and envelope_ms >= 0:
        return envelope_ms / 1000
    if header and header.strip().isdigit():
        return float(header.strip())
    return None


class Master:
    def __init__(self, url: str, *, client_version: str, allow_http: bool,
                 secret: str | None = None, proxy: str | None = None):
        self.base = base_url(url, allow_http=allow_http)
        self.client_version = client_version
        self.secret = secret
        self._proxies = {"http": proxy, "https": proxy} if proxy else {}
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.trust_env = False
            session.headers["User-Agent"] = self.client_version
            self._local.session = session
        return session

    def call(self, method: str, path: str, *, body=None, data=None, headers=None,
             timeout: float = READ_TIMEOUT_S, auth: bool = True) -> tuple[int, dict]:
        """One request; returns (status, JSON body) for 2xx answers.

        Raises:
            Unreachable: no answer (connection refused, reset, timed out).
            Refused: 401 on an authenticated call.
            MasterError: any other error answer, with the envelope's fields.
        """
        all_headers = {CLIENT_VERSION_HEADER: self.client_version, "Accept": "application/json"}
        if auth and self.secret:
            all_headers["Authorization"] = f"Bearer {self.secret}"
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            all_headers["Content-Type"] = "application/json"
        all_headers.update(headers or {})
        try:
            response = self._session().request(
                method, self.base + path, data=data, headers=all_headers,
                timeout=(CONNECT_TIMEOUT_S, timeout), allow_redirects=False,
                proxies=self._proxies)
            payload = response.content
        except requests.RequestException as exc:
            self._local.session = None  # a broken keep-alive connection is not reused
            raise Unreachable(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        return self._answer(method, path, response, payload, auth)

    def _answer(self, method, path, response, payload, auth) -> tuple[int, dict]:
        status = response.status_code
        try:
            decoded = json.loads(payload) if payload else {}
        except ValueError:
            decoded = None
        if 200 <= status < 300:
            if not isinstance(decoded, dict):
                raise MasterError(status, "bad_answer", f"{method} {path}: answer is not a JSON object",
                                  retryable=True)
            return status, decoded
        if 300 <= status < 400:
            raise MasterError(status, "redirect", f"{method} {path} answered a redirect to "
                              f"{response.headers.get('Location')!r}; not followed (the bearer "
                              "token stays with the configured master): fix --master")
        envelope = decoded.get("error") if isinstance(decoded, dict) else None
        if not isinstance(envelope, dict):
            envelope = {"code": f"http_{status}", "message": payload[:200].decode(errors="replace"),
                        "retryable": status >= 500 or status == 429}
        kind = Refused if status == 401 and auth else MasterError
        raise kind(status, str(envelope.get("code")), str(envelope.get("message")),
                   retryable=bool(envelope.get("retryable")) or status in (429, 503, 507),
                   retry_after_s=_retry_after(envelope.get("retry_after_ms"),
                                              response.headers.get("Retry-After")),
                   details=envelope.get("details"))

    def upload(self, attempt_id: str, path, *, sha256: str, size: int, extra_headers: dict,
               timeout: float) -> tuple[int, dict]:
        """PUT the file at ``path`` (exactly ``size`` bytes) as the attempt's PDF."""
        headers = {"Content-Type": "application/pdf", "X-PDF-SHA256": sha256,
                   "X-PDF-Size": str(size), **extra_headers}
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size != size:
                raise OSError(f"{path} changed size since it was journaled")
            return self.call("PUT", f"/api/v1/fleet/uploads/{seg(attempt_id)}",
                             data=BlockReader(f, size), headers=headers, timeout=timeout)


def seg(value: str) -> str:
    quoted = quote(str(value), safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted
