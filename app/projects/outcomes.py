"""Complete, fail and extend: a worker's reports on the attempts it holds.

Each batch is one guarded statement whose row count is the answer (DESIGN
§4.1): a job moves only while it points at the caller's attempt and belongs to
the caller's worker. Items that do not match are explained afterwards by
reading the attempt history, so a lost response replayed by the worker is
answered ``applied`` again instead of looking stale. With ``leasing`` (claims
and expiry) the owner of these job and attempt states (``app.projects.states``).
"""
from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from app.errors import Conflict
from app.extensions import db, fetch_rows
from app.projects import states, wakeups
from app.projects.leasing import Worker
from app.projects.models import savewebhq_state
from app.projects.service import ProjectView
from app.sites import pushback
from workers.wire.failures import NOT_THE_JOBS_FAULT, SITE_PUSHBACK


@dataclass(frozen=True)
class Statements:
    """Where a batch's statements run: ``rows(sql, params, named=False)``
    runs one of them and returns its rows; ``commit()`` ends the batch.

    ``guard``: a condition (SQL, its parameters in ``guard_params``; ``:p``,
    ``:w`` and ``:o`` are the project, worker id and owner) that the batch's
    one write also requires, all or nothing: a batch that moves fewer items
    than it names raises :class:`Unconfirmed` instead of explaining them,
    since a refused guard and stale items look alike.
    """
    rows: Callable[..., list]
    commit: Callable[[], None]
    guard: str = ""
    guard_params: dict = field(default_factory=dict)


class Unconfirmed(Exception):
    """A guarded batch moved fewer items than it named; what it moved is committed."""


@functools.lru_cache(maxsize=16)
def _guarded(sql: str, guard: str) -> str:
    return sql.replace("/*caller's guard*/", f"AND {guard}") if guard else sql


def _commit_session() -> None:
    db.session.commit()


# The request's session: what every caller but the hot path (app.api.hot_path) uses.
IN_SESSION = Statements(fetch_rows, _commit_session)


def _stale(message: str) -> dict:
    """A rejected item's error: SavewebHQ's full APIError shape."""
    return {"code": "stale_attempt", "message": message, "retryable": False,
            "retry_after_ms": 0, "details": {}}


@dataclass
class ItemResult:
    job_id: int
    attempt_id: str
    status: str = "rejected"
    job_status: str | None = None
    lease_expires_at: int | None = None
    error: dict | None = field(default=None)

    def as_dict(self) -> dict:
        return {"job_id": self.job_id, "attempt_id": self.attempt_id, "status": self.status,
                "job_status": self.job_status, "lease_expires_at": self.lease_expires_at,
                "error": self.error}


# The batch's columns go to PostgreSQL as array literals, not Python lists:
# psycopg's list dumper inspects every element of a list to choose its type,
# a fixed cost on each of the one-job requests SavewebHQ's Go SDK sends.
def _bigint_array(values) -> str:
    return "{" + ",".join(str(int(value)) for value in values) + "}"


def _text_array(values) -> str:
    def quoted(value: str) -> str:   # the array literal's own quoting, whatever the id holds
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "{" + ",".join(quoted(value) for value in values) + "}"


def _boolean_array(values) -> str:
    return "{" + ",".join("t" if value else "f" for value in values) + "}"


def _parse_ids(items) -> tuple[str, str]:
    """The items' job ids and attempt ids, as ``bigint[]`` and ``text[]`` literals."""
    return (_bigint_array(item["job_id"] for item in items),
            _text_array(item["attempt_id"] for item in items))


# The attempt an item names: its wire id (attempts imported from SavewebHQ
# keep the ``at_…`` ids their workers hold) or else its decimal number.
_ATTEMPT_OF = """COALESCE(
        (SELECT a.id FROM attempts a WHERE a.job_id = t.job_id AND a.wire_id = t.attempt_ref),
        CASE WHEN t.attempt_ref ~ '^[0-9]{1,18}$' THEN CAST(t.attempt_ref AS bigint) END)"""

