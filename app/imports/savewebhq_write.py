"""Set-based writes from the stage tables into FleetHQ's tables.

Every statement inserts only rows the target does not hold yet (the checks
have already proved that rows it does hold are equal), so the same
statements serve the first run and a rerun. Jobs go in batches of job-id
ranges, each one statement that also creates the job's attempts: the job
counters' statement triggers then add one delta row per (project, state) and
batch, so project summaries are right the moment the import commits.

How a SavewebHQ job becomes FleetHQ attempts (SavewebHQ keeps no attempt
history, only the current lease and the last outcome or error):

=================================  ==========================================
SavewebHQ job                      FleetHQ attempts (oldest first)
=================================  ==========================================
todo                               none, or one failed attempt when it carries
                                   an execution error (a retryable failure)
wip                                that failed attempt if any, then a running
                                   attempt with ``wire_id`` = ``attempt_id``,
                                   the worker, its owner and the lease
done                               a done attempt, ``outcome`` =
                                   ``{"outcome": …, "artifact_receipts": […]}``
failed                             a failed attempt (``retryable`` false)
reset_exhausted by a failure       a failed attempt (``retryable`` true)
reset_exhausted by lease expiries  the failed attempt if any, then an
                                   expired attempt
=================================  ==========================================

Attempts of the past carry the worker id ``IMPORTED_WORKER`` (SavewebHQ does
not record who finished a job) and the job's completion or update time.
"""
from __future__ import annotations

import psycopg

from app.imports.savewebhq_marks import KINDS, TERMINAL, with_verdict
from app.projects.policy import defaults

IMPORTED_WORKER = "savewebhq-import"

USERS = f"""
INSERT INTO users (id, status, roles, github_login, created_at, updated_at)
SELECT s.id, s.status, s.roles, s.github_login, s.created_at, s.updated_at FROM sw_users s
WHERE {with_verdict('users', ('new',))}
"""

USERS_CAUGHT_UP = f"""
UPDATE users t SET status = s.status, roles = s.roles, github_login = s.github_login,
    updated_at = s.updated_at
FROM sw_users s WHERE t.id = s.id AND {with_verdict('users', ('catch_up',))}
"""

# A token SavewebHQ rotated or revoked since: the one here goes first.
TOKENS_REPLACED = f"""
DELETE FROM machine_tokens t USING sw_tokens s
WHERE t.user_id = s.user_id AND {with_verdict('machine_tokens', ('catch_up',))}
"""

TOKENS = f"""
INSERT INTO machine_tokens (user_id, token_hash, created_at)
SELECT s.user_id, s.token_hash, s.created_at FROM sw_tokens s
WHERE NOT s.revoked AND {with_verdict('machine_tokens', ('new', 'catch_up'))}
RETURNING user_id
"""

PROJECTS = f"""
WITH new AS (
    INSERT INTO projects (id, kind, status, identity_mode, claim_order, dispatch_qps,
        worker_claim_qps, max_jobs_per_claim, max_resets, recommended_lease_seconds,
        retry_backoff_seconds, client_versions, max_in_flight, max_worker_in_flight,
        prefer_new_worker, task_timeout_seconds, attempt_timeout_seconds,
        upload_timeout_seconds, policy_version, created_at, updated_at)
    SELECT s.id, 'generic', s.status, s.identity_mode, s.claim_order, s.dispatch_qps,
        s.worker_claim_qps, s.max_jobs_per_claim, s.max_resets, s.recommended_lease_seconds,
        %(retry_backoff_seconds)s, s.client_versions, %(max_in_flight)s,
        %(max_worker_in_flight)s, %(prefer_new_worker)s, %(task_timeout_seconds)s,
        %(attempt_timeout_seconds)s, %(upload_timeout_seconds)s, s.policy_version,
        s.created_at, s.updated_at
    FROM sw_projects s WHERE {with_verdict('projects', ('new',))}
    RETURNING id
)
INSERT INTO project_dispatch (project_id, tokens) SELECT id, 0 FROM new
"""

PROJECTS_CAUGHT_UP = f"""
UPDATE projects t SET status = s.status, identity_mode = s.identity_mode,
    claim_order = s.claim_order, dispatch_qps = s.dispatch_qps,
    worker_claim_qps = s.worker_claim_qps, max_jobs_per_claim = s.max_jobs_per_claim,
    max_resets = s.max_resets, recommended_lease_seconds = s.recommended_lease_seconds,
    client_versions = s.client_versions, policy_version = s.policy_version,
    updated_at = s.updated_at
FROM sw_projects s WHERE t.id = s.id AND {with_verdict('projects', ('catch_up',))}
"""

