"""The domain exception tree; the API maps it to the error envelope.

    FleetError                       (500 internal_error)
    ├── InvalidRequest               400 invalid_request
    │   └── InvalidJob               400 invalid_job
    ├── InvalidToken                 401 invalid_machine_token
    ├── PermissionDenied             403 permission_denied
    │   └── AwaitingApproval         403 permission_denied, details.reason awaiting_approval
    ├── EnrollmentRefused            403 permission_denied (a bad enrollment credential)
    ├── NotFound                     404 not_found
    ├── Conflict                     409 (identity_conflict, project_not_active,
    │   │                                 invalid_transition, stale_attempt)
    │   └── UploadMismatch           409 stale_attempt (the upload is not this attempt's)
    ├── StaleUpload                  409 stale_attempt (superseded, or released while it streamed)
    ├── TooLarge                     413 too_large
    ├── UnsupportedMediaType         415 unsupported_media_type
    ├── InvalidUpload                422 invalid_upload (a worker's file failed its checks)
    ├── InvalidText                  422 invalid_upload (a derived upload's text)
    ├── InvalidDocument              422 invalid_document (a document put in)
    ├── UpgradeRequired              426 client_upgrade_required
    ├── RateLimited                  429 project_dispatch_rate_limited
    │   └── TooManyAttempts          429 rate_limited (sign-in, enrollment)
    ├── StorageUnavailable           503 storage_unavailable (retryable)
    │   └── VerificationUnavailable  503 (an upload could not be verified or staged now)
    └── SpoolFull                    507 spool_full (retryable)

Every subclass lives here (tests/test_errors.py holds the tree to this
drawing). A client decides on ``code`` and, where one code covers several
cases, on ``details.reason`` — never on the message text.
"""
from __future__ import annotations


class FleetError(Exception):
    status = 500
    code = "internal_error"
    retryable = False

    def __init__(self, message: str, *, code: str | None = None, details: dict | None = None,
                 retry_after_ms: int = 0):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.details = details or {}
        # Always an integer on the wire (0: nothing to wait for); SavewebHQ's
        # clients decode it as int64 and refuse null.
        self.retry_after_ms = int(retry_after_ms or 0)

    def envelope(self) -> dict:
        return {"error": {
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
            "retry_after_ms": self.retry_after_ms,
            "details": self.details,
        }}


class InvalidRequest(FleetError):
    status, code = 400, "invalid_request"


class InvalidJob(InvalidRequest):
    code = "invalid_job"


class InvalidToken(FleetError):
    status, code = 401, "invalid_machine_token"


class PermissionDenied(FleetError):
    status, code = 403, "permission_denied"


class NotFound(FleetError):
    status, code = 404, "not_found"


class Conflict(FleetError):
    status, code = 409, "invalid_transition"


class TooLarge(FleetError):
    status, code = 413, "too_large"


class UnsupportedMediaType(FleetError):
    status, code = 415, "unsupported_media_type"


class UpgradeRequired(FleetError):
    status, code = 426, "client_upgrade_required"


class RateLimited(FleetError):
    status, code, retryable = 429, "project_dispatch_rate_limited", True


class StorageUnavailable(FleetError):
    """The object store, or the check of a file, cannot be reached now; the
    same request succeeds later."""
    status, code, retryable = 503, "storage_unavailable", True


class AwaitingApproval(PermissionDenied):
    """A node enrolled but not yet approved: it may heartbeat, not work. The
    worker waits (and says so) instead of asking an admin to act."""

    def __init__(self, message: str = "node is waiting for approval"):
        super().__init__(message, details={"reason": "awaiting_approval"})


class EnrollmentRefused(FleetError):
    status, code = 403, "permission_denied"


class UploadMismatch(Conflict):
    code = "stale_attempt"


class StaleUpload(FleetError):
    status, code = 409, "stale_attempt"


class InvalidUpload(FleetError):
    status, code = 422, "invalid_upload"


class InvalidText(FleetError):
    status, code = 422, "invalid_upload"


class InvalidDocument(FleetError):
    status, code = 422, "invalid_document"


class TooManyAttempts(RateLimited):
    """429 with Retry-After: a rate-limited key used up its window."""
    code = "rate_limited"


class VerificationUnavailable(StorageUnavailable):
    """An upload could not be verified or staged now."""


class SpoolFull(FleetError):
    status, code, retryable = 507, "spool_full", True
