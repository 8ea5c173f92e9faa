"""Strict request bodies: bounded, JSON objects only, unknown fields rejected.

A schema is a dict of field name → rule; a rule is a callable
``rule(value, path) -> value`` raising :class:`InvalidRequest`. Wrap a rule in
:class:`Optional` for fields that may be absent.
"""
from __future__ import annotations


from flask import request

from app.errors import InvalidRequest, TooLarge, UnsupportedMediaType
from workers.protocol import compact_json, is_identifier, is_int, strict_json_loads


class Optional:
    def __init__(self, rule, default=None):
        self.rule = rule
        self.default = default


def _fail(path: str, message: str):
    raise InvalidRequest(f"{path}: {message}", details={"field": path})


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
    except (UnicodeDecodeError, ValueError) as exc:
        # json.loads also refuses trailing data after the document.
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("body must be a JSON object")
    return body


def check(obj, schema: dict, path: str = "") -> dict:
    if not isinstance(obj, dict):
        _fail(path or "body", "must be an object")
    for key in obj:
        if key not in schema:
            _fail(f"{path}{key}", "unknown field")
    out = {}
    for key, rule in schema.items():
        where = f"{path}{key}"
        if isinstance(rule, Optional):
            if key not in obj:
                if rule.default is not None:
                    out[key] = rule.default
                continue
            rule = rule.rule
        elif key not in obj:
            _fail(where, "is required")
        out[key] = rule(obj[key], where)
    return out


def identifier(value, path):
    if not is_identifier(value):
        _fail(path, "must be 1..128 of [A-Za-z0-9._:-]")
    return value


def int_range(lo, hi, nullable=False):
    def rule(value, path):
        if value is None and nullable:
            return None
        if not is_int(value) or not lo <= value <= hi:
            _fail(path, f"must be an integer {lo}..{hi}" + (" or null" if nullable else ""))
        return value
    return rule


def boolean(value, path):
    if not isinstance(value, bool):
        _fail(path, "must be true or false")
    return value


def string(max_bytes, nullable=False, min_bytes=0):
    def rule(value, path):
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            _fail(path, "must be a string")
        size = len(value.encode("utf-8", "surrogatepass"))
        if not min_bytes <= size <= max_bytes:
            _fail(path, f"must be {min_bytes}..{max_bytes} bytes")
        if "\x00" in value:
            _fail(path, "may not contain NUL")
        return value
    return rule


def one_of(*options):
    def rule(value, path):
        if value not in options:
            _fail(path, f"must be one of {', '.join(map(str, options))}")
        return value
    return rule


def json_object(max_bytes, nullable=False):
    def rule(value, path):
        if value is None and nullable:
            return None
        if not isinstance(value, dict):
            _fail(path, "must be an object")
        encoded = compact_json(value)
        if len(encoded.encode("utf-8", "surrogatepass")) > max_bytes:
            _fail(path, f"must encode to at most {max_bytes} bytes")
        if "\\u0000" in encoded:
            _fail(path, "may not contain NUL")
        return value
    return rule


def list_of(rule, min_len, max_len, unique=False):
    def check_list(value, path):
        if not isinstance(value, list) or not min_len <= len(value) <= max_len:
            _fail(path, f"must be a list of {min_len}..{max_len} items")
        out = [rule(item, f"{path}[{i}]") for i, item in enumerate(value)]
        if unique and len(set(out)) != len(out):
            _fail(path, "items must be unique")
        return out
    return check_list


def obj(schema):
    def rule(value, path):
        return check(value, schema, f"{path}.")
    return rule
