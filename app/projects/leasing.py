"""Claim and expire, the sweep, heartbeat renewals and cancelling a revoked
worker's attempts; with ``app.projects.outcomes`` (complete, fail, extend)
the owner of job and attempt states outside uploads (the transitions are
declared in ``app.projects.states``).

Every transition is one guarded statement whose row count is the answer
(DESIGN §4.1): a job moves only while it is claimable, its lease has run out,
or it belongs to the worker named.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass

from sqlalchemy import text

from app.errors import Conflict, RateLimited
from app.extensions import changed, db, fetch_rows
from app.fleet.lanes import REMOTE_ON_SQL, Lane, first_choice_free
from app.projects import ratelimit, states, wakeups
from app.projects.service import ProjectView
from app.sites import gate as site_gate


@dataclass(frozen=True)
class Worker:
    """Who is calling: a token worker (owner = user id) or an enrolled node (owner None)."""
    worker_id: str
    owner: str | None

    def owns(self, row) -> bool:
        """Is this attempt row (``worker_owner``, ``worker_id``) the caller's?
        Token workers upload with their user's token and no worker id: the
        user owns all of its workers' attempts."""
        return row is not None and row["worker_owner"] == self.owner \
            and self.worker_id in (None, row["worker_id"])


# What a claim answers in ``retry_after_ms`` when the bucket gives no hint:
# SavewebHQ's default pause before the next claim.
IDLE_RETRY_MS = 1000


@dataclass
class ClaimResult:
    jobs: list[dict]
    retry_after_ms: int = IDLE_RETRY_MS
    policy_version: int = 1
    # Set when the tier rule held jobs back from a fallback worker: a long
    # poll asks again this soon (jobs become old enough without any notice).
    recheck_s: float | None = None


# --------------------------------------------------------------------- claim

# Which jobs of the project this worker may take now.
_CLAIMABLE = """project_id = :p AND state = 'todo' AND not_before <= now()
      AND (deadline_at IS NULL OR deadline_at > now()) {type_filter} {prefer_filter} {pdf_filter}
      AND {worker_allowed} {lane_filter}"""

_CLAIM_SQL = """
WITH {fresh_cte} {site_cte} picked AS (
    SELECT id, {deadline} AS deadline_at, {allowance} AS allowance FROM jobs
    WHERE {claimable} {site_filter}
    ORDER BY {order}
    LIMIT :n
    FOR UPDATE SKIP LOCKED
), att AS (
    INSERT INTO attempts (job_id, project_id, worker_id, worker_owner, state, lease_expires_at, deadline_at)
    SELECT id, :p, :w, :o, 'running',
           LEAST(now() + make_interval(secs => :lease), deadline_at,
                 now() + make_interval(secs => CAST(:attempt_timeout AS int) + allowance)),
           LEAST(deadline_at, now() + make_interval(secs => CAST(:attempt_timeout AS int) + allowance))
    FROM picked
    RETURNING id, job_id, lease_expires_at
)
UPDATE jobs j SET state = 'wip', current_attempt_id = att.id, worker_id = :w, worker_owner = :o,
    lease_expires_at = att.lease_expires_at, attempts_count = j.attempts_count + 1, updated_at = now(),
    deadline_at = {deadline}
FROM att WHERE j.id = att.job_id
RETURNING j.id, j.ext_id, j.value, j.type, j.via, j.hops, j.attr, att.id,
          floor(extract(epoch FROM att.lease_expires_at))::bigint, j.created_at, j.random_key,
          j.site_key
"""

