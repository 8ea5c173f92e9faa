"""``/api/v1/openapi.json``: the machine API as an OpenAPI 3.1 document,
derived from the app.

Paths and methods come from Flask's url_map; request bodies, responses,
query parameters and headers from the ``validate.declare`` record beside each
view, written with the same rule objects the views check bodies with, so the
document cannot drift from the validation. Path parameters are typed by name
(integer job ids, identifier project and user ids). Error statuses all answer
the one envelope. A view without a declaration gets a minimal entry (and
tests/test_openapi.py fails until it is declared).
"""
from __future__ import annotations

import copy
import re
from http import HTTPStatus

from flask import current_app, jsonify
from werkzeug.routing import IntegerConverter, PathConverter

from app.api.base import bp
from app.api import validate as v
from app.api.declarations import Declaration, Media, declaration_for

TITLE = "FleetHQ machine API"
IGNORED_METHODS = frozenset({"HEAD", "OPTIONS"})

# Integer ids travel as decimal path segments; the rest are identifiers.
_ROW_ID = v.int_range(1, v.INT64_MAX)
PATH_PARAMETERS = {
    "project_id": v.identifier, "user_id": v.identifier, "worker_id": v.identifier,
    "attempt_id": v.identifier, "job_id": _ROW_ID, "consumer_id": _ROW_ID, "delivery_id": _ROW_ID,
}

ERROR_STATUSES = {
    400: "invalid_request / invalid_job: bad JSON, an unknown or invalid field or parameter",
    401: "invalid_machine_token: missing, unknown or revoked bearer token",
    403: "permission_denied: the token lacks the role, or the action needs a human",
    404: "not_found",
    409: "identity_conflict / project_not_active / invalid_transition / stale_attempt",
    413: "too_large: the body exceeds the route's limit",
    415: "unsupported_media_type",
    422: "invalid_upload: the file is not what its headers say (permanent); invalid_document: "
         "the file cannot be a document (empty, truncated, not a PDF or image)",
    426: "client_upgrade_required: X-Client-Version missing or not allowed",
    429: "project_dispatch_rate_limited (Retry-After)",
    503: "storage_unavailable (Retry-After)",
    507: "spool_full (Retry-After)",
}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait (rounded up)",
                                "schema": {"type": "integer", "minimum": 1}}}


def openapi_path(rule: str) -> str:
    """Flask's ``<name>`` and ``<converter:name>`` become OpenAPI's ``{name}``."""
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule)


def _path_parameters(rule, overrides: dict, refs: dict) -> list[dict]:
    params = []
    for name in re.findall(r"{([^}]+)}", openapi_path(rule.rule)):
        converter = rule._converters.get(name)
        if name in overrides:
            schema = v.schema_of(overrides[name], refs)
        elif isinstance(converter, IntegerConverter):
            schema = {"type": "integer", "minimum": 0}
        elif isinstance(converter, PathConverter):
            schema = {"type": "string", "minLength": 1}
        else:
            schema = v.schema_of(PATH_PARAMETERS.get(name, v.string(1024, min_bytes=1)), refs)
        params.append({"name": name, "in": "path", "required": True, "schema": schema})
    return params


def _parameters(where: str, declared: dict, refs: dict) -> list[dict]:
    params = []
    for name, rule in declared.items():
        required = not isinstance(rule, v.Optional)
        schema = v.schema_of(rule.rule if not required else rule, refs)
        params.append({"name": name, "in": where, "required": required, "schema": schema})
    return params


def _content(body, refs: dict) -> dict:
    if isinstance(body, Media):
        return {body.media_type: {"schema": body.schema}}
    return {"application/json": {"schema": v.schema_of(body, refs)}}


