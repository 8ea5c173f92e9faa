"""Field rules: each checks a decoded JSON value and knows its JSON Schema.

A rule is called as ``rule(value, path) -> value`` and raises
:class:`InvalidRequest` naming ``path``; its ``schema`` property is the JSON
Schema (2020-12, as OpenAPI 3.1 uses) of what it accepts. One declaration
therefore drives both the check and the published document.

The server counts string bounds in UTF-8 bytes, JSON Schema in characters.
Published schemas keep ``minLength``/``maxLength`` as necessary bounds (a
string of at most N bytes has at most N characters) and state the byte rule in
``x-min-bytes``/``x-max-bytes`` and the description. A JSON object field whose
compact encoding is bounded carries ``x-max-encoded-bytes``.

A plain function is still a valid rule; its schema is ``{}`` (any value).
"""
from __future__ import annotations

import copy
import math

from app.errors import InvalidRequest
from workers.wire.protocol import IDENTIFIER_RE, compact_json, is_identifier, is_int

INT32 = (-(2**31), 2**31 - 1)
INT64_MAX = 2**63 - 1


def json_pattern(regex) -> str:
    """A Python ``\\A…\\Z`` regex spelled for JSON Schema (ECMA-262, where "$"
    is the very end)."""
    return "^" + regex.pattern.removeprefix(r"\A").removesuffix(r"\Z") + "$"


IDENTIFIER_PATTERN = json_pattern(IDENTIFIER_RE)
# No NUL character anywhere (PostgreSQL text cannot hold one).
NO_NUL_PATTERN = "^[^\x00]*$"


def fail(path: str, message: str):
    raise InvalidRequest(f"{path}: {message}", details={"field": path})


