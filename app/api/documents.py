"""Documents over FleetHQ's API (app/documents): put a file in, read it back.

``POST /api/v1/fleethq/projects/<p>/documents`` takes the file as the raw
body (its name in ``?filename=``) and answers the document at once: 201
when it is new, 200 when the same bytes are already in the project. Its
OCR state is read later with ``GET /api/v1/fleethq/documents/<id>``.
"""
from __future__ import annotations

import os
import time

from flask import current_app, jsonify, request

from app.api.base import bp
from app.api import validate as v
from app.api.auth import body_limit, require
from app.api.search import SNIPPET_SEGMENT
from app.documents import intake, reading, runs
from app.documents.downloads import file_response
from app.errors import InvalidRequest, StorageUnavailable, TooLarge
from app.extensions import db
from app.search import query
from app.storage import shared_store
from app.storage.base import StorageError
from app.uploads import ingest
from app.uploads.spool import Spool

UPLOAD_QUERY = {
    "filename": v.Optional(v.string(4 * intake.FILENAME_MAX).describe(
        "the file's name, shown and used for downloads (a path keeps its last part)")),
    "languages": v.Optional(v.string(256).describe(
        "Tesseract languages for its OCR, joined by '+' (default eng)")),
}
LIST_QUERY = {
    "after_id": v.Optional(v.int_range(0, v.INT64_MAX)),
    "limit": v.Optional(v.int_range(1, reading.LIST_MAX)),
}
DOCUMENT = v.named("Document", {
    "document_id": v.int_range(1, v.INT64_MAX), "project_id": v.identifier, "filename": v.text,
    "media_type": v.one_of("application/pdf", "image/tiff", "image/png", "image/jpeg"),
    "sha256": v.text.describe("of the file as it came"), "size": v.int_range(0, v.INT64_MAX),
    "pages": v.int_range(1, v.INT64_MAX), "added_via": v.one_of("api", "page", "consume", "cli"),
    "added_by": v.text, "created_at": v.timestamp,
    "state": v.one_of(*reading.STATES).describe("of its indexed OCR run"),
    "searchable": v.boolean.describe("its text is in the search index"),
    "ocr": v.obj({
        "job_id": v.int_range(1, v.INT64_MAX, nullable=True), "job_state": v.text.or_null(),
        "profile": v.text.or_null(), "languages": v.text.or_null(),
        "asset_key": v.text.or_null().describe("the OCRed PDF, once archived"),
        "error": v.any_object.or_null()}),
    "asset_key": v.text.describe("the archived PDF of the file"),
})


def _length() -> int:
    limit = current_app.config["UPLOAD_MAX_BYTES"]
    length = request.content_length
    if length is not None and length > limit:
        raise TooLarge(f"documents are limited to {limit} bytes", details={"limit": limit})
    if length is None and "chunked" in request.headers.get("Transfer-Encoding", "").lower():
        raise InvalidRequest("Content-Length must be present (no chunked uploads)",
                             details={"field": "Content-Length"})
    return length or 0  # no body at all is an empty file, refused as one


@bp.post("/fleethq/projects/<project_id>/documents")
@v.declare(body=v.Media("application/octet-stream", description=(
               "the file: PDF, TIFF (also multi-page), PNG or JPEG, at most 100 MiB")),
           query=UPLOAD_QUERY, responses={200: ("already in the project", DOCUMENT),
                                          201: ("added", DOCUMENT)},
           errors=(409, 422, 503), operation_id="fleethqAddDocument",
           summary="Put a document into a documents project (raw body)")
def add_document(project_id):
    who = require("admin")
    args = v.query(UPLOAD_QUERY)
    cfg = current_app.config
    length = _length()
    project = intake.documents_project(project_id)  # refused before a byte is read
    deadline = time.monotonic() + project.upload_timeout_seconds
    spool = Spool.from_config(cfg)
    scratch = intake.scratch_dir(spool.directory)
    try:
        path = os.path.join(scratch.name, "upload")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        sock = request.environ.get("gunicorn.socket") or request.environ.get("werkzeug.socket")
        try:
            sha256 = ingest.stream_to(fd, request.stream, length, deadline, sock)
        except (TimeoutError, ConnectionError) as exc:
            err = InvalidRequest(f"upload interrupted: {exc}")
            err.retryable = True
            raise err from None
        finally:
            os.close(fd)
        added = intake.add_file(project_id, path, sha256, args.get("filename"), via="api",
                                by=who.user_id or who.node_id, store=shared_store(cfg),
                                workdir=scratch.name, max_bytes=cfg["UPLOAD_MAX_BYTES"],
                                languages=args.get("languages"))
    finally:
        intake.remove_scratch(scratch)
    return jsonify(reading.get(added.document_id)), 201 if added.created else 200


@bp.get("/fleethq/documents/<int:document_id>")
@v.declare(responses={200: DOCUMENT}, summary="A document and the state of its OCR")
def show_document(document_id):
    require("admin", "reader")
    return jsonify(reading.get(document_id))


@bp.get("/fleethq/projects/<project_id>/documents")
@v.declare(query=LIST_QUERY, responses={200: {"documents": v.array(DOCUMENT),
                                             "next_after_id": v.int_range(1, v.INT64_MAX, nullable=True)}},
           summary="A project's documents, oldest first (cursor paging)")
