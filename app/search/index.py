"""Writing a paper's text into the search index (the archive actor's step).

The master's archive actor is the only writer: it calls :func:`index_paper`
inside its own open transaction, so the text appears together with the rest
of the archive commit, or not at all. Nothing here commits.

``text`` is the OCR's plain text with pages separated by form feeds (``\\f``,
as pdftotext and Tesseract's text renderer write them; one trailing form feed
ends the last page, it does not start an empty one). Page numbers are
1-based; an empty page is stored too, so page N of the index is page N of the
paper.

Re-indexing a key replaces its text: the ``paper_texts`` row is upserted
first, which locks it, so two writers of one key run one after the other;
then the old pages go and the new ones arrive by COPY (the ``tsv`` column is
generated, so COPY carries only the text).
"""
from __future__ import annotations

from sqlalchemy import text as sql

from app.errors import InvalidRequest, NotFound, TooLarge
from app.extensions import db

# Bounds on what one paper may put into the index. A page's text is bounded
# so its tsvector stays far below PostgreSQL's 1 MiB limit and a snippet
# (ts_headline re-parses the page) stays cheap; dense OCRed pages are ~5 KiB.
MAX_PAGES = 100_000
MAX_PAGE_BYTES = 64 * 1024
MAX_TEXT_BYTES = 256 * 1024 * 1024
MAX_LANGUAGES_CHARS = 256
PAGE_SEPARATOR = "\f"

_UPSERT_PAPER = sql("""
    INSERT INTO paper_texts (canonical_key, project_id, derived_key, pages, chars, languages)
    VALUES (:k, :p, :d, :n, :c, :l)
    ON CONFLICT (canonical_key) DO UPDATE SET
        project_id = EXCLUDED.project_id, derived_key = EXCLUDED.derived_key,
        pages = EXCLUDED.pages, chars = EXCLUDED.chars, languages = EXCLUDED.languages,
        indexed_at = now()""")


def split_pages(text: str) -> list[str]:
    """The pages of ``text`` (form-feed separated; one trailing form feed ends
    the last page). Empty text is one empty page."""
    if text.endswith(PAGE_SEPARATOR):
        text = text[:-1]
    return text.split(PAGE_SEPARATOR)


def _check(canonical_key: str, text: str, languages: str | None) -> list[str]:
    if not isinstance(text, str):
        raise InvalidRequest("text must be a string", details={"field": "text"})
    if "\x00" in text:
        raise InvalidRequest(f"text of {canonical_key} contains NUL characters",
                             details={"field": "text", "canonical_key": canonical_key})
    if languages is not None and len(languages) > MAX_LANGUAGES_CHARS:
        raise InvalidRequest(f"languages is longer than {MAX_LANGUAGES_CHARS} characters",
                             details={"field": "languages", "limit": MAX_LANGUAGES_CHARS})
    # A character is at most 4 bytes: short text is not encoded to be measured.
    if len(text) > MAX_TEXT_BYTES // 4 and len(text.encode("utf-8")) > MAX_TEXT_BYTES:
        raise TooLarge(f"text of {canonical_key} exceeds {MAX_TEXT_BYTES} bytes",
                       details={"canonical_key": canonical_key, "limit": MAX_TEXT_BYTES})
    if text.count(PAGE_SEPARATOR) > MAX_PAGES:  # before splitting a huge count
        raise TooLarge(f"text of {canonical_key} has more than {MAX_PAGES} pages",
                       details={"canonical_key": canonical_key, "limit": MAX_PAGES})
    pages = split_pages(text)
    if len(pages) > MAX_PAGES:
        raise TooLarge(f"text of {canonical_key} has more than {MAX_PAGES} pages",
                       details={"canonical_key": canonical_key, "limit": MAX_PAGES})
    for number, body in enumerate(pages, 1):
        if len(body) > MAX_PAGE_BYTES // 4 and len(body.encode("utf-8")) > MAX_PAGE_BYTES:
            raise TooLarge(f"page {number} of {canonical_key} exceeds {MAX_PAGE_BYTES} bytes",
                           details={"canonical_key": canonical_key, "page": number,
                                    "limit": MAX_PAGE_BYTES})
    return pages


def check_text(label: str, text: str) -> int:
    """The limits :func:`index_paper` enforces, for a text before it is
    accepted (an upload): its page count, or the same errors."""
    return len(_check(label, text, None))


def _check_asset(canonical_key: str, project_id: str) -> None:
    owner = db.session.execute(sql("SELECT project_id FROM assets WHERE canonical_key = :k"),
                               {"k": canonical_key}).scalar()
    if owner is None:
        raise NotFound(f"no asset {canonical_key}", details={"canonical_key": canonical_key})
    if owner != project_id:
        raise InvalidRequest(f"asset {canonical_key} belongs to project {owner}, not {project_id}",
                             details={"canonical_key": canonical_key, "project_id": owner})


def index_paper(canonical_key: str, project_id: str, text: str, *, derived_key: str | None = None,
                languages: str | None = None) -> int:
    """Store and index a paper's text in the caller's transaction (no commit).

    Parameters:
        canonical_key: the paper's asset (``assets.canonical_key``).
        project_id: the asset's project (checked against the asset row).
        text: plain text, pages separated by form feeds.
        derived_key: the canonical key of the OCR output asset, if any.
        languages: the languages the OCR used or found (e.g. ``"eng+pol"``).

    Returns the number of pages indexed. Raises :class:`NotFound` for an
    unknown asset, :class:`InvalidRequest` for a project mismatch or NUL
    characters, :class:`TooLarge` past :data:`MAX_PAGES`,
    :data:`MAX_PAGE_BYTES` or :data:`MAX_TEXT_BYTES`.
    """
    pages = _check(canonical_key, text, languages)
    _check_asset(canonical_key, project_id)
    db.session.execute(_UPSERT_PAPER, {"k": canonical_key, "p": project_id, "d": derived_key,
                                       "n": len(pages), "c": len(text), "l": languages})
    db.session.execute(sql("DELETE FROM paper_pages WHERE canonical_key = :k"),
                       {"k": canonical_key})
    raw = db.session.connection().connection.driver_connection
    with raw.cursor() as cur:
        with cur.copy("COPY paper_pages (canonical_key, page, project_id, body) FROM STDIN") as copy:
            for number, body in enumerate(pages, 1):
                copy.write_row((canonical_key, number, project_id, body))
    return len(pages)


def forget_paper(canonical_key: str) -> bool:
    """Remove a paper's text from the index (its pages go by cascade); no commit.
    True when there was one."""
    return db.session.execute(sql("DELETE FROM paper_texts WHERE canonical_key = :k"),
                              {"k": canonical_key}).rowcount > 0