WORKERS = """
INSERT INTO worker_users (worker_id, user_id)
SELECT s.worker_id, s.user_id FROM sw_workers s
WHERE NOT EXISTS (SELECT 1 FROM worker_users w WHERE w.worker_id = s.worker_id)
"""

# The state of the attempt that ended (or holds) the job; NULL: none.
FINAL_ATTEMPT = """CASE s.state WHEN 'wip' THEN 'running' WHEN 'done' THEN 'done'
    WHEN 'failed' THEN 'failed'
    WHEN 'reset_exhausted' THEN CASE WHEN s.completed_at IS NOT NULL AND s.error IS NOT NULL
                                     THEN 'failed' ELSE 'expired' END END"""
# An execution error the final attempt does not explain came from an earlier one.
EARLIER_FAILURE = "s.error IS NOT NULL AND ({final}) IS DISTINCT FROM 'failed'"

NEW_JOBS = f"FROM sw_jobs s WHERE {with_verdict('jobs', ('new',))}"

# The attempt that ended (or holds) a job, after (id, job_id, project_id):
# worker_id, worker_owner, state, created_at, lease_expires_at, finished_at,
# outcome, error, wire_id — over a row of sw_jobs with its final_state.
FINAL_ATTEMPT_ROW = """CASE WHEN final_state = 'running' THEN worker_id ELSE %(imported)s END,
        CASE WHEN final_state = 'running' THEN worker_owner END,
        final_state,
        COALESCE(completed_at, updated_at),
        COALESCE(lease_expires_at, completed_at, updated_at),
        CASE WHEN final_state <> 'running' THEN COALESCE(completed_at, updated_at) END,
        CASE WHEN final_state = 'done' THEN jsonb_build_object(
            'outcome', outcome, 'artifact_receipts', COALESCE(receipts, '[]'::jsonb)) END,
        CASE WHEN final_state = 'failed' THEN jsonb_build_object(
            'retryable', state = 'reset_exhausted', 'error', error) END,
        CASE WHEN final_state = 'running' THEN wire_id END"""

ATTEMPTS_PLANNED = f"""
SELECT state, count(*) FROM (
    SELECT 'failed' AS state {NEW_JOBS} AND {EARLIER_FAILURE.format(final=FINAL_ATTEMPT)}
    UNION ALL
    SELECT {FINAL_ATTEMPT} {NEW_JOBS} AND s.state <> 'todo'
) planned GROUP BY state
"""

JOBS = f"""
WITH picked AS MATERIALIZED (
    SELECT s.*, {FINAL_ATTEMPT} AS final_state,
           {EARLIER_FAILURE.format(final=FINAL_ATTEMPT)} AS failed_before
    {NEW_JOBS} AND s.id >= %(lo)s AND s.id < %(hi)s
), n AS MATERIALIZED (
    -- Attempt ids come from FleetHQ's own sequence, the earlier one first.
    SELECT p.*,
           CASE WHEN p.failed_before THEN nextval(CAST(%(attempt_seq)s AS regclass)) END AS earlier_id,
           CASE WHEN p.final_state IS NOT NULL THEN nextval(CAST(%(attempt_seq)s AS regclass)) END AS final_id
    FROM picked p ORDER BY p.id
), new_jobs AS (
    INSERT INTO jobs (id, project_id, ext_id, value_sha256, value, type, via, hops, attr,
        random_key, state, created_at, updated_at, not_before, current_attempt_id, worker_id,
        worker_owner, lease_expires_at, resets, attempts_count, last_error)
    SELECT id, project_id, ext_id, value_sha256, value, COALESCE(NULLIF(type, ''), 'seed'), via,
        hops::int, attr, random_key, state, created_at, updated_at, created_at,
        COALESCE(final_id, earlier_id), worker_id, worker_owner, lease_expires_at, resets,
        (earlier_id IS NOT NULL)::int + (final_id IS NOT NULL)::int, error
    FROM n
    RETURNING 1
), new_attempts AS (
    INSERT INTO attempts (id, job_id, project_id, worker_id, worker_owner, state, created_at,
        lease_expires_at, finished_at, outcome, error, wire_id)
    SELECT earlier_id, id, project_id, %(imported)s, NULL, 'failed', updated_at, updated_at,
        updated_at, NULL, jsonb_build_object('retryable', true, 'error', error), NULL
    FROM n WHERE earlier_id IS NOT NULL
    UNION ALL
    SELECT final_id, id, project_id,
        {FINAL_ATTEMPT_ROW}
    FROM n WHERE final_id IS NOT NULL
    RETURNING state
)
SELECT (SELECT count(*) FROM new_jobs),
       (SELECT COALESCE(jsonb_object_agg(state, c), '{{}}') FROM
            (SELECT state, count(*) AS c FROM new_attempts GROUP BY state) x)
"""


