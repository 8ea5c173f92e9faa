"""``/api/v1/openapi.json``: the machine API as an OpenAPI 3.1 document.

Schemas are written out here rather than derived from the validators: the
document is part of the contract and is reviewed as such. A test checks that
every API route of the app appears in it.
"""
from __future__ import annotations

from flask import jsonify

from app.api import bp

IDENT = {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"}
TS = {"type": "integer", "format": "int64", "description": "UNIX seconds"}


def _ref(name):
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema):
    return {"content": {"application/json": {"schema": schema}}}


ERRORS = {str(code): {"description": desc, **_json(_ref("Error"))} for code, desc in {
    400: "invalid_request / invalid_job", 401: "invalid_machine_token", 403: "permission_denied",
    404: "not_found", 409: "identity_conflict / project_not_active / invalid_transition / stale_attempt",
    413: "too_large", 415: "unsupported_media_type", 426: "client_upgrade_required",
    429: "project_dispatch_rate_limited (Retry-After header)"}.items()}

SCHEMAS = {
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "message", "retryable", "retry_after_ms", "details"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"},
                       "retryable": {"type": "boolean"},
                       "retry_after_ms": {"type": ["integer", "null"]},
                       "details": {"type": "object"}}}}},
    "JobSpec": {"type": "object", "additionalProperties": False, "required": ["value"], "properties": {
        "id": IDENT, "value": {"type": "string", "minLength": 1, "description": "1..8192 UTF-8 bytes"},
        "type": {"enum": ["seed", "asset"], "default": "seed"},
        "via": {"type": ["string", "null"]}, "hops": {"type": ["integer", "null"], "minimum": 0},
        "attr": {"type": ["object", "null"], "description": "at most 8 KiB encoded"},
        "random_key": {"type": "integer", "minimum": -2147483648, "maximum": 2147483647}}},
    "ClaimedJob": {"type": "object", "required": ["value", "type", "job_id", "attempt_id",
                                                  "lease_expires_at"], "properties": {
        "id": IDENT, "value": {"type": "string"}, "type": {"enum": ["seed", "asset"]},
        "via": {"type": "string"}, "hops": {"type": "integer"}, "attr": {"type": "object"},
        "job_id": IDENT, "attempt_id": IDENT, "lease_expires_at": TS}},
    "ItemResult": {"type": "object", "required": ["job_id", "attempt_id", "status", "job_status",
                                                  "lease_expires_at", "error"], "properties": {
        "job_id": IDENT, "attempt_id": IDENT, "status": {"enum": ["applied", "rejected"]},
        "job_status": {"type": ["string", "null"]}, "lease_expires_at": {**TS, "type": ["integer", "null"]},
        "error": {"type": ["object", "null"]}}},
    "Results": {"type": "object", "required": ["results"],
                "properties": {"results": {"type": "array", "items": _ref("ItemResult")}}},
    "Policy": {"type": "object", "additionalProperties": False, "required": [
        "project_id", "dispatch_qps", "worker_claim_qps", "max_jobs_per_claim",
        "recommended_lease_seconds", "policy_version", "refresh_after_ms"], "properties": {
        "project_id": IDENT, "dispatch_qps": {"type": ["number", "null"]},
        "worker_claim_qps": {"type": ["number", "null"]}, "max_jobs_per_claim": {"type": "integer"},
        "recommended_lease_seconds": {"type": "integer"}, "policy_version": {"type": "integer"},
        "refresh_after_ms": {"type": "integer"}}},
    "ProjectPolicyInput": {"type": "object", "additionalProperties": False, "properties": {
        "kind": {"enum": ["generic", "pdf"]}, "status": {"enum": ["active", "draining", "archived"]},
        "identity_mode": {"enum": ["none", "external_id", "unique_value"]},
        "claim_order": {"enum": ["fifo", "random"]},
        "dispatch_qps": {"type": ["number", "null"], "exclusiveMinimum": 0},
        "worker_claim_qps": {"type": ["number", "null"], "exclusiveMinimum": 0},
        "max_jobs_per_claim": {"type": "integer", "minimum": 1, "maximum": 256},
        "max_resets": {"type": "integer", "minimum": 0, "maximum": 1000},
        "recommended_lease_seconds": {"type": "integer", "minimum": 1, "maximum": 3600},
        "retry_backoff_seconds": {"type": "integer", "minimum": 0, "maximum": 86400},
        "client_versions": {"type": "array", "maxItems": 64, "items": {"type": "string"}},
        "max_in_flight": {"type": ["integer", "null"], "minimum": 1},
        "max_worker_in_flight": {"type": ["integer", "null"], "minimum": 1},
        "prefer_new_worker": {"type": "boolean"},
        "task_timeout_seconds": {"type": ["integer", "null"], "minimum": 60},
        "attempt_timeout_seconds": {"type": ["integer", "null"], "minimum": 15},
        "upload_timeout_seconds": {"type": "integer", "minimum": 10, "maximum": 600}}},
    "ProjectSummary": {"allOf": [_ref("ProjectPolicyInput"), {"type": "object", "properties": {
        "id": IDENT, "policy_version": {"type": "integer"}, "created_at": TS, "updated_at": TS,
        "job_counts": {"type": "object", "properties": {s: {"type": "integer"} for s in (
            "todo", "wip", "staged", "done", "failed", "reset_exhausted")}}}}]},
    "Job": {"type": "object", "description": "admin view of a job (attempt_history on detail)"},
    "Node": {"type": "object", "properties": {
        "worker_id": IDENT, "name": {"type": "string"},
        "status": {"enum": ["pending", "active", "draining", "rejected", "revoked"]},
        "created_at": TS, "last_heartbeat_at": {"type": ["integer", "null"]}}},
    "Receipt": {"type": "object", "required": ["job_id", "attempt_id", "state", "sha256", "size",
                                               "asset_key", "error"], "properties": {
        "job_id": IDENT, "attempt_id": IDENT,
        "state": {"enum": ["uploading", "staged", "done", "failed", "expired", "held"]},
        "sha256": {"type": "string"}, "size": {"type": "integer"},
        "asset_key": {"type": ["string", "null"]}, "error": {"type": ["object", "null"]}}},
    "AdminUserSummary": {"type": "object", "additionalProperties": False, "required": [
        "id", "status", "roles", "machine_token_active", "machine_token_viewable", "created_at",
        "updated_at"], "properties": {
        "id": IDENT, "github_login": {"type": "string", "description": "only when set"},
        "status": {"enum": ["pending", "active", "suspended"]},
        "roles": {"type": "array", "items": {"enum": ["admin", "worker"]}},
        "machine_token_active": {"type": "boolean"}, "machine_token_viewable": {"type": "boolean"},
        "created_at": TS, "updated_at": TS}},
    "AdminMachineToken": {"type": "object", "additionalProperties": False,
                          "required": ["user_id", "token"], "properties": {
                              "user_id": IDENT, "token": {"type": "string", "minLength": 1}}},
    "User": {"type": "object", "properties": {
        "user_id": IDENT, "status": {"enum": ["active", "pending", "suspended"]},
        "roles": {"type": "array", "items": {"enum": ["admin", "worker", "reader"]}},
        "has_machine_token": {"type": "boolean"}, "created_at": TS, "updated_at": TS}},
}

