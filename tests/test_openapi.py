"""The served OpenAPI 3.1 document (DESIGN §6) is derived from the routes and
the declarations the validators use, and tells the truth about them: every
route and method, typed path parameters, a request schema for every JSON
body, and schemas that accept exactly what the validators accept (checked
with Hypothesis from the document itself)."""
from __future__ import annotations

import json
import re

import jsonschema_rs
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from openapi_spec_validator import validate as validate_openapi

from app.api.declarations import declaration_for
from app.api.openapi import document, openapi_path
from app.api.rules import schema_of
from app.errors import InvalidRequest
from tests.helpers import API_CACHE_CONTROL, VERSION, Api, body

IGNORED_METHODS = {"HEAD", "OPTIONS"}
PROBES = ("/healthz", "/readyz")  # documented beside the API
# Path parameter values that reach the body check of every route.
PATH_VALUES = {"project_id": "p", "job_id": "1", "user_id": "probe-user", "consumer_id": "1",
               "delivery_id": "1", "attempt_id": "1", "worker_id": "w1", "action": "approve",
               "object_key": "x", "document_id": "1", "which": "pdf",
               "site": "example.org"}


def _collection_app():
    """An app for building the document while tests are collected (no database is touched)."""
    from app import create_app
    return create_app({"DATABASE_URL": "postgresql://127.0.0.1:1/unused", "TESTING": True},
                      check_schema=False)


COLLECTION_APP = _collection_app()
DOC = document(COLLECTION_APP)


def _documented_rules(app):
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/api/") or rule.rule in PROBES:
            yield rule


def _api_routes(app) -> dict[str, set[str]]:
    routes: dict[str, set[str]] = {}
    for rule in _documented_rules(app):
        routes.setdefault(openapi_path(rule.rule), set()).update(
            m for m in rule.methods if m not in IGNORED_METHODS)
    return routes


def _declared_json_bodies():
    out = []
    for rule in _documented_rules(COLLECTION_APP):
        view = COLLECTION_APP.view_functions[rule.endpoint]
        for method in sorted(rule.methods - IGNORED_METHODS):
            decl = declaration_for(view, method)
            if decl is not None and decl.body is not None and not hasattr(decl.body, "media_type"):
                out.append((openapi_path(rule.rule), method, decl.body))
    return out


DECLARED_BODIES = _declared_json_bodies()


def _resolve(schema: dict, doc=DOC) -> dict:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _validator(schema: dict):
    return jsonschema_rs.validator_for({"components": DOC["components"], **schema})


def _request_schema(path: str, method: str) -> dict:
    return DOC["paths"][path][method.lower()]["requestBody"]["content"]["application/json"]["schema"]


# ---------------------------------------------------------------- the document

