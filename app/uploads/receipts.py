"""Receipts: the master's durable statement about an attempt's upload."""
from __future__ import annotations

from sqlalchemy import text

from app.errors import NotFound
from app.extensions import db
from app.projects import wakeups
from app.projects.leasing import Worker

# Receipt states a waiting worker waits through: the master is still at work.
_IN_PROGRESS = ("uploading", "staged")


def wakeup_key(attempt_id: int) -> str:
    """The wake-up channel key of one attempt's receipt (app.projects.wakeups)."""
    return f"r{attempt_id}"


def get(attempt_id: int, worker: Worker | None) -> dict:
    """The receipt ``{job_id, attempt_id, state, sha256, size, asset_key, error}``.

    ``worker`` limits it to the caller's own attempts (None: any, for admins;
    a token worker with ``worker_id`` None: any attempt of that user).
    """
    row = db.session.execute(text(
        "SELECT job_id, attempt_id, state, sha256, size, asset_key, error, worker_id, worker_owner "
        "FROM uploads WHERE attempt_id = :a"), {"a": attempt_id}).mappings().first()
    if row is None or not (worker is None or worker.owns(row)):
        raise NotFound("no receipt for this attempt", details={"attempt_id": str(attempt_id)})
    return _receipt(row)


def wait(attempt_id: int, worker: Worker | None, wait_s: float, listen_dsn: str) -> dict:
    """The receipt, once the master has finished with the upload or after
    ``wait_s`` seconds, whichever comes first (a long poll: no database
    connection is held while waiting)."""
    receipt, _ = wakeups.long_poll(listen_dsn, wakeup_key(attempt_id), wait_s,
                                   lambda _waited: get(attempt_id, worker),
                                   done=lambda current: current["state"] not in _IN_PROGRESS)
    return receipt


def for_job(job_id: int) -> list[dict]:
    rows = db.session.execute(text(
        "SELECT job_id, attempt_id, state, sha256, size, asset_key, error FROM uploads "
        "WHERE job_id = :j ORDER BY attempt_id"), {"j": job_id}).mappings().all()
    return [_receipt(row) for row in rows]


def _receipt(row) -> dict:
    return {"job_id": row["job_id"], "attempt_id": str(row["attempt_id"]), "state": row["state"],
            "sha256": row["sha256"], "size": row["size"], "asset_key": row["asset_key"],
            "error": row["error"]}
