"""Admin views of jobs: paged lists, detail with attempt history, requeue, delete."""
from __future__ import annotations

from sqlalchemy import text

from app.errors import Conflict, NotFound
from app.extensions import db
from app.projects import wakeups
from app.projects.models import JOB_STATES

_COLUMNS = ("id, ext_id, value, type, via, hops, attr, random_key, state, created_at, updated_at, "
            "not_before, deadline_at, current_attempt_id, worker_id, lease_expires_at, resets, "
            "attempts_count, last_error")


def _ts(value):
    return int(value.timestamp()) if value is not None else None


def _job_dict(row) -> dict:
    m = row._mapping
    return {
        "job_id": str(m["id"]), "id": m["ext_id"], "value": m["value"], "type": m["type"],
        "via": m["via"], "hops": m["hops"], "attr": m["attr"], "random_key": m["random_key"],
        "state": m["state"], "created_at": _ts(m["created_at"]), "updated_at": _ts(m["updated_at"]),
        "not_before": _ts(m["not_before"]), "deadline_at": _ts(m["deadline_at"]),
        "current_attempt_id": str(m["current_attempt_id"]) if m["current_attempt_id"] else None,
        "worker_id": m["worker_id"], "lease_expires_at": _ts(m["lease_expires_at"]),
        "resets": m["resets"], "attempts": m["attempts_count"], "last_error": m["last_error"],
    }


def list_jobs(project_id: str, *, status: str | None, after_job_id: int | None, limit: int) -> dict:
    """One page in job-id order; ``next_after_job_id`` continues it (cursor paging)."""
    where = ["project_id = :p"]
    params = {"p": project_id, "limit": limit}
    if status is not None:
        where.append("state = :s")
        params["s"] = status
    if after_job_id is not None:
        where.append("id > :after")
        params["after"] = after_job_id
    rows = db.session.execute(text(
        f"SELECT {_COLUMNS} FROM jobs WHERE {' AND '.join(where)} ORDER BY id LIMIT :limit"),
        params).all()
    jobs = [_job_dict(r) for r in rows]
    more = len(rows) == limit
    return {"jobs": jobs, "next_after_job_id": jobs[-1]["job_id"] if more else None}


def _load(project_id: str, job_id: int):
    row = db.session.execute(text(f"SELECT {_COLUMNS} FROM jobs WHERE id = :id AND project_id = :p"),
                             {"id": job_id, "p": project_id}).first()
    if row is None:
        raise NotFound(f"job {job_id} not found in project {project_id!r}",
                       details={"job_id": str(job_id)})
    return row


def detail(project_id: str, job_id: int) -> dict:
    job = _job_dict(_load(project_id, job_id))
    attempts = db.session.execute(text(
        "SELECT id, worker_id, state, created_at, lease_expires_at, deadline_at, finished_at, "
        "outcome, error FROM attempts WHERE job_id = :id ORDER BY id"), {"id": job_id}).all()
    job["attempt_history"] = [{
        "attempt_id": str(a.id), "worker_id": a.worker_id, "state": a.state,
        "created_at": _ts(a.created_at), "lease_expires_at": _ts(a.lease_expires_at),
        "deadline_at": _ts(a.deadline_at), "finished_at": _ts(a.finished_at),
        "outcome": a.outcome, "error": a.error} for a in attempts]
    done = [a for a in job["attempt_history"] if a["state"] == "done"]
    job["outcome"] = done[-1]["outcome"] if done else None
    job["receipts"] = []  # upload receipts belong to pdf projects
    return job


def requeue(project_id: str, job_id: int) -> dict:
    """Put a failed or exhausted job back in the queue with fresh counters. Commits."""
    row = db.session.execute(text(
        "UPDATE jobs SET state = 'todo', resets = 0, not_before = now(), updated_at = now(), "
        "lease_expires_at = NULL, deadline_at = now() + make_interval(secs => CAST("
        "(SELECT task_timeout_seconds FROM projects WHERE id = :p) AS int)) "
        "WHERE id = :id AND project_id = :p "
        "AND state IN ('failed', 'reset_exhausted') RETURNING id"),
        {"id": job_id, "p": project_id}).first()
    if row is None:
        current = _load(project_id, job_id)
        raise Conflict(f"only failed or reset_exhausted jobs can be requeued (job is "
                       f"{current.state})", code="invalid_transition",
                       details={"state": current.state})
    wakeups.notify(project_id)
    db.session.commit()
    return detail(project_id, job_id)


def delete(project_id: str, job_id: int) -> None:
    deleted = db.session.execute(text(
        "DELETE FROM jobs WHERE id = :id AND project_id = :p AND state NOT IN ('wip', 'staged') "
        "RETURNING id"), {"id": job_id, "p": project_id}).first()
    if deleted is None:
        current = _load(project_id, job_id)
        raise Conflict(f"a {current.state} job cannot be deleted", code="invalid_transition",
                       details={"state": current.state})
    db.session.commit()


def valid_status(status) -> bool:
    return status in JOB_STATES
