"""Requeue or delete every job matching a filter, in the background.

:func:`start` records the action (with the count the admin confirmed), its
outbox row and its audit row in one transaction. The ``bulk_jobs`` actor
calls :func:`run`, which works through the matching jobs in id order,
``BATCH`` at a time, each batch one short transaction that also records the
progress, until ``SLICE_S`` has passed; then it hands over to a fresh message
(the outbox row re-sends it if that message is lost, so a crash resumes
where the last committed batch stopped). The same rules as one job's
requeue and delete apply: only failed or exhausted jobs are requeued (not
those tried by ``max_worker_attempts`` distinct workers), jobs in flight
are never deleted; the others count as skipped.
"""
from __future__ import annotations

import json
import time

from sqlalchemy import text

from app import audit
from app.errors import InvalidRequest, NotFound
from app.extensions import db
from app import outbox
from app.projects import jobs_admin, service, wakeups
from app.projects.job_search import COUNT_CAP, JobFilter, count
from app.projects.models import BULK_ACTIONS

TOPIC = "bulk_jobs"
BATCH = 1000
SLICE_S = 20.0
# While a slice runs its outbox row is not due: the reconciler re-sends it
# only if no batch has committed for this long (the worker died).
STALL_S = 120


def preview(project_id: str, found: JobFilter) -> dict:
    """What the confirmation shows: the count (exact up to the cap)."""
    service.get(project_id)
    matched, exact = count(project_id, found)
    return {"matched": matched, "exact": exact}


def start(project_id: str, action: str, found: JobFilter, *, actor: str, reason: str | None) -> int:
    """Record a bulk action and queue its first slice. Commits; returns its id."""
    if action not in BULK_ACTIONS:
        raise InvalidRequest(f"action must be one of {', '.join(BULK_ACTIONS)}", details={"field": "action"})
    if found.is_empty():
        raise InvalidRequest("a bulk action needs a filter: an empty one would match every job",
                             details={"field": "filter"})
    service.get(project_id)
    matched, _ = count(project_id, found)
    # The jobs the admin confirmed: none enqueued after this moment.
    through = db.session.execute(text("SELECT max(id) FROM jobs WHERE project_id = :p"),
                                 {"p": project_id}).scalar() or 0
    action_id = db.session.execute(text(
        "INSERT INTO bulk_actions (project_id, action, filter, matched, through_job_id, created_by, "
        "reason) VALUES (:p, :a, CAST(:f AS jsonb), :m, :through, :by, :r) RETURNING id"),
        {"p": project_id, "a": action, "f": json.dumps(found.as_dict()), "m": matched,
         "through": through, "by": actor, "r": reason}).scalar_one()
    outbox.add(TOPIC, action_id)
    audit.record(f"jobs.bulk_{action}", "project", project_id,
                 {"bulk_action": action_id, "filter": found.as_dict(), "matched": matched}, reason=reason)
    db.session.commit()
    return action_id


_SHOWN = ("SELECT id, project_id, action, filter, state, matched, processed, changed, skipped, "
          "last_error, created_by, reason, created_at, updated_at, finished_at FROM bulk_actions ")


def get(project_id: str, action_id: int) -> dict:
    row = db.session.execute(text(_SHOWN + "WHERE id = :i AND project_id = :p"),
                             {"i": action_id, "p": project_id}).mappings().first()
    if row is None:
        raise NotFound(f"no bulk action {action_id} in project {project_id!r}")
    return _view(row)


def recent(project_id: str, limit: int = 10) -> list[dict]:
    rows = db.session.execute(text(_SHOWN + "WHERE project_id = :p ORDER BY id DESC LIMIT :n"),
                              {"p": project_id, "n": limit}).mappings().all()
    return [_view(r) for r in rows]


def _view(row) -> dict:
    out = dict(row)
    for name in ("created_at", "updated_at", "finished_at"):
        out[name] = out[name].timestamp() if out[name] is not None else None
    # The search counts matches up to its cap: past it, "matched" is a lower bound.
    out["matched_capped"] = row["matched"] >= COUNT_CAP
    out["percent"] = 100.0 if row["state"] == "done" else (
        min(99.9, 100.0 * row["processed"] / row["matched"]) if row["matched"] else 0.0)
    return out


def cancel(project_id: str, action_id: int) -> dict:
    """Stop a running action after its current batch. Commits."""
    moved = db.session.execute(text(
        "UPDATE bulk_actions SET state = 'cancelled', finished_at = now(), updated_at = now() "
        "WHERE id = :i AND project_id = :p AND state = 'running' RETURNING id"),
        {"i": action_id, "p": project_id}).first()
    if moved is None:
        db.session.rollback()
        return get(project_id, action_id)
    outbox.done(TOPIC, action_id)
    audit.record("jobs.bulk_cancel", "project", project_id, {"bulk_action": action_id})
    db.session.commit()
    return get(project_id, action_id)


def run(action_id: int, *, slice_s: float = SLICE_S, batch: int = BATCH) -> str:
    """Work on one action for up to ``slice_s``. Returns ``done``,
    ``more`` (a next slice is queued), ``busy`` (another worker holds it)
    or ``gone`` (finished, cancelled or deleted). Commits each batch."""
    deadline = time.monotonic() + slice_s
    while True:
        row = db.session.execute(text(
            "SELECT project_id, action, filter, state, scanned_through, through_job_id FROM bulk_actions "
            "WHERE id = :i FOR UPDATE SKIP LOCKED"), {"i": action_id}).mappings().first()
        if row is None:
            db.session.rollback()
            exists = db.session.execute(text("SELECT state FROM bulk_actions WHERE id = :i"),
                                        {"i": action_id}).scalar()
            if exists is None:
                outbox.done(TOPIC, action_id)
                db.session.commit()
                return "gone"
            return "busy"
        if row["state"] != "running":
            outbox.done(TOPIC, action_id)
            db.session.commit()
            return "gone"
        where, params = JobFilter.from_dict(row["filter"]).where()
        ids = db.session.execute(text(
            f"SELECT j.id FROM jobs j WHERE j.project_id = :project AND j.id > :after "
            f"AND j.id <= :upto AND {where} ORDER BY j.id LIMIT :n"),
            {**params, "project": row["project_id"], "after": row["scanned_through"],
             "upto": row["through_job_id"], "n": batch}
        ).scalars().all()
        apply = jobs_admin.requeue_many if row["action"] == "requeue" else jobs_admin.delete_many
        changed = apply(list(ids)) if ids else 0
        finished = len(ids) < batch
        totals = db.session.execute(text(
            "UPDATE bulk_actions SET scanned_through = :through, processed = processed + :n, "
            "changed = changed + :c, skipped = skipped + :n - :c, updated_at = now(), "
            "state = CASE WHEN :fin THEN 'done' ELSE state END, "
            "finished_at = CASE WHEN :fin THEN now() END WHERE id = :i "
            "RETURNING processed, changed, skipped"),
            {"through": ids[-1] if ids else row["scanned_through"], "n": len(ids), "c": changed,
             "fin": finished, "i": action_id}).mappings().one()
        if changed and row["action"] == "requeue":
            wakeups.notify(row["project_id"])
        if finished:
            outbox.done(TOPIC, action_id)
            audit.record(f"jobs.bulk_{row['action']}_done", "project", row["project_id"],
                         {"bulk_action": action_id, **totals})
            db.session.commit()
            return "done"
        outbox.defer(TOPIC, action_id, STALL_S)
        db.session.commit()
        if time.monotonic() >= deadline:
            outbox.send_hint(TOPIC, action_id)  # the next slice, as a fresh message
            return "more"
