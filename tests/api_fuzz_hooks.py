"""Schemathesis hooks for fuzzing a live master (loaded through
``SCHEMATHESIS_HOOKS`` by :mod:`tests.api_fuzz`).

They keep the run meaningful, not lenient: every answer is still checked.
- The fuzzing admin's own user is never changed, deleted or re-keyed
  (schemathesis learns its id from ``GET /admin/users`` and would lock
  itself out): such a call goes to another user id instead.
- Long-polls are capped at 50 ms so a bounded run stays bounded.
- Raw bodies (PDF uploads, zstd sources) get serializers: the generated
  bytes as they are, and for sources also wrapped in a zstd frame so the line
  reader is reached.
"""
from __future__ import annotations

import os

import schemathesis
import zstandard

ADMIN_ID = os.environ.get("FLEETHQ_FUZZ_ADMIN", "fuzz-admin")
MAX_WAIT_MS = 50


def _as_bytes(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return repr(value).encode()


@schemathesis.serializer("application/pdf")
def _pdf(ctx, value):
    return _as_bytes(value)


@schemathesis.serializer("application/zstd")
def _zstd(ctx, value):
    data = _as_bytes(value)
    if data[:4] == b"\x28\xb5\x2f\xfd":
        return data
    return zstandard.ZstdCompressor().compress(data)


@schemathesis.hook
def before_call(context, case, kwargs):
    params = case.path_parameters or {}
    if params.get("user_id") == ADMIN_ID:
        params["user_id"] = ADMIN_ID + "-not"
    for name in ("wait_ms",):
        if isinstance(case.body, dict) and isinstance(case.body.get(name), int) \
                and not isinstance(case.body.get(name), bool) and case.body[name] > MAX_WAIT_MS:
            case.body[name] = MAX_WAIT_MS
        query = case.query or {}
        raw = query.get(name)
        if isinstance(raw, int) and not isinstance(raw, bool) and raw > MAX_WAIT_MS:
            query[name] = MAX_WAIT_MS
        elif isinstance(raw, str) and raw.isascii() and raw.isdigit() and int(raw) > MAX_WAIT_MS:
            query[name] = str(MAX_WAIT_MS)
