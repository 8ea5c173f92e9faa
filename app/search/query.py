"""Searching the papers' text: ranked papers, their best page, a snippet.

A query is parsed with ``websearch_to_tsquery`` (words, ``"a phrase"``,
``or``, ``-word``) over the index's configuration (``app.search.models``).

Cost is bounded whatever the query matches. The GIN index finds matching
pages; at most :data:`CANDIDATE_PAGES` of them (plus one, to know there are
more) are read and ranked with ``ts_rank_cd``, in the order the scan meets
them. A word on half a million pages therefore costs a thousand ranked pages,
not half a million, and its count reads "1000+ pages": the answer is the best
papers among the first thousand matching pages, and a narrower query (another
word, a phrase, a project) ranks the whole of its matches. The candidates are
grouped per paper (its best page, how many of its pages matched), and only
the papers shown get a snippet: ``ts_headline`` re-parses the page, which is
the expensive part, so it runs for at most ``limit`` pages.

Two settings hold for the search statement only (a savepoint, then set
back): ``plan_cache_mode = force_custom_plan``, because psycopg prepares a
statement run often and PostgreSQL may then reuse a generic plan made without
the tsquery, a bitmap scan of the whole GIN posting list that is right for a
rare word and ten times too slow for "the"; and ``statement_timeout``
(:data:`SEARCH_TIMEOUT_MS`), because a phrase of two common words that are
seldom adjacent makes PostgreSQL recheck every page holding both: such a
query is refused (400) with advice, not left to hold a connection.

Snippets come back as segments ``{"text", "match"}``; the highlight markers
``ts_headline`` inserts are private-use characters removed from the page
before it runs, so paper text can neither fake a highlight nor inject markup:
the page template escapes every segment.
"""
from __future__ import annotations

from contextlib import contextmanager

from psycopg.errors import QueryCanceled
from sqlalchemy import text as sql
from sqlalchemy.exc import OperationalError

from app.errors import InvalidRequest
from app.extensions import db
from app.search.models import TS_CONFIG

MAX_QUERY_CHARS = 256
SEARCH_TIMEOUT_MS = 5000
MAX_LIMIT = 100
CANDIDATE_PAGES = 1000
MAX_OFFSET = CANDIDATE_PAGES
HIT_START, HIT_STOP = "\ue000", "\ue001"
HEADLINE_OPTIONS = (f'StartSel="{HIT_START}", StopSel="{HIT_STOP}", MinWords=12, MaxWords=30, '
                    'MaxFragments=2, FragmentDelimiter=" … "')

_TSQUERY = f"websearch_to_tsquery('{TS_CONFIG}'::regconfig, :q)"

_SEARCH = f"""
WITH cand AS MATERIALIZED (
    SELECT p.canonical_key, p.page, p.project_id, ts_rank_cd(p.tsv, {_TSQUERY}, 1) AS rank
    FROM paper_pages p
    WHERE p.tsv @@ {_TSQUERY} {{project_filter}}
    LIMIT :cap),
papers AS MATERIALIZED (
    SELECT DISTINCT ON (canonical_key) canonical_key, page, project_id, rank,
           count(*) OVER (PARTITION BY canonical_key) AS hits
    FROM cand ORDER BY canonical_key, rank DESC, page),
shown AS (
    SELECT * FROM papers ORDER BY rank DESC, canonical_key LIMIT :limit OFFSET :offset)
SELECT t.papers, t.pages, s.canonical_key, s.page, s.project_id, s.rank, s.hits,
       (SELECT a.job_id FROM assets a WHERE a.canonical_key = s.canonical_key) AS job_id,
       ts_headline('{TS_CONFIG}'::regconfig, translate(b.body, :markers, ''), {_TSQUERY},
                   :options) AS snippet
FROM (SELECT (SELECT count(*) FROM papers) AS papers, (SELECT count(*) FROM cand) AS pages) t
LEFT JOIN shown s ON true
LEFT JOIN paper_pages b ON b.canonical_key = s.canonical_key AND b.page = s.page
ORDER BY s.rank DESC, s.canonical_key"""
_DOCUMENTS = "AND p.canonical_key LIKE 'doc:%'"  # documents people put in (app/documents)
SEARCH_ALL = sql(_SEARCH.format(project_filter=""))
SEARCH_PROJECT = sql(_SEARCH.format(project_filter="AND p.project_id = :project"))
SEARCH_DOCUMENTS = sql(_SEARCH.format(project_filter=_DOCUMENTS))
SEARCH_PROJECT_DOCUMENTS = sql(_SEARCH.format(project_filter="AND p.project_id = :project " + _DOCUMENTS))


def parse(q) -> str:
    """The user's query, checked: not empty, not too long, something to find.

    ``querytree`` is what of the tsquery an index can use: empty when no word
    survived parsing (only punctuation), ``T`` when nothing positive is left
    (``-word`` alone would match every page that lacks it)."""
    if not isinstance(q, str) or not q.strip():
        raise InvalidRequest("q is empty: give a word or phrase to search for",
                             details={"field": "q"})
    q = q.strip()
    if len(q) > MAX_QUERY_CHARS:
        raise InvalidRequest(f"q is longer than {MAX_QUERY_CHARS} characters",
                             details={"field": "q", "limit": MAX_QUERY_CHARS})
    if "\x00" in q:
        raise InvalidRequest("q contains a NUL character", details={"field": "q"})
    tree = db.session.execute(sql(f"SELECT querytree({_TSQUERY})"), {"q": q}).scalar()
    if tree == "":
        raise InvalidRequest("q has no searchable word (only punctuation or symbols)",
                             details={"field": "q"})
    if tree == "T":
        raise InvalidRequest("q needs a word to find: a -word only excludes pages",
                             details={"field": "q"})
    return q


