"""Worker routes of the v1 job protocol (DESIGN §6).

Response bodies carry exactly the documented fields: some existing clients
reject unknown ones.
"""
from __future__ import annotations

import re

from flask import current_app, jsonify

from app.api import contract
from app.api.base import bp
from app.api import validate as v
from app.api.auth import bearer, check_client_version, principal, worker_call
from app.api.peer import client_gone
from app.extensions import statements_commit_alone
from app.fleet import service as fleet
from app.projects import claims, outcomes, service
from workers.wire.protocol import JOB_TYPES, is_identifier

JOB_ID = v.int_range(1, 2**63 - 1)
# Items per complete, fail or extend-lease request (and per statement the hot
# path runs for several of them, app.api.hot_path).
ITEMS_PER_REQUEST = 256


CLAIM = {
    "worker_id": v.identifier,
    "max_jobs": v.int_range(1, 256),
    "lease_seconds": v.int_range(1, 3600),
    # Empty, omitted or null: every type (SavewebHQ's Python SDK sends [],
    # its Go SDK null).
    "accept_types": v.Optional(v.nullable(v.list_of(v.one_of(*JOB_TYPES), 0, 16))),
    # SavewebHQ requires it (≥ 1); FleetHQ also takes a claim without it.
    "policy_version": v.Optional(v.int_range(1, 2**63 - 1)),
    "wait_ms": v.Optional(v.int_range(0, 30_000)),
}

_ITEM_IDS = {"job_id": JOB_ID, "attempt_id": v.identifier}

# SavewebHQ's receipt rules (ArtifactReceipt in its contract).
_CHECKSUM_RE = re.compile(r"\A[a-z0-9][a-z0-9_-]{0,31}:(?:[0-9a-f]{2}){1,64}\Z")


def _checksum(value, path):
    if not isinstance(value, str) or _CHECKSUM_RE.match(value) is None:
        raise v.InvalidRequest(f"{path}: must be algorithm:lowercase-hex "
                               "(e.g. sha256:<64 hex digits>)", details={"field": path})
    return value


ARTIFACT_RECEIPT = v.obj({
    "id": v.identifier,
    "issuer": v.string(512, min_bytes=1),
    "object_id": v.string(1024, min_bytes=1),
    "checksum": v.custom(_checksum, v.text.with_schema(
        pattern=v.json_pattern(_CHECKSUM_RE), maxLength=161,
        description="algorithm:lowercase-hex, e.g. sha256:<64 hex digits>")),
    "size_bytes": v.int_range(1, 2**63 - 1),
    "accepted_at": v.int_range(1, 2**63 - 1),
})

COMPLETE = {
    "worker_id": v.identifier,
    "items": v.list_of(v.obj({
        **_ITEM_IDS,
        "outcome": v.obj({
            "kind": v.one_of("success", "http_error", "skipped"),
            "code": v.Optional(v.int_range(0, 999, nullable=True)),
            "uri": v.Optional(v.string(4096, nullable=True)),
            "meta": v.Optional(v.json_object(8 * 1024, nullable=True)),
        }),
        "artifact_receipts": v.Optional(v.nullable(v.list_of(ARTIFACT_RECEIPT, 0, 16))),
    }), 1, ITEMS_PER_REQUEST),
}


def _error_code(value, path):
    if not is_identifier(value) or len(value) > 64:
        raise v.InvalidRequest(f"{path}: must be 1..64 of [A-Za-z0-9._:-]", details={"field": path})
    return value


FAIL = {
    "worker_id": v.identifier,
    "items": v.list_of(v.obj({
        **_ITEM_IDS,
        "retryable": v.boolean,
        "error": v.obj({
            "code": v.custom(_error_code, v.identifier.with_schema(maxLength=64)),
            "message": v.string(2048),
            "details": v.Optional(v.json_object(8 * 1024, nullable=True)),
        }),
    }), 1, ITEMS_PER_REQUEST),
}

EXTEND = {
    "worker_id": v.identifier,
    "extend_seconds": v.int_range(1, 3600),
    "items": v.list_of(v.obj(_ITEM_IDS), 1, ITEMS_PER_REQUEST),
}