# Jobs SavewebHQ moved on since the last run (savewebhq_marks: catch_up, and
# finished_there). The job row is updated in place; the attempt running here
# goes on when the source still names it (a renewed lease) or ended the job, else
# it ends (failed, when the source now carries a new execution error; else
# expired) and the attempt the source's state implies is added, as a first
# import would make it. Rows are locked and checked again: a job FleetHQ
# changed meanwhile is not taken, and the caller refuses the run.
BRING_OVER = f"""
WITH b AS MATERIALIZED (
    SELECT s.*, t.current_attempt_id AS cur, t.last_error AS cur_error,
           {FINAL_ATTEMPT} AS final_state
    FROM sw_jobs s
    JOIN sw_verdicts v ON v.kind = 'jobs' AND v.key = CAST(s.id AS text)
    JOIN savewebhq_marks m ON m.kind = 'jobs' AND m.key = v.key
    JOIN jobs t ON t.id = s.id
    WHERE s.id >= %(lo)s AND s.id < %(hi)s
      AND ((v.verdict = 'catch_up' AND m.target_fp = {KINDS['jobs'].target_fp})
           OR (v.verdict = 'finished_there' AND t.state NOT IN {TERMINAL}))
    FOR UPDATE OF t
), n AS MATERIALIZED (
    SELECT b.*, a.state AS cur_state,
           -- SavewebHQ forgets the attempt id when a job ends: the imported
           -- attempt running here is the one that ended it.
           (a.state = 'running' AND a.wire_id IS NOT NULL
            AND (a.wire_id = b.wire_id OR (b.wire_id IS NULL AND b.state IN {TERMINAL}))) AS continues
    FROM b LEFT JOIN attempts a ON a.id = b.cur
), picked AS MATERIALIZED (
    SELECT n.*, CASE WHEN n.final_state IS NOT NULL AND NOT COALESCE(n.continues, false)
                     THEN nextval(CAST(%(attempt_seq)s AS regclass)) END AS new_id
    FROM n ORDER BY n.id
), ended AS (
    UPDATE attempts a SET
        state = CASE WHEN p.continues THEN p.final_state
                     WHEN p.error IS NOT NULL AND p.error IS DISTINCT FROM p.cur_error THEN 'failed'
                     ELSE 'expired' END,
        lease_expires_at = CASE WHEN p.continues AND p.final_state = 'running'
                                THEN p.lease_expires_at ELSE a.lease_expires_at END,
        finished_at = CASE WHEN p.continues AND p.final_state = 'running' THEN NULL
                           ELSE COALESCE(p.completed_at, p.updated_at) END,
        outcome = CASE WHEN p.continues AND p.final_state = 'done' THEN jsonb_build_object(
            'outcome', p.outcome, 'artifact_receipts', COALESCE(p.receipts, '[]'::jsonb))
            ELSE a.outcome END,
        error = CASE WHEN p.continues AND p.final_state = 'failed'
                     THEN jsonb_build_object('retryable', p.state = 'reset_exhausted', 'error', p.error)
                     WHEN NOT p.continues AND p.error IS NOT NULL
                          AND p.error IS DISTINCT FROM p.cur_error
                     THEN jsonb_build_object('retryable', true, 'error', p.error)
                     ELSE a.error END
    FROM picked p WHERE a.id = p.cur AND a.state = 'running'
    RETURNING a.id
), added AS (
    INSERT INTO attempts (id, job_id, project_id, worker_id, worker_owner, state, created_at,
        lease_expires_at, finished_at, outcome, error, wire_id)
    SELECT new_id, id, project_id,
        {FINAL_ATTEMPT_ROW}
    FROM picked WHERE new_id IS NOT NULL
    RETURNING id
), moved AS (
    UPDATE jobs j SET state = p.state, resets = p.resets, last_error = p.error,
        current_attempt_id = COALESCE(p.new_id, j.current_attempt_id),
        worker_id = p.worker_id, worker_owner = p.worker_owner,
        lease_expires_at = p.lease_expires_at,
        attempts_count = j.attempts_count + (p.new_id IS NOT NULL)::int,
        not_before = CASE WHEN p.state = 'todo' THEN p.updated_at ELSE j.not_before END,
        updated_at = p.updated_at
    FROM picked p WHERE j.id = p.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM added), (SELECT count(*) FROM ended)
"""