# ``j.id = ANY(:job_ids)`` repeats the join's condition so that the planner
# looks the batch's jobs up by primary key: without it, it scanned every live
# job of the worker (ix_jobs_live_worker), a cost that grew with its leases.
_GUARD = """j.id = i.job_id AND j.id = ANY(CAST(:job_ids AS bigint[]))
    AND j.current_attempt_id = i.attempt_id AND j.project_id = :p
    AND j.state = 'wip' AND j.worker_id = :w AND j.worker_owner IS NOT DISTINCT FROM :o
    AND j.lease_expires_at > now() /*caller's guard*/"""


def _waking(condition: str) -> str:
    """An outcome statement's last CTE: it wakes the waiting claims
    (app.projects.wakeups) when ``condition`` holds for a moved row, in the
    same statement, with no second round trip on the requests workers send
    most. A capped project's claims wait on any attempt that ends (a slot
    is free). The statement reads it through ``_WOKEN``."""
    return f"""woken AS (
    SELECT pg_notify(:wake_channel, :p) FROM upd WHERE {condition} LIMIT 1
)"""


# In the statement's last FROM: a CTE that nothing reads is not run.
_WOKEN = "(SELECT count(*) FROM woken) AS woken_run"

_COMPLETE_SQL = f"""
WITH i AS (
    SELECT t.*, {_ATTEMPT_OF} AS attempt_id
    FROM ROWS FROM (unnest(CAST(:job_ids AS bigint[])), unnest(CAST(:attempt_ids AS text[])),
                    jsonb_array_elements(CAST(:payloads AS jsonb))) AS t(job_id, attempt_ref, payload)
), upd AS (
    UPDATE jobs j SET state = 'done', lease_expires_at = NULL, updated_at = now()
    FROM i WHERE {_GUARD}
    RETURNING j.id, i.attempt_id, i.attempt_ref, i.payload
), att AS (
    UPDATE attempts a SET state = 'done', finished_at = now(), outcome = upd.payload
    FROM upd WHERE a.id = upd.attempt_id
), {_waking(":capped")}
SELECT id, attempt_ref FROM upd, {_WOKEN}
"""

_FAIL_SQL = f"""
WITH i AS (
    SELECT t.*, {_ATTEMPT_OF} AS attempt_id
    FROM ROWS FROM (unnest(CAST(:job_ids AS bigint[])), unnest(CAST(:attempt_ids AS text[])),
                    unnest(CAST(:retryable AS boolean[])), unnest(CAST(:no_charge AS boolean[])),
                    jsonb_array_elements(CAST(:payloads AS jsonb)))
        AS t(job_id, attempt_ref, retryable, no_charge, payload)
), upd AS (
    -- A site that pushed back, or a worker that found itself the problem
    -- (workers.wire.failures), is not the job's fault: the job waits in the
    -- queue, its resets untouched (a pushed-back site's claims are paused).
    UPDATE jobs j SET
        state = CASE WHEN i.no_charge THEN 'todo' WHEN NOT i.retryable THEN 'failed'
                     ELSE {states.retry_state(':max_resets')} END,
        resets = j.resets + CASE WHEN i.retryable AND NOT i.no_charge THEN 1 ELSE 0 END,
        not_before = CASE WHEN i.no_charge THEN now() WHEN i.retryable
            THEN now() + {states.backoff(':backoff', 'j.resets')} ELSE j.not_before END,
        lease_expires_at = NULL, last_error = i.payload -> 'error', updated_at = now()
    FROM i WHERE {_GUARD}
    RETURNING j.id, i.attempt_id, i.attempt_ref, i.payload, j.state, j.site_key
), att AS (
    UPDATE attempts a SET state = 'failed', finished_at = now(), error = upd.payload
    FROM upd WHERE a.id = upd.attempt_id
), {_waking("upd.state = 'todo' OR :capped")}
SELECT id, attempt_ref, state, site_key, payload FROM upd, {_WOKEN}
"""

