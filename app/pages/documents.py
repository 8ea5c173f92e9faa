"""``/documents``: the readers' pages of documents (role ``reader`` and up).

- ``/documents``: the documents, newest first, or with ``q`` the ones whose
  text matches, each hit opening its document at the matching page;
- ``/documents/<id>``: the file, its state, downloads under the file's own
  name (the file as it came, its PDF, the OCRed PDF), its OCR runs (worker,
  profile, when, how long) and its text page by page, the searched words
  marked;
- ``/documents/<id>/file/<original|pdf|ocr>``: the download itself.
"""
from __future__ import annotations

import functools

from flask import Blueprint, abort, current_app, render_template, request
from flask_babel import gettext as _
from sqlalchemy import text

from app.documents import reading
from app.documents.downloads import file_response
from app.errors import FleetError, NotFound
from app.extensions import db
from app.pages.auth import current_user, login_required_active
from app.search import query
from app.storage.base import StorageError

bp = Blueprint("documents_pages", __name__, url_prefix="/documents")
LIST_LIMIT = 50
PAGES_SHOWN = 20


def readers_only(view):
    @functools.wraps(view)
    @login_required_active
    def wrapped(*args, **kwargs):
        if not current_user.has("reader", "admin"):
            return render_template("auth/error.html", code=403, title=_("Readers only"),
                                   message=_("This page needs the reader role.")), 403
        return view(*args, **kwargs)
    return wrapped


def _projects() -> list[str]:
    ids = db.session.execute(text(
        "SELECT id FROM projects WHERE kind = 'documents' ORDER BY id")).scalars().all()
    db.session.commit()
    return list(ids)


def _int_arg(name: str, default: int, low: int, high: int) -> int:
    raw = request.args.get(name, "")
    return min(max(int(raw), low), high) if raw.isascii() and raw.isdigit() and len(raw) < 10 else default


@bp.get("")
@readers_only
def index():
    project_ids = _projects()
    project = request.args.get("project") or None
    if project is not None and project not in project_ids:
        abort(404)
    q = (request.args.get("q") or "").strip()
    result, error, listing = None, None, None
    if q:
        try:
            result = reading.find(q, project_id=project, limit=20,
                                  offset=_int_arg("offset", 0, 0, query.MAX_OFFSET))
        except FleetError as exc:
            db.session.rollback()
            error = exc.message
    else:
        listing = reading.newest(project, before_id=_int_arg("before_id", 0, 0, 2**62) or None,
                                 limit=LIST_LIMIT)
    return render_template("documents/index.html", project_ids=project_ids, project=project, q=q,
                           result=result, error=error, listing=listing,
                           max_chars=query.MAX_QUERY_CHARS)


@bp.get("/<int:document_id>")
@readers_only
def show(document_id: int):
    try:
        doc = reading.get(document_id)
    except FleetError:
        abort(404)
    q = (request.args.get("q") or "").strip()[:query.MAX_QUERY_CHARS]
    page = _int_arg("page", 1, 1, max(doc["pages"], 1))
    first = max(1, min(page - PAGES_SHOWN // 2, doc["pages"] - PAGES_SHOWN + 1))
    pages = query.pages(doc["asset_key"], first, PAGES_SHOWN, q) if doc["searchable"] else []
    db.session.commit()
    return render_template("documents/show.html", doc=doc, runs=reading.runs(document_id),
                           pages=pages, page=page, first=first, q=q, shown=PAGES_SHOWN)


@bp.get("/<int:document_id>/file/<any(original, pdf, ocr):which>")
@readers_only
def download(document_id: int, which: str):
    try:
        return file_response(current_app.config, *reading.file_of(document_id, which))
    except NotFound:
        abort(404)
    except StorageError:
        abort(503)
