"""FleetHQ Python SDK: claim jobs of a generic project, report them, and keep
their leases alive (DESIGN §6, §9; docs/sdk.md).

    with open_project_queue("https://hq.example.org", token, "crawl",
                            client_version="my-worker/1.0") as queue:
        for job in queue.claim():
            job.complete()

Every error the SDK raises on purpose is a FleetHQError:

    FleetHQError
    ├── TransportError          master unreachable, connection broken (retried first)
    ├── ProtocolError           plain http without allow_http, a redirect, a
    │                           cacheable or malformed answer (never retried)
    ├── APIError                an error answer: code, status, retryable,
    │   │                       retry_after_ms, details
    │   ├── AuthError           401 / 403
    │   ├── NotFound            404
    │   ├── Conflict            409 (project_not_active, invalid_transition, …)
    │   ├── UpgradeRequired     426; .client_versions lists what is allowed
    │   ├── RateLimited         429, after the retries (retry_after_ms honoured)
    │   └── ServerError         5xx, after the retries
    └── LeaseLost               a report or renewal of this attempt was rejected

Only 429, 5xx and network errors are retried (jittered exponential backoff,
bounded by RetryPolicy.attempts); other 4xx answers are raised at once.
Nothing here imports the master (``app``) or Flask.

``workers.sdk.savewebhq`` offers SavewebHQ's Python SDK API (``saveweb_hq``:
``Config``, batch ``complete``/``fail``, raw claim answers) on this SDK.
"""
from workers.sdk._errors import (
    APIError,
    AuthError,
    Conflict,
    FleetHQError,
    LeaseLost,
    NotFound,
    ProtocolError,
    RateLimited,
    ServerError,
    TransportError,
    UpgradeRequired,
)
from workers.sdk._jobs import ItemResult, Job, JobInfo
from workers.sdk._policy import Policy
from workers.sdk._queue import ProjectQueue, open_project_queue
from workers.sdk._retry import RetryPolicy

__all__ = [
    "APIError",
    "AuthError",
    "Conflict",
    "FleetHQError",
    "ItemResult",
    "Job",
    "JobInfo",
    "LeaseLost",
    "NotFound",
    "Policy",
    "ProjectQueue",
    "ProtocolError",
    "RateLimited",
    "RetryPolicy",
    "ServerError",
    "TransportError",
    "UpgradeRequired",
    "open_project_queue",
]
