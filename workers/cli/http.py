"""HTTP plumbing of ``hqctl``: settings, the CLI's errors and a progress line
on stderr. The HTTP itself is the SDK's layer (``workers.sdk._http``: sessions,
no redirects, the error envelope of DESIGN §6, Retry-After, upload bodies,
path segments) with the SDK's bearer auth, so every client on the worker side
sends and reads answers alike. As a shell tool, hqctl takes proxies and a CA
bundle from the environment (HTTPS_PROXY, REQUESTS_CA_BUNDLE, ...), passed to
that layer explicitly.

    CliError          a failure the CLI reports; exit 1
    ├── UsageError    bad settings or arguments; exit 2
    └── ApiError      the master answered with an error, or could not be reached

This module must not import ``app`` (it runs on worker computers).
"""
from __future__ import annotations

import ipaddress
import json
import os
import sys
import time
from importlib import metadata
from urllib.parse import urlsplit

from workers.wire.private_file import OpenToOthers, read_private
from workers.wire.protocol import CLIENT_VERSION_HEADER
from workers.sdk._errors import FleetHQError, ProtocolError
from workers.sdk._http import (CONNECT_TIMEOUT_S, BlockReader, Sessions, base_url, describe,
                               environment_settings, error_from, reached, segment)
from workers.sdk._transport import BearerAuth

__all__ = ["ApiError", "CliError", "Client", "Progress", "UploadBody", "UsageError",
           "check_master", "client_version", "read_token_file", "resolve_settings", "segment"]

CONNECT_TIMEOUT = CONNECT_TIMEOUT_S


class CliError(Exception):
    exit_code = 1


class UsageError(CliError):
    exit_code = 2


class ApiError(CliError, FleetHQError):
    """An error answer (``status`` set) or a transport failure (``status`` None).

    ``enveloped`` is True when the body was FleetHQ's own error envelope, so
    ``retryable`` is the master's word rather than a proxy's guess.
    ``connected`` is False only when the request surely never reached the master.
    """

    def __init__(self, status: int | None, code: str, message: str, *, retryable: bool = False,
                 retry_after_ms: int | None = None, details: dict | None = None,
                 enveloped: bool = False, connected: bool = True):
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms
        self.details = details if isinstance(details, dict) else {}
        self.enveloped = enveloped
        self.connected = connected

    def envelope(self) -> dict:
        return {"code": self.code, "message": self.message, "status": self.status,
                "retryable": self.retryable, "retry_after_ms": self.retry_after_ms,
                "details": self.details}

    def line(self) -> str:
        """``code: message`` plus the details, which often name the culprit."""
        text = f"{self.code}: {self.message}"
        return f"{text} {json.dumps(self.details, ensure_ascii=False)}" if self.details else text


def client_version() -> str:
    try:
        return "hqctl/" + metadata.version("fleethq")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "hqctl/0+unknown"


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_master(url: str, *, allow_http: bool = False) -> str:
    """Return the master's base URL without a trailing slash, or raise UsageError."""
    try:  # plain http to this machine itself never crosses a network
        host = urlsplit(url.strip()).hostname
        return base_url(url, allow_http=allow_http or bool(host and _is_loopback(host)),
                        http_hint="pass --allow-http on a trusted network")
    except (ValueError, ProtocolError) as exc:
        raise UsageError(str(exc)) from None


MAX_TOKEN_BYTES = 1024


