"""The owner of upload-related job, attempt and upload states (the job and
attempt transitions are declared in ``app.projects.states``).

Admission, staging, rejection, archive completion, cancellation, staged
expiry, and holding/releasing the files of revoked workers. Transitions of
live (running or uploading) attempts lock the job row and then the attempt
first — the lock order of claims, outcomes, the reaper and revocation — and
all of them move rows with guarded ``UPDATE``s whose row counts decide. The
spool reservation of an upload is released in the same transaction that
takes the upload out of a live state, so quota is
freed exactly once; a held upload keeps its reservation until released.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import text

from app import audit
from app.errors import Conflict, NotFound, UploadMismatch
from app.extensions import db
from app.projects import states, wakeups
from app.projects.leasing import Worker
from app.projects.models import UPLOAD_KINDS
from app.uploads import receipts
from app.uploads import spool as spool_mod

# The upload's worker has been revoked: a node (no owner) or a token worker
# of the owning user. Its unacknowledged files are held (DESIGN §8.7).
_WORKER_REVOKED = """(
    (u.worker_owner IS NULL AND EXISTS (
        SELECT 1 FROM fleet_nodes n WHERE n.id = u.worker_id AND n.status = 'revoked'))
    OR (u.worker_owner IS NOT NULL AND EXISTS (
        SELECT 1 FROM token_workers t WHERE t.user_id = u.worker_owner
        AND t.worker_id = u.worker_id AND t.status = 'revoked')))"""


@dataclass
class Admission:
    """What the upload route should do next."""
    action: str               # "stream" | "receipt"
    attempt_id: int
    job_id: int
    generation: int = 0
    deadline_s: float = 0.0   # seconds left in the upload budget
    state: str | None = None  # receipt state when action == "receipt"


def _notify_receipt(attempt_id: int) -> None:
    wakeups.notify(receipts.wakeup_key(attempt_id))


def _lock(attempt_id: int):
    """The attempt with its job row locked, or None."""
    return db.session.execute(text("""
        SELECT a.id, a.job_id, a.project_id, a.worker_id, a.worker_owner, a.state,
               a.lease_expires_at > now() AS lease_live,
               (a.deadline_at IS NULL OR a.deadline_at > now()) AS attempt_in_time,
               j.state AS job_state, j.current_attempt_id,
               (j.deadline_at IS NULL OR j.deadline_at > now()) AS job_in_time,
               p.kind, p.upload_timeout_seconds,
               extract(epoch FROM j.deadline_at - now()) AS job_left_s
        FROM attempts a JOIN jobs j ON j.id = a.job_id JOIN projects p ON p.id = a.project_id
        WHERE a.id = :a FOR UPDATE OF j, a"""), {"a": attempt_id}).mappings().first()


def _lock_owned(attempt_id: int, worker: Worker):
    """``_lock`` for the caller's own attempt; else Conflict ``stale_attempt``."""
    row = _lock(attempt_id)
    if not worker.owns(row):
        db.session.rollback()
        raise Conflict("no such attempt for this worker", code="stale_attempt")
    return row


