"""Uploads of derived jobs (an OCR output, say): the source a worker asks for
at run time, the text it uploads beside the PDF, and what the PDF must be.

Nothing in the queue names a URL or a path: a worker that claimed a derived
job asks :func:`source_for` for a fresh, short-lived download URL of the
source asset (a presigned S3 URL, or the master's own signed link for the
local store), so no queued job expires and no host needs another's files.

A derived PDF is verified like any upload (app/uploads/ingest.py) plus
:meth:`Rules.check`: the same page count as its source, a text layer, a
size within ``SIZE_FACTOR`` × the source + ``SIZE_SLACK_BYTES``. Its text
must be uploaded first (:func:`store_text`); the archive commit indexes it
and registers the PDF as derived from its source (app/uploads/archive.py).
A source that needed no OCR ends its job as skipped, with no PDF; the text
the worker read from it is indexed as the source's (:func:`index_source_text`).
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from sqlalchemy import text

from app.errors import Conflict, FleetError, InvalidRequest, InvalidText, NotFound, TooLarge
from app.extensions import db
from app.hooks import derived
from app.search.index import check_text, index_paper
from app.projects.leasing import Worker
from workers.wire import pdfcheck

TEXT_MAX_BYTES = 32 * 1024 * 1024
# OCR adds an invisible text layer and re-encodes nothing it need not; four
# times the source (plus a little for tiny sources) bounds what a broken or
# hostile worker can make the archive keep.
SIZE_FACTOR = 4
SIZE_SLACK_BYTES = 1024 * 1024
SOURCE_URL_TTL_S = 900
log = logging.getLogger(__name__)


def _attempt(attempt_id: int, worker: Worker, *, states=("running",)):
    row = db.session.execute(text(
        "SELECT a.job_id, a.worker_id, a.worker_owner, a.state, a.lease_expires_at > now() AS live "
        "FROM attempts a WHERE a.id = :a"), {"a": attempt_id}).mappings().first()
    if not worker.owns(row):
        raise Conflict("no such attempt for this worker", code="stale_attempt")
    if row["state"] not in states or not row["live"]:
        raise Conflict(f"attempt is {row['state']} and no longer leased", code="stale_attempt",
                       details={"attempt_state": row["state"]})
    facts = derived.facts_for_job(row["job_id"])
    if facts is None:
        raise NotFound("this attempt's job is not a derived job")
    return row, facts


def source_for(attempt_id: int, worker: Worker, url_for) -> dict:
    """Where to download the source of a running derived attempt.
    ``url_for(object_key, ttl_s)`` → (url, expires_at)."""
    _, facts = _attempt(attempt_id, worker)
    asset = db.session.execute(text(
        "SELECT object_key, sha256, size FROM assets WHERE canonical_key = :k"),
        {"k": facts["source_key"]}).first()
    db.session.commit()
    if asset is None:
        raise NotFound("the source asset is no longer registered",
                       details={"source_key": facts["source_key"]})
    url, expires_at = url_for(asset[0], SOURCE_URL_TTL_S)
    return {"url": url, "expires_at": expires_at, "sha256": asset[1], "size": asset[2],
            "pages": facts["source_pages"], "languages": facts["languages"],
            "profile": facts["profile"], "source_key": facts["source_key"],
            "options": facts["options"] or {}}


def store_text(attempt_id: int, worker: Worker, sha256: str, body: bytes) -> dict:
    """Keep the plain text of a derived attempt until its archive. Idempotent
    for the same text; a different text after the PDF was sent is refused.
    Commits."""
    if len(body) > TEXT_MAX_BYTES:
        raise TooLarge(f"text uploads are limited to {TEXT_MAX_BYTES} bytes",
                       details={"limit": TEXT_MAX_BYTES})
    if hashlib.sha256(body).hexdigest() != sha256:
        raise InvalidText("SHA-256 of the body differs from X-Text-SHA256",
                          details={"reason": "hash_mismatch"})
    try:
        decoded = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidText(f"the text is not UTF-8 (byte {exc.start})",
                          details={"reason": "not_utf8"}) from None
    if "\x00" in decoded:
        raise InvalidText("the text contains NUL characters", details={"reason": "nul_character"})
    try:  # refused now, not at the archive commit, which must not fail on it
        check_text(f"the text of attempt {attempt_id}", decoded)
    except FleetError as exc:
        raise InvalidText(exc.message, details={"reason": "index_limits", **(exc.details or {})}) from None
    _attempt(attempt_id, worker, states=("running", "uploading"))
    sent = db.session.execute(text(
        "SELECT t.sha256 FROM upload_texts t JOIN uploads u ON u.attempt_id = t.attempt_id "
        "WHERE t.attempt_id = :a AND u.state IN ('uploading', 'staged', 'done')"),
        {"a": attempt_id}).scalar()
    if sent is not None and sent != sha256:
        db.session.rollback()
        raise Conflict("a different text was sent with this attempt's PDF", code="stale_attempt")
    db.session.execute(text(
        "INSERT INTO upload_texts (attempt_id, sha256, size, body) VALUES (:a, :s, :n, :b) "
        "ON CONFLICT (attempt_id) DO UPDATE SET sha256 = EXCLUDED.sha256, size = EXCLUDED.size, "
        "body = EXCLUDED.body, created_at = now()"),
        {"a": attempt_id, "s": sha256, "n": len(body), "b": decoded})
    db.session.commit()
    return {"attempt_id": str(attempt_id), "sha256": sha256, "size": len(body)}


@dataclass(frozen=True)
class Rules:
    """What a derived PDF must be, known before its body is read."""
    source_pages: int | None
    source_size: int
    # Whether the worker's text has any word: a blank page, or a photo with
    # no writing, is OCRed into a PDF with nothing to show and no font.
    text_found: bool = True

    # The papers' minimum size guards against error pages posing as PDFs; an
    # OCRed one-bit scan of a short page is a few KB and is checked otherwise.
    min_bytes = 1

    @property
    def max_bytes(self) -> int:
        return SIZE_FACTOR * self.source_size + SIZE_SLACK_BYTES

    def check(self, info: pdfcheck.PdfInfo) -> None:
        """Raises PdfRejected (the attempt fails retryably, as for any bad file)."""
        if self.source_pages is not None and info.pages != self.source_pages:
            raise pdfcheck.PdfRejected(
                "page_count", f"the derived PDF has {info.pages} pages, its source {self.source_pages}")
        if self.text_found and not info.font_pages:
            raise pdfcheck.PdfRejected("no_text_layer", "the derived PDF has no text layer")
        if info.size > self.max_bytes:
            raise pdfcheck.PdfRejected(
                "too_large_for_source", f"the derived PDF is {info.size} bytes; at most "
                f"{self.max_bytes} for a {self.source_size}-byte source")


def rules_for(attempt_id: int) -> Rules | None:
    """The derived checks of an upload, or None for an ordinary job (one
    index lookup on the upload path). Raises InvalidRequest when the text
    was not uploaded first."""
    row = db.session.execute(text(
        "SELECT dj.source_pages, dj.source_size, "
        "(SELECT t.body ~ '\\S' FROM upload_texts t WHERE t.attempt_id = a.id) "
        "FROM attempts a JOIN derived_jobs dj ON dj.job_id = a.job_id WHERE a.id = :a"),
        {"a": attempt_id}).first()
    db.session.commit()
    if row is None:
        return None
    if row[2] is None:
        raise InvalidRequest("a derived PDF needs its text first: PUT /api/v1/fleet/uploads/"
                             f"{attempt_id}/text", details={"field": "text"})
    return Rules(row[0], row[1], text_found=row[2])


@dataclass(frozen=True)
class Archived:
    """How the archive commit registers and indexes a derived upload."""
    canonical_key: str       # the derived asset's own registry key
    source_key: str
    source_project_id: str
    languages: str
    text: str


def for_archive(attempt_id: int, job_id: int) -> Archived | None:
    facts = derived.facts_for_job(job_id)
    if facts is None:
        return None
    body = db.session.execute(text("SELECT body FROM upload_texts WHERE attempt_id = :a"),
                              {"a": attempt_id}).scalar()
    return Archived(f"{facts['profile']}:{facts['source_key']}", facts["source_key"],
                    facts["source_project_id"], facts["languages"], body or "")


def index_source_text(attempt_id: int, facts) -> None:
    """A skipped derived job (its source needed no OCR): the source's own
    text, if the worker sent it, into the index, in the caller's transaction,
    so a born-digital paper is found by its words like a scanned one."""
    body = db.session.execute(text("SELECT body FROM upload_texts WHERE attempt_id = :a"),
                              {"a": attempt_id}).scalar()
    if body is None:
        return
    try:
        with db.session.begin_nested():  # a failed index must not undo the skip
            index_paper(facts["source_key"], facts["source_project_id"], body)
    except FleetError as exc:
        log.warning("text of skipped attempt %s not indexed: %s", attempt_id, exc.message)
    forget_text(attempt_id)


def forget_text(attempt_id: int) -> None:
    db.session.execute(text("DELETE FROM upload_texts WHERE attempt_id = :a"), {"a": attempt_id})


def forget_finished_texts(limit: int = 500) -> int:
    """Texts whose attempt ended without an archive (failed, expired,
    cancelled, or gone): nothing will index them. Commits."""
    gone = db.session.execute(text("""
        DELETE FROM upload_texts WHERE attempt_id IN (
            SELECT t.attempt_id FROM upload_texts t LEFT JOIN attempts a ON a.id = t.attempt_id
            WHERE a.id IS NULL OR a.state IN ('failed', 'expired', 'cancelled', 'done')
            LIMIT :n)"""), {"n": limit}).rowcount
    db.session.commit()
    return gone