# Response bodies (SavewebHQ's contract: a staged job is reported as wip).
CLAIMED_JOB = v.named("ClaimedJob", {
    "id": v.Optional(v.identifier), "value": v.text, "type": v.one_of(*JOB_TYPES),
    "via": v.Optional(v.text), "hops": v.Optional(v.int_range(0, v.INT64_MAX)),
    "attr": v.Optional(v.any_object), "job_id": JOB_ID, "attempt_id": v.identifier,
    "lease_expires_at": v.timestamp,
})
CLAIM_RESPONSE = v.named("ProjectClaimResponse", {
    "project_id": v.identifier, "jobs": v.array(CLAIMED_JOB),
    "retry_after_ms": v.int_range(0, v.INT64_MAX), "policy_version": v.int_range(1, v.INT64_MAX),
})
ITEM_RESULT = v.named("ItemResult", {
    "job_id": JOB_ID, "attempt_id": v.identifier, "status": v.one_of("applied", "rejected"),
    "job_status": v.one_of("todo", "wip", "done", "failed", "reset_exhausted").or_null(),
    "lease_expires_at": v.timestamp.or_null(), "error": v.API_ERROR.or_null(),
})
BATCH_RESULT = v.named("BatchResultResponse", {"results": v.array(ITEM_RESULT)})
POLICY = v.named("ProjectPolicy", {
    "project_id": v.identifier, "dispatch_qps": v.number(0, exclusive_lo=True, nullable=True),
    "worker_claim_qps": v.number(0, exclusive_lo=True, nullable=True),
    "max_jobs_per_claim": v.int_range(1, 256), "recommended_lease_seconds": v.int_range(1, 3600),
    "policy_version": v.int_range(1, v.INT64_MAX), "refresh_after_ms": v.int_range(1, v.INT64_MAX),
})
WHOAMI = {"user_id": v.identifier.or_null(),
          "worker_id": v.Optional(v.identifier.describe("enrolled nodes: the node id"))}
CLIENT_VERSION = {
    "X-Client-Version": v.Optional(v.text.with_schema(minLength=1, maxLength=128).describe(
        "required, or its alias: checked against the project's client_versions")),
    "X-SavewebHQ-Client-Version": v.Optional(v.text.with_schema(minLength=1, maxLength=128)
                                             .describe("alias of X-Client-Version")),
}
_WORKER_ERRORS = (409, 426, 429)


def _stored_outcome(outcome: dict) -> dict:
    # Stored with every key, as SavewebHQ's AdminJob shows it.
    return {"kind": outcome["kind"], "code": outcome.get("code"), "uri": outcome.get("uri"),
            "meta": outcome.get("meta") or {}}


def _stored_error(error: dict) -> dict:
    return {"code": error["code"], "message": error["message"], "details": error.get("details") or {}}


def _read_json() -> tuple[dict | None, v.InvalidRequest | None]:
    """The body, or the reason it is unusable. SavewebHQ authenticates and
    checks the client version before it looks at the body, so body errors
    are raised only after those checks."""
    try:
        return contract.json_body(), None
    except v.InvalidRequest as exc:
        return None, exc


def _worker_call(project_id: str, schema: dict):
    """Common prologue, in SavewebHQ's order: bearer token, identity +
    project + worker standing (one query), version gate, then the body."""
    bearer()
    raw, body_error = _read_json()
    worker_id = raw.get("worker_id") if raw is not None else None
    call = worker_call(project_id, worker_id if is_identifier(worker_id) else None)
    check_client_version(call.project)
    if body_error is not None:
        raise body_error
    body = v.check(raw, schema)
    if call.worker.owner is not None and call.mapped_user != call.worker.owner:
        fleet.map_worker(call.worker.owner, call.worker.worker_id)
    return call, body


@bp.get("/whoami")
@v.declare(responses={200: WHOAMI}, operation_id="whoAmI",
           summary="Who the bearer token belongs to")
