"""Admin views of jobs — cursor-paged lists and details in two shapes — and
the admin's requeue and delete.

Two shapes of the same rows: the v1 contract's AdminJob (``contract_*``;
five statuses, a ``staged`` job shown as ``wip``, the current attempt only
while the job is in flight) and FleetHQ's full view (every state, attempt
history, ``not_before``, ``deadline_at``).
"""
from __future__ import annotations

from sqlalchemy import text

from app import audit
from app.errors import InvalidRequest, NotFound
from app.extensions import changed, db
from app.projects import states, wakeups
from app.projects.models import JOB_STATES, savewebhq_state

CONTRACT_STATUSES = ("todo", "wip", "done", "failed", "reset_exhausted")
# The jobs states each contract status stands for.
_CONTRACT_STATES = {**{s: (s,) for s in CONTRACT_STATUSES}, "wip": ("wip", "staged")}
_LIVE = ("wip", "staged")
_FINISHED = ("done", "failed", "reset_exhausted")

# The current attempt comes along for its wire id and, once the job is done,
# the payload its completion stored: {"outcome": …, "artifact_receipts": […]}.
_SELECT = """
SELECT j.id, j.ext_id, j.value, j.type, j.via, j.hops, j.attr, j.random_key, j.site_key, j.state,
       j.created_at, j.updated_at, j.not_before, j.deadline_at, j.current_attempt_id,
       j.worker_id, j.lease_expires_at, j.resets, j.attempts_count, j.last_error,
       a.wire_id AS attempt_wire_id,
       CASE WHEN j.state = 'done' THEN a.outcome END AS done_payload
FROM jobs j LEFT JOIN attempts a ON a.id = j.current_attempt_id
"""


def _ts(value):
    return int(value.timestamp()) if value is not None else None


def _spec(m) -> dict:
    """The JobSpec fields that are set, as a worker's claim shows them."""
    spec = {}
    if m["ext_id"] is not None:
        spec["id"] = m["ext_id"]
    spec["value"] = m["value"]
    spec["type"] = m["type"]
    for name in ("via", "hops", "attr"):
        if m[name] is not None:
            spec[name] = m[name]
    return spec


def _full_job(row) -> dict:
    m = row._mapping
    return {
        "job_id": m["id"], "id": m["ext_id"], "value": m["value"], "type": m["type"],
        "via": m["via"], "hops": m["hops"], "attr": m["attr"], "random_key": m["random_key"],
        "site": m["site_key"], "state": m["state"],
        "created_at": _ts(m["created_at"]), "updated_at": _ts(m["updated_at"]),
        "not_before": _ts(m["not_before"]), "deadline_at": _ts(m["deadline_at"]),
        "current_attempt_id": (m["attempt_wire_id"] or str(m["current_attempt_id"])
                               if m["current_attempt_id"] else None),
        "worker_id": m["worker_id"], "lease_expires_at": _ts(m["lease_expires_at"]),
        "resets": m["resets"], "attempts": m["attempts_count"], "last_error": m["last_error"],
    }


def _outcome(payload) -> dict | None:
    outcome = payload.get("outcome") if isinstance(payload, dict) else None
    if not isinstance(outcome, dict):
        return None  # pdf jobs end with an archived upload, not a worker's outcome
    return {"kind": outcome.get("kind"), "code": outcome.get("code"), "uri": outcome.get("uri"),
            "meta": outcome.get("meta") or {}}


def _receipts(payload) -> list:
    receipts = payload.get("artifact_receipts") if isinstance(payload, dict) else None
    return list(receipts) if isinstance(receipts, list) else []


def _execution_error(error) -> dict | None:
    if not isinstance(error, dict) or not isinstance(error.get("code"), str):
        return None
    message = error.get("message")
    return {"code": error["code"], "message": message if isinstance(message, str) else "",
            "details": error.get("details") or {}}


