"""Receipts: the master's durable statement about an attempt's upload."""
from __future__ import annotations

from sqlalchemy import text

from app.errors import NotFound
from app.extensions import db
from app.projects.leasing import Worker


def get(attempt_id: int, worker: Worker | None) -> dict:
    """The receipt ``{job_id, attempt_id, state, sha256, size, asset_key, error}``.

    ``worker`` limits it to the caller's own attempts (None: any, for admins;
    a token worker with ``worker_id`` None: any attempt of that user).
    """
    row = db.session.execute(text(
        "SELECT job_id, attempt_id, state, sha256, size, asset_key, error, worker_id, worker_owner "
        "FROM uploads WHERE attempt_id = :a"), {"a": attempt_id}).first()
    mine = worker is None or (row is not None and row[8] == worker.owner
                              and worker.worker_id in (None, row[7]))
    if row is None or not mine:
        raise NotFound("no receipt for this attempt", details={"attempt_id": str(attempt_id)})
    return {"job_id": row[0], "attempt_id": str(row[1]), "state": row[2], "sha256": row[3],
            "size": row[4], "asset_key": row[5], "error": row[6]}


def for_job(job_id: int) -> list[dict]:
    rows = db.session.execute(text(
        "SELECT job_id, attempt_id, state, sha256, size, asset_key, error FROM uploads "
        "WHERE job_id = :j ORDER BY attempt_id"), {"j": job_id}).all()
    return [{"job_id": r[0], "attempt_id": str(r[1]), "state": r[2], "sha256": r[3],
             "size": r[4], "asset_key": r[5], "error": r[6]} for r in rows]
