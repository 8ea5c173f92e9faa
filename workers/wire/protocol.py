"""Wire protocol v1: the rules both sides of the job API agree on.

The master validates every JobSpec with :func:`normalize_jobspec`; the CLIs run
the same function before sending, so a bad line is reported locally with the
same message the server would give.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import TypeGuard
from urllib.parse import urlsplit, urlunsplit

CLIENT_VERSION_HEADER = "X-Client-Version"
# Existing SavewebHQ v1 workers send this name; it is accepted as an alias.
CLIENT_VERSION_HEADER_ALIAS = "X-SavewebHQ-Client-Version"

IDENTIFIER_RE = re.compile(r"\A[A-Za-z0-9._:-]{1,128}\Z")
JOB_TYPES = ("seed", "asset")
IDENTITY_MODES = ("none", "external_id", "unique_value")

MAX_VALUE_BYTES = 8192
MAX_VIA_BYTES = 8192
MAX_ATTR_BYTES = 8 * 1024
MAX_SPEC_BYTES = 32 * 1024
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

SPEC_FIELDS = ("id", "value", "type", "via", "hops", "attr", "random_key")
SOURCE_FORMAT = "jobs-jsonl-zstd-v1"


class SpecError(ValueError):
    """A JobSpec that breaks a rule of DESIGN §4.2; ``field`` names the culprit."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:32]} is out of range")
    return value


# Arrays and objects nested in one another, at most. A valid body needs a
# handful (an enqueue batch is 3 deep plus its attr objects); without a bound,
# ~1000 levels exhaust the interpreter's recursion limit inside the decoder.
MAX_JSON_DEPTH = 64


class JsonTooDeep(ValueError):
    """A document nesting arrays and objects deeper than ``limit`` levels."""

    def __init__(self, limit: int):
        super().__init__(f"JSON nests arrays and objects deeper than {limit} levels")
        self.limit = limit


def _deeper_than(value, limit: int) -> bool:
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:  # iterative: the decoded document may be hundreds deep
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def _openers(data) -> int:
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return data.count(b"[") + data.count(b"{")


def strict_json_loads(data, *, max_depth: int = MAX_JSON_DEPTH):
    """``json.loads`` that refuses NaN, Infinity and numbers beyond float range
    (none of them is JSON, and jsonb cannot store them) and documents nested
    deeper than ``max_depth`` arrays/objects (:class:`JsonTooDeep`). Every
    refusal is a ValueError; none is a RecursionError."""
    try:
        value = json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise JsonTooDeep(max_depth) from None
    # Fewer brackets than the limit cannot nest past it: skip the walk.
    if _openers(data) > max_depth and _deeper_than(value, max_depth):
        raise JsonTooDeep(max_depth)
    return value


def is_identifier(value) -> TypeGuard[str]:
    return isinstance(value, str) and IDENTIFIER_RE.match(value) is not None


def is_int(value) -> TypeGuard[int]:
    # JSON booleans decode to bool, a subclass of int: they are not integers here.
    return isinstance(value, int) and not isinstance(value, bool)


def compact_json(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, sort_keys=True, allow_nan=False)


