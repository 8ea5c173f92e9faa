"""Per-worker claim audit (SavewebHQ's claim buckets, DESIGN §5).

Only projects that pace their workers (``worker_claim_qps`` set) pay for
it: each claim adds one to its worker's row for the current minute, with the
jobs it got and the policy version the worker reported, so an operator can
see which workers ignore the pace. Unpaced projects skip the write.
"""
from __future__ import annotations

from sqlalchemy import text

from app.extensions import changed, db

_RECORD = text("""
INSERT INTO worker_claim_buckets (project_id, worker_id, bucket_started_at, claim_requests,
                                  jobs_dispatched, policy_version)
VALUES (:p, :w, date_trunc('minute', now()), 1, :n, :v)
ON CONFLICT (project_id, worker_id, bucket_started_at) DO UPDATE SET
    claim_requests = worker_claim_buckets.claim_requests + 1,
    jobs_dispatched = worker_claim_buckets.jobs_dispatched + EXCLUDED.jobs_dispatched,
    policy_version = EXCLUDED.policy_version
""")


def record(project, worker_id: str, jobs: int, policy_version: int | None) -> None:
    """Count one claim of a paced project. Commits."""
    if project.worker_claim_qps is None:
        return
    db.session.execute(_RECORD, {"p": project.id, "w": worker_id, "n": jobs, "v": policy_version})
    db.session.commit()


def prune(retention_days: int, limit: int = 50_000) -> int:
    """Delete buckets older than the retention. Commits."""
    deleted = changed(text(
        "DELETE FROM worker_claim_buckets WHERE ctid = ANY(ARRAY("
        "SELECT ctid FROM worker_claim_buckets "
        "WHERE bucket_started_at < now() - make_interval(days => :d) LIMIT :n))"),
        {"d": retention_days, "n": limit})
    db.session.commit()
    return deleted


def buckets(project_id: str, limit: int = 500) -> list[dict]:
    rows = db.session.execute(text(
        "SELECT worker_id, floor(extract(epoch FROM bucket_started_at))::bigint, claim_requests, "
        "jobs_dispatched, policy_version FROM worker_claim_buckets WHERE project_id = :p "
        "ORDER BY bucket_started_at DESC, worker_id LIMIT :n"), {"p": project_id, "n": limit}).all()
    return [{"worker_id": r[0], "bucket_started_at": r[1], "claim_requests": r[2],
             "jobs_dispatched": r[3], "policy_version": r[4]} for r in rows]