# Claims a site rule or pause touches (app.sites.gate): the claimable jobs
# of blocked sites are passed over, and of each limited site at most its
# allowance is taken. The candidates are read without locks, a bounded
# window in claim order; the claim then locks its pick among them (SKIP
# LOCKED, the claimable test re-checked on each row's newest version).
_SITE_CTE = """site_ranked AS (
    SELECT c.id, l.rule, l.allow, row_number() OVER (PARTITION BY l.rule ORDER BY {order}) AS rn
    FROM (SELECT id, site_key, created_at, random_key FROM jobs
          WHERE {claimable}
            AND (site_key IS NULL OR site_key <> ALL(CAST(:site_blocked AS text[])))
          ORDER BY {order} LIMIT :site_scan) c
    LEFT JOIN unnest(CAST(:site_keys AS text[]), CAST(:site_rules AS int[]), CAST(:site_allow AS int[]))
        AS l(key, rule, allow) ON l.key = c.site_key
), site_allowed AS (SELECT id FROM site_ranked WHERE rule IS NULL OR rn <= allow),"""
# By primary key from the window's few ids: an ``IN (subquery)`` let the
# planner walk the queue's head in claim order testing each job against the
# window, past every job of the sites that are full (a queue filled one site
# after another puts thousands there): 3.5 ms a claim against 0.3.
_SITE_FILTER = "AND id = ANY(ARRAY(SELECT id FROM site_allowed))"

# How many candidates a site-gated claim reads for each job it wants (and at
# least SITE_SCAN_MIN): enough that a few sites at the queue's head, each
# allowed one or two more starts, leave room for the others.
SITE_SCAN_PER_JOB = 8
SITE_SCAN_MIN = 64
SITE_SCAN_MAX = 4096

_ORDERS = {"fifo": "created_at, id", "random": "random_key, id"}

# prefer_new_worker: workers that could take a retry right now (approved or
# active token workers with a heartbeat younger than one node lease) and
# serve this project (by their heartbeat's projects; one that does not say
# counts for every project) and offer slots (a worker that signed off, or
# cannot do its task, heartbeats capacity 0): a retry is never held back for
# a worker that would not take it.
_FRESH_WORKERS = """fresh AS (
    SELECT id AS worker_id, NULL::text AS owner FROM fleet_nodes
    WHERE status = 'active' AND last_heartbeat_at > now() - make_interval(secs => :fresh_s)
      AND (projects IS NULL OR :p = ANY(projects)) AND capacity IS DISTINCT FROM 0
    UNION ALL
    SELECT worker_id, user_id FROM token_workers
    WHERE status = 'active' AND last_heartbeat_at > now() - make_interval(secs => :fresh_s)
      AND (projects IS NULL OR :p = ANY(projects)) AND capacity IS DISTINCT FROM 0
),"""

# A retry skips a worker that already tried the job while some other fresh
# worker has not; with no such worker (say, a lone worker) it may retry.
# It is a preference, not a block: a fresh worker may serve other projects or
# another task only (fetch nodes beside OCR nodes), and would never take the
# job. Once the retry has waited PREFER_NEW_WAIT_S, any worker may take it.
_PREFER_NEW = """AND (attempts_count = 0
      OR not_before <= now() - make_interval(secs => :prefer_wait)
      OR NOT EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.id AND a.worker_id = :w
                     AND a.worker_owner IS NOT DISTINCT FROM :o)
      OR NOT EXISTS (SELECT 1 FROM fresh f
                     WHERE NOT (f.worker_id = :w AND f.owner IS NOT DISTINCT FROM :o)
                       AND NOT EXISTS (SELECT 1 FROM attempts a2 WHERE a2.job_id = jobs.id
                                       AND a2.worker_id = f.worker_id
                                       AND a2.worker_owner IS NOT DISTINCT FROM f.owner)))"""


# The worker's standing is re-checked inside the claim itself, so a claim
# racing a drain or revoke can never hand out work after the decision.
_WORKER_ALLOWED = """CASE WHEN CAST(:o AS text) IS NULL
        THEN EXISTS (SELECT 1 FROM fleet_nodes WHERE id = :w AND status = 'active')
        ELSE NOT EXISTS (SELECT 1 FROM token_workers
                         WHERE user_id = :o AND worker_id = :w AND status <> 'active') END"""

# DESIGN §12: a job is tried by at most ``max_worker_attempts`` distinct
# workers (pdf default 3); counting distinct workers only once the job has
# had that many attempts keeps first claims cheap.
_WORKER_CAP = f"""AND (attempts_count < :max_workers
      OR {states.distinct_workers('jobs.id')} < :max_workers)"""