def _contract_job(row) -> dict:
    """The contract's AdminJob. The attempt, worker and lease are shown only
    while the job is in flight; a done job shows the outcome and receipts
    its completion stored and no error; ``completed_at`` is when it ended."""
    m = row._mapping
    state = m["state"]
    live, done = state in _LIVE, state == "done"
    attempt_id = None
    if live and m["current_attempt_id"] is not None:
        attempt_id = m["attempt_wire_id"] or str(m["current_attempt_id"])
    return {
        **_spec(m),
        "job_id": m["id"],
        "random_key": m["random_key"],
        "status": savewebhq_state(state),
        "attempt_id": attempt_id,
        "worker_id": m["worker_id"] if live else None,
        "lease_expires_at": _ts(m["lease_expires_at"]) if live else None,
        "reset_count": m["resets"],
        "outcome": _outcome(m["done_payload"]) if done else None,
        "artifact_receipts": _receipts(m["done_payload"]) if done else [],
        "execution_error": None if done else _execution_error(m["last_error"]),
        "created_at": _ts(m["created_at"]),
        "updated_at": _ts(m["updated_at"]),
        "completed_at": _ts(m["updated_at"]) if state in _FINISHED else None,
    }


def _page(project_id: str, states, after_job_id: int | None, limit: int) -> tuple[list, int | None]:
    """Rows of these states in job-id order after the cursor, and the next cursor.

    One query per state: each is a short range scan of the (project, state,
    id) index, whereas a single ``WHERE project_id = … ORDER BY id`` has no
    index of its own and would walk other projects' jobs or sort a whole
    project. One extra row per state tells whether another page follows.
    """
    rows: list = []
    for state in states:
        rows += db.session.execute(text(
            f"{_SELECT} WHERE j.project_id = :p AND j.state = :s AND j.id > :after "
            "ORDER BY j.id LIMIT :n"),
            {"p": project_id, "s": state, "after": after_job_id or 0, "n": limit + 1}).all()
    rows.sort(key=lambda r: r.id)
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, rows[-1].id if more else None


def list_jobs(project_id: str, *, status: str | None, after_job_id: int | None, limit: int) -> dict:
    """One page of FleetHQ's full job view, optionally of one state."""
    rows, after = _page(project_id, (status,) if status else JOB_STATES, after_job_id, limit)
    return {"jobs": [_full_job(r) for r in rows], "next_after_job_id": after}


def contract_list(project_id: str, *, status: str | None, after_job_id: int | None,
                  limit: int) -> dict:
    """One page of contract AdminJobs; ``status=wip`` includes staged jobs."""
    states = _CONTRACT_STATES[status] if status else JOB_STATES
    rows, after = _page(project_id, states, after_job_id, limit)
    return {"jobs": [_contract_job(r) for r in rows], "next_after_job_id": after}


def _load(project_id: str, job_id: int):
    row = db.session.execute(text(f"{_SELECT} WHERE j.id = :id AND j.project_id = :p"),
                             {"id": job_id, "p": project_id}).first()
    if row is None:
        raise NotFound(f"job {job_id} not found in project {project_id!r}",
                       details={"job_id": job_id})
    return row


def contract_detail(project_id: str, job_id: int) -> dict:
    return _contract_job(_load(project_id, job_id))


def detail(project_id: str, job_id: int) -> dict:
    """FleetHQ's full view with the attempt history, the artifact receipts of
    the completing attempt and when the job ended."""
    row = _load(project_id, job_id)
    job = _full_job(row)
    job["artifact_receipts"] = _receipts(row._mapping["done_payload"])
    job["completed_at"] = job["updated_at"] if job["state"] in _FINISHED else None
    attempts = db.session.execute(text(
        "SELECT id, COALESCE(wire_id, id::text) AS wire, worker_id, state, created_at, "
        "lease_expires_at, deadline_at, finished_at, outcome, error "
        "FROM attempts WHERE job_id = :id ORDER BY id"), {"id": job_id}).all()
    job["attempt_history"] = [{
        "attempt_id": a.wire, "number": a.id, "worker_id": a.worker_id, "state": a.state,
        "created_at": _ts(a.created_at), "lease_expires_at": _ts(a.lease_expires_at),
        "deadline_at": _ts(a.deadline_at), "finished_at": _ts(a.finished_at),
        "outcome": a.outcome, "error": a.error} for a in attempts]
    done = [a for a in job["attempt_history"] if a["state"] == "done"]
    job["outcome"] = done[-1]["outcome"] if done else None
    job["receipts"] = []  # upload receipts belong to pdf projects
    return job


