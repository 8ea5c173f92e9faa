"""Worker routes of the v1 job protocol (DESIGN §6).

Response bodies carry exactly the documented fields: some existing clients
reject unknown ones.
"""
from __future__ import annotations

import re
import time

from flask import current_app, jsonify

from app.api import contract
from app.api.base import bp
from app.api import validate as v
from app.api.auth import bearer, check_client_version, principal, worker_call
from app.api.peer import client_gone
from app.errors import Conflict, RateLimited
from app.extensions import db
from app.fleet import service as fleet
from app.projects import claim_audit, leasing, outcomes, service, wakeups
from app.projects.models import UPLOAD_KINDS
from workers.wire.protocol import JOB_TYPES, is_identifier

JOB_ID = v.int_range(1, 2**63 - 1)


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
    }), 1, 256),
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
    }), 1, 256),
}

EXTEND = {
    "worker_id": v.identifier,
    "extend_seconds": v.int_range(1, 3600),
    "items": v.list_of(v.obj(_ITEM_IDS), 1, 256),
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
    worker, project = call.worker, call.project
    if worker.owner is not None:
        fleet.note_token_worker(worker.owner, worker.worker_id)
    if call.status == "draining":  # finishes its work, gets no more
        return _empty_claim(project)
    if project.kind in UPLOAD_KINDS and (call.heartbeat_age_s is None or
                                         call.heartbeat_age_s > current_app.config["NODE_LEASE_S"]):
        raise Conflict(f"{project.kind} projects need a fresh heartbeat before claiming "
                       "(POST /api/v1/fleet/heartbeat)", code="invalid_transition")
    accept = tuple(body.get("accept_types") or JOB_TYPES)
    wait_s = body.get("wait_ms", 0) / 1000.0
    deadline = time.monotonic() + wait_s
    reap_limit = current_app.config["CLAIM_REAP_LIMIT"]
    listener = wakeups.listener(current_app.config["LISTEN_DSN"]) if wait_s else None
    # Only a claim that slept can have outlived its client: one answered at
    # once skips the socket checks (they cost the busy claim path ~15 %).
    waited = False
    while True:
        if waited and client_gone():  # nobody to answer: lease nothing
            claim_audit.record(project, worker.worker_id, 0, body.get("policy_version"))
            return _empty_claim(project)
        seen = listener.generation(project_id) if listener else None
        try:
            result = leasing.claim(project, worker, max_jobs=body["max_jobs"],
                                   lease_seconds=body["lease_seconds"], accept_types=accept,
                                   reap_limit=reap_limit,
                                   fresh_after_s=current_app.config["NODE_LEASE_S"],
                                   lane=call.lane,
                                   stale_after_s=current_app.config["WORKER_STALE_S"])
        except RateLimited:
            claim_audit.record(project, worker.worker_id, 0, body.get("policy_version"))
            raise
        left = deadline - time.monotonic()
        if result.jobs or left <= 0:
            break
        wake_in = [left, leasing.next_claimable_in(project_id), result.recheck_s]
        db.session.commit()  # hand the connection back while we sleep
        listener.wait(project_id, seen, min(w + 0.005 for w in wake_in if w is not None))
        waited = True
        project = service.view(project_id)
    attempt_ids = [int(job["attempt_id"]) for job in result.jobs]
    gone = waited and bool(attempt_ids) and client_gone()  # went away while we leased
    if gone:
        leasing.release_undelivered(attempt_ids)
    claim_audit.record(project, worker.worker_id, 0 if gone else len(result.jobs),
                       body.get("policy_version"))
    if gone:
        return _empty_claim(project)
    return jsonify(project_id=project_id, jobs=result.jobs,
                   retry_after_ms=result.retry_after_ms, policy_version=result.policy_version)


def _empty_claim(project):
    return jsonify(project_id=project.id, jobs=[], retry_after_ms=leasing.IDLE_RETRY_MS,
                   policy_version=project.policy_version)


@bp.post("/projects/<project_id>/jobs/complete")
@v.declare(body=COMPLETE, headers=CLIENT_VERSION, responses={200: BATCH_RESULT},
           errors=_WORKER_ERRORS, operation_id="completeProjectJobs",
           summary="Complete attempts (generic projects)")
def complete(project_id):
    call, body = _worker_call(project_id, COMPLETE)
    worker, project = call.worker, call.project
    for item in body["items"]:
        item["outcome"] = _stored_outcome(item["outcome"])
        item["artifact_receipts"] = item.get("artifact_receipts") or []
    results = outcomes.complete(project, worker, body["items"])
    return jsonify(results=results)


@bp.post("/projects/<project_id>/jobs/fail")
@v.declare(body=FAIL, headers=CLIENT_VERSION, responses={200: BATCH_RESULT},
           errors=_WORKER_ERRORS, operation_id="failProjectJobs", summary="Report failed attempts")
def fail(project_id):
    call, body = _worker_call(project_id, FAIL)
    worker, project = call.worker, call.project
    for item in body["items"]:
        item["error"] = _stored_error(item["error"])
    results = outcomes.fail(project, worker, body["items"])
    return jsonify(results=results)


@bp.post("/projects/<project_id>/jobs/extend-lease")
@v.declare(body=EXTEND, headers=CLIENT_VERSION, responses={200: BATCH_RESULT},
           errors=_WORKER_ERRORS, operation_id="extendProjectJobLeases", summary="Renew leases")
def extend_lease(project_id):
    call, body = _worker_call(project_id, EXTEND)
    worker, project = call.worker, call.project
    results = outcomes.extend(project, worker, body["items"], body["extend_seconds"])
    return jsonify(results=results)
