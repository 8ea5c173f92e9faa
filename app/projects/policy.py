"""Project policy (DESIGN §5): field rules, defaults per kind, which changes
bump ``policy_version``, and the v1 contract's project request."""
from __future__ import annotations

import math

from app.errors import InvalidRequest
from app.projects.models import UPLOAD_KINDS
from workers.wire.policy import (BY_NAME, CHOICE, FIELDS, INTEGER, MAX_WORKER_ATTEMPTS, RATE, SWITCH,
                                 VERSIONS, Field)
from workers.wire.protocol import is_identifier, is_int

__all__ = ["MAX_WORKER_ATTEMPTS"]

# Fields a worker's behaviour or access depends on: changing one bumps
# policy_version, so that workers re-read the policy (P4).
VERSIONED_FIELDS = frozenset(f.name for f in FIELDS if f.versioned)
FIXED_FIELDS = frozenset(f.name for f in FIELDS if f.fixed)
POLICY_FIELDS = tuple(BY_NAME)
# What the fields whose range does not say it all mean: the API document,
# the CLI's --help and the admin project page show these words.
HELP = {f.name: f.help for f in FIELDS if f.help}


def defaults(kind: str) -> dict:
    pdf = kind == "pdf"
    upload = kind in UPLOAD_KINDS
    documents = kind == "documents"
    return {
        "kind": kind,
        "status": "active",
        "identity_mode": "external_id",
        "claim_order": "fifo",
        "dispatch_qps": None,
        "worker_claim_qps": None,
        "max_jobs_per_claim": 256,
        "max_resets": 3,
        "recommended_lease_seconds": 300,
        "retry_backoff_seconds": 30 if upload else 0,
        "client_versions": [],
        # Papers come from publishers the fleet must not crowd; documents are
        # the master's own files, so an OCR host that wakes may use every core
        # it offers (its --concurrency is the cap).
        "max_in_flight": 6 if pdf else None,
        "max_worker_in_flight": 2 if pdf else None,
        "prefer_new_worker": pdf,
        "max_worker_attempts": 3 if upload else None,
        # A document waiting for a host that sleeps must never fail for it:
        # no task deadline; each run is bounded by the attempt timeout (an
        # hour: a long scan at one page in a few seconds on a slow lane).
        "task_timeout_seconds": 900 if pdf else None,
        "attempt_timeout_seconds": 360 if pdf else 3600 if documents else None,
        "upload_timeout_seconds": 120,
        # Applied by the server alone (like claim_order), so not versioned.
        "fallback_after_seconds": 60,
        # The download fleet's seed fetches locally first; the OCR seed sends
        # work to its strong remote host first (docs/worker.md, "Lanes").
        "lane_order": "local_first" if pdf else "remote_first",
        "share_weight": 1,
    }


def _choice(*options):
    def check(name, value):
        if value not in options:
            raise InvalidRequest(f"{name} must be one of {', '.join(options)}", details={"field": name})
        return value
    return check


def _int_range(lo, hi=None, nullable=False):
    def check(name, value):
        if value is None and nullable:
            return None
        if not is_int(value) or value < lo or (hi is not None and value > hi):
            bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            null = " or null" if nullable else ""
            raise InvalidRequest(f"{name} must be an integer {bound}{null}", details={"field": name})
        return value
    return check


def _positive_rate(name, value):
    if value is None:
        return None
    try:
        rate = float(value) if not isinstance(value, bool) and isinstance(value, (int, float)) else None
    except OverflowError:  # an integer beyond float range
        rate = None
    if rate is None or not math.isfinite(rate) or rate <= 0:
        raise InvalidRequest(f"{name} must be a finite number > 0 or null", details={"field": name})
    return rate


def _bool(name, value):
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false", details={"field": name})
    return value


def _client_versions(name, value):
    """Exact-match versions: each stored as given (never trimmed or merged),
    so a bad entry is an error rather than an allow-list the admin did not type."""
    if not isinstance(value, list) or len(value) > 64:
        raise InvalidRequest(f"{name} must be a list of at most 64 strings", details={"field": name})
    for item in value:
        if (not isinstance(item, str) or not 1 <= len(item.encode("utf-8", "surrogatepass")) <= 128
                or not item.isprintable() or item.strip() != item):
            raise InvalidRequest(f"{name} entries must be printable strings of 1..128 bytes without "
                                 "surrounding whitespace", details={"field": name})
    if len(set(value)) != len(value):
        raise InvalidRequest(f"{name} entries must be unique", details={"field": name})
    return sorted(value)


def _rule(field: Field):
    if field.type == CHOICE:
        return _choice(*field.choices)
    if field.type == INTEGER:
        return _int_range(field.lo, field.hi, nullable=field.nullable)
    if field.type == RATE:
        return _positive_rate
    if field.type == SWITCH:
        return _bool
    if field.type == VERSIONS:
        return _client_versions
    raise AssertionError(f"no rule for {field.type}")


RULES = {field.name: _rule(field) for field in FIELDS}


def validate_fields(body: dict, *, allow=None) -> dict:
    """Check every given field; unknown fields are an error."""
    allow = set(allow) if allow is not None else set(RULES)
    clean = {}
    for name, value in body.items():
        if name not in allow:
            raise InvalidRequest(f"unknown field {name!r}", details={"field": name})
        clean[name] = RULES[name](name, value)
    return clean


def validate_project_id(project_id) -> str:
    if not is_identifier(project_id):
        raise InvalidRequest("project id must be 1..128 of [A-Za-z0-9._:-]", details={"field": "id"})
    return project_id


# The v1 contract's AdminProjectRequest. Its optional fields mean, when
# omitted on a change of an existing project: identity_mode and claim_order
# keep the current value, max_resets and recommended_lease_seconds return to
# their defaults. Fields it does not name (kind, FleetHQ's own policy) are
# never touched by it.
CONTRACT_REQUIRED = ("status", "dispatch_qps", "worker_claim_qps", "max_jobs_per_claim",
                     "client_versions")
CONTRACT_OPTIONAL = ("identity_mode", "claim_order", "max_resets", "recommended_lease_seconds")
CONTRACT_KEPT_WHEN_OMITTED = ("identity_mode", "claim_order")


def validate_contract_request(body: dict) -> dict:
    """Check a contract project request: unknown fields and missing required
    ones are errors, every given value is checked by its rule."""
    clean = validate_fields(body, allow=CONTRACT_REQUIRED + CONTRACT_OPTIONAL)
    for name in CONTRACT_REQUIRED:
        if name not in clean:
            raise InvalidRequest(f"{name} is required", details={"field": name})
    return clean