# A fallback worker while a first-choice worker is free: only jobs that
# became claimable at least fallback_after_seconds ago. not_before is never
# before created_at, so the created_at bound is implied; it is there because
# ix_jobs_todo_fifo can range-scan it (fresh jobs are not even visited).
_FALLBACK_WAITED = """AND created_at <= now() - make_interval(secs => :fallback_after)
      AND not_before <= now() - make_interval(secs => :fallback_after)"""

PREFER_NEW_WAIT_S = 60.0

# How soon a long poll held back by the tier rule asks again.
FALLBACK_RECHECK_S = 1.0


def _lane_filter(project: ProjectView, lane: Lane, stale_s: float) -> tuple[str, bool]:
    """The claim's lane conditions and whether the tier rule holds jobs back:
    remote workers claim only while the remote switch is on; a fallback
    worker (its tier in the project's lane order) waits for old jobs while
    some first-choice worker is free."""
    parts = [] if lane.local else [REMOTE_ON_SQL]
    held = lane.tier_in(project.lane_order) == "fallback" and first_choice_free(
        project.id, project.max_worker_in_flight, stale_s, project.lane_order)
    if held:
        parts.append(_FALLBACK_WAITED)
    return " ".join(parts), held


# The site keys of the claim's next jobs, in claim order, first appearance
# first (app.sites.gate decides which of their rules the claim holds).
_SITE_SCAN = """
WITH {fresh_cte} ahead AS (
    SELECT site_key, row_number() OVER (ORDER BY {order}) AS place FROM (
        SELECT id, site_key, created_at, random_key FROM jobs
        WHERE {claimable} AND site_key IS NOT NULL
          AND site_key <> ALL(CAST(:site_blocked AS text[]))
        ORDER BY {order} LIMIT :site_scan) c
)
SELECT site_key FROM ahead GROUP BY site_key ORDER BY min(place)
"""


@functools.lru_cache(maxsize=128)
def _site_scan_sql(order: str, accept_types: tuple[str, ...], prefer_new_worker: bool = False,
                   worker_cap: bool = False, lane_filter: str = "") -> str:
    return _SITE_SCAN.format(order=_ORDERS[order], fresh_cte=_FRESH_WORKERS if prefer_new_worker else "",
                             claimable=_claimable(accept_types, prefer_new_worker, worker_cap, lane_filter))


def _claimable(accept_types: tuple[str, ...], prefer_new_worker: bool, worker_cap: bool,
               lane_filter: str) -> str:
    type_filter = "" if set(accept_types) >= {"seed", "asset"} else "AND type = ANY(:types)"
    return _CLAIMABLE.format(type_filter=type_filter,
                             prefer_filter=_PREFER_NEW if prefer_new_worker else "",
                             pdf_filter=_WORKER_CAP if worker_cap else "",
                             worker_allowed=_WORKER_ALLOWED, lane_filter=lane_filter)


@functools.lru_cache(maxsize=128)
def _claim_sql(order: str, accept_types: tuple[str, ...], prefer_new_worker: bool = False,
               worker_cap: bool = False, lane_filter: str = "", site_gate: bool = False) -> str:
    claimable = _claimable(accept_types, prefer_new_worker, worker_cap, lane_filter)
    return _CLAIM_SQL.format(order=_ORDERS[order], claimable=claimable,
                             fresh_cte=_FRESH_WORKERS if prefer_new_worker else "",
                             site_cte=_SITE_CTE.format(order=_ORDERS[order], claimable=claimable)
                             if site_gate else "",
                             site_filter=_SITE_FILTER if site_gate else "",
                             deadline=states.first_claim_deadline(":task_timeout"),
                             allowance=states.page_allowance())


def _wire_job(row) -> dict:
    job_id, ext_id, value, job_type, via, hops, attr, attempt_id, lease, _, _, _ = row
    job = {}
    if ext_id is not None:
        job["id"] = ext_id
    job["value"] = value
    job["type"] = job_type
    if via is not None:
        job["via"] = via
    if hops is not None:
        job["hops"] = hops
    if attr is not None:
        job["attr"] = attr
    job["job_id"] = job_id
    job["attempt_id"] = str(attempt_id)
    job["lease_expires_at"] = lease
    return job


