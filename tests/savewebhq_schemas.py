"""SavewebHQ's v1 wire contract, declared as JSON Schema for the drop-in tests.

Written from SavewebHQ's ``api/openapi-v1.yaml`` (operation and schema names
are the contract's). ``closed`` marks the objects the contract declares with
``additionalProperties: false`` — every answer object except the free-form
``Attrs`` (``attr``, ``meta``, ``details``) — so an extra field in an answer
is a contract break, as it is for SavewebHQ's strict Go client.

Integers are checked strictly: a JSON ``1.0`` or ``"1"`` is not an integer
here, because SavewebHQ's Go types (``int64``) refuse both.
"""
from __future__ import annotations

from jsonschema import Draft202012Validator, validators

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
JOB_STATUSES = ("todo", "wip", "done", "failed", "reset_exhausted")


def closed(required: dict, optional: dict | None = None) -> dict:
    """An object with exactly these properties (``additionalProperties: false``)."""
    return {"type": "object", "additionalProperties": False, "required": sorted(required),
            "properties": {**required, **(optional or {})}}


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def array(items: dict, **bounds) -> dict:
    return {"type": "array", "items": items, **bounds}


def integer(minimum: int = INT64_MIN, maximum: int = INT64_MAX) -> dict:
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


def string(min_length: int = 0, max_length: int | None = None, **extra) -> dict:
    schema = {"type": "string", "minLength": min_length, **extra}
    if max_length is not None:
        schema["maxLength"] = max_length
    return schema


def enum(*values) -> dict:
    return {"enum": list(values)}


IDENTIFIER = string(1, 128, pattern=r"^[A-Za-z0-9._:-]+$")
JOB_ID = integer(1)              # int64 >= 1 on every route
INT64 = integer()
UNIX_SECONDS = integer()
ATTRS = {"type": "object"}       # the contract's open ``Attrs``
QPS = nullable({"type": "number", "exclusiveMinimum": 0})
BOOLEAN = {"type": "boolean"}
CLIENT_VERSIONS = array(string(1, 128), maxItems=64, uniqueItems=True)
JOB_STATUS = enum(*JOB_STATUSES)
JOB_TYPE = enum("seed", "asset")

# The JobSpec fields every job shape shares; only ``value`` is required.
SPEC_REQUIRED = {"value": string(1, 8192)}
SPEC_OPTIONAL = {"id": IDENTIFIER, "type": JOB_TYPE, "via": nullable(string(0, 8192)),
                 "hops": integer(0), "attr": ATTRS}

# ----------------------------------------------------------------- answers

HEALTH = closed({"status": {"const": "ok"}})
WHO_AM_I = closed({"user_id": IDENTIFIER})
JOB_COUNTS = closed({status: integer(0) for status in JOB_STATUSES})

API_ERROR = closed({"code": string(), "message": string(), "retryable": BOOLEAN,
                    "retry_after_ms": INT64, "details": ATTRS})
ERROR_ENVELOPE = closed({"error": API_ERROR})

ADMIN_USER_SUMMARY = closed(
    {"id": IDENTIFIER, "status": enum("pending", "active", "suspended"),
     "roles": array(enum("admin", "worker")), "machine_token_active": BOOLEAN,
     "machine_token_viewable": BOOLEAN, "created_at": UNIX_SECONDS, "updated_at": UNIX_SECONDS},
    {"github_login": string()})
ADMIN_USER_LIST = closed({"users": array(ADMIN_USER_SUMMARY)})
ADMIN_MACHINE_TOKEN = closed({"user_id": IDENTIFIER, "token": string(1)})

ADMIN_PROJECT_SUMMARY = closed({
    "id": IDENTIFIER, "status": enum("active", "draining", "archived"),
    "identity_mode": enum("none", "external_id", "unique_value"),
    "claim_order": enum("fifo", "random"), "dispatch_qps": QPS, "worker_claim_qps": QPS,
    "max_jobs_per_claim": integer(1, 256), "max_resets": integer(0, 1000),
    "recommended_lease_seconds": integer(1, 3600), "client_versions": CLIENT_VERSIONS,
    "policy_version": integer(1), "job_counts": JOB_COUNTS,
    "created_at": UNIX_SECONDS, "updated_at": UNIX_SECONDS,
})
ADMIN_PROJECT_LIST = closed({"projects": array(ADMIN_PROJECT_SUMMARY)})

ADMIN_ENQUEUE_JOBS_RESPONSE = closed({"project_id": IDENTIFIER, "submitted": integer(1),
                                      "inserted": integer(0)})
ADMIN_ENQUEUE_SOURCE_RESPONSE = closed({"project_id": IDENTIFIER, "jobs": integer(0),
                                        "inserted": integer(0), "uncompressed_bytes": integer(0)})

OUTCOME = closed({"kind": enum("success", "http_error", "skipped"),
                  "code": nullable(integer(0, 999)), "uri": nullable(string(0, 4096)),
                  "meta": ATTRS})
CHECKSUM = string(0, 161, pattern=r"^[a-z0-9][a-z0-9_-]{0,31}:([0-9a-f]{2}){1,64}$")
ARTIFACT_RECEIPT = closed({"id": IDENTIFIER, "issuer": string(1, 512),
                           "object_id": string(1, 1024), "checksum": CHECKSUM,
                           "size_bytes": integer(1), "accepted_at": integer(1)})