def admit(attempt_id: int, worker: Worker, sha256: str, size: int, spool) -> Admission:
    """Admit an upload (DESIGN §8.1–2) and reserve its spool quota. Commits.

    Raises:
        NotFound-like Conflict ``stale_attempt`` for attempts the caller does
        not own or that can no longer upload; ``UploadMismatch`` for a
        different SHA-256/size than an earlier upload of the same attempt;
        ``SpoolFull`` when the quota is exhausted.
    """
    row = _lock_owned(attempt_id, worker)
    if row["kind"] not in UPLOAD_KINDS:
        db.session.rollback()
        raise Conflict("uploads are for pdf and documents projects", code="invalid_transition")
    upload = db.session.execute(text(
        "SELECT state, sha256, size, generation, extract(epoch FROM upload_deadline_at - now()), "
        # Locked before the spool quota row, the order of the sweeper's
        # expire_abandoned (upload, then quota), so the two cannot deadlock.
        "reserved_bytes FROM uploads WHERE attempt_id = :a FOR UPDATE"), {"a": attempt_id}).first()
    same = upload is not None and upload[1] == sha256 and upload[2] == size
    if upload is not None and not same and upload[0] in ("uploading", "staged", "done"):
        db.session.rollback()
        raise UploadMismatch("a different file was already uploaded for this attempt",
                             details={"sha256": upload[1], "size": upload[2]})
    if upload is not None and same and upload[0] in ("staged", "done"):
        db.session.rollback()
        return Admission("receipt", attempt_id, row["job_id"], upload[3], state=upload[0])

    if upload is not None and same and upload[0] == "uploading" and row["state"] == "uploading":
        if not upload[5]:
            # The last transfer ended early and gave its reservation back
            # (``interrupted``): this one takes it again (SpoolFull: no change).
            try:
                spool_mod.reserve(spool, size)
            except Exception:
                db.session.rollback()
                raise
        generation = db.session.execute(text(
            "UPDATE uploads SET generation = generation + 1, reserved_bytes = :size, updated_at = now() "
            "WHERE attempt_id = :a AND state = 'uploading' RETURNING generation"),
            {"a": attempt_id, "size": size}).scalar()
        db.session.commit()
        return Admission("stream", attempt_id, row["job_id"], generation, max(0.0, float(upload[4])))

    budget = float(row["upload_timeout_seconds"])
    if row["job_left_s"] is not None:
        budget = min(budget, float(row["job_left_s"]))
    ordinary = (row["state"] == "running" and row["current_attempt_id"] == attempt_id
                and row["job_state"] == "wip" and row["lease_live"] and row["job_in_time"])
    late = (row["state"] in ("running", "expired") and not row["lease_live"]
            and row["job_state"] not in ("staged", "done") and row["job_in_time"])
    if late:
        _make_current_again(row)  # the download is finished: never throw it away
    elif not ordinary:
        db.session.rollback()
        raise Conflict(f"attempt is {row['state']} and cannot upload", code="stale_attempt",
                       details={"attempt_state": row["state"], "job_state": row["job_state"]})
    if budget <= 0:
        db.session.rollback()
        raise Conflict("the task deadline has passed", code="stale_attempt")

    if upload is not None and upload[0] == "uploading":
        # A late upload replaces a transfer the sweeper has not expired yet:
        # hand its reservation back before taking a new one.
        spool_mod.release(upload[5])
    spool_mod.reserve(spool, size)
    moved = db.session.execute(text(
        "UPDATE attempts SET state = 'uploading', lease_expires_at = now() + make_interval(secs => :b) "
        "WHERE id = :a AND state IN ('running', 'expired')"), {"a": attempt_id, "b": budget}).rowcount
    db.session.execute(text(
        "UPDATE jobs SET lease_expires_at = GREATEST(lease_expires_at, now() + make_interval(secs => :b)), "
        "updated_at = now() WHERE id = :j AND current_attempt_id = :a AND state = 'wip'"),
        {"j": row["job_id"], "a": attempt_id, "b": budget})
    if not moved:
        db.session.rollback()
        raise Conflict("attempt changed while admitting the upload", code="stale_attempt")
    db.session.execute(text("""
        INSERT INTO uploads (attempt_id, job_id, project_id, worker_id, worker_owner, state, sha256,
                             size, generation, reserved_bytes, upload_deadline_at)
        VALUES (:a, :j, :p, :w, :o, 'uploading', :sha, :size, 1, :size,
                now() + make_interval(secs => :b))
        ON CONFLICT (attempt_id) DO UPDATE SET state = 'uploading', sha256 = EXCLUDED.sha256,
            size = EXCLUDED.size, generation = uploads.generation + 1,
            reserved_bytes = EXCLUDED.reserved_bytes, upload_deadline_at = EXCLUDED.upload_deadline_at,
            error = NULL, updated_at = now()
        """), {"a": attempt_id, "j": row["job_id"], "p": row["project_id"], "w": row["worker_id"],
               "o": row["worker_owner"], "sha": sha256, "size": size, "b": budget})
    generation = db.session.execute(text("SELECT generation FROM uploads WHERE attempt_id = :a"),
                                    {"a": attempt_id}).scalar()
    db.session.commit()
    return Admission("stream", attempt_id, row["job_id"], generation, budget)