def _jobs_waiting(project_id: str) -> bool:
    return bool(db.session.execute(text(
        "SELECT EXISTS (SELECT 1 FROM jobs WHERE project_id = :p AND state = 'todo' "
        "AND not_before <= now() AND (deadline_at IS NULL OR deadline_at > now()))"),
        {"p": project_id}).scalar())


def _live_attempts(project_id: str, worker: Worker | None) -> int:
    sql = f"SELECT count(*) FROM jobs WHERE project_id = :p AND {states.holds_slot('jobs')}"
    params: dict[str, str | None] = {"p": project_id}
    if worker is not None:
        sql += " AND worker_id = :w AND worker_owner IS NOT DISTINCT FROM :o"
        params.update(w=worker.worker_id, o=worker.owner)
    return db.session.execute(text(sql), params).scalar_one()


def _dispatch_limit(project: ProjectView, worker: Worker, want: int) -> tuple[int, float | None]:
    """Apply the token bucket and in-flight caps under the project's dispatch lock.

    Returns the number of jobs this claim may take and the bucket's token count
    after refill (None when the project has no rate).
    """
    row = db.session.execute(text(
        "SELECT tokens, extract(epoch FROM clock_timestamp() - refilled_at) FROM project_dispatch "
        "WHERE project_id = :p FOR UPDATE"), {"p": project.id}).one()
    tokens = None
    if project.dispatch_qps is not None:
        tokens = ratelimit.refill(row[0], float(row[1]), project.dispatch_qps)
        want = ratelimit.grantable(tokens, want)
    if project.max_in_flight is not None and want:
        want = min(want, max(0, project.max_in_flight - _live_attempts(project.id, None)))
    if project.max_worker_in_flight is not None and want:
        want = min(want, max(0, project.max_worker_in_flight - _live_attempts(project.id, worker)))
    return want, tokens


def claim(project: ProjectView, worker: Worker, *, max_jobs: int, lease_seconds: int,
          accept_types: tuple[str, ...], reap_limit: int = 64,
          fresh_after_s: float = 60.0, lane: Lane = Lane(),
          stale_after_s: float = 90.0) -> ClaimResult:
    """Claim up to ``max_jobs`` jobs for ``worker`` in one statement. Commits.

    ``lane`` is the worker's tier and locality (app.fleet.lanes); a
    first-choice worker counts as free for the tier rule while its heartbeat
    is younger than ``stale_after_s``.

    When the queue cannot fill the claim, expired leases of this project are
    reset first (at most ``reap_limit``) and the claim is topped up: a busy
    queue pays nothing for lazy reaping, an idle one never keeps dead ``wip``
    jobs from a worker that asks.

    Site rules and pauses (app.sites.gate) pass over the jobs of sites at
    their limit or paused, and take at most each limited site's allowance.

    Raises:
        Conflict: ``project_not_active`` when the project is draining or archived.
        RateLimited: the dispatch bucket is empty while jobs are waiting.
    """
    if project.status != "active":
        raise Conflict(f"project {project.id!r} is {project.status}", code="project_not_active",
                       details={"status": project.status})
    want = min(max_jobs, project.max_jobs_per_claim)
    gated = (project.dispatch_qps is not None or project.max_in_flight is not None
             or project.max_worker_in_flight is not None)
    tokens = None
    if gated:
        if reap_limit:
            reap_expired(project.id, limit=reap_limit)  # expired leases must not hold a cap
        want, tokens = _dispatch_limit(project, worker, want)
        if want == 0:
            waiting = _jobs_waiting(project.id)
            db.session.commit()
            qps = project.dispatch_qps  # set whenever there are tokens
            if tokens is not None and qps is not None and waiting and ratelimit.grantable(tokens, 1) == 0:
                delay = ratelimit.retry_after_ms(tokens, qps)
                raise RateLimited("project dispatch rate exceeded", retry_after_ms=delay,
                                  details={"dispatch_qps": project.dispatch_qps})
            return ClaimResult([], IDLE_RETRY_MS, project.policy_version)
    lane_filter, held = _lane_filter(project, lane, stale_after_s)
    shape = (project.claim_order, accept_types, project.prefer_new_worker,
             project.max_worker_attempts is not None, lane_filter)
    params = {"p": project.id, "w": worker.worker_id, "o": worker.owner, "n": want,
              "lease": float(lease_seconds), "attempt_timeout": project.attempt_timeout_seconds,
              "task_timeout": project.task_timeout_seconds, "max_workers": project.max_worker_attempts,
              "types": list(accept_types), "fresh_s": float(fresh_after_s),
              "prefer_wait": PREFER_NEW_WAIT_S,
              "fallback_after": float(project.fallback_after_seconds)}
    gate = None
    if project.site_rules:
        def scan(excluded: list[str]) -> list[str]:
            found = fetch_rows(_site_scan_sql(*shape), {**params, "site_blocked": excluded,
                                                        "site_scan": _site_scan(want)})
            return [r[0] for r in found]
        gate = site_gate.admit(project.id, want, scan)
    sql = _claim_sql(*shape, gate is not None)

    def take(n: int) -> list:
        if gate is None:
            return fetch_rows(sql, {**params, "n": n})
        return _site_gated_claim(sql, params, gate, n)
    rows = take(want)
    if len(rows) < want and reap_limit and not gated and reap_expired(project.id, limit=reap_limit):
        rows += take(want - len(rows))
    if gate is not None:
        site_gate.spend(gate, [r[11] for r in rows])
    if tokens is not None:
        db.session.execute(text(
            "UPDATE project_dispatch SET tokens = :t, refilled_at = clock_timestamp() "
            "WHERE project_id = :p"), {"t": tokens - len(rows), "p": project.id})
    db.session.commit()
    retry_ms = IDLE_RETRY_MS
    if tokens is not None and project.dispatch_qps is not None and rows:
        # As SavewebHQ: when the next token is due (0 while tokens remain).
        retry_ms = ratelimit.retry_after_ms(tokens - len(rows), project.dispatch_qps)
    key = (lambda r: (r[9], r[0])) if project.claim_order == "fifo" else (lambda r: (r[10], r[0]))
    hints = [h for h in (FALLBACK_RECHECK_S if held else None,
                         gate.recheck_s if gate is not None else None) if h is not None]
    return ClaimResult([_wire_job(r) for r in sorted(rows, key=key)], retry_ms,
                       project.policy_version, min(hints, default=None))


