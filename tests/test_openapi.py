"""The OpenAPI 3.1 document describes every machine API route (DESIGN §6)."""
from __future__ import annotations

import re

from tests.helpers import body

IGNORED_METHODS = {"HEAD", "OPTIONS"}
PROBES = ("/healthz", "/readyz")  # documented beside the API


def _openapi_path(rule: str) -> str:
    # Flask's <name> and <converter:name> become OpenAPI's {name}.
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule)


def _api_routes(app) -> dict[str, set[str]]:
    routes: dict[str, set[str]] = {}
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/api/") or rule.rule in PROBES:
            routes.setdefault(_openapi_path(rule.rule), set()).update(
                m for m in rule.methods if m not in IGNORED_METHODS)
    return routes


def test_document_is_openapi_3_1(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    assert response.headers["Cache-Control"] == "no-store"
    doc = body(response)
    assert doc["openapi"].startswith("3.1")
    assert doc["info"]["title"] and doc["info"]["version"]
    assert isinstance(doc["paths"], dict) and doc["paths"]


def test_every_api_route_is_documented_with_its_methods(app, client):
    doc = body(client.get("/api/v1/openapi.json"))
    routes = _api_routes(app)
    assert "/api/v1/projects/{project_id}/jobs/claim" in routes  # the conversion works
    missing = []
    for path, methods in sorted(routes.items()):
        documented = {m.upper() for m in doc["paths"].get(path, {})}
        for method in sorted(methods - documented):
            missing.append(f"{method} {path}")
    assert missing == [], "routes missing from openapi.json: " + ", ".join(missing)


def test_document_has_no_phantom_operations(app, client):
    """Every documented operation exists in the app (the document does not lie)."""
    doc = body(client.get("/api/v1/openapi.json"))
    routes = _api_routes(app)
    phantom = []
    for path, operations in doc["paths"].items():
        for method in operations:
            if method.upper() not in routes.get(path, set()):
                phantom.append(f"{method.upper()} {path}")
    assert phantom == []


def test_path_parameters_are_declared(client):
    doc = body(client.get("/api/v1/openapi.json"))
    for path, operations in doc["paths"].items():
        names = set(re.findall(r"{([^}]+)}", path))
        for method, op in operations.items():
            declared = {p["name"] for p in op.get("parameters", []) if p.get("in") == "path"}
            assert names <= declared, f"{method.upper()} {path} does not declare {names - declared}"


def test_error_envelope_schema_is_published(client):
    doc = body(client.get("/api/v1/openapi.json"))
    ref = doc["components"]["schemas"]["Error"]["properties"]["error"]["$ref"]
    error = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert set(error["required"]) == {"code", "message", "retryable", "retry_after_ms", "details"}
