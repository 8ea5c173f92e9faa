"""``GET /api/v1/admin/search``: full-text search of the archived papers'
OCR text (``app.search``), the JSON twin of the ``/admin/search`` page."""
from __future__ import annotations

from flask import jsonify

from app.api.base import bp
from app.api import validate as v
from app.api.auth import require
from app.search import query

SEARCH_QUERY = {
    "q": v.string(4 * query.MAX_QUERY_CHARS, min_bytes=1).describe(
        f"words, \"a phrase\", or, -word (websearch syntax); at most {query.MAX_QUERY_CHARS} "
        "characters, with at least one word that is not excluded"),
    "project": v.Optional(v.identifier),
    "limit": v.Optional(v.int_range(1, query.MAX_LIMIT)),
    "offset": v.Optional(v.int_range(0, query.MAX_OFFSET)),
}

SNIPPET_SEGMENT = v.named("SnippetSegment", {
    "text": v.text.describe("plain text, not HTML: escape it when rendering"),
    "match": v.boolean.describe("a word the query matched"),
})
PAPER_HIT = v.named("PaperHit", {
    "canonical_key": v.text, "project_id": v.identifier,
    "page": v.int_range(1, v.INT64_MAX).describe("the paper's best-ranked matching page, from 1"),
    "pages_matched": v.int_range(1, v.INT64_MAX).describe("its matching pages among the ranked ones"),
    "rank": v.number(0), "snippet": v.array(SNIPPET_SEGMENT),
    "job_id": v.text.or_null().describe("decimal; the job that archived the paper"),
})
PAPER_SEARCH = v.named("PaperSearch", {
    "query": v.text, "project_id": v.identifier.or_null(),
    "limit": v.int_range(1, query.MAX_LIMIT), "offset": v.int_range(0, query.MAX_OFFSET),
    "total": v.int_range(0, v.INT64_MAX).describe("matching papers among the ranked pages"),
    "total_is_lower_bound": v.boolean.describe(
        f"more than {query.CANDIDATE_PAGES} pages matched: only the first were ranked"),
    "more": v.boolean.describe("more papers follow this page (raise offset)"),
    "results": v.array(PAPER_HIT),
})


@bp.get("/admin/search")
@v.declare(query=SEARCH_QUERY, responses={200: PAPER_SEARCH},
           summary="Search the archived papers' text (best papers first, with snippets)")
def search_papers():
    require("admin")
    args = v.query(SEARCH_QUERY)
    return jsonify(query.search(args["q"], project_id=args.get("project"),
                                limit=args.get("limit", 20), offset=args.get("offset", 0)))
