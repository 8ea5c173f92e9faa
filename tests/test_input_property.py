"""Every declared input answers hostile strings cleanly (issue 26 §3).

The master's own OpenAPI document names every operation, its parameters
(path, query, header) and its JSON body. For each operation Hypothesis puts
a hostile string into one of them — lone surrogates, NUL, bidirectional
overrides, 4-byte characters, line breaks, control and format characters,
alone or inside ordinary text — the rest of the request as a client would
send it (path parameters naming objects that exist: a project with jobs, a
job in flight, an approved node holding an attempt, a user). Each answer
must be below 500; a refusal must be in the documented envelope and change
nothing (jobs, attempts, uploads, assets, users, tokens, nodes, projects);
and the master must log no traceback.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from urllib.parse import quote

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.helpers import VERSION
from tests.support.world import World, world  # noqa: F401 (fixture)

EXAMPLES_PER_OPERATION = 20

# Each of the characters the probe found answering 500, and their kin.
NASTY = ["\ud800", "\udfff", "\udc80abc", "\x00", "a\x00b", "\u202e", "\u200f\u05d0", "\U0001F600",
         "\U00010348", "\ufeff", "\r\n", "\n", "\x7f", "\u0085", "\u2028", "\ufffe", "\\", "%00", "../.."]
HOSTILE = st.one_of(
    st.sampled_from(NASTY),
    st.text(st.characters(categories=("Cs", "Cc", "Cf", "Co", "Zl", "Zp", "So", "Lo")), min_size=1, max_size=12),
    st.tuples(st.sampled_from(["w1", "p", "example.org", "x" * 40]), st.sampled_from(NASTY),
              st.sampled_from(["", "z", "\U0001F600"])).map("".join),
)


def _doc(app) -> dict:
    return app.test_client().get("/api/v1/openapi.json").get_json()


def _resolve(doc: dict, schema: dict) -> dict:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        schema = doc["components"]["schemas"][name]
    return schema


def _types(schema: dict) -> list:
    kind = schema.get("type")
    return kind if isinstance(kind, list) else [kind] if kind else []


CANDIDATES = ["w1", "x", "example.org", "0" * 64, "1", "a" * 16 + "-hook-secret", "https://example.org/a.pdf"]


def _minimal(doc: dict, schema: dict, depth: int = 0):
    """A plain value the schema accepts (the request around the hostile string)."""
    schema = _resolve(doc, schema)
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return _minimal(doc, schema[key][0], depth)
    types = [t for t in _types(schema) if t != "null"] or ["object"]
    kind = types[0]
    if kind == "string":
        pattern = schema.get("pattern")
        for candidate in CANDIDATES:
            if pattern is None or re.search(pattern, candidate):
                return candidate
        return "x"
    if kind == "integer":
        return max(1, schema.get("minimum", 1))
    if kind == "number":
        return 1
    if kind == "boolean":
        return False
    if kind == "array":
        return [_minimal(doc, schema.get("items", {}), depth + 1)] if depth < 4 else []
    out = {}
    for name in schema.get("required", []):
        out[name] = _minimal(doc, schema.get("properties", {}).get(name, {}), depth + 1)
    return out


def _string_slots(doc: dict, schema: dict, at: tuple = ()) -> list[tuple]:
    """Paths (keys and list indexes) to every place of the body a string may go."""
    schema = _resolve(doc, schema)
    slots = []
    if "string" in _types(schema) or ("enum" in schema and any(isinstance(v, str) for v in schema["enum"])):
        slots.append(at)
    if "array" in _types(schema) and len(at) < 6:
        slots += _string_slots(doc, schema.get("items", {}), at + (0,))
    if "object" in _types(schema) and len(at) < 6:
        for name, sub in schema.get("properties", {}).items():
            slots += _string_slots(doc, sub, at + (name,))
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            slots += _string_slots(doc, extra, at + ("extra",))
    return slots


def _put(value, at: tuple, hostile: str):
    if not at:
        return hostile
    key, rest = at[0], at[1:]
    if isinstance(key, int):
        value = list(value) if isinstance(value, list) else []
        if not value:
            value.append({} if rest and isinstance(rest[0], str) else None)
        value[0] = _put(value[0], rest, hostile)
        return value
    value = dict(value) if isinstance(value, dict) else {}
    value[key] = _put(value.get(key), rest, hostile)
    return value


class Operation:
    def __init__(self, doc: dict, method: str, path: str):
        self.method, self.path = method.upper(), path
        op = doc["paths"][path][method]
        self.params = [p for p in op.get("parameters", []) + doc["paths"][path].get("parameters", [])]
        content = op.get("requestBody", {}).get("content", {})
        self.content_type = next(iter(content), None)
        self.body_schema = content.get("application/json", {}).get("schema")
        self.body = _minimal(doc, self.body_schema) if self.body_schema else None
        self.slots = [("param", p["name"]) for p in self.params]
        if self.body_schema:
            self.slots += [("body", at) for at in _string_slots(doc, self.body_schema)]

    def __repr__(self):
        return f"{self.method} {self.path}"


def operations(doc: dict) -> list[Operation]:
    found = [Operation(doc, method, path) for path, methods in doc["paths"].items()
             for method in methods if method in ("get", "post", "put", "patch", "delete")]
    return [op for op in found if op.slots]


def _collected() -> list[str]:
    """The operations with inputs, named at collection: the document is
    derived from the routes, no database needed."""
    from app import create_app
    from app.api.openapi import document
    app = create_app({"DATABASE_URL": "postgresql+psycopg://collect@127.0.0.1:1/none", "SECRET_KEY": "x",
                      "LOG_JSON": False}, check_schema=False)
    return [repr(op) for op in operations(document(app))]


OPERATIONS = _collected()


def _good_params(world: World) -> dict:
    """Values naming things that exist, so that a request gets past its look-ups."""
    return {"project_id": "p", "job_id": str(world.job["job_id"]), "user_id": "wk",
            "worker_id": world.node.node_id, "action": "approve", "consumer_id": "1", "delivery_id": "1",
            "attempt_id": str(world.attempt["attempt_id"]), "object_key": "sha256/ab/cdef",
            "document_id": "1", "which": "original", "site": "example.org", "X-Client-Version": VERSION,
            "X-SavewebHQ-Client-Version": VERSION, "X-PDF-SHA256": "0" * 64}


def _raw_body(op: Operation) -> bytes:
    return {"application/pdf": b"%PDF-1.4\n" + b"0" * 2000 + b"\n%%EOF\n",
            "application/zstd": zstandard.ZstdCompressor().compress(b'{"id": "a", "value": "v"}\n'),
            "text/plain": b"some recognised text\n",
            "application/octet-stream": b"%PDF-1.4\n%%EOF\n"}.get(op.content_type, b"")


def _wsgi(text: str) -> str:
    """A string as it arrives off the wire in a WSGI environ: UTF-8 bytes
    (lone surrogates as a careless client encodes them), read as Latin-1."""
    return text.encode("utf-8", "surrogatepass").decode("latin-1")


def _request(world: World, op: Operation, slot: tuple, hostile: str) -> dict | None:
    good = _good_params(world)
    path, query, headers = op.path, [], {}
    for param in op.params:
        where, name = param["in"], param["name"]
        value = hostile if slot == ("param", name) else good.get(name)
        if value is None:
            if not param.get("required") and slot != ("param", name):
                continue
            value = "1" if param.get("schema", {}).get("type") == "integer" else "x"
        encoded = quote(value.encode("utf-8", "surrogatepass"), safe="")
        if where == "path":
            path = path.replace("{" + name + "}", encoded)
        elif where == "query":
            query.append(f"{quote(name)}={encoded}")
        elif where == "header":
            if any(c in value for c in "\r\n\x00"):
                return None  # no HTTP client sends these in a header: the request never exists
            headers[name] = _wsgi(value)
    token = (world.node.secret if op.path.startswith("/api/v1/fleet/") else
             None if op.path.startswith("/api/v1/assets/") else world.admin)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if "/api/v1/projects/" in op.path:
        headers.setdefault("X-Client-Version", VERSION)
    if op.body_schema is not None:
        body = _put(op.body, slot[1], hostile) if slot[0] == "body" else op.body
        data = json.dumps(body).encode()   # ensure_ascii: a lone surrogate travels as \\udXXX
        headers["Content-Type"] = "application/json"
    else:
        data = _raw_body(op)
        if op.content_type:
            headers["Content-Type"] = op.content_type
        if op.content_type == "application/pdf":
            headers.setdefault("X-PDF-Size", str(len(data)))
            if slot != ("param", "X-PDF-SHA256"):
                headers["X-PDF-SHA256"] = hashlib.sha256(data).hexdigest()
    return {"method": op.method, "path": path + ("?" + "&".join(query) if query else ""),
            "headers": headers, "data": data}


@pytest.fixture(scope="module")
def declared(app):
    return {repr(op): op for op in operations(_doc(app))}


def test_the_document_declares_what_is_fuzzed(declared):
    # Every operation with an input is here: the document was read whole.
    assert list(declared) == OPERATIONS
    assert len(OPERATIONS) >= 50, OPERATIONS
    assert sum(len(op.slots) for op in declared.values()) >= 150


@pytest.mark.parametrize("name", OPERATIONS)
def test_hostile_strings_in_every_declared_input_are_refused_cleanly(declared, world, caplog, name):  # noqa: F811
    op = declared[name]
    caplog.set_level(logging.ERROR)

    @settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.filter_too_much])
    @given(slot=st.sampled_from(op.slots), hostile=HOSTILE)
    def refused_cleanly(slot, hostile):
        request = _request(world, op, slot, hostile)
        if request is None:
            return
        before = world.snapshot()
        response = world.client.open(request["path"], method=request["method"], headers=request["headers"],
                                     data=request["data"])
        what = f"{op} with {slot} = {hostile!r}: {response.status_code} {response.data[:300]!r}"
        assert response.status_code < 500, what
        if response.status_code >= 400:
            if op.path.startswith("/api/"):
                error = response.get_json(silent=True)
                assert error and set(error) == {"error"} and error["error"]["code"], what
            assert world.snapshot() == before, what

    refused_cleanly()
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert tracebacks == [], f"{op}: the master logged tracebacks: {tracebacks[:3]}"
