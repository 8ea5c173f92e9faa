"""Putting a document in: check, archive, register, then queue its OCR run.

Every way in (the upload API, the page form, the consume folder, ``flask
fleet documents add``) ends in :func:`add_file` with the file on this host's
disk and its SHA-256 known. In order:

1. the project must be a ``documents`` project taking work; a file already
   in it (the same SHA-256) answers its existing document, adding nothing;
2. :func:`app.documents.formats.prepare` checks the file and makes the PDF
   OCR gets (a PDF stays as it is; an image is converted without loss);
3. the object store gets the PDF and, for an image, the file as it came,
   under content-addressed keys — with no transaction open;
4. one transaction: the ``documents`` row, the asset ``doc:<sha256>``, the
   OCR run's derived-job identity and its job in the same project (the
   derived-job path of app/hooks/derived.py: an OCR worker asks for the
   source at run time and the archive commit indexes its text under the
   document's asset key), and an audit row. Only then is the answer sent.

A crash before step 4 leaves at most content-addressed objects that the next
try of the same file finds again; nothing is half registered.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass

from sqlalchemy import text

from app import audit
from app.documents import formats
from app.errors import InvalidDocument, InvalidRequest, StorageUnavailable
from app.extensions import db
from app.hooks import derived
from app.hooks.derived import LANGUAGES, PROFILE_NAME
from app.projects import enqueue, service, wakeups
from app.storage.base import StorageError, content_key
from workers.wire import pdfcheck

log = logging.getLogger(__name__)
DEFAULT_PROFILE = {"name": "ocr", "languages": "eng"}
FILENAME_MAX = 255
CHUNK = 1024 * 1024
SCRATCH = "intake"  # under the spool directory; the spool sweeper ignores it


@dataclass(frozen=True)
class Added:
    document_id: int
    created: bool


def clean_filename(name: str | None, sha256: str) -> str:
    """The name to show and download under: its last path part, printable,
    at most 255 characters; a nameless file is named by its hash."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(ch for ch in base if ch.isprintable() and ch not in "\r\n\t").strip()
    if not base or base in (".", ".."):
        base = f"document-{sha256[:12]}"
    if len(base) > FILENAME_MAX:
        stem, dot, suffix = base.rpartition(".")
        base = (stem[:FILENAME_MAX - len(suffix) - 1] + dot + suffix) if dot and len(suffix) < 16 \
            else base[:FILENAME_MAX]
    return base


def check_profile(languages: str | None) -> dict:
    languages = languages or DEFAULT_PROFILE["languages"]
    if not isinstance(languages, str) or not LANGUAGES.match(languages):
        raise InvalidRequest("languages must be Tesseract language names joined by '+' "
                             "(e.g. eng+pol), at most 8", details={"field": "languages"})
    return {"name": DEFAULT_PROFILE["name"], "languages": languages}


def documents_project(project_id: str):
    project = service.get(project_id)
    if project.kind != "documents":
        db.session.rollback()
        raise InvalidRequest(f"{project_id} is a {project.kind} project; documents go into a "
                             "project of kind documents", details={"field": "project_id"})
    service.ensure_status(project, "active", "draining")
    return project


def scratch_dir(spool_directory: str) -> tempfile.TemporaryDirectory:
    """A private directory for one intake, on the spool's filesystem."""
    root = os.path.join(spool_directory, SCRATCH)
    os.makedirs(root, mode=0o700, exist_ok=True)
    return tempfile.TemporaryDirectory(dir=root)


def sha256_file(path: str) -> tuple[str, int]:
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        return digest, f.tell()


def _existing(project_id: str, sha256: str) -> int | None:
    return db.session.execute(text(
        "SELECT id FROM documents WHERE project_id = :p AND sha256 = :s"),
        {"p": project_id, "s": sha256}).scalar()


def _archived_asset(key: str):
    return db.session.execute(text(
        "SELECT sha256, size, object_key, pages FROM assets WHERE canonical_key = :k"),
        {"k": key}).first()


