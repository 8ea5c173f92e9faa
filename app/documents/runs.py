"""OCR runs of documents after the first: re-OCR with another profile, and
which run's text the index holds.

A document has one run per OCR profile (the derived-job identity: project,
source, profile name). Re-OCR queues a run with a profile the document has
not had (a profile name is the run's name: "ocr-pol" for Polish, say); a
run already queued or running is answered as it is, and a finished one is
not run again under the same name. The document's ``job_id`` names the run
whose text is indexed: the first run until another run's text is indexed,
which the archive commit records here (:func:`indexed`) in its own
transaction. The pages show it ("indexed"); nothing replaces it silently.
"""
from __future__ import annotations

from sqlalchemy import text

from app import audit
from app.documents import intake
from app.errors import Conflict, InvalidRequest, NotFound
from app.extensions import db
from app.hooks.derived import check_profile
from app.projects import service

FILTER_MAX = 10_000
_FINISHED = ("done", "failed", "reset_exhausted")


def _existing_run(project_id: str, pdf_sha256: str, profile: str):
    return db.session.execute(text(
        "SELECT dj.job_id, j.state FROM derived_jobs dj LEFT JOIN jobs j ON j.id = dj.job_id "
        "WHERE dj.target_project_id = :p AND dj.source_sha256 = :s AND dj.profile = :pr"),
        {"p": project_id, "s": pdf_sha256, "pr": profile}).first()


def _queue(doc, profile: dict) -> tuple[int, bool]:
    """(job id, queued now) for one document; Conflict for a finished run."""
    found = _existing_run(doc["project_id"], doc["pdf_sha256"], profile["name"])
    if found is not None and found[1] in _FINISHED:
        raise Conflict(f"document {doc['id']} already had a run with profile {profile['name']!r} "
                       f"({found[1]}); name the new run with another profile",
                       code="invalid_transition",
                       details={"document_id": doc["id"], "profile": profile["name"]})
    if found is not None and found[1] is not None:
        return found[0], False
    project = service.get(doc["project_id"])
    return intake.queue_run(project, doc["id"], profile), True


def reocr(profile, *, project_id: str | None = None, document_ids: list[int] | None = None,
          actor: str) -> dict:
    """Queue an OCR run with ``profile`` for the named documents (all of them
    in ``project_id`` when it is given too), or for every document of
    ``project_id``. Commits. A document that already finished a run of that
    profile is refused (409) when named alone, and skipped (counted) in a
    filter."""
    profile = check_profile(profile)
    if project_id is not None:
        intake.documents_project(project_id)
    if document_ids is not None:
        document_ids = sorted(set(document_ids))
        if not 1 <= len(document_ids) <= FILTER_MAX:
            raise InvalidRequest(f"name 1..{FILTER_MAX} documents", details={"field": "document_ids"})
        rows = db.session.execute(text(
            "SELECT id, project_id, pdf_sha256 FROM documents WHERE id = ANY(:ids) "
            "AND (CAST(:p AS text) IS NULL OR project_id = :p) ORDER BY id"),
            {"ids": document_ids, "p": project_id}).mappings().all()
        missing = sorted(set(document_ids) - {r["id"] for r in rows})
        if missing:
            db.session.rollback()
            where = f" in {project_id}" if project_id else ""
            raise NotFound(f"no document {missing[0]}{where}", details={"document_id": missing[0]})
    elif project_id is not None:
        rows = db.session.execute(text(
            "SELECT id, project_id, pdf_sha256 FROM documents WHERE project_id = :p ORDER BY id "
            "LIMIT :n"), {"p": project_id, "n": FILTER_MAX + 1}).mappings().all()
        if len(rows) > FILTER_MAX:
            db.session.rollback()
            raise InvalidRequest(f"{project_id} has more than {FILTER_MAX} documents: name them",
                                 details={"limit": FILTER_MAX})
    else:
        raise InvalidRequest("name documents or a project")
    for project in {r["project_id"] for r in rows}:
        intake.documents_project(project)
    queued, running, skipped = [], [], []
    try:
        for doc in rows:
            try:
                with db.session.begin_nested():
                    job_id, new = _queue(doc, profile)
            except Conflict:
                if document_ids is not None and len(rows) == 1:
                    raise
                skipped.append(doc["id"])
                continue
            (queued if new else running).append(doc["id"])
        audit.record("documents.reocr", "project", project_id or (rows[0]["project_id"] if rows else ""), {
            "profile": profile, "queued": len(queued), "already_queued": len(running),
            "skipped": len(skipped), "document_ids": [r["id"] for r in rows][:100]})
        db.session.commit()
    except Exception:
        db.session.rollback()
        raise
    return {"profile": profile, "queued": queued, "already_queued": running, "skipped": skipped}


def indexed(job_id: int, source_key: str, project_id: str) -> None:
    """The run ``job_id``'s text is now the indexed text of the document(s)
    of ``source_key`` in ``project_id`` (caller's transaction)."""
    db.session.execute(text(
        "UPDATE documents SET job_id = :j WHERE asset_key = :k AND project_id = :p"),
        {"j": job_id, "k": source_key, "p": project_id})
