"""Held uploads: unacknowledged files of revoked workers (DESIGN §8.7).

When a worker is revoked, an upload of its that was still streaming — or a
staged one that could not be archived within the retention — is not thrown
away with the attempt: the upload becomes ``held`` and its spool file is
kept, quota and all, so an admin can look at what the machine sent. Nothing
archives or sweeps a held file; an admin releases it (``flask fleet
release-held``, or the worker's page), which deletes it and frees the quota.
Held uploads that never left a file are released by the spool sweeper once
their transfer can no longer be running.
"""
from __future__ import annotations

import logging
import os

from sqlalchemy import text

from app.errors import Conflict, NotFound
from app.extensions import db
from app.uploads import transitions
from app.uploads.spool import Spool, in_store

log = logging.getLogger(__name__)
MAX_ROWS = 500


def listing(worker_id: str | None = None, owner: str | None = None, *,
            limit: int = MAX_ROWS) -> list[dict]:
    """Held uploads, oldest first, optionally of one worker (``owner`` for a
    token worker's user)."""
    rows = db.session.execute(text("""
        SELECT u.attempt_id, u.job_id, u.project_id, u.worker_id, u.worker_owner, u.sha256, u.size,
               u.generation, u.spool_file, u.error, u.held_at
        FROM uploads u
        WHERE u.state = 'held'
          AND (CAST(:w AS text) IS NULL OR (u.worker_id = :w
               AND u.worker_owner IS NOT DISTINCT FROM CAST(:o AS text)))
        ORDER BY u.held_at, u.attempt_id
        LIMIT :n"""), {"w": worker_id, "o": owner, "n": min(limit, MAX_ROWS)}).mappings().all()
    db.session.commit()
    return [{
        "attempt_id": str(r["attempt_id"]), "job_id": r["job_id"], "project_id": r["project_id"],
        "worker_id": r["worker_id"], "user_id": r["worker_owner"], "sha256": r["sha256"],
        "size": r["size"], "spool_file": r["spool_file"],
        "file_present": bool(r["spool_file"]) and (in_store(r["spool_file"])
                                                   or os.path.exists(r["spool_file"])),
        "error": r["error"], "held_at": int(r["held_at"].timestamp()) if r["held_at"] else None,
    } for r in rows]


def held_file(attempt_id: int, spool: Spool) -> tuple[str, str] | None:
    """(location, sha256) of a held upload's file for an admin to download
    (a path, or a staging key with s3 staging), or None when the upload is
    not held or left no file. Only paths inside the spool directory are ever
    returned."""
    row = db.session.execute(text(
        "SELECT spool_file, sha256 FROM uploads WHERE attempt_id = :a AND state = 'held'"),
        {"a": attempt_id}).first()
    db.session.commit()
    if row is None or not row[0]:
        return None
    if in_store(row[0]):
        return (row[0], row[1]) if spool.exists(row[0]) else None
    path = os.path.realpath(row[0])
    if os.path.dirname(path) != os.path.realpath(spool.directory) or not os.path.isfile(path):
        return None
    return path, row[1]


def release(attempt_id: int, spool: Spool, released_by: str) -> dict:
    """Release one held upload: it fails, its quota is freed, its files go.

    Raises what :func:`transitions.release_held` raises.
    """
    released = transitions.release_held(attempt_id)
    log.info("held upload released", extra={"attempt_id": attempt_id, "released_by": released_by})
    # Every name the transfer may have left: the part file if it never
    # finished, the sealed file otherwise (both carry the held generation).
    for path in {spool.part_path(attempt_id, released.generation),
                 spool.final_path(attempt_id, released.generation), released.spool_file}:
        spool.remove(path)
    return {"attempt_id": str(attempt_id), "state": "failed"}


def release_worker(worker_id: str, owner: str | None, spool: Spool, released_by: str) -> list[dict]:
    """Release every held upload of one worker that can be released now.

    Uploads whose transfer may still be streaming are left held (an admin
    releases them later, or the sweeper once nothing arrived).
    """
    released = []
    while True:  # listings stop at MAX_ROWS: go on while a full page made progress
        page = listing(worker_id, owner)
        before = len(released)
        for row in page:
            try:
                released.append(release(int(row["attempt_id"]), spool, released_by))
            except (Conflict, NotFound):
                continue  # still streaming, or released meanwhile by someone else
        if len(page) < MAX_ROWS or len(released) == before:
            return released


def release_fileless(spool: Spool, *, grace_s: float) -> int:
    """Release held uploads that never left a file (the transfer had already
    failed when the worker was revoked, or never started): nothing to look
    at, and their quota would otherwise stay reserved until an admin acted.
    Only once the upload budget is over by ``grace_s``. Returns how many."""
    rows = db.session.execute(text("""
        SELECT attempt_id, generation FROM uploads
        WHERE state = 'held' AND spool_file IS NULL
          AND upload_deadline_at < now() - make_interval(secs => :g)
        ORDER BY attempt_id LIMIT :n"""), {"g": grace_s, "n": MAX_ROWS}).all()
    db.session.commit()
    count = 0
    for attempt_id, generation in rows:
        if any(os.path.exists(p) for p in (spool.part_path(attempt_id, generation),
                                           spool.final_path(attempt_id, generation))):
            continue  # a file is there after all: an admin decides
        try:
            release(attempt_id, spool, "sweeper")
        except (Conflict, NotFound):
            continue
        count += 1
    return count
