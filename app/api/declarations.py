"""What each API view accepts and answers, declared beside the view.

``@declare(body=CLAIM, responses={200: CLAIM_RESPONSE})`` records the request
body, the response body per status, query parameters and headers on the view
function; :mod:`app.api.openapi` turns the url_map plus these records into the
served document. Declaring changes nothing at run time: the view still checks
its body with ``validate.check`` against the same schema object.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from app.api import rules as r
from app.api.rules import Rule, obj

ATTRIBUTE = "api_declarations"

# The one error shape (app/errors.py FleetError.envelope); also the shape of a
# rejected item's error in batch results.
API_ERROR = r.named("APIError", {
    "code": r.text.describe(
        "invalid_request, invalid_job, invalid_machine_token, permission_denied, not_found, "
        "identity_conflict, project_not_active, invalid_transition, stale_attempt, too_large, "
        "unsupported_media_type, invalid_upload, invalid_document, client_upgrade_required, "
        "project_dispatch_rate_limited, rate_limited, spool_full, storage_unavailable, "
        "internal_error"),
    "message": r.text.describe("for people; never parse it"),
    "retryable": r.boolean,
    "retry_after_ms": r.int_range(0, r.INT64_MAX).describe(
        "milliseconds to wait before retrying; 0 when not retrying"),
    "details": r.any_object.describe("the field, index or line at fault, limits…"),
})
ERROR_ENVELOPE = r.named("Error", {"error": API_ERROR})


@dataclass(frozen=True)
class Media:
    """A body that is not JSON: a media type and, optionally, a JSON Schema."""
    media_type: str
    schema: dict = field(default_factory=lambda: {"type": "string", "format": "binary"})
    description: str | None = None


@dataclass(frozen=True)
class Declaration:
    summary: str | None
    body: Rule | Media | None
    responses: dict            # status -> Rule | Media | None (no body)
    errors: tuple[int, ...]    # error statuses beyond those derived from the rest
    query: dict                # name -> rule (validate.Optional: not required)
    headers: dict              # name -> rule (validate.Optional: not required)
    path: dict                 # name -> rule, overriding the typing by name
    auth: str | None           # "bearer", or None for a public route
    methods: frozenset | None  # only these methods of the view's routes (None: all)
    operation_id: str | None
    description: str | None


def _as_rule(value):
    return obj(value) if isinstance(value, dict) else value


def declare(*, body=None, responses=None, summary=None, description=None, query=None,
            headers=None, path=None, errors=(), auth="bearer", methods=None,
            operation_id=None):
    """Record a view's contract for the OpenAPI document.

    Parameters:
        body: the JSON request body (a field dict or a rule), or a
            :class:`Media` for a raw body.
        responses: ``{status: rule | dict | Media | None}``; ``None`` means
            no body (204). Error statuses need no entry: they answer the error
            envelope and are listed from ``errors`` and what the declaration
            implies (bearer → 401/403, a body → 400/413/415, query → 400, a
            path parameter → 404).
        methods: restrict this declaration to some methods of the view
            (a view serving PUT and PATCH may declare each).
    """
    decl = Declaration(
        summary=summary, description=description, body=_as_rule(body),
        responses={int(k): _as_rule(r) for k, r in
                   (responses if responses is not None else {200: None}).items()},
        errors=tuple(errors), query=dict(query or {}), headers=dict(headers or {}),
        path=dict(path or {}), auth=auth,
        methods=frozenset(m.upper() for m in methods) if methods else None,
        operation_id=operation_id)

    def record(view):
        view.__dict__.setdefault(ATTRIBUTE, []).append(decl)
        return view
    return record


def declaration_for(view, method: str) -> Declaration | None:
    for decl in getattr(view, ATTRIBUTE, ()):
        if decl.methods is None or method in decl.methods:
            return decl
    return None
