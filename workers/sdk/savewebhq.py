"""SavewebHQ's Python SDK API (``saveweb_hq``), served by FleetHQ's SDK.

A script written for ``saveweb_hq`` runs here with only its import changed:

    from workers.sdk.savewebhq import Config, open_project_queue

    with open_project_queue(Config(tracker_url="https://hq.example",
                                   machine_token=token,
                                   client_version="sinavideo/2.4.0"),
                            "sinavideo") as queue:
        response = queue.claim(max_jobs=64)
        for job in response["jobs"]:
            ...
        queue.complete(items)

The names, signatures, return values and errors are SavewebHQ's; everything
underneath is FleetHQ's SDK: its HTTP transport, its one retry policy, the
policy cache and the claim pacing of ``workers.sdk.ProjectQueue``
(docs/sdk.md, "SavewebHQ's API"). No lease is renewed in the background, as
in SavewebHQ's Python SDK: call ``extend_lease``.

The errors fit FleetHQ's tree:

    FleetHQError (= SavewebHQError)
    ├── TransportError      the master unreachable, a disallowed URL, a
    │                       cacheable, redirected or malformed answer, an
    │                       error answer without the envelope
    └── workers.sdk.APIError
        └── APIError        (status, error): every enveloped error answer,
                            with .code, .retryable, .retry_after_ms, .error
"""
# Imported under private names: the module's public names are exactly
# saveweb_hq's (tests/test_sdk_savewebhq_api.py).
from contextlib import contextmanager as _contextmanager
from dataclasses import dataclass as _dataclass

from workers.wire import protocol as _protocol
from workers.sdk import _errors
from workers.sdk._queue import ProjectQueue as _FleetQueue
from workers.sdk._queue import new_worker_id as _new_worker_id
from workers.sdk._transport import Transport as _Transport
from workers.sdk._transport import segment as _segment

__all__ = [
    "APIError",
    "Config",
    "ProjectQueue",
    "SavewebHQError",
    "TransportError",
    "default_job_id",
    "open_project_queue",
    "whoami",
]

SavewebHQError = _errors.FleetHQError
TransportError = _errors.TransportError


class APIError(_errors.APIError):
    """An error answer: ``status`` and the envelope's ``error`` object as
    received; ``code``, ``retryable`` and ``retry_after_ms`` (0 when absent)
    read from it as SavewebHQ's SDK reads them."""

    def __init__(self, status: int, error: dict):
        pause = error.get("retry_after_ms", 0)
        code = str(error.get("code", "internal_error"))
        message = str(error.get("message", ""))
        super().__init__(message, code=code, status=status,
                         retryable=bool(error.get("retryable", False)),
                         retry_after_ms=pause if _protocol.is_int(pause) else 0,
                         details=error.get("details"), envelope=error)
        self.error = error
        self.args = (f"HTTP {status}: {code}: {message}",)


@_contextmanager
def _savewebhq_errors():
    """FleetHQ's errors as SavewebHQ's SDK raises them."""
    try:
        yield
    except APIError:
        raise
    except _errors.APIError as exc:
        if not isinstance(exc.envelope, dict):
            raise TransportError(f"HTTP {exc.status} has no error envelope: {exc}",
                                 retryable=exc.retryable) from exc
        raise APIError(exc.status, exc.envelope) from exc
    except _errors.ProtocolError as exc:
        raise TransportError(str(exc), retryable=False) from exc


@_dataclass(frozen=True, slots=True)
class Config:
    """Where the master is and how to speak to it."""
    tracker_url: str
    machine_token: str
    client_version: str
    allow_http_tracker: bool = False
    request_timeout: float = 45.0

    def validate(self) -> None:
        """Raises ValueError: a required field is empty, or the timeout is
        outside 1..600 seconds."""
        if not self.tracker_url or not self.machine_token or not self.client_version:
            raise ValueError("tracker URL, machine token, and client version are required")
        if not 1.0 <= self.request_timeout <= 600.0:
            raise ValueError("request_timeout must be between 1 and 600 seconds")


def _transport(config: Config) -> _Transport:
    config.validate()
    with _savewebhq_errors():
        return _Transport(config.tracker_url, config.machine_token, config.client_version,
                         allow_http=config.allow_http_tracker, timeout_s=config.request_timeout,
                         http_hint="set Config(allow_http_tracker=True) on a trusted network")


class ProjectQueue:
    """One project's queue; ``worker_id`` is a fresh seven-character
    ``a-z0-9`` id fixed for this instance. Use :func:`open_project_queue`."""

    def __init__(self, config: Config, project_id: str):
        config.validate()
        if not project_id:
            raise ValueError("project_id is required")
        self.project_id = project_id
        self.worker_id = _new_worker_id()
        self._transport = _transport(config)
        self._queue = _FleetQueue(self._transport, project_id, worker_id=self.worker_id,
                                  lease_seconds=None, long_poll_ms=0, renew=False,
                                  accept_types=None)
        self._jobs_path = f"projects/{_segment(project_id)}/jobs"

    def close(self) -> None:
        self._queue.close()

    def __enter__(self) -> "ProjectQueue":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def claim(self, max_jobs: int = 64, lease_seconds: int | None = None,
              accept_types: list[str] | None = None) -> dict:
        """Claim up to ``max_jobs`` (clamped to the policy's
        ``max_jobs_per_claim``) for ``lease_seconds`` (default the policy's
        recommendation) of ``accept_types`` (default, or ``[]``: every type).

        Returns:
            The claim answer: ``project_id``, ``jobs``, ``retry_after_ms``,
            ``policy_version``.
        """
        if not _protocol.is_int(max_jobs) or max_jobs < 1:
            raise ValueError("max_jobs must be positive")
        with _savewebhq_errors():
            response = self._queue.claim_response(
                max_jobs, lease_seconds=lease_seconds,
                accept_types=[] if accept_types is None else list(accept_types))
        if response.get("project_id") != self.project_id:
            raise ValueError("tracker returned a mismatched claim response")
        return response

    def complete(self, items: list[dict]) -> dict:
        """Report up to 256 finished attempts; returns ``{"results": [...]}``."""
        return self._post("complete", {"worker_id": self.worker_id, "items": items})

    def fail(self, items: list[dict]) -> dict:
        """Report up to 256 failed attempts; returns ``{"results": [...]}``."""
        return self._post("fail", {"worker_id": self.worker_id, "items": items})

    def extend_lease(self, extend_seconds: int, items: list[dict]) -> dict:
        """Extend up to 256 leases by ``extend_seconds``; returns ``{"results": [...]}``."""
        return self._post("extend-lease", {"worker_id": self.worker_id,
                                           "extend_seconds": extend_seconds, "items": items})

    def _post(self, route: str, body: dict) -> dict:
        with _savewebhq_errors():
            return self._transport.call("POST", f"{self._jobs_path}/{route}", body)


def open_project_queue(config: Config, project_id: str) -> ProjectQueue:
    """Open a project's queue; nothing is sent until the first call."""
    return ProjectQueue(config, project_id)


def whoami(config: Config) -> str:
    """The user id of the config's machine token."""
    transport = _transport(config)
    try:
        with _savewebhq_errors():
            response = transport.call("GET", "whoami")
    finally:
        transport.close()
    user_id = response.get("user_id")
    if not isinstance(user_id, str) or not user_id:
        raise ValueError("tracker returned an invalid user ID")
    return user_id


def default_job_id(job_type: str, value: str) -> str:
    """The v1 external job id of ``value`` (not normalized); an empty
    ``job_type`` is ``seed``. Arguments in SavewebHQ's order."""
    return _protocol.default_job_id(value, job_type or "seed")