def _utf8_len(text: str, field: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates from \ud800 escapes
        raise SpecError(f"{field} is not valid UTF-8", field) from None


def normalize_jobspec(raw, identity_mode: str = "external_id", *, allow_random_key: bool = True) -> dict:
    """Check one JobSpec and return its normalized form.

    Parameters:
        raw: the decoded JSON object.
        identity_mode: the project's identity mode (§4.3); decides whether
            ``id`` is required or rejected.
        allow_random_key: False for source files, which may not carry one.

    Returns:
        A dict with ``value`` and ``type`` always set and the optional fields
        only when given.

    Raises:
        SpecError: with a message and the offending field.
    """
    if not isinstance(raw, dict):
        raise SpecError("job must be a JSON object")
    allowed = SPEC_FIELDS if allow_random_key else SPEC_FIELDS[:-1]
    for key in raw:
        if key not in allowed:
            raise SpecError(f"unknown field {key!r}", key)
    spec: dict = {}
    value = raw.get("value")
    if not isinstance(value, str):
        raise SpecError("value is required and must be a string", "value")
    if not 1 <= _utf8_len(value, "value") <= MAX_VALUE_BYTES:
        raise SpecError(f"value must be 1..{MAX_VALUE_BYTES} bytes", "value")
    spec["value"] = value

    if "id" in raw:
        if identity_mode != "external_id":
            raise SpecError(f"id is not accepted in {identity_mode} projects", "id")
        if not is_identifier(raw["id"]):
            raise SpecError("id must be 1..128 of [A-Za-z0-9._:-]", "id")
        spec["id"] = raw["id"]
    elif identity_mode == "external_id":
        raise SpecError("id is required in external_id projects", "id")

    job_type = raw.get("type", "seed")
    if job_type not in JOB_TYPES:
        raise SpecError("type must be 'seed' or 'asset'", "type")
    spec["type"] = job_type

    if raw.get("via") is not None:
        via = raw["via"]
        if not isinstance(via, str) or _utf8_len(via, "via") > MAX_VIA_BYTES:
            raise SpecError(f"via must be a string of at most {MAX_VIA_BYTES} bytes", "via")
        spec["via"] = via
    if raw.get("hops") is not None:
        hops = raw["hops"]
        if not is_int(hops) or not 0 <= hops <= INT32_MAX:
            raise SpecError("hops must be an integer >= 0", "hops")
        spec["hops"] = hops
    if raw.get("attr") is not None:
        attr = raw["attr"]
        if not isinstance(attr, dict):
            raise SpecError("attr must be a JSON object", "attr")
        try:
            encoded = compact_json(attr)
        except (TypeError, ValueError):
            raise SpecError("attr is not encodable JSON", "attr") from None
        if len(encoded.encode("utf-8", "surrogatepass")) > MAX_ATTR_BYTES:
            raise SpecError(f"attr must encode to at most {MAX_ATTR_BYTES} bytes", "attr")
        if "\\u0000" in encoded:
            raise SpecError("attr may not contain NUL characters", "attr")
        spec["attr"] = attr
    if raw.get("random_key") is not None:
        key = raw["random_key"]
        if not is_int(key) or not INT32_MIN <= key <= INT32_MAX:
            raise SpecError("random_key must be a signed 32-bit integer", "random_key")
        spec["random_key"] = key
    for field in ("value", "via"):
        if field in spec and "\x00" in spec[field]:
            raise SpecError(f"{field} may not contain NUL characters", field)
    if _encoded_bound(spec) > MAX_SPEC_BYTES and len(compact_json(spec).encode("utf-8")) > MAX_SPEC_BYTES:
        raise SpecError(f"job must encode to at most {MAX_SPEC_BYTES} bytes")
    return spec


# Keys, punctuation, type, hops and random_key of a spec's JSON: under 100 bytes.
_SPEC_FRAME_BYTES = 160


def _encoded_bound(spec: dict) -> int:
    """At least the size of ``compact_json(spec)`` in UTF-8, without encoding
    it (enqueue checks every job): a character of a string encodes to at most
    6 bytes (``\\u001f``), and attr was measured already."""
    chars = len(spec["value"]) + len(spec.get("via") or "") + len(spec.get("id") or "")
    attr = spec.get("attr")
    return 6 * chars + (MAX_ATTR_BYTES if attr is not None else 0) + _SPEC_FRAME_BYTES


def default_job_id(value: str, job_type: str = "seed") -> str:
    """The default external id: ``j1_`` + sha256(type, NUL, value)."""
    digest = hashlib.sha256(job_type.encode() + b"\x00" + value.encode("utf-8")).hexdigest()
    return "j1_" + digest


def value_digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8")).digest()


def master_base_url(url: str, *, allow_http: bool, http_hint: str) -> str:
    """The master's base URL (http(s), no credentials, query or fragment) without
    a trailing slash; plain http only with ``allow_http``, since the bearer token
    would cross the network in clear. ``http_hint`` says how the caller allows it.

    Raises:
        ValueError: with a message for the user.
    """
    parts = urlsplit(str(url).strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"master URL must be http(s)://host[:port][/path], got {url!r}")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError("master URL may not carry credentials, a query or a fragment")
    if parts.scheme == "http" and not allow_http:
        raise ValueError(f"refusing plain http to {parts.hostname}: the token would travel in "
                         f"clear; use https, or {http_hint}")
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