def _make_current_again(row) -> None:
    """A late upload wins the job back: newer running attempts are cancelled."""
    newer = db.session.execute(text(
        "UPDATE attempts SET state = 'cancelled', finished_at = now() "
        "WHERE job_id = :j AND id <> :a AND state IN ('running', 'uploading') RETURNING id"),
        {"j": row["job_id"], "a": row["id"]}).scalars().all()
    db.session.execute(text(
        "UPDATE jobs SET state = 'wip', current_attempt_id = :a, worker_id = a.worker_id, "
        "worker_owner = a.worker_owner, lease_expires_at = now(), updated_at = now() "
        "FROM attempts a WHERE a.id = :a AND jobs.id = :j AND jobs.state NOT IN ('staged', 'done')"),
        {"a": row["id"], "j": row["job_id"]})
    for attempt_id in newer:
        _fail_live_upload(attempt_id, {"code": "cancelled", "message": "superseded by a late upload"})


def stage(attempt_id: int, generation: int, spool_file: str, spool_stamp: str, meta: dict) -> bool:
    """Mark a verified, durable upload as staged and ask for its archive commit.

    Guarded by generation: an abandoned transfer whose newer generation
    exists cannot stage. Commits. Returns False when the guard failed.
    """
    if _lock(attempt_id) is None:  # job and attempt first, like every transition
        db.session.rollback()
        return False
    staged = db.session.execute(text(
        "UPDATE uploads SET state = 'staged', spool_file = :f, spool_stamp = :stamp, "
        "staged_at = now(), updated_at = now(), pages = :pages, "
        "source_url = :src, download_strategy = :strategy, download_result = CAST(:result AS jsonb) "
        "WHERE attempt_id = :a AND generation = :g AND state = 'uploading' RETURNING job_id"),
        {"a": attempt_id, "g": generation, "f": spool_file, "stamp": spool_stamp,
         "src": meta.get("source_url"), "pages": meta.get("pages"),
         "strategy": meta.get("download_strategy"),
         "result": json.dumps(meta["download_result"]) if meta.get("download_result") is not None
         else None}).first()
    if staged is None:
        db.session.rollback()
        return False
    attempt = db.session.execute(text(
        "UPDATE attempts SET state = 'staged' WHERE id = :a AND state = 'uploading'"),
        {"a": attempt_id}).rowcount
    job = db.session.execute(text(
        "UPDATE jobs SET state = 'staged', lease_expires_at = NULL, updated_at = now() "
        "WHERE id = :j AND current_attempt_id = :a AND state = 'wip'"),
        {"j": staged[0], "a": attempt_id}).rowcount
    if not (attempt and job):
        db.session.rollback()
        return False
    from app import outbox
    outbox.add("archive_commit", attempt_id)
    _notify_receipt(attempt_id)
    db.session.commit()
    return True


def _fail_live_upload(attempt_id: int, error: dict) -> None:
    freed = db.session.execute(text(
        "UPDATE uploads SET state = 'failed', error = CAST(:e AS jsonb), updated_at = now() "
        "WHERE attempt_id = :a AND state IN ('uploading', 'staged') RETURNING reserved_bytes"),
        {"a": attempt_id, "e": json.dumps(error)}).scalar()
    if freed is not None:
        spool_mod.release(freed)
        _notify_receipt(attempt_id)


def reject(attempt_id: int, generation: int, error: dict) -> None:
    """A permanent problem with the uploaded file (422): the attempt fails
    retryably so another try may fetch a good copy. Commits."""
    _lock(attempt_id)  # job and attempt first, like every transition
    still = db.session.execute(text(
        "SELECT 1 FROM uploads WHERE attempt_id = :a AND generation = :g AND state = 'uploading'"),
        {"a": attempt_id, "g": generation}).first()
    if still is None:
        db.session.rollback()
        return  # a newer generation owns the attempt now
    _fail_live_upload(attempt_id, error)
    _requeue_after_bad_file(attempt_id, "uploading", "wip", error)
    db.session.commit()