# A site-gated claim tries again at most this often when the sites it
# filled left it short (each try blocks the sites the last one filled).
SITE_ROUNDS = 3


def _site_scan(n: int) -> int:
    return min(SITE_SCAN_MAX, max(SITE_SCAN_MIN, n * SITE_SCAN_PER_JOB))


def _site_gated_claim(sql: str, params: dict, gate: site_gate.Gate, want: int) -> list:
    rows: list = []
    for _ in range(SITE_ROUNDS):
        n = want - len(rows)
        got = fetch_rows(sql, {**params, **gate.params(), "n": n, "site_scan": _site_scan(n)})
        rows += got
        if len(rows) >= want or not gate.take([r[11] for r in got]):
            break
    return rows


_RELEASE_SQL = f"""
WITH released AS (
    UPDATE jobs j SET state = 'todo', lease_expires_at = NULL,
        attempts_count = GREATEST(j.attempts_count - 1, 0), updated_at = now(),
        -- a first claim nobody received starts no task deadline; a later
        -- one keeps what was left of it, paused like an expiry's
        work_left_s = CASE WHEN j.attempts_count <= 1 THEN NULL ELSE {states._WORK_LEFT} END,
        deadline_at = NULL
    FROM attempts a
    WHERE a.id = ANY(:ids) AND j.id = a.job_id AND j.current_attempt_id = a.id
      AND j.state = 'wip' AND a.state = 'running'
    RETURNING a.id, j.project_id
), att AS (
    UPDATE attempts a SET state = 'cancelled', finished_at = now(),
        error = jsonb_build_object('code', '{states.UNDELIVERED}',
                                   'message', 'the claim answer could not be delivered')
    FROM released r WHERE a.id = r.id
)
SELECT project_id, count(*) FROM released GROUP BY project_id
"""