def whoami():
    who = principal()
    if who.node_id is not None:
        return jsonify(user_id=None, worker_id=who.node_id)
    return jsonify(user_id=who.user_id)


@bp.get("/projects/<project_id>")
@v.declare(headers=CLIENT_VERSION, responses={200: POLICY}, errors=(409, 426),
           operation_id="getProjectPolicy", summary="Project policy for workers")
def project_policy(project_id):
    project = worker_call(project_id, None).project
    check_client_version(project)
    service.ensure_status(project, "active")  # SavewebHQ: 409 project_not_active
    return jsonify(service.worker_policy(project, current_app.config["POLICY_REFRESH_MS"]))


@bp.post("/projects/<project_id>/jobs/claim")
@v.declare(body=CLAIM, headers=CLIENT_VERSION, responses={200: CLAIM_RESPONSE},
           errors=_WORKER_ERRORS, operation_id="claimProjectJobs",
           summary="Claim jobs (optionally long-polling with wait_ms)")
def claim(project_id):
    call, body = _worker_call(project_id, CLAIM)
    request = claims.Request(max_jobs=body["max_jobs"], lease_seconds=body["lease_seconds"],
                             accept_types=tuple(body.get("accept_types") or ()),
                             policy_version=body.get("policy_version"),
                             wait_s=body.get("wait_ms", 0) / 1000.0)
    standing = claims.Standing(call.status, call.heartbeat_age_s, call.lane)
    result = claims.serve(call.project, call.worker, standing, request,
                          claims.Settings.from_config(current_app.config), client_gone)
    return jsonify(project_id=project_id, jobs=result.jobs,
                   retry_after_ms=result.retry_after_ms, policy_version=result.policy_version)


@bp.post("/projects/<project_id>/jobs/complete")
@v.declare(body=COMPLETE, headers=CLIENT_VERSION, responses={200: BATCH_RESULT},
           errors=_WORKER_ERRORS, operation_id="completeProjectJobs",
           summary="Complete attempts (generic projects)")
def complete(project_id):
    statements_commit_alone()
    call, body = _worker_call(project_id, COMPLETE)
    return jsonify(results=complete_checked(call.project, call.worker, body))


def complete_checked(project, worker, body: dict, run=outcomes.IN_SESSION) -> list[dict]:
    """The results of a checked ``COMPLETE`` body (here and in app.api.hot_path)."""
    for item in body["items"]:
        item["outcome"] = _stored_outcome(item["outcome"])
        item["artifact_receipts"] = item.get("artifact_receipts") or []
    return outcomes.complete(project, worker, body["items"], run)


@bp.post("/projects/<project_id>/jobs/fail")
@v.declare(body=FAIL, headers=CLIENT_VERSION, responses={200: BATCH_RESULT},
           errors=_WORKER_ERRORS, operation_id="failProjectJobs", summary="Report failed attempts")
def fail(project_id):
    call, body = _worker_call(project_id, FAIL)
    return jsonify(results=fail_checked(call.project, call.worker, body))


def fail_checked(project, worker, body: dict, run=outcomes.IN_SESSION) -> list[dict]:
    """The results of a checked ``FAIL`` body (here and in app.api.hot_path)."""
    for item in body["items"]:
        item["error"] = _stored_error(item["error"])
    return outcomes.fail(project, worker, body["items"], run)


@bp.post("/projects/<project_id>/jobs/extend-lease")
@v.declare(body=EXTEND, headers=CLIENT_VERSION, responses={200: BATCH_RESULT},
           errors=_WORKER_ERRORS, operation_id="extendProjectJobLeases", summary="Renew leases")
def extend_lease(project_id):
    statements_commit_alone()
    call, body = _worker_call(project_id, EXTEND)
    return jsonify(results=extend_checked(call.project, call.worker, body))


def extend_checked(project, worker, body: dict, run=outcomes.IN_SESSION) -> list[dict]:
    """The results of a checked ``EXTEND`` body (here and in app.api.hot_path)."""
    return outcomes.extend(project, worker, body["items"], body["extend_seconds"], run)