def _bounded(value, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be an integer from {low} to {high}",
                             details={"field": name})
    return value


def segments(headline: str | None) -> list[dict]:
    """A ts_headline string as ``[{"text", "match"}]`` split at the markers."""
    out: list[dict] = []
    match = False
    piece = []
    for char in headline or "":
        if char in (HIT_START, HIT_STOP):
            if piece:
                out.append({"text": "".join(piece), "match": match})
                piece = []
            match = char == HIT_START
        else:
            piece.append(char)
    if piece:
        out.append({"text": "".join(piece), "match": match})
    return out


_SETTINGS = sql("SELECT set_config('statement_timeout', :timeout, true), "
                "set_config('plan_cache_mode', :plans, true)")


@contextmanager
def _guarded():
    """Run the block in a savepoint with a custom plan and a statement
    timeout, then set both back; a timeout becomes a clear refusal and
    leaves the caller's transaction usable."""
    old = db.session.execute(sql("SELECT current_setting('statement_timeout'), "
                                 "current_setting('plan_cache_mode')")).one()
    try:
        with db.session.begin_nested():
            db.session.execute(_SETTINGS, {"timeout": str(SEARCH_TIMEOUT_MS),
                                           "plans": "force_custom_plan"})
            yield
            db.session.execute(_SETTINGS, {"timeout": old[0], "plans": old[1]})
    except OperationalError as exc:
        if not isinstance(exc.orig, QueryCanceled):
            raise
        raise InvalidRequest(
            f"the search took longer than {SEARCH_TIMEOUT_MS / 1000:g} s: narrow it (a rarer "
            "word, a project, or words instead of a phrase of common words)",
            details={"field": "q", "timeout_ms": SEARCH_TIMEOUT_MS}) from None


def search(q: str, *, project_id: str | None = None, limit: int = 20, offset: int = 0,
           documents_only: bool = False) -> dict:
    """Papers whose text matches ``q``, best first, one entry per paper.

    Returns ``{"query", "project_id", "limit", "offset", "total",
    "total_is_lower_bound", "more", "results"}``; each result is
    ``{"canonical_key", "project_id", "page", "pages_matched", "rank",
    "snippet", "job_id"}``. ``total`` counts papers among the ranked
    candidate pages; ``total_is_lower_bound`` says more than
    :data:`CANDIDATE_PAGES` pages matched. Raises :class:`InvalidRequest`
    for a bad query, limit or offset, and for a search that ran past
    :data:`SEARCH_TIMEOUT_MS`.
    """
    q = parse(q)
    limit = _bounded(limit, "limit", 1, MAX_LIMIT)
    offset = _bounded(offset, "offset", 0, MAX_OFFSET)
    params = {"q": q, "cap": CANDIDATE_PAGES + 1, "limit": limit, "offset": offset,
              "markers": HIT_START + HIT_STOP, "options": HEADLINE_OPTIONS}
    statement = SEARCH_DOCUMENTS if documents_only else SEARCH_ALL
    if project_id is not None:
        statement = SEARCH_PROJECT_DOCUMENTS if documents_only else SEARCH_PROJECT
        params["project"] = project_id
    with _guarded():
        rows = db.session.execute(statement, params).mappings().all()
    papers, pages = rows[0]["papers"], rows[0]["pages"]
    results = [{"canonical_key": r["canonical_key"], "project_id": r["project_id"],
                "page": r["page"], "pages_matched": int(r["hits"]),
                "rank": round(float(r["rank"]), 6), "snippet": segments(r["snippet"]),
                "job_id": str(r["job_id"]) if r["job_id"] is not None else None}
               for r in rows if r["canonical_key"] is not None]
    return {"query": q, "project_id": project_id, "limit": limit, "offset": offset,
            "total": int(papers), "total_is_lower_bound": pages > CANDIDATE_PAGES,
            "more": offset + len(results) < papers, "results": results}


_PAGES = sql(f"""
SELECT p.page, p.body, CASE WHEN :q = '' THEN NULL
       WHEN p.tsv @@ {_TSQUERY} THEN ts_headline('{TS_CONFIG}'::regconfig, translate(p.body, :markers, ''),
                                                {_TSQUERY}, :options) END AS marked
FROM paper_pages p WHERE p.canonical_key = :k AND p.page BETWEEN :first AND :last ORDER BY p.page""")
WHOLE_PAGE = f'StartSel="{HIT_START}", StopSel="{HIT_STOP}", HighlightAll=true'


def pages(canonical_key: str, first: int, count: int, q: str | None = None) -> list[dict]:
    """Pages ``first``.. ``first + count - 1`` of an indexed text as
    ``[{"page", "segments"}]``, each whole page, with the words of ``q``
    marked on the pages that match it (a bad query marks nothing)."""
    if q:
        try:
            q = parse(q)
        except InvalidRequest:
            q = ""
    params = {"k": canonical_key, "first": first, "last": first + count - 1, "q": q or "",
              "markers": HIT_START + HIT_STOP, "options": WHOLE_PAGE}
    with _guarded():
        rows = db.session.execute(_PAGES, params).mappings().all()
    return [{"page": r["page"], "segments": segments(r["marked"]) if r["marked"] is not None
             else [{"text": r["body"], "match": False}]} for r in rows]
