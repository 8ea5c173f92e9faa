"""Hand-written OpenAPI entries for the routes not yet declared with
``validate.declare``.

The generator in :mod:`app.api.openapi` serves these only for operations
whose view carries no declaration, so the document stays complete while route
modules are converted; delete an entry once its view is declared. Path
parameters are retyped by the generator from the url_map.
"""
from __future__ import annotations

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

PROJECT_POLICY_FIELDS = {
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
    "upload_timeout_seconds": {"type": "integer", "minimum": 10, "maximum": 600}
}

SCHEMAS = {
    # "Error" (the envelope) is derived by the generator.
    "JobSpec": {"type": "object", "additionalProperties": False, "required": ["value"], "properties": {
        "id": IDENT, "value": {"type": "string", "minLength": 1, "description": "1..8192 UTF-8 bytes"},
        "type": {"enum": ["seed", "asset"], "default": "seed"},
        "via": {"type": ["string", "null"]}, "hops": {"type": ["integer", "null"], "minimum": 0},
        "attr": {"type": ["object", "null"], "description": "at most 8 KiB encoded"},
        "random_key": {"type": "integer", "minimum": -2147483648, "maximum": 2147483647}}},
    "ProjectPolicyInput": {"type": "object", "additionalProperties": False,
                           "properties": PROJECT_POLICY_FIELDS},
    # Policy fields plus the server's own; not allOf with ProjectPolicyInput,
    # whose additionalProperties false would refuse the extra fields.
    "ProjectSummary": {"type": "object", "additionalProperties": False, "properties": {
        **PROJECT_POLICY_FIELDS, "id": IDENT, "policy_version": {"type": "integer"},
        "created_at": TS, "updated_at": TS,
        "job_counts": {"type": "object", "properties": {s: {"type": "integer"} for s in (
            "todo", "wip", "staged", "done", "failed", "reset_exhausted")}}}},
    "Job": {"type": "object", "description": "admin view of a job (attempt_history on detail)"},
}


def _body(properties, required):
    return {"required": True, **_json({"type": "object", "additionalProperties": False,
                                       "required": required, "properties": properties})}


def _op(summary, *, body=None, ok=None, ok_code="200", params=()):
    op = {"summary": summary, "security": [{"bearer": []}], "responses": {
        ok_code: {"description": "OK", **(_json(ok) if ok else {})}, **ERRORS}}
    if params:
        op["parameters"] = list(params)
    if body:
        op["requestBody"] = body
    return op


def _path(*names):
    return [{"name": n, "in": "path", "required": True, "schema": IDENT} for n in names]


def _query(name, schema):
    return {"name": name, "in": "query", "required": False, "schema": schema}


P = _path("project_id")
PJ = _path("project_id", "job_id")
ADMIN_P = "/api/v1/admin/projects/{project_id}"

PATHS = {
    "/api/v1/admin/projects": {"get": _op("List projects", ok={"type": "object", "properties": {
        "projects": {"type": "array", "items": _ref("ProjectSummary")}}})},
    ADMIN_P: {
        "get": _op("Project summary", params=P, ok=_ref("ProjectSummary")),
        "put": _op("Create or replace a project", params=P, ok=_ref("ProjectSummary"),
                   body={"required": True, **_json(_ref("ProjectPolicyInput"))}),
        "patch": _op("Change some policy fields", params=P, ok=_ref("ProjectSummary"),
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
}

# PUT answers 201 when it creates the project.
PATHS[ADMIN_P]["put"]["responses"]["201"] = {"description": "Created",
                                             **_json(_ref("ProjectSummary"))}
