"""Job and attempt states: every transition, who performs it, and the SQL
pieces the writers share.

Only the modules in ``OWNERS`` write ``jobs.state`` or ``attempts.state`` or
insert attempts (``tests/test_state_owners.py`` scans the source tree for any
other). Each transition is one guarded statement in its owner whose row count
decides (DESIGN §4.1); the tables below are the reference for what those
statements may do, and the same test checks that every move observed while
claiming, finishing, failing, expiring, uploading and requeueing is listed.
"""
from __future__ import annotations

# Source files (relative to the repository root) allowed to write states.
OWNERS = {
    "app/projects/leasing.py": "claims, lease expiry, the sweep, revoked workers, undelivered claims",
    "app/projects/outcomes.py": "complete, fail and extend reported by workers",
    "app/uploads/transitions.py": "uploads: admission, staging, bad files, archive, staged expiry",
    "app/projects/jobs_admin.py": "the admin's requeue, one job or a bulk action's batch",
    "app/imports/savewebhq_write.py": "rows copied from a SavewebHQ database in the states they "
                                      "had there (an import, not a transition)",
}

# (from, to): who moves a job that way; ``None`` is "inserted".
JOB_TRANSITIONS = {
    (None, "todo"): "enqueue (enqueue.insert_batch), with no task deadline yet",
    ("todo", "wip"): "claim (leasing.claim); a late upload of a reaped attempt (transitions.admit)",
    ("todo", "failed"): "sweep: a retry whose task deadline passed, or a job tried by "
                        "max_worker_attempts distinct workers (leasing.sweep)",
    ("wip", "done"): "complete, generic projects (outcomes.complete); a derived job whose "
                     "input needs no work, e.g. already has text (transitions.skip_derived)",
    ("wip", "todo"): "retryable fail (outcomes); lease expiry, revoked worker, a claim answer "
                     "that never reached its worker (leasing); rejected upload (transitions.reject)",
    ("wip", "reset_exhausted"): "the same, with max_resets used up",
    ("wip", "failed"): "non-retryable fail; a retry past the task deadline",
    ("wip", "staged"): "a verified upload is durable in the spool (transitions.stage)",
    ("staged", "done"): "archive committed (transitions.complete)",
    ("staged", "todo"): "the staged file was damaged: fetch again (transitions.discard_damaged)",
    ("staged", "reset_exhausted"): "the same, with max_resets used up",
    ("staged", "failed"): "the same past the task deadline; not archived within the staged "
                          "retention (transitions.expire_staged)",
    ("failed", "todo"): "admin requeue (jobs_admin.requeue)",
    ("reset_exhausted", "todo"): "admin requeue (jobs_admin.requeue)",
    ("failed", "wip"): "a late upload wins the job back (transitions.admit)",
    ("reset_exhausted", "wip"): "a late upload wins the job back (transitions.admit)",
}

# (from, to) for attempts; ``None`` is "inserted".
ATTEMPT_TRANSITIONS = {
    (None, "running"): "claim (leasing.claim)",
    ("running", "done"): "complete, generic projects (outcomes.complete); a skipped derived "
                         "job (transitions.skip_derived)",
    ("running", "failed"): "fail (outcomes.fail)",
    ("uploading", "failed"): "fail while uploading (outcomes.fail); rejected file (transitions.reject)",
    ("running", "expired"): "lease expiry (leasing.reap_expired)",
    ("uploading", "expired"): "lease expiry (leasing.reap_expired)",
    ("running", "cancelled"): "revoked worker (leasing.cancel_worker_attempts); claim answer "
                              "undelivered (leasing.release_undelivered); superseded by a "
                              "late upload (transitions.admit)",
    ("uploading", "cancelled"): "the same",
    ("running", "uploading"): "upload admitted (transitions.admit)",
    ("expired", "uploading"): "late upload admitted (transitions.admit)",
    ("uploading", "staged"): "upload staged (transitions.stage)",
    ("staged", "done"): "archive committed (transitions.complete)",
    ("staged", "failed"): "damaged staged file, staged retention passed (transitions)",
}


# ------------------------------------------------------------- shared SQL
# The pieces below name the job row ``j``.

DEADLINE_PASSED = "j.deadline_at IS NOT NULL AND j.deadline_at <= now()"
TIMEOUT_ERROR = "jsonb_build_object('code', 'timeout', 'message', 'task deadline passed')"