def _utf8(value: str, path: str) -> bytes:
    """The text's UTF-8 bytes; a lone surrogate (a ``"\\ud800"`` escape in
    the JSON) is not text, and PostgreSQL could store none of it."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        fail(path, "must be Unicode text (a lone surrogate \\ud800-\\udfff is not)")
        raise   # fail() raises; this line is for type checkers


class Optional:
    """A field that may be absent; ``default`` fills it in when given."""

    def __init__(self, rule, default=None):
        self.rule = rule
        self.default = default


def schema_of(rule, refs: dict | None = None) -> dict:
    """The JSON Schema of a rule, a field dict (an object) or a plain function.

    With ``refs``, named rules become ``$ref``s and their definitions are
    added to ``refs`` (the document's ``components.schemas``)."""
    if isinstance(rule, dict):
        return obj(rule).json_schema(refs)
    if isinstance(rule, Rule):
        return rule.json_schema(refs)
    return {}


class Rule:
    """Base of the rules: ``nullable`` and ``description`` apply to every kind."""

    nullable = False
    description: str | None = None
    extra_schema: dict | None = None

    def __call__(self, value, path):
        if value is None and self.nullable:
            return None
        return self.check(value, path)

    def check(self, value, path):  # pragma: no cover - every rule overrides it
        raise NotImplementedError

    def _schema(self, refs) -> dict:  # pragma: no cover
        raise NotImplementedError

    def json_schema(self, refs: dict | None = None) -> dict:
        schema = self._schema(refs)
        if self.nullable:
            schema = _or_null(schema)
        if self.description and "description" not in schema:
            schema = {**schema, "description": self.description}
        if self.extra_schema:
            schema = {**schema, **self.extra_schema}
        return schema

    @property
    def schema(self) -> dict:
        """The JSON Schema with every named part written out in place."""
        return self.json_schema()

    def or_null(self) -> "Rule":
        twin = copy.copy(self)
        twin.nullable = True
        return twin

    def describe(self, text: str) -> "Rule":
        twin = copy.copy(self)
        twin.description = text
        return twin

    def with_schema(self, **keywords) -> "Rule":
        """Publish what a later layer (a domain service) also requires, e.g. a
        ``pattern``; the check itself stays as it is."""
        twin = copy.copy(self)
        twin.extra_schema = {**(self.extra_schema or {}), **keywords}
        return twin


def _or_null(schema: dict) -> dict:
    kind = schema.get("type")
    if "enum" in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def _sized(schema: dict, lo, hi) -> dict:
    if lo is not None:
        schema["minimum"] = lo
    if hi is not None:
        schema["maximum"] = hi
    if (lo is not None and lo < INT32[0]) or (hi is not None and hi > INT32[1]):
        schema["format"] = "int64"
    return schema


class _Identifier(Rule):
    def check(self, value, path):
        if not is_identifier(value):
            fail(path, "must be 1..128 of [A-Za-z0-9._:-]")
        return value

    def _schema(self, refs):
        return {"type": "string", "pattern": IDENTIFIER_PATTERN}


class _Boolean(Rule):
    def check(self, value, path):
        if not isinstance(value, bool):
            fail(path, "must be true or false")
        return value

    def _schema(self, refs):
        return {"type": "boolean"}


class _Text(Rule):
    """Any string (response bodies; requests bound theirs with ``string``)."""

    def check(self, value, path):
        if not isinstance(value, str):
            fail(path, "must be a string")
        return value

    def _schema(self, refs):
        return {"type": "string"}


identifier = _Identifier()
boolean = _Boolean()
text = _Text()


class IntRange(Rule):
    def __init__(self, lo, hi, nullable=False):
        self.lo, self.hi, self.nullable = lo, hi, nullable

    def check(self, value, path):
        if not is_int(value) or not self.lo <= value <= self.hi:
            fail(path, f"must be an integer {self.lo}..{self.hi}" + (" or null" if self.nullable else ""))
        return value

    def _schema(self, refs):
        return _sized({"type": "integer"}, self.lo, self.hi)


class Number(Rule):
    """Any JSON number (booleans are not numbers here), optionally bounded."""

    def __init__(self, lo=None, hi=None, nullable=False, exclusive_lo=False):
        self.lo, self.hi, self.nullable, self.exclusive_lo = lo, hi, nullable, exclusive_lo

    def check(self, value, path):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(path, "must be a number")
        if self.lo is not None and (value <= self.lo if self.exclusive_lo else value < self.lo):
            fail(path, f"must be {'above' if self.exclusive_lo else 'at least'} {self.lo}")
        if self.hi is not None and value > self.hi:
            fail(path, f"must be at most {self.hi}")
        return value

    def _schema(self, refs):
        schema: dict = {"type": "number"}
        if self.lo is not None:
            schema["exclusiveMinimum" if self.exclusive_lo else "minimum"] = self.lo
        if self.hi is not None:
            schema["maximum"] = self.hi
        return schema


class String(Rule):
    def __init__(self, max_bytes, nullable=False, min_bytes=0):
        self.max_bytes, self.nullable, self.min_bytes = max_bytes, nullable, min_bytes

    def check(self, value, path):
        if not isinstance(value, str):
            fail(path, "must be a string")
        size = len(_utf8(value, path))
        if not self.min_bytes <= size <= self.max_bytes:
            fail(path, f"must be {self.min_bytes}..{self.max_bytes} bytes")
        if "\x00" in value:
            fail(path, "may not contain NUL")
        return value

    def _schema(self, refs):
        rule = f"{self.min_bytes}..{self.max_bytes} UTF-8 bytes, no NUL"
        schema = {"type": "string", "pattern": NO_NUL_PATTERN, "maxLength": self.max_bytes,
                  "x-max-bytes": self.max_bytes,
                  "description": f"{self.description} ({rule})" if self.description else rule}
        if self.min_bytes:
            # Four bytes at most per character: fewer characters can never do.
            schema["minLength"] = math.ceil(self.min_bytes / 4)
            schema["x-min-bytes"] = self.min_bytes
        return schema


class OneOf(Rule):
    def __init__(self, *options):
        self.options = options

    def check(self, value, path):
        if value not in self.options:
            fail(path, f"must be one of {', '.join(map(str, self.options))}")
        return value

    def _schema(self, refs):
        return {"enum": list(self.options)}


class JsonObject(Rule):
    """Any JSON object; ``max_bytes`` bounds its compact encoding (None: unbounded)."""

    def __init__(self, max_bytes, nullable=False):
        self.max_bytes, self.nullable = max_bytes, nullable

    def check(self, value, path):
        if not isinstance(value, dict):
            fail(path, "must be an object")
        if self.max_bytes is None:
            return value
        encoded = compact_json(value)
        if len(_utf8(encoded, path)) > self.max_bytes:
            fail(path, f"must encode to at most {self.max_bytes} bytes")
        if "\\u0000" in encoded:
            fail(path, "may not contain NUL")
        return value

    def _schema(self, refs):
        if self.max_bytes is None:
            return {"type": "object"}
        return {"type": "object", "x-max-encoded-bytes": self.max_bytes,
                "description": f"any JSON object; compact encoding at most {self.max_bytes} "
                               "bytes; no NUL"}


class ListOf(Rule):
    def __init__(self, rule, min_len, max_len, unique=False, nullable=False):
        self.rule, self.min_len, self.max_len = rule, min_len, max_len
        self.unique, self.nullable = unique, nullable

    def check(self, value, path):
        if (not isinstance(value, list) or len(value) < self.min_len
                or (self.max_len is not None and len(value) > self.max_len)):
            fail(path, f"must be a list of {self.min_len}..{self.max_len or ''} items")
        out = [self.rule(item, f"{path}[{i}]") for i, item in enumerate(value)]
        if self.unique and len(set(out)) != len(out):
            fail(path, "items must be unique")
        return out

    def _schema(self, refs):
        schema = {"type": "array", "items": schema_of(self.rule, refs)}
        if self.min_len:
            schema["minItems"] = self.min_len
        if self.max_len is not None:
            schema["maxItems"] = self.max_len
        if self.unique:
            schema["uniqueItems"] = True
        return schema


class MapOf(Rule):
    """An object whose keys are free and whose values follow one rule."""

    def __init__(self, rule, nullable=False):
        self.rule, self.nullable = rule, nullable

    def check(self, value, path):
        if not isinstance(value, dict):
            fail(path, "must be an object")
        return {key: self.rule(item, f"{path}.{key}") for key, item in value.items()}

    def _schema(self, refs):
        return {"type": "object", "additionalProperties": schema_of(self.rule, refs)}


class AnyOf(Rule):
    """The first of several rules that accepts the value."""

    def __init__(self, *rules, nullable=False):
        self.rules, self.nullable = rules, nullable

    def check(self, value, path):
        for rule in self.rules:
            try:
                return rule(value, path)
            except InvalidRequest:
                continue
        fail(path, "matches none of the allowed forms")

    def _schema(self, refs):
        return {"anyOf": [schema_of(rule, refs) for rule in self.rules]}


class Const(Rule):
    def __init__(self, value):
        self.value = value

    def check(self, value, path):
        if value != self.value or type(value) is not type(self.value):
            fail(path, f"must be {self.value!r}")
        return value

    def _schema(self, refs):
        return {"const": self.value}


class AnyValue(Rule):
    def check(self, value, path):
        return value

    def _schema(self, refs):
        return {}


class Obj(Rule):
    """A JSON object with exactly the declared fields (``extra``: others allowed)."""

    def __init__(self, fields: dict, extra=False, nullable=False):
        self.fields, self.extra, self.nullable = fields, extra, nullable

    def check(self, value, path):
        prefix = f"{path}." if path else ""
        if self.extra:
            if not isinstance(value, dict):
                fail(prefix or "body", "must be an object")
            known = {k: item for k, item in value.items() if k in self.fields}
            return {**value, **check(known, self.fields, prefix)}
        return check(value, self.fields, prefix)

    def _schema(self, refs):
        properties, required = {}, []
        for key, rule in self.fields.items():
            if isinstance(rule, Optional):
                prop = schema_of(rule.rule, refs)
                if rule.default is not None:
                    prop = {**prop, "default": rule.default}
            else:
                prop = schema_of(rule, refs)
                required.append(key)
            properties[key] = prop
        schema = {"type": "object", "additionalProperties": self.extra}
        if required:
            schema["required"] = required
        schema["properties"] = properties
        return schema


class Named(Rule):
    """A rule published once under ``components/schemas/<name>`` and referenced."""

    def __init__(self, name: str, rule):
        self.name, self.rule = name, rule

    def check(self, value, path):
        return self.rule(value, path)

    def json_schema(self, refs=None):
        if refs is None:
            schema = schema_of(self.rule)
            return _or_null(schema) if self.nullable else schema
        if self.name not in refs:
            refs[self.name] = {}  # placeholder: a rule may refer to itself
            refs[self.name] = schema_of(self.rule, refs)
        ref = {"$ref": f"#/components/schemas/{self.name}"}
        return {"anyOf": [ref, {"type": "null"}]} if self.nullable else ref


class Custom(Rule):
    """A check written as a plain ``(value, path)`` function, published with
    the schema (a rule or a field dict) of what it accepts."""

    def __init__(self, check_fn, shape):
        self.check_fn, self.shape = check_fn, shape

    def check(self, value, path):
        return self.check_fn(value, path)

    def _schema(self, refs):
        return schema_of(self.shape, refs)


def check(obj, schema: dict, path: str = "") -> dict:
    if not isinstance(obj, dict):
        fail(path or "body", "must be an object")
    for key in obj:
        if key not in schema:
            fail(f"{path}{key}", "unknown field")
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
            fail(where, "is required")
        out[key] = rule(obj[key], where)
    return out


# Constructors, under the names the route modules use.

def int_range(lo, hi, nullable=False) -> IntRange:
    return IntRange(lo, hi, nullable)


def string(max_bytes, nullable=False, min_bytes=0) -> String:
    return String(max_bytes, nullable, min_bytes)


def one_of(*options) -> OneOf:
    return OneOf(*options)


def json_object(max_bytes, nullable=False) -> JsonObject:
    return JsonObject(max_bytes, nullable)


def list_of(rule, min_len, max_len, unique=False) -> ListOf:
    return ListOf(rule, min_len, max_len, unique)


def array(rule) -> ListOf:
    """An unbounded list (response bodies)."""
    return ListOf(rule, 0, None)


def obj(schema: dict, extra: bool = False) -> Obj:
    return Obj(schema, extra)


def map_of(rule) -> MapOf:
    return MapOf(rule)


def any_of(*rules) -> AnyOf:
    return AnyOf(*rules)


def const(value) -> Const:
    return Const(value)


def named(name: str, rule) -> Named:
    return Named(name, obj(rule) if isinstance(rule, dict) else rule)


def custom(check_fn, shape) -> Custom:
    return Custom(check_fn, shape)


def nullable(rule) -> Rule:
    """``rule`` that also accepts null (any rule, a plain function too)."""
    return (rule if isinstance(rule, Rule) else Custom(rule, {})).or_null()


def number(lo=None, hi=None, nullable=False, exclusive_lo=False) -> Number:
    return Number(lo, hi, nullable, exclusive_lo)


any_value = AnyValue()
any_object = JsonObject(None)
timestamp = IntRange(0, INT64_MAX).describe("UNIX seconds")