def release_undelivered(attempt_ids: list[int]) -> int:
    """Give back jobs whose claim answer never reached the worker (its
    connection was closed): they are ``todo`` and claimable at once, with no
    reset counted and the attempt not counted either (it is kept, cancelled,
    with the error code ``claim_undelivered``). Commits.

    Returns the number of jobs released.
    """
    if not attempt_ids:
        return 0
    rows = db.session.execute(text(_RELEASE_SQL), {"ids": [int(a) for a in attempt_ids]}).all()
    for project_id, _ in rows:
        wakeups.notify(project_id)
    db.session.commit()
    return sum(n for _, n in rows)


def next_claimable_in(project_id: str) -> float | None:
    """Seconds until a job may become claimable without any notification:
    the end of the earliest retry backoff, or the earliest lease expiry."""
    delay = db.session.execute(text("""
        SELECT extract(epoch FROM LEAST(
            (SELECT min(not_before) FROM jobs
             WHERE project_id = :p AND state = 'todo' AND not_before > now()),
            (SELECT min(lease_expires_at) FROM jobs WHERE project_id = :p AND state = 'wip')
        ) - now())"""), {"p": project_id}).scalar()
    return None if delay is None else max(0.0, float(delay))


# ------------------------------------------------------------------- expiry

_REAP_SQL = f"""
WITH expired AS (
    SELECT j.id FROM jobs j
    WHERE j.state = 'wip' AND j.lease_expires_at <= now() {{project_filter}}
    ORDER BY j.lease_expires_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE jobs j SET
        {states.expiry_set('p.max_resets', 'p.retry_backoff_seconds')},
        last_error = CASE WHEN {states.DEADLINE_PASSED} THEN {states.TIMEOUT_ERROR}
            ELSE jsonb_build_object('code', 'lease_expired', 'message', 'the lease ran out') END,
        updated_at = now()
    FROM expired e, projects p
    WHERE j.id = e.id AND p.id = j.project_id
    RETURNING j.id, j.project_id, j.current_attempt_id, j.state
), att AS (
    UPDATE attempts a SET state = 'expired', finished_at = now()
    FROM upd WHERE a.id = upd.current_attempt_id AND a.state IN ('running', 'uploading')
)
SELECT project_id, state, count(*) FROM upd GROUP BY project_id, state
"""

# Only a job that was claimed has a task deadline (it starts at the first
# claim): this fails retries waiting past it, never a job still in its backlog.
# ``attempts_count > 0`` lets both sweeps read ix_jobs_todo_retries, whose
# size does not grow with the backlog.
_FAIL_OVERDUE_SQL = f"""
WITH overdue AS (
    SELECT id FROM jobs WHERE state = 'todo' AND attempts_count > 0 AND deadline_at <= now()
    LIMIT :limit FOR UPDATE SKIP LOCKED
)
UPDATE jobs j SET state = 'failed', updated_at = now(), last_error = {states.TIMEOUT_ERROR}
FROM overdue WHERE j.id = overdue.id
"""


def reap_expired(project_id: str | None = None, *, limit: int = 1000) -> int:
    """Return jobs whose lease ran out to the queue (or to reset_exhausted /
    failed). Does not commit when called for one project from a claim."""
    sql = _REAP_SQL.format(project_filter="AND j.project_id = :p" if project_id else "")
    rows = db.session.execute(text(sql), {"p": project_id, "limit": limit}).all()
    # Every expiry may release a job or free a capped slot: wake that project's waiters.
    for pid in {r[0] for r in rows}:
        wakeups.notify(pid)
    return sum(r[2] for r in rows)


_FAIL_TRIED_OUT_SQL = f"""
WITH tried_out AS (
    SELECT j.id FROM jobs j JOIN projects p ON p.id = j.project_id
    WHERE p.max_worker_attempts IS NOT NULL AND j.state = 'todo' AND j.attempts_count > 0
      AND j.attempts_count >= p.max_worker_attempts
      AND {states.distinct_workers('j.id')} >= p.max_worker_attempts
    LIMIT :limit FOR UPDATE OF j SKIP LOCKED
)
UPDATE jobs j SET state = 'failed', updated_at = now(),
    last_error = jsonb_build_object('code', 'no_eligible_worker',
                                    'message', 'tried by the maximum number of distinct workers')
FROM tried_out WHERE j.id = tried_out.id
"""


