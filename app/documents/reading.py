"""What a document is now: its file, its OCR run and whether its text is found.

The API and the pages read documents through here only. A document's state
is its indexed OCR run's job state, said the way a person asks it:
``queued`` (waiting for an OCR worker), ``running``, ``done`` (its text is
searchable), ``failed``.
"""
from __future__ import annotations

from sqlalchemy import text

from app.errors import NotFound
from app.extensions import db

STATES = ("queued", "running", "done", "failed")
_STATE = {"todo": "queued", "wip": "running", "staged": "running", "done": "done",
          "failed": "failed", "reset_exhausted": "failed"}
LIST_MAX = 200

_SELECT = """
    SELECT d.id, d.project_id, d.filename, d.media_type, d.sha256, d.size, d.pages,
           d.pdf_sha256, d.asset_key, d.original_key, d.added_via, d.added_by, d.created_at,
           d.job_id, j.state AS job_state, j.last_error, j.updated_at AS job_updated_at,
           dj.profile, dj.languages,
           o.canonical_key AS ocr_key, o.object_key AS ocr_object_key,
           t.indexed_at, t.derived_key IS NOT DISTINCT FROM o.canonical_key AS indexed_ocr
    FROM documents d
    LEFT JOIN jobs j ON j.id = d.job_id
    LEFT JOIN derived_jobs dj ON dj.job_id = d.job_id
    LEFT JOIN assets o ON o.canonical_key = dj.profile || ':' || d.asset_key
    LEFT JOIN paper_texts t ON t.canonical_key = d.asset_key
"""


def _view(row) -> dict:
    state = _STATE.get(row["job_state"], "queued")
    return {
        "document_id": row["id"], "project_id": row["project_id"], "filename": row["filename"],
        "media_type": row["media_type"], "sha256": row["sha256"], "size": row["size"],
        "pages": row["pages"], "added_via": row["added_via"], "added_by": row["added_by"],
        "created_at": int(row["created_at"].timestamp()), "state": state,
        "searchable": row["indexed_at"] is not None,
        "ocr": {"job_id": row["job_id"], "job_state": row["job_state"],
                "profile": row["profile"], "languages": row["languages"],
                "asset_key": row["ocr_key"],
                "error": row["last_error"] if state == "failed" else None},
        "asset_key": row["asset_key"],
    }


def get(document_id: int) -> dict:
    row = db.session.execute(text(_SELECT + " WHERE d.id = :d"),
                             {"d": document_id}).mappings().first()
    db.session.commit()
    if row is None:
        raise NotFound(f"no document {document_id}", details={"document_id": document_id})
    return _view(row)


def _page(where: str, order: str, params: dict, limit: int) -> tuple[list[dict], int | None]:
    """One page of documents and the id to continue from (None: the last page)."""
    limit = max(1, min(limit, LIST_MAX))
    rows = db.session.execute(text(f"{_SELECT} WHERE {where} ORDER BY d.id {order} LIMIT :n"),
                              {**params, "n": limit + 1}).mappings().all()
    db.session.commit()
    return [_view(r) for r in rows[:limit]], rows[limit - 1]["id"] if len(rows) > limit else None


def list_page(project_id: str, *, after_id: int = 0, limit: int = 50) -> dict:
    """A project's documents, oldest first, in pages of at most 200 (the API)."""
    documents, cursor = _page("d.project_id = :p AND d.id > :a", "ASC",
                              {"p": project_id, "a": after_id}, limit)
    return {"documents": documents, "next_after_id": cursor}


