"""The spool sweeper: expire uploads that can no longer finish, and remove
spool files that no live or held upload owns."""
from __future__ import annotations

import logging
import time

from sqlalchemy import text

from app.extensions import db
from app.uploads import derived as derived_uploads
from app.uploads import held, transitions
from app.storage.base import StorageError
from app.uploads.spool import Spool, in_store

log = logging.getLogger(__name__)

# A part file younger than this may belong to a transfer that is still
# streaming on another web process; never race it.
ORPHAN_GRACE_S = 15 * 60


def sweep(config, *, now: float | None = None) -> dict:
    spool = Spool.from_config(config)
    abandoned = transitions.expire_abandoned()
    expired = transitions.expire_staged(int(config["STAGED_RETENTION_S"]))
    removed = remove_orphans(spool, now=now)
    released = held.release_fileless(spool, grace_s=ORPHAN_GRACE_S)
    texts = derived_uploads.forget_finished_texts()
    return {"abandoned": abandoned, "expired": expired, "orphans_removed": removed,
            "held_released": released, "texts_dropped": texts}


def remove_orphans(spool: Spool, *, now: float | None = None, grace_s: float = ORPHAN_GRACE_S,
                   local_only: bool = False) -> int:
    """Remove spool files and staged objects no live or held upload owns.

    ``local_only``: this host's spool directory only, as a web process
    does at start (with s3 staging its scratch files are on no other host's
    disk, and a web process killed mid-upload leaves them there).
    """
    now = time.time() if now is None else now
    live = {row[0]: (row[1], row[2], row[3]) for row in db.session.execute(text(
        "SELECT attempt_id, state, generation, spool_file FROM uploads "
        "WHERE state IN ('uploading', 'staged', 'held')"))}
    db.session.commit()
    try:
        files = spool.local_files() if local_only else spool.files()
    except StorageError as exc:  # the store is down: sweep this host's files, the rest next time
        log.warning("could not list staged objects: %s", exc)
        files = spool.local_files()
    # Staged files of uploads that have ended (done, failed, expired): left
    # by a process that died between the receipt and its clean-up. A
    # generation the row has recorded is over and may go at once; a newer one
    # may be a retry being admitted right now, and waits out the grace like
    # any file without a row. So do part files: a transfer whose upload
    # expired may still be streaming into one.
    unowned = sorted({attempt for path, attempt, _, _ in files
                      if attempt not in live and not path.endswith(".part")})
    ended = {}
    if unowned:
        ended = dict(db.session.execute(text(
            "SELECT attempt_id, generation FROM uploads WHERE attempt_id = ANY(:ids) "
            "AND state IN ('done', 'failed', 'expired')"), {"ids": unowned}).all())
        db.session.commit()
    removed = 0
    for path, attempt_id, generation, mtime in files:
        if attempt_id in ended and generation <= ended[attempt_id] and not path.endswith(".part"):
            spool.remove(path)
            removed += 1
            continue
        owner = live.get(attempt_id)
        if owner is not None:
            state, current_generation, spool_file = owner
            if state == "staged" and path == spool_file:
                continue
            if state == "held" and generation == current_generation:
                continue  # kept for an admin, finished or not (DESIGN §8.7)
            if state == "uploading" and generation == current_generation and now - mtime < grace_s:
                continue
        if owner is None and now - mtime < grace_s and (path.endswith(".part")
                                                  or (in_store(path) and path.endswith(".pdf"))):
            # admitted or staged a moment ago by another process, its row not
            # visible yet (a part file streaming, an object put before staging)
            continue
        spool.remove(path)
        removed += 1
    return removed