def sweep(limit: int = 5000) -> dict:
    """The periodic actor's pass over every project. Commits."""
    expired = reap_expired(None, limit=limit)
    overdue = changed(text(_FAIL_OVERDUE_SQL), {"limit": limit})
    tried_out = changed(text(_FAIL_TRIED_OUT_SQL), {"limit": limit})
    db.session.commit()
    return {"expired": expired, "overdue": overdue, "tried_out": tried_out}


# -------------------------------------------------------------- revocation

_CANCEL_SQL = f"""
WITH target AS (
    SELECT id, current_attempt_id FROM jobs
    WHERE state = 'wip' AND worker_id = :w AND worker_owner IS NOT DISTINCT FROM :o
    FOR UPDATE
), att AS (
    UPDATE attempts a SET state = 'cancelled', finished_at = now()
    FROM target WHERE a.id = target.current_attempt_id AND a.state IN ('running', 'uploading')
    RETURNING a.id, a.job_id
)
UPDATE jobs j SET state = 'todo', lease_expires_at = NULL, not_before = now(), updated_at = now(),
    last_error = jsonb_build_object('code', 'cancelled', 'message', 'worker revoked'),
    {states.PAUSE_BUDGET}
FROM att WHERE j.id = att.job_id AND j.current_attempt_id = att.id AND j.state = 'wip'
RETURNING j.project_id, att.id
"""


def cancel_worker_attempts(worker_id: str, owner: str | None) -> list[int]:
    """Revocation: the worker's running and uploading attempts are cancelled
    and their jobs go back to the queue at once, costing no reset (the job did
    nothing wrong); staged uploads still finish. The caller holds the
    cancelled attempts' uploads (``transitions.hold_uploads``) and commits.

    Driven from the jobs (locked first, then their attempts) — the lock order
    of claims, outcomes and the reaper, so a revoke racing them cannot
    deadlock.

    Returns:
        The ids of the cancelled attempts.
    """
    rows = db.session.execute(text(_CANCEL_SQL), {"w": worker_id, "o": owner}).all()
    for project_id in {r[0] for r in rows}:
        wakeups.notify(project_id)
    return [r[1] for r in rows]


# ---------------------------------------------------------------- heartbeat

_HEARTBEAT_SQL = """
WITH renewed AS (
    UPDATE jobs j SET lease_expires_at = GREATEST(j.lease_expires_at,
            LEAST(now() + make_interval(secs => :lease), j.deadline_at, a.deadline_at))
    FROM attempts a
    WHERE a.id = ANY(:ids) AND j.id = a.job_id AND j.current_attempt_id = a.id
      AND j.state = 'wip' AND j.worker_id = :w AND j.worker_owner IS NOT DISTINCT FROM :o
      AND j.lease_expires_at > now() AND a.state IN ('running', 'uploading')
    RETURNING a.id, j.lease_expires_at
), att AS (
    UPDATE attempts a SET lease_expires_at = renewed.lease_expires_at
    FROM renewed WHERE a.id = renewed.id
)
SELECT id, floor(extract(epoch FROM lease_expires_at))::bigint FROM renewed
UNION ALL
SELECT a.id, floor(extract(epoch FROM a.lease_expires_at))::bigint FROM attempts a
WHERE a.id = ANY(:ids) AND a.state = 'staged' AND a.worker_id = :w
  AND a.worker_owner IS NOT DISTINCT FROM :o
"""


def renew_for_heartbeat(worker: Worker, attempt_ids: list[int], lease_seconds: int) -> dict[str, int]:
    """Renew the leases a worker reports as running (never past a deadline,
    never reviving an expired one). Staged attempts are listed unchanged: the
    worker keeps them until their receipt says done. Commits.

    Returns:
        {attempt_id: lease_expires_at} — the worker must stop every attempt
        it runs that is missing here.
    """
    if not attempt_ids:
        return {}
    rows = db.session.execute(text(_HEARTBEAT_SQL), {
        "ids": attempt_ids, "w": worker.worker_id, "o": worker.owner,
        "lease": float(lease_seconds)}).all()
    db.session.commit()
    return {str(r[0]): r[1] for r in rows}