def backoff(base: str, resets: str) -> str:
    """Exponential backoff with "equal jitter" (50..100 % of the step), capped at 1 h."""
    return (f"make_interval(secs => LEAST(3600.0, {base} * power(2.0, LEAST({resets}, 20))) "
            "* (0.5 + random() * 0.5))")


def retry_state(max_resets: str) -> str:
    """Where a job goes when its attempt ends retryably: ``failed`` once its
    task deadline has passed, ``reset_exhausted`` out of resets, else ``todo``."""
    return (f"CASE WHEN {DEADLINE_PASSED} THEN 'failed' "
            f"WHEN j.resets >= {max_resets} THEN 'reset_exhausted' ELSE 'todo' END")


def retry_set(max_resets: str, backoff_base: str) -> str:
    """The SET list of a retryable end: the retry decision, one more reset,
    the backoff before the next claim, no lease."""
    return (f"state = {retry_state(max_resets)}, resets = j.resets + 1, "
            f"not_before = now() + {backoff(backoff_base, 'j.resets')}, lease_expires_at = NULL")


# The error code of an attempt whose claim answer never reached its worker.
UNDELIVERED = "claim_undelivered"


def distinct_workers(job_id: str) -> str:
    """How many distinct workers have tried the job (``max_worker_attempts``).
    A claim whose answer never reached its worker is no try."""
    return ("(SELECT count(DISTINCT (a.worker_id, a.worker_owner)) FROM attempts a "
            f"WHERE a.job_id = {job_id} AND a.error->>'code' IS DISTINCT FROM '{UNDELIVERED}')")


def holds_slot(job: str) -> str:
    """Whether a job takes one of its worker's in-flight slots: running on a
    live lease, or staged (its upload waits for the archive)."""
    return (f"{job}.state IN ('wip', 'staged') "
            f"AND ({job}.state = 'staged' OR {job}.lease_expires_at > now())")


# OCR runs (derived jobs, documents) name their page count in attr.pages;
# their attempt and task budgets grow by PAGE_SECONDS a page, as the OCR
# worker's own time limit does (workers/ocr/limits.py). Any other attr.pages
# that is not a number counts for nothing.
PAGE_SECONDS = 30
MAX_BUDGET_PAGES = 100_000


def page_allowance(attr: str = "attr") -> str:
    """Seconds a job's page count adds to its budgets (double precision)."""
    return (f"(CASE WHEN jsonb_typeof({attr} -> 'pages') = 'number' THEN CAST(LEAST(GREATEST("
            f"CAST({attr} ->> 'pages' AS numeric), 0), {MAX_BUDGET_PAGES}) * {PAGE_SECONDS} "
            "AS double precision) ELSE 0.0 END)")


def first_claim_deadline(task_timeout: str) -> str:
    """The task deadline a claim gives a job: the one it holds, or from now
    what is left of its budget (``work_left_s``, kept while a job whose
    worker went away waited in the queue), else ``task_timeout`` plus its
    page allowance (NULL without a timeout). Waiting in the queue never
    counts, so a backlog of any size waits safely."""
    return (f"CASE WHEN deadline_at IS NOT NULL THEN deadline_at "
            f"WHEN CAST({task_timeout} AS int) IS NULL THEN NULL "
            f"ELSE now() + make_interval(secs => COALESCE(work_left_s, "
            f"CAST({task_timeout} AS int) + {page_allowance()})) END")


# A job whose lease ran out (its worker went away: a host asleep, a crash)
# goes back to the queue with what is left of its task budget, and no
# deadline runs while it waits: it never fails because nobody worked on it.
# A reported retryable failure keeps its deadline running (backoff counts).
_WORK_LEFT = ("CASE WHEN j.deadline_at IS NULL THEN j.work_left_s "
              "ELSE GREATEST(0.0, extract(epoch FROM j.deadline_at - now())) END")
# (A job whose deadline has passed fails for it and keeps the deadline it had.)
PAUSE_BUDGET = (f"work_left_s = CASE WHEN {DEADLINE_PASSED} THEN j.work_left_s ELSE {_WORK_LEFT} END, "
                f"deadline_at = CASE WHEN {DEADLINE_PASSED} THEN j.deadline_at END")


def expiry_set(max_resets: str, backoff_base: str) -> str:
    """:func:`retry_set` for a lease that ran out: the budget pauses."""
    return f"{retry_set(max_resets, backoff_base)}, {PAUSE_BUDGET}"
