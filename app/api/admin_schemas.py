"""Declared shapes of the admin routes (``admin`` answers SavewebHQ's
contract, ``fleethq_admin`` FleetHQ's fuller views).

Response bodies are written with the validation rules, as everywhere. The
project PUT/PATCH bodies are checked by the policy module
(``app.projects.policy``), not by a rule dict; their rules here publish what
it accepts and are kept beside the views so a change to one shows in the
other's review.
"""
from __future__ import annotations

from app.api import validate as v
from app.api.jobs import ARTIFACT_RECEIPT, JOB_ID
from app.projects.jobs_admin import CONTRACT_STATUSES
from app.projects.models import JOB_STATES
from workers.wire.policy import CHOICE, FIELDS, INTEGER, RATE, SWITCH, VERSIONS, Field
from workers.wire.protocol import (INT32_MAX, INT32_MIN, JOB_TYPES, MAX_ATTR_BYTES,
                              MAX_VALUE_BYTES, MAX_VIA_BYTES)

COUNT = v.int_range(0, v.INT64_MAX)
QPS = v.number(0, exclusive_lo=True, nullable=True)
# Checked by policy._client_versions: printable, no surrounding whitespace.
# The pattern is the ASCII part of that (a conservative bound: the server also
# takes other printable characters).
CLIENT_VERSIONS = v.list_of(v.string(128, min_bytes=1).with_schema(
    pattern="^[!-~](?:[ -~]*[!-~])?$").describe("an exact client version, e.g. my-worker/1.2"),
    0, 64, unique=True)
POLICY_VERSION = v.int_range(1, v.INT64_MAX)


def _policy_rule(field: Field):
    """The published rule of one policy field (workers.wire.policy), as
    app.projects.policy checks it."""
    if field.type == CHOICE:
        rule = v.one_of(*field.choices)
    elif field.type == INTEGER:
        rule = v.int_range(field.lo, field.hi, nullable=field.nullable)
    else:
        rule = {RATE: QPS, SWITCH: v.boolean, VERSIONS: CLIENT_VERSIONS}[field.type]
    return rule.describe(field.help) if field.help else rule


POLICY_RULES = {field.name: _policy_rule(field) for field in FIELDS}

# ----------------------------------------------------------------- the contract

JOB_COUNTS = v.named("JobCounts", {state: COUNT for state in CONTRACT_STATUSES})
_R = POLICY_RULES
PROJECT_REQUEST = v.named("AdminProjectRequest", {
    "status": _R["status"], "identity_mode": v.Optional(_R["identity_mode"]),
    "claim_order": v.Optional(_R["claim_order"]), "dispatch_qps": _R["dispatch_qps"],
    "worker_claim_qps": _R["worker_claim_qps"], "max_jobs_per_claim": _R["max_jobs_per_claim"],
    "max_resets": v.Optional(_R["max_resets"], default=3),
    "recommended_lease_seconds": v.Optional(_R["recommended_lease_seconds"], default=300),
    "client_versions": _R["client_versions"],
})
PROJECT_SUMMARY = v.named("AdminProjectSummary", {
    "id": v.identifier, **{name: _R[name] for name in (
        "status", "identity_mode", "claim_order", "dispatch_qps", "worker_claim_qps",
        "max_jobs_per_claim", "max_resets", "recommended_lease_seconds")},
    "client_versions": v.array(v.text),
    "policy_version": POLICY_VERSION, "job_counts": JOB_COUNTS, "created_at": v.timestamp,
    "updated_at": v.timestamp,
})
_SPEC = {
    "id": v.Optional(v.identifier.describe("required in external_id projects, refused in others")),
    "value": v.string(MAX_VALUE_BYTES, min_bytes=1),
    "type": v.Optional(v.one_of(*JOB_TYPES), default="seed"),
    "via": v.Optional(v.string(MAX_VIA_BYTES, nullable=True)),
    "hops": v.Optional(v.int_range(0, INT32_MAX, nullable=True)),
    "attr": v.Optional(v.json_object(MAX_ATTR_BYTES, nullable=True)),
}
JOB_SPEC = v.named("AdminEnqueueJob", {
    **_SPEC, "random_key": v.Optional(v.int_range(INT32_MIN, INT32_MAX, nullable=True))})
ENQUEUED = v.named("AdminEnqueueJobsResponse", {
    "project_id": v.identifier, "submitted": COUNT, "inserted": COUNT})
SOURCE_IMPORTED = v.named("AdminEnqueueSourceResponse", {
    "project_id": v.identifier, "jobs": COUNT, "inserted": COUNT, "uncompressed_bytes": COUNT})