def list_documents(project_id):
    require("admin", "reader")
    args = v.query(LIST_QUERY)
    intake.documents_project(project_id)
    return jsonify(reading.list_page(project_id, after_id=args.get("after_id", 0),
                                     limit=args.get("limit", 50)))


SEARCH_QUERY = {
    "q": v.string(4 * query.MAX_QUERY_CHARS, min_bytes=1).describe(
        "words, \"a phrase\", or, -word (websearch syntax)"),
    "project": v.Optional(v.identifier),
    "limit": v.Optional(v.int_range(1, query.MAX_LIMIT)),
    "offset": v.Optional(v.int_range(0, query.MAX_OFFSET)),
}
PAGES_QUERY = {
    "first": v.Optional(v.int_range(1, 100_000).describe("the first page, from 1 (default 1)")),
    "count": v.Optional(v.int_range(1, 100).describe("how many pages (default 20)")),
    "q": v.Optional(v.string(4 * query.MAX_QUERY_CHARS).describe("words to mark in the text")),
}
DOCUMENT_HIT = v.named("DocumentHit", {
    "document_id": v.int_range(1, v.INT64_MAX, nullable=True), "filename": v.text.or_null(),
    "canonical_key": v.text, "project_id": v.identifier,
    "page": v.int_range(1, v.INT64_MAX).describe("its best-ranked matching page"),
    "pages_matched": v.int_range(1, v.INT64_MAX), "rank": v.number(0),
    "snippet": v.array(SNIPPET_SEGMENT), "job_id": v.text.or_null(),
})


@bp.get("/fleethq/documents/search")
@v.declare(query=SEARCH_QUERY, responses={200: {
               "query": v.text, "project_id": v.identifier.or_null(),
               "limit": v.int_range(1, query.MAX_LIMIT), "offset": v.int_range(0, query.MAX_OFFSET),
               "total": v.int_range(0, v.INT64_MAX), "total_is_lower_bound": v.boolean,
               "more": v.boolean, "results": v.array(DOCUMENT_HIT)}},
           summary="Search the documents' text (best first, each with its best page)")
def search_documents():
    require("admin", "reader")
    args = v.query(SEARCH_QUERY)
    return jsonify(reading.find(args["q"], project_id=args.get("project"),
                                limit=args.get("limit", 20), offset=args.get("offset", 0)))


@bp.get("/fleethq/documents/<int:document_id>/pages")
@v.declare(query=PAGES_QUERY, responses={200: {
               "document_id": v.int_range(1, v.INT64_MAX), "pages": v.int_range(1, v.INT64_MAX),
               "text": v.array(v.obj({"page": v.int_range(1, v.INT64_MAX),
                                      "segments": v.array(SNIPPET_SEGMENT)}))}},
           summary="A document's text page by page (empty until it is OCRed), words of q marked")
def document_pages(document_id):
    require("admin", "reader")
    args = v.query(PAGES_QUERY)
    doc = reading.get(document_id)
    pages = query.pages(doc["asset_key"], args.get("first", 1), args.get("count", 20),
                        args.get("q")) if doc["searchable"] else []
    db.session.commit()
    return jsonify(document_id=document_id, pages=doc["pages"], text=pages)


@bp.get("/fleethq/documents/<int:document_id>/file/<any(original, pdf, ocr):which>")
@v.declare(responses={200: v.Media("application/octet-stream",
                                   description="the file, under its own name (Content-Disposition)")},
           path={"which": v.one_of(*reading.FILES)}, errors=(503,),
           summary="Download a document's original file, its PDF, or its OCRed PDF")
def document_file(document_id, which):
    require("admin", "reader")
    try:
        return file_response(current_app.config, *reading.file_of(document_id, which))
    except StorageError as exc:
        raise StorageUnavailable(f"the archive is unavailable: {exc}", retry_after_ms=5000) from None


REOCR = {
    "profile": v.obj({"name": v.string(32, min_bytes=1).describe("names the run: a-z, 0-9 and '-'"),
                      "languages": v.Optional(v.string(256).describe("Tesseract names joined by '+'")),
                      "mode": v.Optional(v.one_of("skip-text", "redo", "force").describe(
                          "skip-text: pages with text are left alone; redo: every text layer made "
                          "again; force: every page rasterized and OCRed")),
                      "deskew": v.Optional(v.boolean), "rotate": v.Optional(v.boolean),
                      "clean": v.Optional(v.boolean.describe("unpaper before OCR")),
                      "optimize": v.Optional(v.int_range(0, 1))}),
    "document_ids": v.Optional(v.list_of(v.int_range(1, v.INT64_MAX), 1, 10_000).describe(
        "these documents; omitted: every document of the project")),
}
REOCR_RESULT = {"profile": v.any_object, "queued": v.array(v.int_range(1, v.INT64_MAX)),
                "already_queued": v.array(v.int_range(1, v.INT64_MAX)),
                "skipped": v.array(v.int_range(1, v.INT64_MAX)).describe(
                    "documents that already finished a run of this profile")}


@bp.post("/fleethq/projects/<project_id>/documents/ocr")
@v.declare(body=REOCR, responses={200: REOCR_RESULT}, errors=(409,),
           summary="OCR documents again with another profile (its text is indexed when it is done)")
def reocr_documents(project_id):
    who = require("admin")
    body = v.check(v.json_body(body_limit("api")), REOCR)
    return jsonify(runs.reocr(body["profile"], project_id=project_id,
                              document_ids=body.get("document_ids"), actor=who.user_id or who.node_id))
