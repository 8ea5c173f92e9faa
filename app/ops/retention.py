"""Retention: finished rows are pruned by the clock, a bounded batch at a time.

Each kind below deletes at most ``PRUNE_BATCH`` rows per tick in one short
statement (row locks on the rows it deletes, nothing else; rows locked by a
writer are skipped), so a backlog of old rows drains over several ticks
instead of holding locks for minutes. What each tick pruned is recorded in
``retention_stats`` (:mod:`app.ops.retention_stats`).

What is never pruned:

- a job's current attempt, and any attempt that is not finished;
- a ``done`` attempt: it completed its job and carries the outcome and the
  artifact receipts the job pages and the SavewebHQ contract show;
- an attempt whose upload row still means something (an archived, live or
  held upload, or one holding spool quota); a failed or expired upload row is
  pruned together with its attempt;
- an outbox row that is not done, a hook delivery that is not ``delivered``
  (a ``skipped`` one is owed to a consumer that may be re-enabled), and a
  job whose upload such a delivery still needs;
- ``assets``: they are the archive's index.

Pruning a finished job (off by default) forgets its identity: enqueueing
the same external id or value again creates a new job.
"""
from __future__ import annotations

from sqlalchemy import text

from app.extensions import db
from app.ops import retention_stats

# Attempts are pruned per job, walking jobs in id order: this many job ids
# per tick, resuming where the last tick stopped, so a tick reads a bounded
# range of the primary key however big ``jobs`` is.
ATTEMPT_SCAN_JOB_IDS = 100_000
# Finished jobs are looked for among the oldest ids of each (project, state),
# at most this many per tick: ids follow enqueue order, so the oldest
# finished jobs are at the front.
JOB_SCAN_ROWS = 50_000
FINISHED_ATTEMPT_STATES = ("failed", "expired", "cancelled")
FINISHED_JOB_STATES = ("done", "failed", "reset_exhausted")
KINDS = ("attempts", "outbox", "hook_deliveries", "page_sessions", "rate_limits", "jobs", "audit_log")

_PRUNE_ATTEMPTS = text("""
WITH scanned AS (
    SELECT id, current_attempt_id FROM jobs
    WHERE id > :cursor AND id <= :cursor + :span AND attempts_count > :keep
), victims AS (
    SELECT old.id FROM scanned j
    CROSS JOIN LATERAL (
        SELECT a.id, a.state, a.worker_id, a.worker_owner FROM attempts a WHERE a.job_id = j.id
        ORDER BY a.id DESC OFFSET :keep
    ) old
    WHERE old.state IN ('failed', 'expired', 'cancelled')
      AND old.id IS DISTINCT FROM j.current_attempt_id
      -- the newest attempt of each worker stays: the distinct-worker cap and
      -- prefer_new_worker must not forget who has tried the job
      AND EXISTS (SELECT 1 FROM attempts b WHERE b.job_id = j.id AND b.id > old.id
                  AND b.worker_id = old.worker_id AND b.worker_owner IS NOT DISTINCT FROM old.worker_owner)
      AND NOT EXISTS (SELECT 1 FROM uploads u WHERE u.attempt_id = old.id
                      AND (u.state NOT IN ('failed', 'expired') OR u.reserved_bytes > 0))
    LIMIT :n
), locked AS (
    SELECT id FROM attempts WHERE id IN (SELECT id FROM victims) FOR UPDATE SKIP LOCKED
), receipts AS (
    DELETE FROM uploads WHERE attempt_id IN (SELECT id FROM locked)
)
DELETE FROM attempts WHERE id IN (SELECT id FROM locked)
""")


def prune_attempts(keep: int, batch: int) -> int:
    """Finished attempts beyond the newest ``keep`` of each job. Commits.

    Scans one range of job ids; when the range yields less than a full
    batch the cursor moves on (and wraps after the last job), otherwise the
    next tick takes the same range again.
    """
    cursor = retention_stats.cursor("attempts")
    pruned = db.session.execute(_PRUNE_ATTEMPTS, {
        "cursor": cursor, "span": ATTEMPT_SCAN_JOB_IDS, "keep": keep, "n": batch}).rowcount
    if pruned < batch:
        last_id = db.session.execute(text("SELECT max(id) FROM jobs")).scalar() or 0
        cursor = cursor + ATTEMPT_SCAN_JOB_IDS
        retention_stats.set_cursor("attempts", 0 if cursor >= last_id else cursor)
    db.session.commit()
    return pruned


def _delete_batch(table: str, where: str, batch: int, *, order: str | None = None,
                  key: str = "id", **params) -> int:
    """Delete at most ``batch`` rows matching ``where`` (oldest by ``order``
    first). The outer ``where`` re-checks rows that changed while the batch
    was being locked. Commits."""
    order_by = f"ORDER BY {order} " if order else ""
    pruned = db.session.execute(text(
        f"DELETE FROM {table} WHERE {key} = ANY(ARRAY(SELECT {key} FROM {table} "
        f"WHERE {where} {order_by}LIMIT :n FOR UPDATE SKIP LOCKED)) AND {where}"),
        {"n": batch, **params}).rowcount
    db.session.commit()
    return pruned