OUTCOME = v.named("Outcome", {
    "kind": v.one_of("success", "http_error", "skipped"), "code": v.int_range(0, 999, nullable=True),
    "uri": v.text.or_null(), "meta": v.any_object})
EXECUTION_ERROR = v.named("ExecutionError", {
    "code": v.text, "message": v.text, "details": v.any_object})
_CLAIMED_SPEC = {"id": v.Optional(v.identifier), "value": v.text, "type": v.one_of(*JOB_TYPES),
                 "via": v.Optional(v.text), "hops": v.Optional(COUNT),
                 "attr": v.Optional(v.any_object)}
ADMIN_JOB = v.named("AdminJob", {
    **_CLAIMED_SPEC, "job_id": JOB_ID, "random_key": v.int_range(INT32_MIN, INT32_MAX),
    "status": v.one_of(*CONTRACT_STATUSES), "attempt_id": v.identifier.or_null(),
    "worker_id": v.text.or_null(), "lease_expires_at": v.timestamp.or_null(),
    "reset_count": COUNT, "outcome": OUTCOME.or_null(),
    "artifact_receipts": v.array(v.named("ArtifactReceipt", ARTIFACT_RECEIPT)),
    "execution_error": EXECUTION_ERROR.or_null(), "created_at": v.timestamp,
    "updated_at": v.timestamp, "completed_at": v.timestamp.or_null(),
})
JOB_LIST = v.named("AdminJobListResponse", {
    "jobs": v.array(ADMIN_JOB), "next_after_job_id": JOB_ID.or_null()})
JOB_QUERY = {  # read by admin_params.contract_job_query
    "status": v.Optional(v.one_of(*CONTRACT_STATUSES).describe("wip includes staged jobs")),
    "after_job_id": v.Optional(v.int_range(0, v.INT64_MAX), default=0),
    "limit": v.Optional(v.int_range(1, 200), default=50),
}

# ------------------------------------------------------------ FleetHQ's own views

POLICY_INPUT = v.named("FleetHQProjectPolicy", {
    name: v.Optional(rule) for name, rule in POLICY_RULES.items()})
FLEETHQ_PROJECT = v.named("FleetHQProject", {
    "id": v.identifier, **POLICY_RULES, "client_versions": v.array(v.text),
    "policy_version": POLICY_VERSION,
    "job_counts": v.named("FleetHQJobCounts", {state: COUNT for state in JOB_STATES}),
    "created_at": v.timestamp, "updated_at": v.timestamp,
})
_FLEETHQ_JOB = {
    "job_id": JOB_ID, "id": v.identifier.or_null(), "value": v.text, "type": v.one_of(*JOB_TYPES),
    "via": v.text.or_null(), "hops": COUNT.or_null(), "attr": v.any_object.or_null(),
    "random_key": v.int_range(INT32_MIN, INT32_MAX), "site": v.text.or_null(),
    "state": v.one_of(*JOB_STATES),
    "created_at": v.timestamp, "updated_at": v.timestamp, "not_before": v.timestamp.or_null(),
    "deadline_at": v.timestamp.or_null(), "current_attempt_id": v.text.or_null(),
    "worker_id": v.text.or_null(), "lease_expires_at": v.timestamp.or_null(), "resets": COUNT,
    "attempts": COUNT, "last_error": v.any_object.or_null(),
}
FLEETHQ_JOB = v.named("FleetHQJob", _FLEETHQ_JOB)
ATTEMPT = v.named("FleetHQAttempt", {
    "attempt_id": v.text, "number": COUNT, "worker_id": v.text.or_null(), "state": v.text,
    "created_at": v.timestamp, "lease_expires_at": v.timestamp.or_null(),
    "deadline_at": v.timestamp.or_null(), "finished_at": v.timestamp.or_null(),
    "outcome": v.any_value, "error": v.any_value,
})
FLEETHQ_JOB_DETAIL = v.named("FleetHQJobDetail", {
    **_FLEETHQ_JOB, "artifact_receipts": v.array(v.any_object),
    "completed_at": v.timestamp.or_null(), "attempt_history": v.array(ATTEMPT),
    "outcome": v.any_value, "receipts": v.array(v.any_value),
})
FLEETHQ_JOB_QUERY = {  # read by admin_params.fleethq_job_query; others are refused
    "status": v.Optional(v.one_of(*JOB_STATES)),
    "after_job_id": v.Optional(v.int_range(0, v.INT64_MAX)),
    "limit": v.Optional(v.int_range(1, 200), default=100),
}