def project_defaults() -> dict:
    """FleetHQ-only policy fields of an imported (generic) project."""
    fields = defaults("generic")
    return {name: fields[name] for name in (
        "retry_backoff_seconds", "max_in_flight", "max_worker_in_flight", "prefer_new_worker",
        "task_timeout_seconds", "attempt_timeout_seconds", "upload_timeout_seconds")}


def insert_small_tables(tgt: psycopg.Connection) -> dict:
    """Users, machine tokens, projects: the new ones and those SavewebHQ
    changed since the last run; returns the rows written per table (and the
    users whose token rows may be sealed for viewing)."""
    users = tgt.execute(USERS).rowcount + tgt.execute(USERS_CAUGHT_UP).rowcount
    replaced = tgt.execute(TOKENS_REPLACED).rowcount
    token_users = [r[0] for r in tgt.execute(TOKENS).fetchall()]
    projects = tgt.execute(PROJECTS, project_defaults()).rowcount
    projects += tgt.execute(PROJECTS_CAUGHT_UP).rowcount
    return {"users": users, "machine_tokens": len(token_users), "tokens_removed": replaced,
            "projects": projects, "token_users": token_users}


def insert_jobs(tgt: psycopg.Connection, lo: int, hi: int) -> tuple[int, dict]:
    """One batch: the new jobs with ids in [lo, hi) and their attempts."""
    seq = tgt.execute("SELECT pg_get_serial_sequence('attempts', 'id')").fetchone()[0]
    jobs, attempts = tgt.execute(JOBS, {"lo": lo, "hi": hi, "imported": IMPORTED_WORKER,
                                        "attempt_seq": seq}).fetchone()
    return jobs, attempts


def bring_over_jobs(tgt: psycopg.Connection, lo: int, hi: int) -> tuple[int, int]:
    """One batch of the jobs SavewebHQ moved on since the last run; returns
    the jobs updated and the attempts added."""
    seq = tgt.execute("SELECT pg_get_serial_sequence('attempts', 'id')").fetchone()[0]
    jobs, attempts, _ = tgt.execute(BRING_OVER, {"lo": lo, "hi": hi, "imported": IMPORTED_WORKER,
                                            "attempt_seq": seq}).fetchone()
    return jobs, attempts


def insert_workers(tgt: psycopg.Connection) -> int:
    return tgt.execute(WORKERS).rowcount


CLAIM_BUCKETS = """
INSERT INTO worker_claim_buckets (project_id, worker_id, bucket_started_at, claim_requests,
                                  jobs_dispatched, policy_version)
SELECT project_id, worker_id, bucket_started_at, claim_requests, jobs_dispatched, policy_version
FROM sw_claim_buckets
ON CONFLICT (project_id, worker_id, bucket_started_at) DO UPDATE SET
    claim_requests = GREATEST(worker_claim_buckets.claim_requests, EXCLUDED.claim_requests),
    jobs_dispatched = GREATEST(worker_claim_buckets.jobs_dispatched, EXCLUDED.jobs_dispatched),
    policy_version = EXCLUDED.policy_version
WHERE (worker_claim_buckets.claim_requests, worker_claim_buckets.jobs_dispatched)
      < (EXCLUDED.claim_requests, EXCLUDED.jobs_dispatched)
"""


def insert_claim_buckets(tgt: psycopg.Connection) -> int:
    return tgt.execute(CLAIM_BUCKETS).rowcount


def move_job_sequence(tgt: psycopg.Connection, imported_max: int, *, write: bool) -> dict:
    """Make the next FleetHQ job id larger than every job id held and imported.

    Returns the next id before and after (equal when nothing had to move).
    """
    seq = tgt.execute("SELECT pg_get_serial_sequence('jobs', 'id')").fetchone()[0]
    last, called = tgt.execute(f"SELECT last_value, is_called FROM {seq}").fetchone()
    next_id = last + 1 if called else last
    highest = max(imported_max, tgt.execute("SELECT COALESCE(max(id), 0) FROM jobs").fetchone()[0])
    if highest < next_id:
        return {"next_before": next_id, "next_after": next_id}
    if write:
        tgt.execute("SELECT setval(%s, %s, true)", (seq, highest))
    return {"next_before": next_id, "next_after": highest + 1}
