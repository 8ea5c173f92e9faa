"""HTTP to the master for the worker program: the SDK's HTTP layer
(``workers.sdk._http``) under the names and answers the runner modules use.

What the layer guarantees (one implementation for the SDK, this module and
the admin CLIs): one ``requests.Session`` per thread with ``trust_env`` off
and an explicit proxy, redirects never followed, the error envelope and
Retry-After read one way, uploads streamed with 1 MiB reads, the base URL
checked (HTTPS unless ``allow_http``) and path segments quoted.

What is the worker program's own:

- ``call`` sends once and never retries: each loop that calls the master
  (claiming, delivery, heartbeats, registration) decides when to try again;
  ``RETRY`` is the SDK's retry policy, for its pauses (its ``attempts`` is
  not used: those loops retry until stopped).
- Errors are ``MasterError`` (an SDK ``FleetHQError``): ``Unreachable`` when
  nothing answered, ``Refused`` for a 401 on an authenticated call. 429, 503
  and 507 count as retryable whatever the envelope says (the spool or a
  rate limit frees up by itself).
- An empty 2xx body reads as ``{}``; there is no Cache-Control check.
"""
from __future__ import annotations

import json
import os

from workers.wire.protocol import CLIENT_VERSION_HEADER
from workers.sdk._errors import FleetHQError, ProtocolError
from workers.sdk._http import (CONNECT_TIMEOUT_S, READ_TIMEOUT_S, UPLOAD_BLOCK, BlockReader,
                               Sessions, base_url as _base_url, error_from, segment)
from workers.sdk._retry import DEFAULT as RETRY

__all__ = ["CONNECT_TIMEOUT_S", "READ_TIMEOUT_S", "RETRY", "UPLOAD_BLOCK", "BlockReader", "Master",
           "MasterError", "Refused", "Unreachable", "base_url", "seg"]

seg = segment


class MasterError(FleetHQError):
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
    try:
        return _base_url(url, allow_http=allow_http, http_hint="--allow-http on a trusted network")
    except ProtocolError as exc:
        raise ValueError(str(exc)) from None


class Master:
    def __init__(self, url: str, *, client_version: str, allow_http: bool,
                 secret: str | None = None, proxy: str | None = None):
        self.base = base_url(url, allow_http=allow_http)
        self.client_version = client_version
        self.secret = secret
        self._sessions = Sessions(headers={"User-Agent": client_version},
                                  proxies={"http": proxy, "https": proxy} if proxy else None)

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
            response = self._sessions.request(method, self.base + path, data=data,
                                              headers=all_headers,
                                              timeout=(CONNECT_TIMEOUT_S, timeout))
        except FleetHQError as exc:
            cause = exc.__cause__
            raise Unreachable(f"{method} {path}: {type(cause).__name__}: {cause}") from None
        return self._answer(method, path, response, auth)

    def _answer(self, method, path, response, auth) -> tuple[int, dict]:
        status = response.status_code
        if 200 <= status < 300:
            try:
                decoded = json.loads(response.content) if response.content else {}
            except ValueError:
                decoded = None
            if not isinstance(decoded, dict):
                raise MasterError(status, "bad_answer", f"{method} {path}: answer is not a JSON object",
                                  retryable=True)
            return status, decoded
        if 300 <= status < 400:
            raise MasterError(status, "redirect", f"{method} {path} answered a redirect to "
                              f"{response.headers.get('Location')!r}; not followed (the bearer "
                              "token stays with the configured master): fix --master")
        err = error_from(response)
        kind = Refused if status == 401 and auth else MasterError
        raise kind(status, err.code, err.message,
                   retryable=err.retryable or status in (429, 503, 507),
                   retry_after_s=None if err.retry_after_ms is None else err.retry_after_ms / 1000,
                   details=err.details)

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