def prune_outbox(days: int, batch: int) -> int:
    """Outbox rows done more than ``days`` ago; pending rows are never touched. Commits."""
    return _delete_batch("outbox", "done_at < now() - make_interval(days => :d)", batch,
                         order="done_at", d=days)


def prune_hook_deliveries(days: int, batch: int) -> int:
    """Deliveries ``delivered`` more than ``days`` ago. Commits.

    ``skipped`` ones are kept: they are work owed to a consumer disabled on
    purpose, sent again when it is re-enabled."""
    return _delete_batch(
        "hook_deliveries",
        "state = 'delivered' AND updated_at < now() - make_interval(days => :d)",
        batch, order="updated_at", d=days)


# Sessions and rate-limit rows are few (recent traffic only) and have no
# index on their expiry; ctid addresses the rows found without a key lookup.
def prune_page_sessions(batch: int) -> int:
    """Page sessions past their absolute expiry (they no longer sign anyone in). Commits."""
    return _delete_batch("page_sessions", "expires_at <= now()", batch, key="ctid")


def prune_rate_limits(batch: int) -> int:
    """Rate-limit counters whose window has ended. Commits."""
    return _delete_batch("rate_limits", "window_end < now()", batch, key="ctid")


def prune_audit_log(days: int, batch: int) -> int:
    """Audit rows older than ``days``. Commits."""
    return _delete_batch("audit_log", "at < now() - make_interval(days => :d)", batch,
                         order="at", d=days)


_PRUNE_JOBS = text("""
WITH oldest AS (
    SELECT id, updated_at FROM jobs WHERE project_id = :p AND state = :s ORDER BY id LIMIT :scan
), locked AS (
    SELECT j.id FROM jobs j
    WHERE j.id IN (SELECT id FROM oldest WHERE updated_at < now() - make_interval(days => :d))
      AND j.state = :s
      AND NOT EXISTS (SELECT 1 FROM uploads u WHERE u.job_id = j.id
                      AND (u.state NOT IN ('done', 'failed', 'expired') OR u.reserved_bytes > 0))
      -- a delivery reads its upload row: keep both until it has ended for good
      AND NOT EXISTS (SELECT 1 FROM uploads u JOIN hook_deliveries d ON d.attempt_id = u.attempt_id
                      WHERE u.job_id = j.id AND d.state <> 'delivered')
    ORDER BY j.id LIMIT :n FOR UPDATE SKIP LOCKED
), receipts AS (
    DELETE FROM uploads WHERE job_id IN (SELECT id FROM locked)
)
DELETE FROM jobs WHERE id IN (SELECT id FROM locked)
""")


def prune_jobs(days: int, batch: int) -> int:
    """Finished jobs last changed more than ``days`` ago, with their attempts
    (cascade) and upload receipts; the archived assets stay. Commits."""
    pruned = 0
    projects = db.session.execute(text("SELECT id FROM projects ORDER BY id")).scalars().all()
    for project_id in projects:
        for state in FINISHED_JOB_STATES:
            if pruned >= batch:
                break
            pruned += db.session.execute(_PRUNE_JOBS, {
                "p": project_id, "s": state, "scan": JOB_SCAN_ROWS, "d": days,
                "n": batch - pruned}).rowcount
            db.session.commit()
    return pruned


def run(config) -> dict[str, int]:
    """One tick: every enabled kind once, each at most ``PRUNE_BATCH`` rows.

    Returns:
        Rows pruned per kind (0 for a kind that is disabled).
    """
    batch = int(config["PRUNE_BATCH"])
    keep_attempts = int(config["KEEP_ATTEMPTS_PER_JOB"])
    outbox_days = int(config["KEEP_DONE_OUTBOX_DAYS"])
    job_days = int(config["KEEP_FINISHED_JOBS_DAYS"])
    audit_days = int(config["KEEP_AUDIT_DAYS"])
    pruned = {
        "attempts": prune_attempts(keep_attempts, batch) if keep_attempts else 0,
        "outbox": prune_outbox(outbox_days, batch) if outbox_days else 0,
        "hook_deliveries": prune_hook_deliveries(outbox_days, batch) if outbox_days else 0,
        "page_sessions": prune_page_sessions(batch),
        "rate_limits": prune_rate_limits(batch),
        "jobs": prune_jobs(job_days, batch) if job_days else 0,
        "audit_log": prune_audit_log(audit_days, batch) if audit_days else 0,
    }
    retention_stats.record(pruned)
    return pruned
