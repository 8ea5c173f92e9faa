"""Strict request bodies: bounded, JSON objects only, unknown fields rejected.

A schema is a dict of field name → rule; a rule is a callable
``rule(value, path) -> value`` raising :class:`InvalidRequest` that also knows
its JSON Schema (:mod:`app.api.rules`). Wrap a rule in :class:`Optional` for
fields that may be absent. :func:`declare` puts a view's request and response
bodies beside it, and the served OpenAPI document is derived from them.
"""
from __future__ import annotations

from flask import request

from app.api.declarations import API_ERROR, ERROR_ENVELOPE, Media, declare
from app.api.rules import (INT64_MAX, IntRange, Optional, any_object, any_of, any_value, array,
                           boolean, check, const, custom, identifier, int_range,
                           json_object, json_pattern, list_of, map_of, named, nullable, number,
                           obj, one_of, schema_of, string, text, timestamp)
from app.errors import InvalidRequest, TooLarge, UnsupportedMediaType
from workers.wire.protocol import JsonTooDeep, strict_json_loads

__all__ = ["API_ERROR", "ERROR_ENVELOPE", "INT64_MAX", "InvalidRequest", "Media", "Optional",
           "any_object", "any_of", "any_value", "array", "boolean", "check", "const", "custom",
           "declare", "identifier", "int_range", "json_body", "json_object", "json_pattern",
           "list_of", "map_of", "named", "nullable", "number", "obj", "one_of", "query",
           "read_body", "schema_of", "string", "text", "timestamp"]



def read_body(limit: int) -> bytes:
    length = request.content_length
    if length is not None and length > limit:
        raise TooLarge(f"request body exceeds {limit} bytes", details={"limit": limit})
    data = request.stream.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"request body exceeds {limit} bytes", details={"limit": limit})
    return data


def json_body(limit: int) -> dict:
    mimetype = request.mimetype
    if mimetype and mimetype != "application/json":
        raise UnsupportedMediaType("expected application/json", details={"content_type": mimetype})
    data = read_body(limit)
    try:
        body = strict_json_loads(data)
    except JsonTooDeep as exc:
        raise InvalidRequest(f"body refused: {exc}", details={"max_depth": exc.limit}) from None
    except (UnicodeDecodeError, ValueError) as exc:
        # json.loads also refuses trailing data after the document.
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("body must be a JSON object")
    return body


def query(spec: dict) -> dict:
    """The query parameters ``spec`` declares (name → rule, as in
    ``declare(query=...)``), checked; others are ignored and an empty value
    counts as absent. Integer rules take ASCII decimal digits only."""
    raw = {}
    for name, rule in spec.items():
        value = request.args.get(name)
        if not value:
            continue
        inner = rule.rule if isinstance(rule, Optional) else rule
        if isinstance(inner, IntRange) and value.isascii() and value.isdigit():
            value = int(value)
        raw[name] = value
    return check(raw, spec)