_ITEM_IDS = {"job_id": IDENT, "attempt_id": IDENT}


def _body(properties, required):
    return {"required": True, **_json({"type": "object", "additionalProperties": False,
                                       "required": required, "properties": properties})}


def _op(summary, *, body=None, ok=None, ok_code="200", worker=False, params=()):
    op = {"summary": summary, "security": [{"bearer": []}], "responses": {
        ok_code: {"description": "OK", **(_json(ok) if ok else {})}, **ERRORS}}
    parameters = list(params)
    if worker:
        parameters.append({"name": "X-Client-Version", "in": "header", "required": True,
                           "schema": {"type": "string"},
                           "description": "alias accepted: X-SavewebHQ-Client-Version"})
    if parameters:
        op["parameters"] = parameters
    if body:
        op["requestBody"] = body
    return op


def _path(*names):
    return [{"name": n, "in": "path", "required": True, "schema": IDENT} for n in names]


def _query(name, schema):
    return {"name": name, "in": "query", "required": False, "schema": schema}


P = _path("project_id")
PJ = _path("project_id", "job_id")
U = _path("user_id")
JOBS = "/api/v1/projects/{project_id}/jobs"
ADMIN_P = "/api/v1/admin/projects/{project_id}"

PATHS = {
    "/api/v1/whoami": {"get": _op("Who the bearer token belongs to", ok={"type": "object"})},
    "/api/v1/projects/{project_id}": {"get": _op("Project policy for workers", worker=True,
                                                 ok=_ref("Policy"), params=P)},
    f"{JOBS}/claim": {"post": _op("Claim jobs (optionally long-polling with wait_ms)", worker=True,
                                  params=P, body=_body({
        "worker_id": IDENT, "max_jobs": {"type": "integer", "minimum": 1, "maximum": 256},
        "lease_seconds": {"type": "integer", "minimum": 1, "maximum": 3600},
        "accept_types": {"type": "array", "items": {"enum": ["seed", "asset"]}},
        "policy_version": {"type": ["integer", "null"]},
        "wait_ms": {"type": "integer", "minimum": 0, "maximum": 30000}},
        ["worker_id", "max_jobs", "lease_seconds"]), ok={
        "type": "object", "additionalProperties": False,
        "required": ["project_id", "jobs", "retry_after_ms", "policy_version"], "properties": {
            "project_id": IDENT, "jobs": {"type": "array", "items": _ref("ClaimedJob")},
            "retry_after_ms": {"type": "integer"}, "policy_version": {"type": "integer"}}})},
    f"{JOBS}/complete": {"post": _op("Complete attempts (generic projects)", worker=True, params=P,
                                     ok=_ref("Results"), body=_body({
        "worker_id": IDENT, "items": {"type": "array", "minItems": 1, "maxItems": 256, "items": {
            "type": "object", "required": ["job_id", "attempt_id", "outcome"], "properties": {
                **_ITEM_IDS, "outcome": {"type": "object", "required": ["kind"], "properties": {
                    "kind": {"enum": ["success", "http_error", "skipped"]},
                    "code": {"type": ["integer", "null"], "minimum": 0, "maximum": 999},
                    "uri": {"type": ["string", "null"], "maxLength": 4096},
                    "meta": {"type": ["object", "null"]}}},
                "artifact_receipts": {"type": "array", "maxItems": 16, "items": {
                    "type": "object", "required": ["id", "issuer", "object_id", "checksum",
                                                   "size_bytes", "accepted_at"]}}}}}},
        ["worker_id", "items"]))},
    f"{JOBS}/fail": {"post": _op("Report failed attempts", worker=True, params=P, ok=_ref("Results"),
                                 body=_body({
        "worker_id": IDENT, "items": {"type": "array", "minItems": 1, "maxItems": 256, "items": {
            "type": "object", "required": ["job_id", "attempt_id", "retryable", "error"], "properties": {
                **_ITEM_IDS, "retryable": {"type": "boolean"},
                "error": {"type": "object", "required": ["code", "message"], "properties": {
                    "code": {"type": "string"}, "message": {"type": "string", "maxLength": 2048},
                    "details": {"type": ["object", "null"]}}}}}}},
        ["worker_id", "items"]))},
    f"{JOBS}/extend-lease": {"post": _op("Renew leases", worker=True, params=P, ok=_ref("Results"),
                                         body=_body({
        "worker_id": IDENT, "extend_seconds": {"type": "integer", "minimum": 1, "maximum": 3600},
        "items": {"type": "array", "minItems": 1, "maxItems": 256,
                  "items": {"type": "object", "required": ["job_id", "attempt_id"],
                            "properties": _ITEM_IDS}}}, ["worker_id", "extend_seconds", "items"]))},
    "/api/v1/admin/projects": {"get": _op("List projects", ok={"type": "object", "properties": {
        "projects": {"type": "array", "items": _ref("ProjectSummary")}}})},
    ADMIN_P: {
        "get": _op("Project summary", params=P, ok=_ref("ProjectSummary")),
        "put": _op("Create or replace a project", params=P, ok=_ref("ProjectSummary"),
                   body={"required": True, **_json(_ref("ProjectPolicyInput"))}),
        "delete": _op("Delete a project without jobs in flight", params=P, ok_code="204"),
    },
    f"{ADMIN_P}/jobs": {
        "post": _op("Enqueue a batch (atomic)", params=P, body=_body(
            {"jobs": {"type": "array", "minItems": 1, "maxItems": 10000, "items": _ref("JobSpec")}},
            ["jobs"]), ok={"type": "object", "properties": {
                "project_id": IDENT, "submitted": {"type": "integer"}, "inserted": {"type": "integer"}}}),
        "get": _op("List jobs (cursor paging)", params=P + [
            _query("status", {"enum": ["todo", "wip", "staged", "done", "failed", "reset_exhausted"]}),
            _query("after_job_id", IDENT), _query("limit", {"type": "integer", "minimum": 1,
                                                           "maximum": 200})],
            ok={"type": "object", "properties": {"jobs": {"type": "array", "items": _ref("Job")},
                                                 "next_after_job_id": {"type": ["string", "null"]}}}),
    },
    f"{ADMIN_P}/source": {"post": _op("Import a jobs-jsonl-zstd-v1 source by streaming", params=P,
                                      body={"required": True, "content": {"application/zstd": {
                                          "schema": {"type": "string", "format": "binary"}}}},
                                      ok={"type": "object", "properties": {
                                          "jobs": {"type": "integer"}, "inserted": {"type": "integer"},
                                          "uncompressed_bytes": {"type": "integer"}}})},
    f"{ADMIN_P}/jobs/{{job_id}}": {
        "get": _op("Job detail with attempts", params=PJ, ok=_ref("Job")),
        "delete": _op("Delete a job that is not in flight", params=PJ, ok_code="204"),
    },
    f"{ADMIN_P}/jobs/{{job_id}}/requeue": {"post": _op("Requeue a failed or exhausted job",
                                                       params=PJ, ok=_ref("Job"))},
    "/api/v1/admin/users": {"get": _op("List users and their token state", ok={
        "type": "object", "additionalProperties": False, "required": ["users"],
        "properties": {"users": {"type": "array", "items": _ref("AdminUserSummary")}}})},
    "/api/v1/admin/users/{user_id}": {
        "put": _op("Create or update a user (FleetHQ's reader role is left as it is)", params=U,
                   ok_code="204", body=_body({
                       "status": {"enum": ["pending", "active", "suspended"]},
                       "roles": {"type": "array", "uniqueItems": True,
                                 "items": {"enum": ["admin", "worker"]}}}, ["status", "roles"])),
        "delete": _op("Delete a user, with its token and sessions", params=U, ok_code="204"),
    },
    "/api/v1/fleethq/users/{user_id}": {
        "put": _op("Create or update a user, roles including reader (201 when created)",
                   params=U, ok=_ref("User"), body=_body({
                       "status": {"enum": ["pending", "active", "suspended"]},
                       "roles": {"type": "array", "uniqueItems": True,
                                 "items": {"enum": ["admin", "worker", "reader"]}}},
                       ["status", "roles"])),
    },
    "/api/v1/admin/users/{user_id}/machine-token": {
        "get": _op("The current token again (404 when none or not viewable)", params=U,
                   ok=_ref("AdminMachineToken")),
        "post": _op("Rotate: a new fhq_ token", params=U, ok_code="201",
                    ok=_ref("AdminMachineToken")),
        "delete": _op("Revoke the token (404 when there is none)", params=U, ok_code="204"),
    },
    "/api/v1/openapi.json": {"get": {"summary": "This document", "responses": {"200": {
        "description": "OpenAPI 3.1"}}}},
    # Fleet (DESIGN §7)
    "/api/v1/fleet/register": {"post": {**_op("Register a node identity with an enrollment credential",
                                              ok_code="201", ok=_ref("Node"), body=_body({
        "id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{16,128}$"},
        "name": {"type": "string", "maxLength": 128},
        "enrollment_token": {"type": "string"},
        "secret": {"type": "string", "pattern": "^fhqn_[A-Za-z0-9_-]{43}$"}},
        ["id", "name", "enrollment_token", "secret"])), "security": []}},
    "/api/v1/fleet/status": {"get": _op("The calling node's record (allowed while pending)",
                                        ok=_ref("Node"))},
    "/api/v1/fleet/heartbeat": {"post": _op("Heartbeat; renews the leases of running attempts",
                                            body=_body({
        "capacity": {"type": "integer", "minimum": 0}, "browser_ok": {"type": "boolean"},
        "disk_free_bytes": {"type": "integer"}, "spool_bytes": {"type": "integer"},
        "last_error": {"type": ["string", "null"]},
        "running_attempt_ids": {"type": "array", "maxItems": 128, "items": IDENT},
        "worker_id": {**IDENT, "description": "token workers only"}},
        ["capacity", "browser_ok", "disk_free_bytes", "spool_bytes", "running_attempt_ids"]),
        ok={"type": "object", "properties": {"status": {"type": "string"}, "lease_expires": {
            "type": "object", "additionalProperties": TS}}})},
    "/api/v1/fleet/uploads/{attempt_id}": {"put": {
        **_op("Upload the PDF of a pdf attempt (raw body, at most 100 MiB)", ok=_ref("Receipt"),
              params=_path("attempt_id") + [
                  {"name": h, "in": "header", "required": h in ("X-PDF-SHA256", "X-PDF-Size"),
                   "schema": {"type": "string"}} for h in (
                      "X-PDF-SHA256", "X-PDF-Size", "X-Source-URL", "X-Download-Strategy",
                      "X-Download-Result")],
              body={"required": True, "content": {"application/pdf": {
                  "schema": {"type": "string", "format": "binary"}}}}),
        "responses": {"200": {"description": "already archived", **_json(_ref("Receipt"))},
                      "202": {"description": "staged", **_json(_ref("Receipt"))}, **ERRORS,
                      "422": {"description": "invalid_upload", **_json(_ref("Error"))},
                      "503": {"description": "storage_unavailable", **_json(_ref("Error"))},
                      "507": {"description": "spool_full (Retry-After)", **_json(_ref("Error"))}}}},
    "/api/v1/fleet/receipts/{attempt_id}": {"get": _op(
        "Read a receipt; wait_ms long-polls for a change", ok=_ref("Receipt"),
        params=_path("attempt_id") + [_query("wait_ms", {"type": "integer", "minimum": 0,
                                                         "maximum": 30000})])},
    "/api/v1/fleet/enroll": {"post": _op("Always 403: fleet actions need a human", ok_code="403")},
    "/api/v1/admin/fleet/enrollments": {"post": _op("Always 403: fleet actions need a human",
                                                    ok_code="403")},
    "/api/v1/admin/fleet/workers/{worker_id}/{action}": {"post": _op(
        "Always 403: fleet actions need a human", ok_code="403", params=_path("worker_id", "action"))},
    "/api/v1/admin/fleet/workers": {"get": _op("Nodes and token workers (at most 500)", ok={
        "type": "object", "properties": {"workers": {"type": "array", "items": {"type": "object"}}}})},
    "/api/v1/remote-jobs": {"get": _op("Job progress for readers", params=[
        _query("project", IDENT), _query("limit", {"type": "integer", "minimum": 1, "maximum": 500})],
        ok={"type": "object", "properties": {"jobs": {"type": "array", "items": {"type": "object"}}}})},
    # Hooks
    f"{ADMIN_P}/hooks": {
        "get": _op("List webhook consumers", params=P, ok={"type": "object"}),
        "post": _op("Add a webhook consumer (secret shown once)", params=P, ok_code="201",
                    ok={"type": "object"}, body=_body({
                        "name": {"type": "string"}, "url": {"type": "string", "format": "uri"},
                        "secret": {"type": "string", "minLength": 16}, "enabled": {"type": "boolean"}},
                        ["name", "url"])),
    },
    f"{ADMIN_P}/hooks/{{consumer_id}}": {
        "patch": _op("Change a consumer", params=_path("project_id", "consumer_id"), ok={"type": "object"},
                     body=_body({"name": {"type": "string"}, "url": {"type": "string"},
                                 "enabled": {"type": "boolean"}}, [])),
        "delete": _op("Remove a consumer", params=_path("project_id", "consumer_id"), ok_code="204"),
    },
    "/api/v1/admin/hooks/deliveries": {"get": _op("Hook deliveries", params=[
        _query("project", IDENT), _query("state", {"enum": ["pending", "awaiting_callback", "delivered",
                                                            "failed"]})], ok={"type": "object"})},
    "/api/v1/admin/hooks/deliveries/{delivery_id}/retry": {"post": _op(
        "Retry a delivery now", params=_path("delivery_id"), ok={"type": "object"})},
    "/api/v1/hooks/deliveries/{delivery_id}/complete": {"post": _op(
        "Consumer callback after a 202 (bearer: the delivery's callback token)",
        params=_path("delivery_id"), ok={"type": "object"})},
    "/api/v1/assets/{object_key}": {"get": {"summary": "Signed, time-limited download of an archived "
                                            "object (local store)", "parameters": [
        {"name": "object_key", "in": "path", "required": True, "schema": {"type": "string"}},
        _query("expires", {"type": "integer"}), _query("sig", {"type": "string"})],
        "responses": {"200": {"description": "the PDF"}, **ERRORS}}},
}