_EXTEND_SQL = f"""
WITH i AS (
    SELECT t.*, {_ATTEMPT_OF} AS attempt_id
    FROM unnest(CAST(:job_ids AS bigint[]), CAST(:attempt_ids AS text[])) AS t(job_id, attempt_ref)
), upd AS (
    UPDATE jobs j SET lease_expires_at = GREATEST(j.lease_expires_at,
            LEAST(now() + make_interval(secs => :ext), j.deadline_at, a.deadline_at))
    FROM i JOIN attempts a ON a.id = i.attempt_id
    WHERE {_GUARD}
    RETURNING j.id, i.attempt_id, i.attempt_ref, j.lease_expires_at
), att AS (
    UPDATE attempts a SET lease_expires_at = upd.lease_expires_at
    FROM upd WHERE a.id = upd.attempt_id
)
SELECT id, attempt_ref, floor(extract(epoch FROM lease_expires_at))::bigint FROM upd
"""


def _dedupe(items: list[dict]) -> list[dict]:
    seen, unique = set(), []
    for item in items:
        key = (item["job_id"], item["attempt_id"])
        if key not in seen:
            seen.add(key)
            unique.append(item)
    return unique


_EXPLAIN_SQL = f"""
SELECT t.job_id, t.attempt_ref, a.state AS attempt_state, a.worker_id, a.worker_owner,
       COALESCE(a.outcome, a.error) AS payload, a.project_id, j.state AS job_state
FROM unnest(CAST(:job_ids AS bigint[]), CAST(:attempt_ids AS text[])) AS t(job_id, attempt_ref)
JOIN attempts a ON a.id = {_ATTEMPT_OF} AND a.job_id = t.job_id
JOIN jobs j ON j.id = a.job_id
"""


def _explain_rejections(run: Statements, project_id: str, worker: Worker, pending: dict,
                        ended_as: str | None, payloads: dict) -> None:
    """Fill the results of items the guarded statement did not move.

    An item whose attempt already ended as ``ended_as`` with the same payload
    is a replay: ``applied``. Everything else is ``stale_attempt`` with
    ``job_status`` null, as SavewebHQ answers it.
    """
    if not pending:
        return
    rows = run.rows(_EXPLAIN_SQL, {
        "job_ids": _bigint_array(job_id for (job_id, _) in pending),
        "attempt_ids": _text_array(ref for (_, ref) in pending)}, named=True)
    by_item = {(r.job_id, r.attempt_ref): r for r in rows}
    for key, result in pending.items():
        row = by_item.get(key)
        if row is None or row.project_id != project_id:
            result.error = _stale("no such attempt for this job")
            continue
        if not (row.worker_id == worker.worker_id and row.worker_owner == worker.owner):
            result.error = _stale("attempt belongs to another worker")
        elif ended_as is not None and row.attempt_state == ended_as and row.payload == payloads[key]:
            result.status = "applied"
            result.job_status = savewebhq_state(row.job_state)
        elif row.attempt_state in ("running", "uploading"):
            result.error = _stale("lease expired")
        else:
            result.error = _stale(f"attempt already {row.attempt_state}")


def _json_array(payloads: dict, unique: list[dict]) -> str:
    # One JSON array for the batch: a text[] of JSON documents costs psycopg a
    # regex escape per quote of every element, the hottest Python on complete.
    return json.dumps([payloads[(it["job_id"], it["attempt_id"])] for it in unique])


def _wake_params(project: ProjectView) -> dict:
    """The parameters of ``_waking``."""
    return {"wake_channel": wakeups.CHANNEL,
            "capped": project.max_in_flight is not None or project.max_worker_in_flight is not None}