def _requeue_after_bad_file(attempt_id: int, attempt_state: str, job_state: str, error: dict) -> None:
    """The attempt's file is bad: the attempt fails retryably and its job goes
    back to the queue with backoff (or fails, out of resets or time)."""
    moved = db.session.execute(text(f"""
        WITH att AS (
            UPDATE attempts SET state = 'failed', finished_at = now(),
                error = jsonb_build_object('retryable', true, 'error', CAST(:e AS jsonb))
            WHERE id = :a AND state = :as RETURNING job_id
        )
        UPDATE jobs j SET {states.retry_set('p.max_resets', 'p.retry_backoff_seconds')},
            last_error = CAST(:e AS jsonb), updated_at = now()
        FROM att, projects p
        WHERE j.id = att.job_id AND j.current_attempt_id = :a AND j.state = :js AND p.id = j.project_id
        RETURNING j.project_id, j.state"""),
        {"a": attempt_id, "e": json.dumps(error), "as": attempt_state, "js": job_state}).first()
    if moved is not None and moved[1] == "todo":
        wakeups.notify(moved[0])


def discard_damaged(attempt_id: int, error: dict) -> bool:
    """A staged file no longer matches what was uploaded (written or damaged
    after staging): the upload fails and frees its quota, and the job goes
    back to the queue for a fresh download. Commits. False if not staged."""
    _lock(attempt_id)
    freed = db.session.execute(text(
        "UPDATE uploads SET state = 'failed', error = CAST(:e AS jsonb), updated_at = now() "
        "WHERE attempt_id = :a AND state = 'staged' RETURNING reserved_bytes"),
        {"a": attempt_id, "e": json.dumps(error)}).scalar()
    if freed is None:
        db.session.rollback()
        return False
    spool_mod.release(freed)
    _requeue_after_bad_file(attempt_id, "staged", "staged", error)
    _notify_receipt(attempt_id)
    db.session.commit()
    return True


def complete(attempt_id: int, asset_key: str) -> bool:
    """Archive committed: upload, attempt and job become done, hooks are queued,
    the reservation is released. Commits. Returns False if already done."""
    row = db.session.execute(text(
        "UPDATE uploads SET state = 'done', asset_key = :k, done_at = now(), updated_at = now() "
        "WHERE attempt_id = :a AND state = 'staged' RETURNING reserved_bytes, job_id, project_id"),
        {"a": attempt_id, "k": asset_key}).first()
    if row is None:
        db.session.rollback()
        return False
    spool_mod.release(row[0])
    db.session.execute(text(
        "UPDATE attempts SET state = 'done', finished_at = now(), "
        "outcome = jsonb_build_object('asset_key', CAST(:k AS text)) WHERE id = :a AND state = 'staged'"),
        {"a": attempt_id, "k": asset_key})
    db.session.execute(text(
        "UPDATE jobs SET state = 'done', updated_at = now() "
        "WHERE id = :j AND current_attempt_id = :a AND state = 'staged'"), {"j": row[1], "a": attempt_id})
    from app.hooks import deliveries
    deliveries.queue_for_asset(row[2], attempt_id, asset_key)
    _notify_receipt(attempt_id)
    # The job no longer holds a slot of the project's in-flight caps: a claim
    # long-polling because the caps were full goes on now, not at its timeout.
    wakeups.notify(row[2])
    db.session.commit()
    return True