def add_file(project_id: str, path: str, sha256: str, filename: str | None, *, via: str,
             by: str, store, workdir: str, max_bytes: int, languages: str | None = None) -> Added:
    """Put the file at ``path`` (its SHA-256 known) into a documents project.
    Commits. Raises InvalidDocument (422), StorageUnavailable (503), or the
    project's NotFound / InvalidRequest / Conflict."""
    profile = check_profile(languages)
    documents_project(project_id)
    name = clean_filename(filename, sha256)
    found = _existing(project_id, sha256)
    asset_key = f"doc:{sha256}"
    asset = _archived_asset(asset_key)
    db.session.commit()  # nothing stays open across the checks and the store
    if found is not None:
        return Added(found, False)
    size = os.path.getsize(path)
    if size > max_bytes:
        raise InvalidDocument(f"{name}: {size} bytes; documents are limited to {max_bytes} bytes",
                              details={"file": name, "reason": "too_large", "limit": max_bytes})
    try:
        prepared = formats.prepare(path, sha256, name, workdir, max_bytes=max_bytes)
    except formats.Refused as exc:
        raise InvalidDocument(exc.message, details={"file": name, "reason": exc.reason}) from None
    except pdfcheck.PdfCheckError as exc:
        raise StorageUnavailable(f"{name}: could not check the file: {exc}",
                                 retry_after_ms=5000) from None
    original_key = content_key(sha256, formats.SUFFIXES[prepared.media_type])
    if asset is not None:  # the same file archived before (another project)
        pdf_sha256, pdf_size, pdf_key, pages = asset
    else:
        pdf_sha256, pdf_size, pages = prepared.pdf_sha256, prepared.pdf_size, prepared.pages
        pdf_key = content_key(pdf_sha256)
        _put(store, pdf_key, prepared.pdf_path, pdf_sha256, pdf_size, name,
             hashed=prepared.pdf_path == path)
    if original_key != pdf_key:
        _put(store, original_key, path, sha256, size, name, hashed=True)
    try:
        return _register(project_id, sha256, size, name, prepared.media_type, original_key,
                         asset_key, (pdf_sha256, pdf_size, pdf_key, pages), profile, via, by)
    except Exception:
        db.session.rollback()
        raise


def _put(store, key: str, path: str, sha256: str, size: int, name: str, *, hashed: bool) -> None:
    try:
        store.put_file(key, path, sha256_hex=sha256, size=size, source_hashed=hashed)
    except StorageError as exc:
        raise StorageUnavailable(f"{name}: the archive is unavailable: {exc}",
                                 retry_after_ms=5000) from None


def _register(project_id, sha256, size, name, media_type, original_key, asset_key, pdf, profile,
              via, by) -> Added:
    pdf_sha256, pdf_size, pdf_key, pages = pdf
    project = service.get(project_id)
    document_id = db.session.execute(text("""
        INSERT INTO documents (project_id, sha256, size, filename, media_type, original_key,
                               asset_key, pdf_sha256, pdf_size, pages, added_via, added_by)
        VALUES (:p, :s, :n, :f, :m, :o, :k, :ps, :pn, :pages, :via, :by)
        ON CONFLICT (project_id, sha256) DO NOTHING RETURNING id"""),
        {"p": project_id, "s": sha256, "n": size, "f": name, "m": media_type, "o": original_key,
         "k": asset_key, "ps": pdf_sha256, "pn": pdf_size, "pages": pages, "via": via,
         "by": by}).scalar()
    if document_id is None:  # the same file came in at the same moment
        found = _existing(project_id, sha256)
        db.session.commit()
        return Added(found, False)
    db.session.execute(text(
        "INSERT INTO assets (canonical_key, sha256, size, object_key, project_id, pages) "
        "VALUES (:k, :s, :n, :o, :p, :pages) ON CONFLICT (canonical_key) DO NOTHING"),
        {"k": asset_key, "s": pdf_sha256, "n": pdf_size, "o": pdf_key, "p": project_id,
         "pages": pages})
    job_id = queue_run(project, document_id, profile)
    audit.record("documents.add", "project", project_id, {
        "document_id": document_id, "filename": name, "sha256": sha256, "size": size,
        "media_type": media_type, "pages": pages, "via": via, "job_id": job_id})
    db.session.commit()
    log.info("document added", extra={"project_id": project_id, "document_id": document_id,
                                       "pages": pages, "media_type": media_type, "via": via})
    return Added(document_id, True)