def requeue(project_id: str, job_id: int, *, reason: str | None = None) -> None:
    """Put a failed or exhausted job back in the queue with fresh counters, no
    error and no task deadline (A9): a fresh start, whose deadline starts again
    at its next claim. Commits.

    Raises:
        NotFound: no such job in this project.
        InvalidRequest: the job is neither failed nor reset_exhausted, or it
            was tried by the project's ``max_worker_attempts`` distinct
            workers (the sweep would fail it again at once).
    """
    row = db.session.execute(text(
        "UPDATE jobs SET state = 'todo', resets = 0, not_before = now(), updated_at = now(), "
        "lease_expires_at = NULL, last_error = NULL, deadline_at = NULL, work_left_s = NULL "
        "WHERE id = :id AND project_id = :p AND state IN ('failed', 'reset_exhausted') "
        "RETURNING id"), {"id": job_id, "p": project_id}).first()
    tried = _tried_out(project_id, job_id) if row is not None else None
    if tried is not None:
        db.session.rollback()
        raise InvalidRequest(f"job {job_id} was tried by {tried} distinct workers, the project's "
                             "max_worker_attempts; raise it to requeue the job",
                             details={"field": "max_worker_attempts", "distinct_workers": tried})
    if row is None:
        current = _load(project_id, job_id)
        raise InvalidRequest(f"only failed or reset_exhausted jobs can be requeued (job "
                             f"{job_id} is {current.state})", details={"state": current.state})
    wakeups.notify(project_id)
    audit.record("job.requeue", "job", job_id, {"project": project_id}, reason=reason)
    db.session.commit()


def _tried_out(project_id: str, job_id: int) -> int | None:
    """The number of distinct workers that tried the job, when it reaches the
    project's ``max_worker_attempts``; else None."""
    return db.session.execute(text(
        f"SELECT {states.distinct_workers(':id')} FROM projects p WHERE p.id = :p "
        f"AND p.max_worker_attempts IS NOT NULL "
        f"AND {states.distinct_workers(':id')} >= p.max_worker_attempts"),
        {"id": job_id, "p": project_id}).scalar()


def delete(project_id: str, job_id: int, *, reason: str | None = None) -> None:
    """Delete a job that is not in flight (A10). Commits.

    Raises:
        NotFound: no such job in this project.
        InvalidRequest: the job is wip or staged.
    """
    deleted = db.session.execute(text(
        "DELETE FROM jobs WHERE id = :id AND project_id = :p AND state NOT IN ('wip', 'staged') "
        "RETURNING id, state"), {"id": job_id, "p": project_id}).first()
    if deleted is None:
        current = _load(project_id, job_id)
        raise InvalidRequest(f"a {current.state} job cannot be deleted",
                             details={"state": current.state})
    audit.record("job.delete", "job", job_id, {"project": project_id, "state": deleted[1]},
                 reason=reason)
    db.session.commit()


# A bulk action's batch (app/projects/bulk.py): the same rules as one job's
# requeue and delete, for many ids in one statement; the rest are left as
# they are (the caller counts them as skipped). Caller's transaction.
_REQUEUE_MANY = f"""
UPDATE jobs SET state = 'todo', resets = 0, not_before = now(), updated_at = now(),
       lease_expires_at = NULL, last_error = NULL, deadline_at = NULL, work_left_s = NULL
WHERE id = ANY(:ids) AND state IN ('failed', 'reset_exhausted')
  AND NOT EXISTS (SELECT 1 FROM projects p WHERE p.id = jobs.project_id
                  AND p.max_worker_attempts IS NOT NULL
                  AND {states.distinct_workers('jobs.id')} >= p.max_worker_attempts)
"""


def requeue_many(job_ids: list[int]) -> int:
    """Requeue those of ``job_ids`` that can be; returns how many were."""
    return changed(text(_REQUEUE_MANY), {"ids": job_ids})


def delete_many(job_ids: list[int]) -> int:
    """Delete those of ``job_ids`` not in flight; returns how many were."""
    return changed(text(
        "DELETE FROM jobs WHERE id = ANY(:ids) AND state NOT IN ('wip', 'staged')"),
        {"ids": job_ids})


def valid_status(status) -> bool:
    return status in JOB_STATES


def valid_contract_status(status) -> bool:
    return status in CONTRACT_STATUSES