def _run_outcome(project: ProjectView, worker: Worker, items: list[dict], sql: str, params: dict,
                 ended_as: str | None, payloads: dict, moved=lambda rows: None,
                 run: Statements = IN_SESSION) -> list[dict]:
    """``moved``: called with the rows the statement moved, before the commit."""
    unique = _dedupe(items)
    results = {(it["job_id"], it["attempt_id"]): ItemResult(it["job_id"], it["attempt_id"])
               for it in unique}
    rows = run.rows(_guarded(sql, run.guard), {"p": project.id, "w": worker.worker_id, "o": worker.owner,
                                              **params, **run.guard_params})
    moved(rows)
    for row in rows:
        result = results[(row[0], row[1])]
        result.status = "applied"
        if ended_as == "done":
            result.job_status = "done"
        elif ended_as == "failed":
            result.job_status = row[2]
        else:
            result.job_status = "wip"
            result.lease_expires_at = row[2]
    if run.guard and len(rows) < len(unique):
        run.commit()
        raise Unconfirmed(f"{len(rows)} of {len(unique)} items moved")
    pending = {k: r for k, r in results.items() if r.status != "applied"}
    _explain_rejections(run, project.id, worker, pending, ended_as, payloads)
    run.commit()
    return [results[(it["job_id"], it["attempt_id"])].as_dict() for it in items]


def complete(project: ProjectView, worker: Worker, items: list[dict],
             run: Statements = IN_SESSION) -> list[dict]:
    """Finish attempts successfully (generic projects). Commits."""
    if project.kind != "generic":
        raise Conflict("jobs of pdf projects finish only through an archived upload",
                       code="invalid_transition")
    unique = _dedupe(items)
    payloads = {(it["job_id"], it["attempt_id"]): {
        "outcome": it["outcome"], "artifact_receipts": it.get("artifact_receipts", [])}
        for it in unique}
    job_ids, attempt_ids = _parse_ids(unique)
    params = {"job_ids": job_ids, "attempt_ids": attempt_ids,
              "payloads": _json_array(payloads, unique),
              **_wake_params(project)}
    return _run_outcome(project, worker, items, _COMPLETE_SQL, params, "done", payloads, run=run)


def _code(item_or_payload: dict) -> str | None:
    error = item_or_payload.get("error")
    return error.get("code") if isinstance(error, dict) else None


def fail(project: ProjectView, worker: Worker, items: list[dict],
         run: Statements = IN_SESSION) -> list[dict]:
    """Report failed attempts; retryable ones go back to the queue. A site
    that pushed back (workers.wire.failures) is paused for every worker
    (app.sites.pushback); its job, like one whose worker found itself the
    problem, goes back without a reset. Commits."""
    unique = _dedupe(items)
    payloads = {(it["job_id"], it["attempt_id"]): {"retryable": it["retryable"], "error": it["error"]}
                for it in unique}
    job_ids, attempt_ids = _parse_ids(unique)
    params = {"job_ids": job_ids, "attempt_ids": attempt_ids,
              "retryable": _boolean_array(it["retryable"] for it in unique),
              "no_charge": _boolean_array(_code(it) in NOT_THE_JOBS_FAULT for it in unique),
              "payloads": _json_array(payloads, unique),
              "max_resets": project.max_resets, "backoff": float(project.retry_backoff_seconds),
              **_wake_params(project)}

    def pause_sites(rows) -> None:
        for row in rows:
            if row[3] is not None and _code(row[4]) in SITE_PUSHBACK:
                pushback.report(row[3], row[4]["error"], worker.worker_id)
    return _run_outcome(project, worker, items, _FAIL_SQL, params, "failed", payloads, pause_sites, run)


def pauses_sites(items: list[dict]) -> bool:
    """Whether a fail batch may pause a site (a pushback code, app.sites.pushback)."""
    return any(_code(item) in SITE_PUSHBACK for item in items)


def extend(project: ProjectView, worker: Worker, items: list[dict], extend_seconds: int,
           run: Statements = IN_SESSION) -> list[dict]:
    """Renew live leases: new lease = max(current, now + extend), never past a deadline."""
    unique = _dedupe(items)
    job_ids, attempt_ids = _parse_ids(unique)
    params = {"job_ids": job_ids, "attempt_ids": attempt_ids, "ext": float(extend_seconds)}
    return _run_outcome(project, worker, items, _EXTEND_SQL, params, None, {}, run=run)
