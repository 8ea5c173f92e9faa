"""Checks on the staged SavewebHQ rows, before anything is written.

Two kinds, each one set-based query over a stage table:

- *source* checks: rows FleetHQ's schema cannot hold as they are (a job type
  other than seed/asset, hops beyond a 32-bit integer, an identity that does
  not match its project's identity mode or a value digest that is not the
  SHA-256 of the value). Any of them stops the import.
- *conflict* checks: the target already holds a row under the same key with
  other content (a user, project, machine token, worker mapping or job id), or
  a different job holds a staged job's identity. Any of them stops the import
  too: a row is written only when the target has nothing under its key, and a
  row already there must be equal, which is what makes a rerun a no-op.

Each check yields its count and the first few offending keys for the message.
"""
from __future__ import annotations

from dataclasses import dataclass

import psycopg

from app.errors import Conflict, InvalidRequest
from app.imports.savewebhq_marks import with_verdict

EXAMPLES = 5

SOURCE_CHECKS = {
    "job type is neither seed nor asset":
        "SELECT s.id FROM sw_jobs s WHERE COALESCE(s.type, '') NOT IN ('', 'seed', 'asset')",
    "hops is not an integer 0..2147483647":
        "SELECT s.id FROM sw_jobs s WHERE s.hops IS NOT NULL "
        "AND NOT (s.hops ~ '^[0-9]{1,10}$' AND s.hops::bigint <= 2147483647)",
    "attr is not a JSON object":
        "SELECT s.id FROM sw_jobs s WHERE s.attr IS NOT NULL AND jsonb_typeof(s.attr) <> 'object'",
    "identity does not match the project's identity mode":
        "SELECT s.id FROM sw_jobs s JOIN sw_projects p ON p.id = s.project_id "
        "WHERE (p.identity_mode = 'external_id') <> (s.ext_id IS NOT NULL) "
        "OR (p.identity_mode = 'unique_value') <> (s.value_sha256 IS NOT NULL)",
    "unique_value_digest is not the SHA-256 of the value":
        "SELECT s.id FROM sw_jobs s WHERE s.value_sha256 IS NOT NULL "
        "AND s.value_sha256 <> sha256(convert_to(s.value, 'UTF8'))",
}

# Compared fields are what the import writes (FleetHQ-only fields are free).
# A row this import marked before is not compared: savewebhq_marks decides
# what changed on which side. Only rows with no mark ("legacy": carried before
# marks existed, or FleetHQ's own) must be equal; a key SavewebHQ's new or
# changed rows take must be free.
_LEGACY = ("legacy",)
CONFLICT_CHECKS = {
    "users": "SELECT s.id FROM sw_users s JOIN users u ON u.id = s.id "
             "WHERE (u.status, u.roles, u.github_login) IS DISTINCT FROM "
             f"(s.status, s.roles, s.github_login) AND {with_verdict('users', _LEGACY)}",
    "machine_tokens": "SELECT s.user_id FROM sw_tokens s JOIN machine_tokens m "
                      "ON m.user_id = s.user_id OR m.token_hash = s.token_hash "
                      "WHERE NOT s.revoked AND (m.user_id, m.token_hash) <> (s.user_id, s.token_hash) "
                      f"AND (m.user_id <> s.user_id OR {with_verdict('machine_tokens', _LEGACY)})",
    "projects": "SELECT s.id FROM sw_projects s JOIN projects p "
                f"ON p.id = s.id AND {with_verdict('projects', _LEGACY)} "
                "WHERE (p.kind, p.status, p.identity_mode, p.claim_order, p.dispatch_qps, "
                "p.worker_claim_qps, p.max_jobs_per_claim, p.max_resets, "
                "p.recommended_lease_seconds, p.client_versions, p.policy_version) "
                "IS DISTINCT FROM ('generic', s.status, s.identity_mode, s.claim_order, "
                "s.dispatch_qps, s.worker_claim_qps, s.max_jobs_per_claim, s.max_resets, "
                "s.recommended_lease_seconds::int, s.client_versions, s.policy_version::int)",
    "worker_users": "SELECT s.worker_id FROM sw_workers s JOIN worker_users w "
                    "ON w.worker_id = s.worker_id WHERE w.user_id <> s.user_id",
    "jobs (id in use by another job)":
        f"SELECT s.id FROM sw_jobs s JOIN jobs j ON j.id = s.id AND {with_verdict('jobs', _LEGACY)} "
        "WHERE (j.project_id, j.ext_id, j.value, j.type, j.via, j.hops, j.attr, j.random_key, "
        "j.state, j.resets) IS DISTINCT FROM (s.project_id, s.ext_id, s.value, "
        "COALESCE(NULLIF(s.type, ''), 'seed'), s.via, s.hops::int, s.attr, s.random_key, "
        "s.state, s.resets)",
    "jobs (external id held by another job)":
        "SELECT s.id FROM sw_jobs s JOIN jobs j ON j.project_id = s.project_id "
        "AND j.ext_id = s.ext_id AND j.id <> s.id",
    "jobs (value held by another job)":
        "SELECT s.id FROM sw_jobs s JOIN jobs j ON j.project_id = s.project_id "
        "AND j.value_sha256 = s.value_sha256 AND j.id <> s.id",
}