# FleetHQ's own admin routes: the full project and job views (kind, pdf
# policy, staged counts, attempt history) beside the contract's admin routes.
FLEETHQ_P = "/api/v1/fleethq/projects/{project_id}"
PATHS.update({
    "/api/v1/fleethq/projects": {"get": _op("List projects (FleetHQ view)", ok={
        "type": "object", "properties": {"projects": {"type": "array",
                                                      "items": _ref("ProjectSummary")}}})},
    FLEETHQ_P: {
        "get": _op("Project (FleetHQ view)", params=P, ok=_ref("ProjectSummary")),
        "put": {**_op("Create (201, with kind) or replace a project's policy", params=P,
                      ok=_ref("ProjectSummary"),
                      body={"required": True, **_json(_ref("ProjectPolicyInput"))}),
                "responses": {"200": {"description": "replaced", **_json(_ref("ProjectSummary"))},
                              "201": {"description": "created", **_json(_ref("ProjectSummary"))},
                              **ERRORS}},
        "patch": _op("Change some policy fields", params=P, ok=_ref("ProjectSummary"),
                     body={"required": True, **_json(_ref("ProjectPolicyInput"))}),
    },
    f"{FLEETHQ_P}/jobs": {"get": _op("List jobs, every state (FleetHQ view, cursor paging)",
                                     params=P + [
        _query("status", {"enum": ["todo", "wip", "staged", "done", "failed", "reset_exhausted"]}),
        _query("after_job_id", {"type": "integer", "minimum": 0}),
        _query("limit", {"type": "integer", "minimum": 1, "maximum": 200, "default": 100})],
        ok={"type": "object", "properties": {
            "jobs": {"type": "array", "items": _ref("Job")},
            "next_after_job_id": {"type": ["integer", "null"]}}})},
    f"{FLEETHQ_P}/jobs/{{job_id}}": {"get": _op("Job with attempt history (FleetHQ view)",
                                                params=PJ, ok=_ref("Job"))},
})


def document() -> dict:
    return {
        "openapi": "3.1.0",
        "info": {"title": "FleetHQ machine API", "version": "1"},
        "components": {"schemas": SCHEMAS, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": PATHS,
    }


@bp.get("/openapi.json")
def openapi():
    return jsonify(document())
