"""Archive commit (DESIGN §8.6): object store, asset registry, done receipt.

Runs in the ``archive_commit`` actor. The object-store call happens with no
transaction open; the final state change is one transaction. Any failure
leaves the upload staged and pushes its outbox row back with backoff, so a
store outage delays archiving and loses nothing.
"""
from __future__ import annotations

import logging

from sqlalchemy import text

from app import outbox
from app.documents import runs as document_runs
from app.extensions import db
from app.hooks import derived
from app.search.index import index_paper
from app.storage.base import IntegrityError, ObjectNotFound, StorageError, content_key
from app.uploads import derived as derived_uploads
from app.uploads import spool as spool_mod
from app.uploads import transitions
from workers.wire.canonical import InvalidIdentifier, canonical_key

log = logging.getLogger(__name__)


def _canonical(value: str, sha256: str) -> str:
    try:
        return canonical_key(value)
    except InvalidIdentifier:
        return f"sha256:{sha256}"  # a value we cannot classify is keyed by content


def _retry(attempt_id: int, exc: Exception) -> str:
    tries = outbox.retry_later("archive_commit", attempt_id, f"{exc.__class__.__name__}: {exc}")
    db.session.execute(text("UPDATE uploads SET commit_tries = commit_tries + 1, updated_at = now() "
                            "WHERE attempt_id = :a"), {"a": attempt_id})
    db.session.commit()
    log.warning("archive of attempt %s failed (try %s): %s", attempt_id, tries, exc)
    return "retry"


def commit(attempt_id: int, store) -> str:
    """Archive one staged upload. Returns ``done``, ``retry`` or ``skip``."""
    row = db.session.execute(text(
        "SELECT u.sha256, u.size, u.spool_file, u.spool_stamp, u.project_id, u.job_id, j.value, u.pages "
        "FROM uploads u JOIN jobs j ON j.id = u.job_id "
        "WHERE u.attempt_id = :a AND u.state = 'staged'"), {"a": attempt_id}).first()
    db.session.commit()  # nothing may stay open across the object-store call
    if row is None:
        outbox.done("archive_commit", attempt_id)
        db.session.commit()
        return "skip"
    sha256, size, spool_file, spool_stamp, project_id, job_id, value, pages = row
    object_key = content_key(sha256)
    try:
        if spool_mod.in_store(spool_file):
            # s3 staging: a copy inside the store, checked against the SHA-256
            # the store recorded when the web process put it.
            store.copy(spool_file, object_key, sha256_hex=sha256, size=size)
        else:
            # Its bytes were hashed as they streamed in; while the file is still
            # the one sealed then (same inode, size, mtime) the store need not
            # read it again. Anything else is re-hashed by the store and
            # refused if wrong.
            unchanged = spool_stamp is not None and spool_mod.stamp(spool_file) == spool_stamp
            store.put_file(object_key, spool_file, sha256_hex=sha256, size=size,
                           source_hashed=unchanged)
    except ObjectNotFound as exc:
        # The staged object is gone (deleted by hand, or a bucket lifecycle
        # rule): no retry can bring it back, so the job goes back to the queue.
        log.error("staged object of attempt %s is missing: %s", attempt_id, exc)
        return _discard_damaged(attempt_id, f"the staged object is missing: {exc}", None, store)
    except IntegrityError as exc:
        if exc.stored:  # the store's object is wrong: an operator's problem, keep retrying
            return _retry(attempt_id, exc)
        # The spool file itself no longer matches: retrying cannot help.
        log.error("spool file of attempt %s no longer matches its upload: %s", attempt_id, exc)
        return _discard_damaged(attempt_id, f"the staged file changed after upload: {exc}",
                                spool_file, store)
    except (StorageError, OSError) as exc:
        return _retry(attempt_id, exc)
    made_from = derived_uploads.for_archive(attempt_id, job_id)
    key = made_from.canonical_key if made_from else _canonical(value, sha256)
    # An existing asset keeps its own hash and size: the first archived copy wins.
    db.session.execute(text(
        "INSERT INTO assets (canonical_key, sha256, size, object_key, project_id, job_id, attempt_id, "
        "pages, derived_from) VALUES (:k, :sha, :size, :obj, :p, :j, :a, :pages, :src) "
        "ON CONFLICT (canonical_key) DO NOTHING"),
        {"k": key, "sha": sha256, "size": size, "obj": object_key, "p": project_id, "j": job_id,
         "a": attempt_id, "pages": pages, "src": made_from.source_key if made_from else None})
    db.session.execute(text("UPDATE uploads SET canonical_key = :k WHERE attempt_id = :a"),
                       {"k": key, "a": attempt_id})
    if made_from is not None:
        # The master is the index's only writer: the text goes in with the
        # done receipt, in one transaction, and the waiting hooks close.
        index_paper(made_from.source_key, made_from.source_project_id, made_from.text,
                    derived_key=key, languages=made_from.languages)
        document_runs.indexed(job_id, made_from.source_key, made_from.source_project_id)
        derived_uploads.forget_text(attempt_id)
        derived.job_finished(job_id)
    completed = transitions.complete(attempt_id, object_key)  # done receipt + hooks; commits
    outbox.done("archive_commit", attempt_id)
    db.session.commit()
    if not completed:
        return "skip"  # finished or expired meanwhile; nothing more to do
    spool_mod.remove_location(spool_file, store)
    return "done"


def _discard_damaged(attempt_id: int, message: str, spool_file: str | None, store) -> str:
    """No retry can help: the upload fails with ``spool_damaged`` and its job
    goes back to the queue; what is left of the file goes."""
    transitions.discard_damaged(attempt_id, {"code": "spool_damaged", "message": message})
    outbox.done("archive_commit", attempt_id)
    db.session.commit()
    spool_mod.remove_location(spool_file, store)
    return "skip"