def skip_derived(attempt_id: int, worker: Worker, reason: str, details: dict) -> dict:
    """A derived job's input needs no work (an OCR source that already has
    text): its running attempt and the job are done without an upload, the
    source's own text (sent before, if the worker read it) is indexed, and
    the hooks waiting for the job close. Commits; idempotent for a replay.

    Raises Conflict ``stale_attempt`` (not the caller's, or no longer
    running) and NotFound (not a derived job)."""
    from app.hooks import derived
    from app.uploads import derived as derived_uploads
    row = _lock_owned(attempt_id, worker)
    facts = derived.facts_for_job(row["job_id"])
    if facts is None:
        db.session.rollback()
        raise NotFound("this attempt's job is not a derived job")
    outcome = {"skipped": reason, **details}
    if row["state"] == "done" and row["job_state"] == "done":
        db.session.rollback()
        return {"job_id": row["job_id"], "attempt_id": str(attempt_id), "state": "done"}
    ordinary = (row["state"] == "running" and row["current_attempt_id"] == attempt_id
                and row["job_state"] == "wip" and row["lease_live"])
    if not ordinary:
        db.session.rollback()
        raise Conflict(f"attempt is {row['state']} and cannot finish", code="stale_attempt",
                       details={"attempt_state": row["state"], "job_state": row["job_state"]})
    db.session.execute(text(
        "UPDATE attempts SET state = 'done', finished_at = now(), outcome = CAST(:o AS jsonb) "
        "WHERE id = :a AND state = 'running'"), {"a": attempt_id, "o": json.dumps(outcome)})
    db.session.execute(text(
        "UPDATE jobs SET state = 'done', lease_expires_at = NULL, updated_at = now() "
        "WHERE id = :j AND current_attempt_id = :a AND state = 'wip'"),
        {"j": row["job_id"], "a": attempt_id})
    derived_uploads.index_source_text(attempt_id, facts)
    derived.job_finished(row["job_id"])
    wakeups.notify(row["project_id"])  # a slot of the project's caps is free
    db.session.commit()
    return {"job_id": row["job_id"], "attempt_id": str(attempt_id), "state": "done"}


def hold_uploads(attempt_ids: list[int]) -> int:
    """Revocation, after ``leasing.cancel_worker_attempts``: uploads of the
    cancelled attempts still streaming are held — their files are kept, with
    their quota, until an admin releases them (DESIGN §8.7). The caller commits."""
    held = db.session.execute(text(
        "UPDATE uploads SET state = 'held', held_at = now(), updated_at = now(), "
        "error = jsonb_build_object('code', 'cancelled', 'message', 'worker revoked') "
        "WHERE attempt_id = ANY(:a) AND state = 'uploading' RETURNING attempt_id"),
        {"a": list(attempt_ids)}).scalars().all()
    for attempt_id in held:
        _notify_receipt(attempt_id)
    return len(held)


def interrupted(attempt_id: int, generation: int) -> None:
    """A transfer that ended early (the client went away, the budget ran
    out) gives its spool reservation back at once; the attempt stays
    uploading and a retry reserves again (``admit``). Commits."""
    freed = db.session.execute(text("""
        WITH was AS (
            SELECT attempt_id, reserved_bytes FROM uploads
            WHERE attempt_id = :a AND generation = :g AND state = 'uploading' AND reserved_bytes > 0
            FOR UPDATE
        )
        UPDATE uploads u SET reserved_bytes = 0, updated_at = now()
        FROM was WHERE u.attempt_id = was.attempt_id
        RETURNING was.reserved_bytes"""), {"a": attempt_id, "g": generation}).scalar()
    if freed:
        spool_mod.release(freed)
    db.session.commit()


def expire_abandoned(limit: int = 500) -> int:
    """Uploads whose attempt is no longer uploading (lease ran out, cancelled):
    mark them expired and free their quota. Commits."""
    rows = db.session.execute(text("""
        WITH gone AS (
            SELECT u.attempt_id FROM uploads u JOIN attempts a ON a.id = u.attempt_id
            WHERE u.state = 'uploading' AND a.state <> 'uploading'
            LIMIT :n FOR UPDATE OF u SKIP LOCKED
        )
        UPDATE uploads u SET state = 'expired', updated_at = now(),
            error = jsonb_build_object('code', 'timeout', 'message', 'upload did not finish in time')
        FROM gone WHERE u.attempt_id = gone.attempt_id AND u.state = 'uploading'
        RETURNING u.attempt_id, u.reserved_bytes"""), {"n": limit}).all()
    for attempt_id, reserved in rows:
        spool_mod.release(reserved)
        _notify_receipt(attempt_id)
    db.session.commit()
    return len(rows)


