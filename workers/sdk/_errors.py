"""The SDK's exceptions; the tree is drawn in the package docstring."""
from __future__ import annotations


class FleetHQError(Exception):
    """Base of every error the SDK raises on purpose."""


class TransportError(FleetHQError):
    """The master could not be reached, or the connection broke mid-answer.

    ``retryable`` is False for failures that would repeat (a TLS certificate
    that does not verify).
    """

    def __init__(self, message: str, *, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


class ProtocolError(FleetHQError):
    """The exchange broke a rule the SDK relies on: a plain-http URL without
    ``allow_http``, a redirect, a cacheable answer, a body of the wrong shape."""


class APIError(FleetHQError):
    """The master answered with an error status.

    ``code`` is the envelope's code (``http_<status>`` when the answer carried
    no FleetHQ envelope, e.g. from a proxy); ``details`` is always a dict;
    ``envelope`` is the answer's ``error`` object as received (None without one).
    """

    def __init__(self, message: str, *, code: str, status: int, retryable: bool = False,
                 retry_after_ms: int | None = None, details: dict | None = None,
                 envelope: dict | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.message = message
        self.code = code
        self.status = status
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms
        self.details = details if isinstance(details, dict) else {}
        self.envelope = envelope


class AuthError(APIError):
    """401 or 403: a bad or revoked token, a missing role, a revoked worker id."""


class NotFound(APIError):
    """404: no such project (or it is hidden from this token)."""


class Conflict(APIError):
    """409: the project is not active, or a transition is not allowed."""


class UpgradeRequired(APIError):
    """426: this ``client_version`` is not on the project's allow-list."""

    @property
    def client_versions(self) -> list[str]:
        versions = self.details.get("client_versions")
        return list(versions) if isinstance(versions, list) else []


class RateLimited(APIError):
    """429 after the retries ran out (or a wait longer than the policy allows)."""


class ServerError(APIError):
    """5xx after the retries ran out."""


class LeaseLost(FleetHQError):
    """The master no longer accepts reports for this attempt: the lease ran out,
    the job was requeued or deleted, or the attempt already ended another way."""

    def __init__(self, job_id: int, attempt_id: str, reason: str, *,
                 code: str = "stale_attempt", job_status: str | None = None):
        super().__init__(f"job {job_id} attempt {attempt_id}: {reason}")
        self.job_id = job_id
        self.attempt_id = attempt_id
        self.reason = reason
        self.code = code
        self.job_status = job_status


_BY_STATUS = {401: AuthError, 403: AuthError, 404: NotFound, 409: Conflict,
              426: UpgradeRequired, 429: RateLimited}


def api_error_class(status: int) -> type[APIError]:
    if status >= 500:
        return ServerError
    return _BY_STATUS.get(status, APIError)