def read_token_file(path: str) -> str:
    """The token in ``path``, which only its owner may read or write (as
    SavewebHQ's readSecretFile demands): a token other accounts on the machine
    can read is not secret any more."""
    try:
        raw = read_private(path, 4 * MAX_TOKEN_BYTES)
        token = raw.decode("utf-8").strip()
    except OpenToOthers as exc:
        raise UsageError(f"token file {path} is open to group or others (mode "
                         f"{exc.mode:04o}); run: chmod 600 {path}") from None
    except OSError as exc:
        raise UsageError(f"cannot read token file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"token file {path} is not UTF-8 text") from None
    if not token or len(raw) > 4 * MAX_TOKEN_BYTES or len(token.encode()) > MAX_TOKEN_BYTES:
        raise UsageError(f"token file {path} holds no valid token")
    return token


def _one_of(environ, *names) -> str | None:
    """The value of whichever of ``names`` is set; two that disagree are an
    error rather than a guess (the token would go to one of two masters)."""
    found = {name: environ[name] for name in names if environ.get(name)}
    if len(set(found.values())) > 1:
        raise UsageError(f"{' and '.join(found)} are set to different values; unset one")
    return next(iter(found.values()), None)


def resolve_settings(master: str | None, token: str | None, token_file: str | None,
                     environ=os.environ) -> tuple[str, str]:
    """The master URL and the token. Flags win over the environment.

    URL: ``--url``/``--master``, else ``HQ_URL`` or ``FLEETHQ_MASTER``; there
    is no default master. Token: ``--token``, ``--machine-token-file``/
    ``--token-file``, ``FLEETHQ_TOKEN``, then ``HQ_MACHINE_TOKEN_FILE`` or
    ``FLEETHQ_TOKEN_FILE``, in that order.
    """
    master = master or _one_of(environ, "HQ_URL", "FLEETHQ_MASTER")
    if not master:
        raise UsageError("no master URL: pass --url URL or set HQ_URL (there is no default)")
    if not token and token_file:
        token = read_token_file(token_file)
    token = token or environ.get("FLEETHQ_TOKEN")
    if not token:
        path = _one_of(environ, "HQ_MACHINE_TOKEN_FILE", "FLEETHQ_TOKEN_FILE")
        token = read_token_file(path) if path else None
    token = (token or "").strip()
    if not token:
        raise UsageError("no token: pass --machine-token-file FILE (or --token) "
                         "or set HQ_MACHINE_TOKEN_FILE")
    if not token.isascii() or not token.isprintable() or " " in token:
        raise UsageError("token contains characters that cannot be sent in a header")
    return master, token


def _error_from(response) -> ApiError:
    """The SDK's reading of an error answer, as the CLI reports it: the
    envelope's ``retryable`` is the master's word; a proxy's page is never
    called retryable (``enveloped`` False)."""
    err = error_from(response)
    enveloped = err.envelope is not None
    return ApiError(err.status, err.code, err.message,
                    retryable=err.retryable if enveloped else False,
                    retry_after_ms=err.retry_after_ms, details=err.details, enveloped=enveloped)


class Client:
    """Calls ``{master}/api/v1/...`` with the bearer token; never follows redirects."""

    def __init__(self, master: str, token: str, *, allow_http: bool = False, timeout: float = 60.0):
        self.base = check_master(master, allow_http=allow_http)
        self.timeout = timeout
        version = client_version()
        self._auth = BearerAuth(token)
        self._sessions = Sessions(headers={"User-Agent": version, CLIENT_VERSION_HEADER: version,
                                           "Accept": "application/json"},
                                  **environment_settings(self.base))

    def request(self, method: str, path: str, *, params=None, json=None, data=None,
                headers=None, timeout: float | None = None):
        """Send one request; return the decoded JSON body ({} when empty).

        Raises:
            ApiError: an error status, a redirect, a non-JSON answer, or a
                transport failure.
        """
        url = f"{self.base}/api/v1/{path}"
        try:
            response = self._sessions.request(
                method, url, params=params, json=json, data=data, headers=headers,
                auth=self._auth, timeout=(CONNECT_TIMEOUT, timeout or self.timeout))
        except FleetHQError as exc:
            raise ApiError(None, "connection_error", f"{self.base}: {describe(exc.__cause__)}",
                           connected=reached(exc.__cause__)) from None
        # A redirect could carry the token to another host, or turn a POST
        # into a GET: it is reported instead of followed.
        if 300 <= response.status_code < 400:
            target = response.headers.get("Location", "?")
            raise ApiError(response.status_code, "redirect",
                           f"master redirects to {target}; not following it with the token "
                           "(point --url at the final URL)")
        if response.status_code >= 400:
            raise _error_from(response)
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError:
            raise ApiError(response.status_code, "invalid_response",
                           "master answered with a body that is not JSON") from None


def _clock(seconds: float) -> str:
    """12s, 3m05s, 1h02m: elapsed and remaining time at a glance."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """One self-rewriting status line on stderr, drawn at most ten times a second.

    Off unless stderr is a terminal (or forced), so logs and pipes stay clean.
    """

    def __init__(self, label: str, *, total: int | None = None, enabled: bool | None = None,
                 stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.total = total
        self.started = time.monotonic()
        self._drawn_at = 0.0
        self._width = 0

    def update(self, done: int, note: str = "", *, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._drawn_at < 0.1):
            return
        self._drawn_at = now
        elapsed = max(now - self.started, 1e-6)
        if self.total:
            frac = min(done / self.total, 1.0)
            filled = int(frac * 24)
            text = f"{self.label} [{'#' * filled}{'-' * (24 - filled)}] {frac:4.0%}"
            # At the pace so far; shown once there is a pace to go by.
            eta = f" ETA {_clock(elapsed * (1 - frac) / frac)}" if 0.01 <= frac < 1 and elapsed >= 1 else ""
        else:
            text, eta = self.label, ""
        text = f"{text} {note} {_clock(elapsed)}{eta}".strip()
        self.stream.write("\r" + text.ljust(self._width))
        self._width = len(text)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\n")
            self.stream.flush()


class UploadBody(BlockReader):
    """The SDK's upload body (1 MiB reads, never the whole file), counting
    bytes for the progress line."""

    def __init__(self, stream, size: int, progress: Progress):
        super().__init__(stream, size)
        self._progress = progress
        self.sent = 0

    def read(self, _n: int = -1) -> bytes:
        chunk = super().read()
        self.sent += len(chunk)
        self._progress.update(self.sent, f"{self.sent >> 20} MiB", force=not chunk)
        return chunk
