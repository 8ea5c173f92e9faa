"""Path and query parameters of the admin job routes.

The contract's routes read them as its server does: base-10 int64 values,
unknown query parameters ignored, ``limit`` 1..200 with 50 by default.
FleetHQ's own routes keep their stricter reading (unknown parameters are
an error, ``limit`` defaults to 100, ``status`` may be ``staged``).
"""
from __future__ import annotations

from app.errors import InvalidRequest
from app.projects import jobs_admin

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
CONTRACT_LIMIT, FLEETHQ_LIMIT, MAX_LIMIT = 50, 100, 200


def int64(raw: str) -> int | None:
    """A base-10 int64 with an optional sign, or None when ``raw`` is not one."""
    digits = raw[1:] if raw[:1] in "+-" else raw
    if not digits or len(digits) > 19 or not digits.isascii() or not digits.isdigit():
        return None
    value = int(raw)
    return value if INT64_MIN <= value <= INT64_MAX else None


def job_id(raw: str) -> int:
    value = int64(raw)
    if value is None or value < 1:
        raise InvalidRequest("job_id must be an integer >= 1", details={"field": "job_id"})
    return value


def _bounded(args, name: str, default: int, lo: int, hi: int) -> int:
    raw = args.get(name, "")
    if raw == "":
        return default
    value = int64(raw)
    if value is None or not lo <= value <= hi:
        raise InvalidRequest(f"{name} must be an integer {lo}..{hi}", details={"field": name})
    return value


def contract_job_query(args) -> tuple[str | None, int, int]:
    """``(status, after_job_id, limit)`` of a contract job list."""
    status = args.get("status") or None
    if status is not None and not jobs_admin.valid_contract_status(status):
        raise InvalidRequest(f"status must be one of {', '.join(jobs_admin.CONTRACT_STATUSES)}",
                             details={"field": "status"})
    after = _bounded(args, "after_job_id", 0, 0, INT64_MAX)
    return status, after, _bounded(args, "limit", CONTRACT_LIMIT, 1, MAX_LIMIT)


def fleethq_job_query(args) -> tuple[str | None, int | None, int]:
    """``(status, after_job_id, limit)`` of a FleetHQ job list."""
    unknown = set(args) - {"status", "after_job_id", "limit"}
    if unknown:
        raise InvalidRequest(f"unknown query parameter {sorted(unknown)[0]!r}",
                             details={"field": sorted(unknown)[0]})
    status = args.get("status") or None
    if status is not None and not jobs_admin.valid_status(status):
        raise InvalidRequest("unknown status", details={"field": "status"})
    raw = args.get("after_job_id") or None
    after = None
    if raw is not None:
        after = int64(raw)
        if after is None or after < 0 or not raw.isdigit():
            raise InvalidRequest("after_job_id must be a decimal job_id",
                                 details={"field": "after_job_id"})
    return status, after, _bounded(args, "limit", FLEETHQ_LIMIT, 1, MAX_LIMIT)
