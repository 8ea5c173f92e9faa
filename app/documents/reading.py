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


def list_page(project_id: str, *, after_id: int = 0, limit: int = 50) -> dict:
    """A project's documents, oldest first, in pages of at most 200."""
    limit = max(1, min(limit, LIST_MAX))
    rows = db.session.execute(text(
        _SELECT + " WHERE d.project_id = :p AND d.id > :a ORDER BY d.id LIMIT :n"),
        {"p": project_id, "a": after_id, "n": limit + 1}).mappings().all()
    db.session.commit()
    more = len(rows) > limit
    rows = rows[:limit]
    return {"documents": [_view(r) for r in rows],
            "next_after_id": rows[-1]["id"] if more else None}
