"""``/admin/search``: full-text search of the archived papers' OCR text
(``app.search``): the best papers first, each with its best page, a snippet
with the matched words highlighted, and a link to the job that archived it.

A refused query (empty after trimming is simply the empty form; too long,
nothing searchable, an unknown project) is shown on the page with a 400, as
this page is a GET form: there is nowhere to redirect to.
"""
from __future__ import annotations

from flask import render_template, request

from app.errors import InvalidRequest
from app.pages.admin.base import bp
from app.projects import service
from app.search import query


def _offset(raw: str | None) -> int:
    raw = (raw or "0").strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6:
        raise InvalidRequest(f"offset must be an integer from 0 to {query.MAX_OFFSET}",
                             details={"field": "offset"})
    return int(raw)


@bp.get("/search")
def search():
    project_ids = [p["id"] for p in service.list_summaries()]
    q = request.args.get("q", "")
    project = request.args.get("project") or None
    result, error = None, None
    try:
        if project is not None and project not in project_ids:
            raise InvalidRequest(f"unknown project {project!r}")
        offset = _offset(request.args.get("offset"))
        if q.strip():
            result = query.search(q, project_id=project, offset=offset)
    except InvalidRequest as exc:
        error = exc.message
    page = render_template("admin/search.html", q=q, project=project, project_ids=project_ids,
                           result=result, error=error, max_chars=query.MAX_QUERY_CHARS,
                           candidates=query.CANDIDATE_PAGES)
    return page, 400 if error else 200