@dataclass
class Finding:
    what: str
    count: int
    examples: list

    def describe(self) -> str:
        shown = ", ".join(str(e) for e in self.examples)
        more = f" (first {len(self.examples)}: {shown})" if shown else ""
        return f"{self.what}: {self.count}{more}"


def _run(tgt: psycopg.Connection, checks: dict) -> list[Finding]:
    findings = []
    for what, query in checks.items():
        count, examples = tgt.execute(
            f"SELECT count(*), (array_agg(k ORDER BY k))[1:{EXAMPLES}] FROM ({query}) AS f(k)").fetchone()
        if count:
            findings.append(Finding(what, count, list(examples)))
    return findings


def check_source(tgt: psycopg.Connection) -> None:
    """Raises:
        InvalidRequest: ``invalid_source``, listing every failed check."""
    findings = _run(tgt, SOURCE_CHECKS)
    if findings:
        raise InvalidRequest(
            "the SavewebHQ database holds rows FleetHQ cannot import; nothing was written: "
            + "; ".join(f.describe() for f in findings),
            code="invalid_source", details={f.what: f.examples for f in findings})


def check_conflicts(tgt: psycopg.Connection) -> None:
    """Raises:
        Conflict: ``import_conflict``, listing every kind of conflicting row."""
    findings = _run(tgt, CONFLICT_CHECKS)
    if findings:
        raise Conflict(
            "the target already holds other data under the same keys; nothing was written: "
            + "; ".join(f.describe() for f in findings),
            code="import_conflict", details={f.what: f.examples for f in findings})


def warnings(tgt: psycopg.Connection, tokens_plain_mismatch: int) -> list[str]:
    """Things the import carries over as well as it can, told to the operator."""
    out = []
    orphan, examples = tgt.execute(
        f"SELECT count(*), (array_agg(id ORDER BY id))[1:{EXAMPLES}] FROM sw_jobs "
        "WHERE state = 'wip' AND worker_owner IS NULL").fetchone()
    if orphan:
        out.append(f"{orphan} in-flight jobs have a worker missing from the worker map "
                   f"(first: {', '.join(map(str, examples))}); nobody can finish them, "
                   "their leases will run out and they go back to the queue")
    if tokens_plain_mismatch:
        out.append(f"{tokens_plain_mismatch} machine tokens kept in clear do not match their "
                   "stored digest; they are carried by the digest and are not viewable")
    legacy = tgt.execute("SELECT count(*) FROM sw_tokens WHERE NOT revoked AND NOT viewable").fetchone()[0]
    if legacy:
        out.append(f"{legacy} machine tokens are known only by their SavewebHQ digest: they "
                   "authenticate, and become viewable on their first use")
    return out