def queue_run(project, document_id: int, profile: dict) -> int:
    """The OCR run of a document with ``profile``, through the derived-job
    identity (one job per document and profile). In the caller's
    transaction; returns the job id."""
    if not PROFILE_NAME.match(profile["name"]):
        raise InvalidRequest("profile name must be 1..32 of a-z, 0-9 and '-'",
                             details={"field": "profile"})
    doc = db.session.execute(text(
        "SELECT sha256, filename, asset_key, pdf_sha256, pdf_size, pages FROM documents "
        "WHERE id = :d"), {"d": document_id}).mappings().one()
    identity_id, job_id = derived.identity(
        project.id, doc["pdf_sha256"], profile["name"], source_key=doc["asset_key"],
        source_project_id=project.id, size=doc["pdf_size"], pages=doc["pages"],
        languages=profile["languages"], options=derived.options_of(profile))
    if job_id is None or db.session.execute(text("SELECT 1 FROM jobs WHERE id = :j"),
                                            {"j": job_id}).first() is None:
        ext_id = f"{doc['sha256']}:{profile['name']}"
        spec = {"id": ext_id, "value": doc["asset_key"], "type": "asset", "attr": {
            "document_id": document_id, "filename": doc["filename"],
            "source_sha256": doc["pdf_sha256"], "size": doc["pdf_size"], "pages": doc["pages"],
            "profile": profile["name"], "languages": profile["languages"]}}
        enqueue.insert_batch(project, [spec], document_runs=True)
        job_id = db.session.execute(text(
            "SELECT id FROM jobs WHERE project_id = :p AND ext_id = :e"),
            {"p": project.id, "e": ext_id}).scalar()
        db.session.execute(text("UPDATE derived_jobs SET job_id = :j WHERE id = :i"),
                           {"j": job_id, "i": identity_id})
        wakeups.notify(project.id)
    # The first run is the document's; a later one becomes its indexed run
    # when its text is indexed (runs.indexed, from the archive commit).
    db.session.execute(text("UPDATE documents SET job_id = COALESCE(job_id, :j) WHERE id = :d"),
                       {"j": job_id, "d": document_id})
    return job_id


def add_stream(project_id: str, stream, filename: str | None, *, via: str, by: str, store,
               spool_directory: str, max_bytes: int, languages: str | None = None) -> Added:
    """:func:`add_file` for a file that arrives as a stream (a page form's
    upload): copied into a scratch directory while hashed, refused as soon
    as it passes ``max_bytes``."""
    scratch = scratch_dir(spool_directory)
    try:
        path = os.path.join(scratch.name, "upload")
        digest, size = hashlib.sha256(), 0
        with open(path, "xb") as out:
            while chunk := stream.read(CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    name = clean_filename(filename, "0" * 12)
                    raise InvalidDocument(f"{name}: more than {max_bytes} bytes; documents are "
                                          f"limited to {max_bytes} bytes",
                                          details={"file": name, "reason": "too_large",
                                                   "limit": max_bytes})
                digest.update(chunk)
                out.write(chunk)
        return add_file(project_id, path, digest.hexdigest(), filename, via=via, by=by,
                        store=store, workdir=scratch.name, max_bytes=max_bytes,
                        languages=languages)
    finally:
        remove_scratch(scratch)


def remove_scratch(directory: tempfile.TemporaryDirectory) -> None:
    try:
        directory.cleanup()
    except OSError:
        shutil.rmtree(directory.name, ignore_errors=True)