EXECUTION_ERROR = closed({"code": IDENTIFIER, "message": string(0, 2048), "details": ATTRS})

ADMIN_JOB = closed({
    **SPEC_REQUIRED, "job_id": JOB_ID, "random_key": integer(INT32_MIN, INT32_MAX),
    "status": JOB_STATUS, "attempt_id": nullable(IDENTIFIER), "worker_id": nullable(IDENTIFIER),
    "lease_expires_at": nullable(INT64), "reset_count": integer(0),
    "outcome": nullable(OUTCOME), "artifact_receipts": array(ARTIFACT_RECEIPT),
    "execution_error": nullable(EXECUTION_ERROR), "created_at": UNIX_SECONDS,
    "updated_at": UNIX_SECONDS, "completed_at": nullable(UNIX_SECONDS),
}, SPEC_OPTIONAL)
ADMIN_JOB_LIST = closed({"jobs": array(ADMIN_JOB), "next_after_job_id": nullable(JOB_ID)})

CLAIMED_JOB = closed({**SPEC_REQUIRED, "job_id": JOB_ID, "attempt_id": IDENTIFIER,
                      "lease_expires_at": INT64}, SPEC_OPTIONAL)
PROJECT_CLAIM_RESPONSE = closed({"project_id": IDENTIFIER, "jobs": array(CLAIMED_JOB),
                                 "retry_after_ms": integer(0), "policy_version": integer(1)})
PROJECT_POLICY = closed({
    "project_id": IDENTIFIER, "dispatch_qps": QPS, "worker_claim_qps": QPS,
    "max_jobs_per_claim": integer(1, 256), "recommended_lease_seconds": integer(1, 3600),
    "policy_version": integer(1), "refresh_after_ms": integer(1),
})

ITEM_RESULT = closed(
    {"job_id": JOB_ID, "attempt_id": IDENTIFIER, "status": enum("applied", "rejected")},
    {"job_status": enum(*JOB_STATUSES, None), "lease_expires_at": nullable(INT64),
     "error": nullable(API_ERROR)})
BATCH_RESULT = closed({"results": array(ITEM_RESULT)})

# ----------------------------------------------------------------- requests
# What a SavewebHQ client sends: the tests check their own bodies against
# these before sending, so a passing test means a contract-shaped request.

ADMIN_USER_REQUEST = closed({"status": enum("pending", "active", "suspended"),
                             "roles": array(enum("admin", "worker"), uniqueItems=True)})
ADMIN_PROJECT_REQUEST = closed(
    {"status": enum("active", "draining", "archived"), "dispatch_qps": QPS,
     "worker_claim_qps": QPS, "max_jobs_per_claim": integer(1, 256),
     "client_versions": CLIENT_VERSIONS},
    {"identity_mode": enum("none", "external_id", "unique_value"),
     "claim_order": enum("fifo", "random"), "max_resets": integer(0, 1000),
     "recommended_lease_seconds": integer(1, 3600)})
ADMIN_ENQUEUE_JOB = closed(SPEC_REQUIRED, {**SPEC_OPTIONAL,
                                           "random_key": integer(INT32_MIN, INT32_MAX)})
ADMIN_ENQUEUE_JOBS_REQUEST = closed({"jobs": array(ADMIN_ENQUEUE_JOB, minItems=1)})
PROJECT_CLAIM_REQUEST = closed({
    "worker_id": IDENTIFIER, "max_jobs": integer(1, 256), "lease_seconds": integer(1, 3600),
    "accept_types": array(JOB_TYPE, maxItems=16), "policy_version": integer(1)})
PROJECT_COMPLETE_REQUEST = closed({"worker_id": IDENTIFIER, "items": array(closed(
    {"job_id": JOB_ID, "attempt_id": IDENTIFIER, "outcome": OUTCOME,
     "artifact_receipts": array(ARTIFACT_RECEIPT, maxItems=16)}), minItems=1, maxItems=256)})
PROJECT_FAIL_REQUEST = closed({"worker_id": IDENTIFIER, "items": array(closed(
    {"job_id": JOB_ID, "attempt_id": IDENTIFIER, "retryable": BOOLEAN,
     "error": EXECUTION_ERROR}), minItems=1, maxItems=256)})
PROJECT_EXTEND_LEASE_REQUEST = closed({
    "worker_id": IDENTIFIER, "extend_seconds": integer(1, 3600),
    "items": array(closed({"job_id": JOB_ID, "attempt_id": IDENTIFIER}), minItems=1, maxItems=256)})


# ---------------------------------------------------------------- checking

def _strict_integer(_checker, instance) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


_StrictValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer))

for _name, _schema in list(globals().items()):
    if _name.isupper() and isinstance(_schema, dict) and (isinstance(_schema.get("type"), str)
                                                          or "anyOf" in _schema):
        Draft202012Validator.check_schema(_schema)


def violations(instance, schema: dict) -> list[str]:
    """Every way ``instance`` breaks ``schema``, as ``path: message`` lines."""
    errors = sorted(_StrictValidator(schema).iter_errors(instance),
                    key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in errors]


def conforms(instance, schema: dict, what: str) -> None:
    problems = violations(instance, schema)
    assert not problems, f"{what} breaks the contract:\n  " + "\n  ".join(problems[:8])