def test_document_is_served_as_openapi_3_1(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    assert response.headers["Cache-Control"] == API_CACHE_CONTROL
    doc = body(response)
    validate_openapi(doc)  # raises on anything OpenAPI 3.1 does not allow
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["title"] and doc["info"]["version"]
    assert doc == json.loads(json.dumps(DOC))  # what the route serves is what is derived


def test_every_api_route_is_documented_with_its_methods(app, client):
    doc = body(client.get("/api/v1/openapi.json"))
    routes = _api_routes(app)
    assert "/api/v1/projects/{project_id}/jobs/claim" in routes  # the conversion works
    missing = [f"{m} {path}" for path, methods in sorted(routes.items())
               for m in sorted(methods - {k.upper() for k in doc["paths"].get(path, {})})]
    assert missing == [], "routes missing from openapi.json: " + ", ".join(missing)


def test_document_has_no_phantom_operations(app, client):
    """Every documented operation exists in the app (the document does not lie)."""
    doc = body(client.get("/api/v1/openapi.json"))
    routes = _api_routes(app)
    phantom = [f"{m.upper()} {path}" for path, ops in doc["paths"].items() for m in ops
               if m.upper() not in routes.get(path, set())]
    assert phantom == []


def test_every_operation_is_declared(app):
    undeclared = [f"{m} {rule.rule}" for rule in _documented_rules(app)
                  for m in sorted(rule.methods - IGNORED_METHODS)
                  if declaration_for(app.view_functions[rule.endpoint], m) is None]
    assert undeclared == []


SAVEWEBHQ_OPERATIONS = {  # api/openapi-v1.yaml's 24 operationIds
    "health", "whoAmI", "listAdminProjects", "getAdminProject", "putAdminProject",
    "deleteAdminProject", "listAdminProjectJobs", "enqueueAdminProjectJobs",
    "enqueueAdminProjectSource", "getAdminProjectJob", "deleteAdminProjectJob",
    "requeueAdminProjectJob", "listAdminUsers", "putAdminUser", "deleteAdminUser",
    "getAdminMachineToken", "rotateAdminMachineToken", "revokeAdminMachineToken",
    "getProjectPolicy", "claimProjectJobs", "completeProjectJobs", "failProjectJobs",
    "extendProjectJobLeases"}


def test_operation_ids_are_unique_and_savewebhq_names_kept():
    ids = [op["operationId"] for ops in DOC["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
    assert SAVEWEBHQ_OPERATIONS <= set(ids)


def test_path_parameters_are_declared_and_typed():
    typed = {}
    for path, operations in DOC["paths"].items():
        names = set(re.findall(r"{([^}]+)}", path))
        for method, op in operations.items():
            params = {p["name"]: p for p in op.get("parameters", []) if p.get("in") == "path"}
            assert names == set(params), f"{method.upper()} {path}"
            assert all(p["required"] for p in params.values())
            for name, param in params.items():
                typed.setdefault(name, []).append(_resolve(param["schema"]))
    assert all(s["type"] == "integer" and s["minimum"] == 1 for s in typed["job_id"])
    for name in ("project_id", "user_id", "worker_id"):
        assert all(s == {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"}
                   for s in typed[name]), name


def test_error_envelope_is_published_with_an_integer_retry_after_ms():
    envelope = _resolve(DOC["components"]["schemas"]["Error"])
    assert envelope["required"] == ["error"]
    error = _resolve(envelope["properties"]["error"])
    assert set(error["required"]) == {"code", "message", "retryable", "retry_after_ms", "details"}
    assert error["properties"]["retry_after_ms"]["type"] == "integer"
    assert error["additionalProperties"] is False
    claim = DOC["paths"]["/api/v1/projects/{project_id}/jobs/claim"]["post"]["responses"]
    limited = DOC["components"]["responses"][claim["429"]["$ref"].rsplit("/", 1)[1]]
    assert "Retry-After" in limited["headers"]


def test_security_is_bearer_except_on_public_routes():
    public = {(path, method) for path, ops in DOC["paths"].items()
              for method, op in ops.items() if op["security"] == []}
    assert public == {("/healthz", "get"), ("/readyz", "get"), ("/api/v1/openapi.json", "get"),
                      ("/api/v1/fleet/register", "post"), ("/api/v1/assets/{object_key}", "get")}
    scheme = DOC["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert all(op["security"] == [{"bearer": []}] for ops in DOC["paths"].values()
               for method, op in ops.items() if op["security"])


def test_the_served_error_matches_the_published_envelope(client):
    answer = client.get("/api/v1/admin/projects")  # no token
    assert answer.status_code == 401
    assert _validator({"$ref": "#/components/schemas/Error"}).is_valid(body(answer))


# ---------------------------------------------------------- bodies, declared once

def test_every_route_with_a_json_body_declares_its_request_schema(app, client, admin_token):
    """Each POST/PUT/PATCH route is sent a JSON array: the ones that read a
    JSON body answer 'body must be a JSON object'; each of those must publish
    its declared object schema."""
    api = Api(client, admin_token)
    api.put_project("p")
    json_routes = []
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/api/"):
            continue
        path = rule.rule
        for name in re.findall(r"<(?:[^:<>]+:)?([^<>]+)>", rule.rule):
            path = re.sub(r"<(?:[^:<>]+:)?" + name + ">", PATH_VALUES[name], path)
        for method in sorted(rule.methods & {"POST", "PUT", "PATCH"}):
            answer = api.call(method, path, [])
            if answer.status_code == 400 and "must be a JSON object" in body(answer)["error"]["message"]:
                json_routes.append((rule, method))
    assert len(json_routes) >= 10  # the probe reaches the body checks
    for rule, method in json_routes:
        where = f"{method} {rule.rule}"
        schema = _resolve(_request_schema(openapi_path(rule.rule), method))
        assert schema["type"] == "object" and schema["properties"], where
        decl = declaration_for(app.view_functions[rule.endpoint], method)
        assert decl is not None, f"{where} has no declaration"
        assert _request_schema(openapi_path(rule.rule), method) == schema_of(decl.body, {})


def test_declarations_are_the_schemas_the_views_check():
    from app.api import fleet, hooks, jobs
    bodies = {(path, method): rule for path, method, rule in DECLARED_BODIES}
    for (path, method), fields in {
        ("/api/v1/projects/{project_id}/jobs/claim", "POST"): jobs.CLAIM,
        ("/api/v1/projects/{project_id}/jobs/complete", "POST"): jobs.COMPLETE,
        ("/api/v1/projects/{project_id}/jobs/fail", "POST"): jobs.FAIL,
        ("/api/v1/projects/{project_id}/jobs/extend-lease", "POST"): jobs.EXTEND,
        ("/api/v1/fleet/register", "POST"): fleet.REGISTER,
        ("/api/v1/fleet/heartbeat", "POST"): fleet.HEARTBEAT,
        ("/api/v1/admin/projects/{project_id}/hooks", "POST"): hooks.CONSUMER,
        ("/api/v1/admin/projects/{project_id}/hooks/{consumer_id}", "PATCH"): hooks.CONSUMER_PATCH,
    }.items():
        assert bodies[(path, method)].fields is fields, (path, method)


def _broken_rule(schema: dict, value) -> str | None:
    """The documented rule beyond JSON Schema's vocabulary that ``value``
    breaks (UTF-8 byte bounds, encoded-size bounds, integers written as
    floats), or None. JSON Schema itself is checked by the generator."""
    schema = _resolve(schema)
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if _resolve(s).get("type") != "null"]
        if value is None:
            return None
        reasons = [_broken_rule(s, value) for s in options]
        return None if None in reasons else reasons[0]
    kinds = schema.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if isinstance(value, float) and "integer" in kinds and "number" not in kinds:
        return f"{value!r} is an integer written with a fraction"
    if isinstance(value, str):
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > schema.get("x-max-bytes", size) or size < schema.get("x-min-bytes", size):
            return f"{size} bytes"
    if isinstance(value, dict):
        if "x-max-encoded-bytes" in schema:
            encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
            if len(encoded.encode("utf-8", "surrogatepass")) > schema["x-max-encoded-bytes"] \
                    or "\\u0000" in encoded:
                return "encoding too large or holds a NUL"
        for key, item in value.items():
            sub = schema.get("properties", {}).get(key, schema.get("additionalProperties"))
            reason = _broken_rule(sub, item) if isinstance(sub, dict) else None
            if reason:
                return f"{key}: {reason}"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            reason = _broken_rule(schema["items"], item)
            if reason:
                return f"[{i}]: {reason}"
    return None


SCHEMATHESIS_DOC = schemathesis.openapi.from_dict(DOC)


def _jobspecs(body):
    from workers.wire.protocol import SpecError, normalize_jobspec
    for job in body["jobs"]:
        try:
            normalize_jobspec(job, "external_id" if "id" in job else "none")
        except SpecError as exc:
            raise InvalidRequest(str(exc)) from None


def _policy(check):
    def run(body):
        from app.projects import policy
        body = dict(body)
        if "kind" in body and body.get("identity_mode") is None:
            body.pop("identity_mode", None)
        check(policy, body)
    return run


# Bodies whose view checks more than its declared rule, with the check the
# view then runs (a domain function; no database needed).
DOMAIN_CHECKS = {
    ("/api/v1/admin/projects/{project_id}/jobs", "POST"): _jobspecs,
    ("/api/v1/admin/projects/{project_id}", "PUT"):
        _policy(lambda policy, body: policy.validate_contract_request(body)),
    ("/api/v1/fleethq/projects/{project_id}", "PUT"):
        _policy(lambda policy, body: policy.validate_fields(body)),
    ("/api/v1/fleethq/projects/{project_id}", "PATCH"):
        _policy(lambda policy, body: policy.validate_fields(body)),
}


@pytest.mark.parametrize("path, method, rule", DECLARED_BODIES,
                         ids=[f"{m} {p}" for p, m, _ in DECLARED_BODIES])
def test_bodies_generated_from_the_document_are_accepted(path, method, rule):
    """Hypothesis draws request bodies from the served schema (schemathesis'
    generator); the view's validator accepts every one that keeps the
    documented byte rules, and refuses with a 400 each one that breaks one."""
    strategy = SCHEMATHESIS_DOC[path][method].as_strategy()
    domain_check = DOMAIN_CHECKS.get((path, method), lambda body: None)

    @settings(max_examples=80, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def accepted(case):
        broken = _broken_rule(_request_schema(path, method), case.body)
        try:
            rule(case.body, "")
            domain_check(case.body)
        except InvalidRequest as exc:
            assert exc.status == 400
            assert broken, f"valid per the document, refused: {exc.message} — {case.body!r:.300}"
        else:
            assert not broken, f"accepted although {broken}: {case.body!r:.300}"
    accepted()


HAND_PICKED = [  # (method, path, body, the field named in the answer)
    ("POST", "/api/v1/projects/p/jobs/claim", {"worker_id": "w1", "max_jobs": 0, "lease_seconds": 60},
     "max_jobs"),
    ("POST", "/api/v1/projects/p/jobs/claim", {"worker_id": "w 1", "max_jobs": 1, "lease_seconds": 60},
     "worker_id"),
    ("POST", "/api/v1/projects/p/jobs/claim",
     {"worker_id": "w1", "max_jobs": 1.5, "lease_seconds": 60}, "max_jobs"),
    ("POST", "/api/v1/projects/p/jobs/claim",
     {"worker_id": "w1", "max_jobs": 1, "lease_seconds": 60, "surprise": 1}, "surprise"),
    ("POST", "/api/v1/projects/p/jobs/complete",
     {"worker_id": "w1", "items": [{"job_id": "1", "attempt_id": "1", "outcome": {"kind": "success"}}]},
     "items[0].job_id"),
    ("POST", "/api/v1/projects/p/jobs/fail", {"worker_id": "w1", "items": [
        {"job_id": 1, "attempt_id": "1", "retryable": True, "error": {"code": "x" * 65, "message": ""}}]},
     "items[0].error.code"),
    ("POST", "/api/v1/projects/p/jobs/extend-lease",
     {"worker_id": "w1", "extend_seconds": 0, "items": [{"job_id": 1, "attempt_id": "1"}]},
     "extend_seconds"),
    ("POST", "/api/v1/fleet/heartbeat", {"capacity": -1, "browser_ok": True, "disk_free_bytes": 0,
                                         "spool_bytes": 0, "running_attempt_ids": []}, "capacity"),
    ("POST", "/api/v1/fleet/heartbeat", {"capacity": 1, "browser_ok": 1, "disk_free_bytes": 0,
                                         "spool_bytes": 0, "running_attempt_ids": []}, "browser_ok"),
    ("POST", "/api/v1/fleet/register", {"id": "short", "name": "n", "enrollment_token": "t",
                                        "secret": "s"}, "id"),
    ("POST", "/api/v1/admin/projects/p/hooks", {"name": "é" * 65, "url": "https://example.org/h"},
     "name"),
    ("PATCH", "/api/v1/admin/projects/p/hooks/1", {"enabled": "yes"}, "enabled"),
    ("POST", "/api/v1/admin/projects/p/hooks",
     {"name": "n", "url": "https://example.org/h", "completion_timeout_seconds": 9},
     "completion_timeout_seconds"),
    ("PATCH", "/api/v1/admin/projects/p/hooks/1", {"completion_timeout_seconds": 604801},
     "completion_timeout_seconds"),
]


@pytest.mark.parametrize("method, path, payload, field", HAND_PICKED,
                         ids=[f"{m} {p} {f}" for m, p, _, f in HAND_PICKED])
def test_hand_picked_invalid_bodies_are_refused_by_both(client, admin_token, method, path,
                                                        payload, field):
    """The validator answers 400 naming the field, and the published schema
    refuses the same body (or, for byte bounds, states the broken rule)."""
    api = Api(client, admin_token, version=VERSION)
    api.put_project("p")
    answer = api.call(method, path, payload)
    assert answer.status_code == 400, body(answer)
    err = body(answer)["error"]
    assert (err["code"], err["details"]) == ("invalid_request", {"field": field}), err
    doc_path = next(p for p, ops in DOC["paths"].items()
                    if re.fullmatch(re.sub(r"{[^}]+}", "[^/]+", p), path) and method.lower() in ops)
    schema = _request_schema(doc_path, method)
    assert not _validator(schema).is_valid(payload) or _broken_rule(schema, payload), payload


def test_policy_help_is_published_and_max_worker_attempts_stays_off_the_contract():
    schemas = DOC["components"]["schemas"]
    fleethq = schemas["FleetHQProjectPolicy"]["properties"]
    assert (fleethq["max_worker_attempts"]["minimum"], fleethq["max_worker_attempts"]["maximum"]) == (1, 20)
    assert "counted from its first claim" in fleethq["task_timeout_seconds"]["description"]
    assert "max_worker_attempts" in schemas["FleetHQProject"]["properties"]
    for contract in ("AdminProjectRequest", "AdminProjectSummary", "ProjectPolicy"):
        assert "max_worker_attempts" not in schemas[contract]["properties"], contract