def runs(document_id: int) -> list[dict]:
    """The OCR runs of a document, newest first: profile, languages, the job
    state, and per attempt the worker, when it started, how long it took and
    how it ended. ``indexed`` marks the run whose text the index holds."""
    rows = db.session.execute(text("""
        SELECT dj.job_id, dj.profile, dj.languages, j.state, d.job_id = dj.job_id AS indexed,
               a.id AS attempt_id, a.worker_id, a.state AS attempt_state, a.created_at,
               a.finished_at, a.error, u.staged_at, u.done_at
        FROM documents d
        JOIN derived_jobs dj ON dj.target_project_id = d.project_id AND dj.source_key = d.asset_key
        LEFT JOIN jobs j ON j.id = dj.job_id
        LEFT JOIN attempts a ON a.job_id = dj.job_id
        LEFT JOIN uploads u ON u.attempt_id = a.id
        WHERE d.id = :d ORDER BY dj.id DESC, a.id DESC LIMIT 200"""), {"d": document_id}).mappings().all()
    db.session.commit()
    out: dict[int, dict] = {}
    for r in rows:
        run = out.setdefault(r["job_id"], {
            "job_id": r["job_id"], "profile": r["profile"], "languages": r["languages"],
            "state": _STATE.get(r["state"], "queued"), "indexed": bool(r["indexed"]), "attempts": []})
        if r["attempt_id"] is not None:
            started, finished = r["created_at"], r["done_at"] or r["finished_at"]
            run["attempts"].append({
                "attempt_id": r["attempt_id"], "worker_id": r["worker_id"], "state": r["attempt_state"],
                "started_at": int(started.timestamp()),
                "finished_at": int(finished.timestamp()) if finished else None,
                "seconds": round((finished - started).total_seconds(), 1) if finished else None,
                "error": r["error"]})
    return list(out.values())


def find(q: str, *, project_id: str | None = None, limit: int = 20, offset: int = 0) -> dict:
    """Documents whose text matches ``q``, best first, each with its best
    page and a snippet (app.search.query over documents only)."""
    from app.search import query
    found = query.search(q, project_id=project_id, limit=limit, offset=offset, documents_only=True)
    keys = [(hit["project_id"], hit["canonical_key"]) for hit in found["results"]]
    ids = {}
    if keys:
        ids = {(r[0], r[1]): (r[2], r[3]) for r in db.session.execute(text(
            "SELECT project_id, asset_key, id, filename FROM documents "
            "WHERE (project_id, asset_key) IN (SELECT * FROM unnest(CAST(:p AS text[]), CAST(:k AS text[])))"),
            {"p": [k[0] for k in keys], "k": [k[1] for k in keys]})}
    db.session.commit()
    for hit in found["results"]:
        hit["document_id"], hit["filename"] = ids.get((hit["project_id"], hit["canonical_key"]),
                                                      (None, None))
    return found


def newest(project_id: str | None, *, before_id: int | None = None, limit: int = 50) -> dict:
    """Documents newest first, of one project or of all (the pages)."""
    documents, cursor = _page("(CAST(:b AS bigint) IS NULL OR d.id < :b) "
                              "AND (CAST(:p AS text) IS NULL OR d.project_id = :p)", "DESC",
                              {"b": before_id, "p": project_id}, limit)
    return {"documents": documents, "next_before_id": cursor}


FILES = ("original", "pdf", "ocr")


def file_of(document_id: int, which: str) -> tuple[str, str, str]:
    """(object key, media type, download name) of one of a document's files:
    ``original`` (as it came), ``pdf`` (its archived PDF), ``ocr`` (the
    OCRed PDF of its indexed run). Raises NotFound."""
    doc = get(document_id)
    keys = db.session.execute(text(
        "SELECT d.original_key, a.object_key, o.object_key FROM documents d "
        "JOIN assets a ON a.canonical_key = d.asset_key "
        "LEFT JOIN assets o ON o.canonical_key = :ocr WHERE d.id = :d"),
        {"d": document_id, "ocr": doc["ocr"]["asset_key"] or ""}).first()
    db.session.commit()
    key = dict(zip(FILES, keys)).get(which) if keys else None
    if key is None:
        raise NotFound(f"document {document_id} has no {which} file yet",
                       details={"document_id": document_id, "file": which})
    name = doc["filename"]
    stem = name.rsplit(".", 1)[0] if "." in name else name
    if which == "original":
        return key, doc["media_type"], name
    return key, "application/pdf", f"{stem}.ocr.pdf" if which == "ocr" else f"{stem}.pdf"