def expire_staged(retention_s: int, limit: int = 500) -> int:
    """Staged uploads that could not be archived within the retention fail
    and free their quota; their jobs fail. A revoked worker's file is held
    instead, quota and all, until an admin releases it. Commits."""
    rows = db.session.execute(text(f"""
        UPDATE uploads u SET
            state = CASE WHEN {_WORKER_REVOKED} THEN 'held' ELSE 'failed' END,
            held_at = CASE WHEN {_WORKER_REVOKED} THEN now() END, updated_at = now(),
            error = jsonb_build_object('code', 'storage_unavailable',
                                       'message', 'not archived within the staged retention')
        WHERE u.state = 'staged'
          AND attempt_id IN (SELECT attempt_id FROM uploads WHERE state = 'staged'
                             AND staged_at < now() - make_interval(secs => :r)
                             LIMIT :n FOR UPDATE SKIP LOCKED)
        RETURNING attempt_id, reserved_bytes, job_id, state"""), {"r": retention_s, "n": limit}).all()
    for attempt_id, reserved, job_id, state in rows:
        if state == "failed":
            spool_mod.release(reserved)
        db.session.execute(text(
            "UPDATE attempts SET state = 'failed', finished_at = now() WHERE id = :a AND state = 'staged'"),
            {"a": attempt_id})
        db.session.execute(text(
            "UPDATE jobs SET state = 'failed', updated_at = now(), last_error = "
            "jsonb_build_object('code', 'storage_unavailable', 'message', 'archive failed') "
            "WHERE id = :j AND current_attempt_id = :a AND state = 'staged'"), {"j": job_id, "a": attempt_id})
        _notify_receipt(attempt_id)
    db.session.commit()
    return len(rows)


def keep_if_held(attempt_id: int, generation: int, path: str) -> bool:
    """Instead of deleting an admitted upload's file: if revocation put the
    upload on hold, record the file (it is kept) and return True. Commits."""
    kept = db.session.execute(text(
        "UPDATE uploads SET spool_file = :f, updated_at = now() "
        "WHERE attempt_id = :a AND generation = :g AND state = 'held' RETURNING 1"),
        {"a": attempt_id, "g": generation, "f": path}).first()
    db.session.commit()
    return kept is not None


@dataclass(frozen=True)
class Released:
    attempt_id: int
    generation: int
    spool_file: str | None


def release_held(attempt_id: int) -> Released:
    """An admin is done with a held upload: it fails and its quota is freed.
    The caller deletes the files after this commits.

    Raises:
        NotFound: no upload for this attempt.
        Conflict ``invalid_transition``: the upload is not held, or its
            transfer may still be streaming (no file recorded yet and the
            upload budget not yet over): its quota is still in use.
    """
    row = db.session.execute(text("""
        UPDATE uploads SET state = 'failed', updated_at = now(),
            error = COALESCE(error, '{}'::jsonb) || jsonb_build_object('released_at', now())
        WHERE attempt_id = :a AND state = 'held'
          AND NOT (spool_file IS NULL AND upload_deadline_at > now())
        RETURNING reserved_bytes, generation, spool_file"""), {"a": attempt_id}).first()
    if row is None:
        found = db.session.execute(text(
            "SELECT state, extract(epoch FROM upload_deadline_at - now()) FROM uploads "
            "WHERE attempt_id = :a"), {"a": attempt_id}).first()
        db.session.rollback()
        if found is None:
            raise NotFound("no upload for this attempt", details={"attempt_id": str(attempt_id)})
        if found[0] == "held":
            raise Conflict("the transfer may still be streaming; release it once its upload budget "
                           f"is over (in {max(1, int(found[1] or 0))} s)", code="invalid_transition",
                           details={"attempt_id": str(attempt_id), "state": "held"})
        raise Conflict(f"the upload is {found[0]}, not held", code="invalid_transition",
                       details={"attempt_id": str(attempt_id), "state": found[0]})
    spool_mod.release(row[0])
    _notify_receipt(attempt_id)
    audit.record("upload.release", "attempt", attempt_id, {"bytes": row[0]})
    db.session.commit()
    return Released(attempt_id, row[1], row[2])