def _error(status: int, used: set | None = None) -> dict:
    """A $ref to the shared error response of ``status`` (recorded in ``used``);
    without ``used``, the response itself."""
    if used is not None:
        used.add(status)
        return {"$ref": f"#/components/responses/Error{status}"}
    response = {"description": ERROR_STATUSES.get(status, HTTPStatus(status).phrase),
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    if status in (429, 503, 507):
        response["headers"] = copy.deepcopy(_RETRY_AFTER)
    return response


# Answered by the HTTP server in front of the app (gunicorn: request line
# over 4094 bytes), before any route runs: plain text, not the envelope.
URI_TOO_LONG = {"description": "the request line is longer than the HTTP server accepts "
                               "(answered by the server, not in the error envelope)"}


def _error_statuses(decl: Declaration, has_path: bool) -> set[int]:
    statuses = set(decl.errors)
    if decl.auth == "bearer":
        statuses |= {401, 403}
    if decl.body is not None:
        statuses |= {400, 413, 415}
    if decl.query:
        statuses.add(400)
    if has_path:
        statuses.add(404)
    return statuses


def _operation_id(view, method: str, rule, seen: set) -> str:
    base = re.sub(r"_(\w)", lambda m: m.group(1).upper(), view.__name__)
    candidate = base
    if candidate in seen:
        candidate = base + method.capitalize()
    n = 2
    while candidate in seen:
        candidate, n = f"{base}{method.capitalize()}{n}", n + 1
    seen.add(candidate)
    return candidate


def _declared_operation(decl: Declaration, view, rule, method, refs, seen, errors) -> dict:
    doc_line = (view.__doc__ or "").strip().splitlines()
    op = {"operationId": decl.operation_id or _operation_id(view, method, rule, seen),
          "summary": decl.summary or (doc_line[0] if doc_line else view.__name__)}
    if decl.operation_id:
        seen.add(decl.operation_id)
    if decl.description:
        op["description"] = decl.description
    op["security"] = [{"bearer": []}] if decl.auth == "bearer" else []
    params = (_path_parameters(rule, decl.path, refs) + _parameters("query", decl.query, refs)
              + _parameters("header", decl.headers, refs))
    if params:
        op["parameters"] = params
    if decl.body is not None:
        op["requestBody"] = {"required": True, "content": _content(decl.body, refs)}
    responses = {}
    for status, answer in sorted(decl.responses.items()):
        if isinstance(answer, tuple):
            description, body = answer
        else:
            description, body = HTTPStatus(status).phrase, answer
        responses[str(status)] = {"description": description}
        if body is not None:
            responses[str(status)]["content"] = _content(body, refs)
    has_path = "{" in openapi_path(rule.rule)
    for status in sorted(_error_statuses(decl, has_path)):
        responses.setdefault(str(status), _error(status, errors))
    op["responses"] = responses
    return op


def _undeclared_operation(view, method: str, rule, refs, seen, errors) -> dict:
    """A route nobody declared yet: the least that is still true (a test
    fails until it is declared)."""
    doc_line = (view.__doc__ or "").strip().splitlines()
    op = {"operationId": _operation_id(view, method, rule, seen),
          "summary": doc_line[0] if doc_line else view.__name__,
          "security": [{"bearer": []}],
          "responses": {"200": {"description": "OK"}, "default": _error(500, errors)}}
    params = _path_parameters(rule, {}, refs)
    if params:
        op["parameters"] = params
    return op


def document(app) -> dict:
    """Build the document from ``app``'s url_map and the views' declarations."""
    refs: dict = {}
    v.ERROR_ENVELOPE.json_schema(refs)
    paths: dict = {}
    seen: set = set()
    errors: set = set()
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        view = app.view_functions[rule.endpoint]
        methods = sorted(rule.methods - IGNORED_METHODS)
        declared = {m: declaration_for(view, m) for m in methods}
        if not rule.rule.startswith("/api/") and not any(declared.values()):
            continue
        path = openapi_path(rule.rule)
        for method in methods:
            decl = declared[method]
            op = (_declared_operation(decl, view, rule, method, refs, seen, errors) if decl
                  else _undeclared_operation(view, method, rule, refs, seen, errors))
            op["responses"].setdefault("414", {"$ref": "#/components/responses/UriTooLong"})
            paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": TITLE, "version": "1",
                 "description": "Derived at run time from the server's routes and the "
                                "declarations its request validation uses."},
        "components": {"schemas": dict(sorted(refs.items())),
                       "responses": {**{f"Error{n}": _error(n) for n in sorted(errors)},
                                     "UriTooLong": URI_TOO_LONG},
                       "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "a user machine token (fhq_…) or an enrolled node's "
                                      "secret (fhqn_…)"}}},
        "paths": paths,
    }


@bp.get("/openapi.json")
@v.declare(auth=None, summary="This document (OpenAPI 3.1)",
           responses={200: v.obj({"openapi": v.const("3.1.0")}, extra=True)})
def openapi():
    cache = current_app.extensions
    if "fleethq.openapi" not in cache:  # the url_map is fixed once the app serves
        cache["fleethq.openapi"] = document(current_app)
    return jsonify(cache["fleethq.openapi"])
