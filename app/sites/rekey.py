"""Give site keys to jobs that have none: those enqueued before site keys
existed (migration 0020) or imported from SavewebHQ's database, whose rows
are copied in SQL (app/imports) where the public suffix list cannot be read.
"""
from __future__ import annotations

from sqlalchemy import text

from app.extensions import db
from app.sites import keys

BATCH = 1000


def rekey(project_id: str | None = None, *, batch: int = BATCH) -> dict:
    """Walk the jobs without a site key in id order, a batch per transaction
    (commits each), and set the key their value names. A job whose value
    names no site (a generic value, a document's OCR run) keeps none; a job
    whose ``attr.fleethq_site`` is not a key keeps none and is counted.

    Returns ``{"scanned", "keyed", "bad_names"}``.
    """
    after, scanned, keyed, bad = 0, 0, 0, 0
    only = "AND j.project_id = :p" if project_id else ""
    while True:
        rows = db.session.execute(text(
            "SELECT j.id, j.value, j.attr FROM jobs j JOIN projects p ON p.id = j.project_id "
            f"WHERE j.id > :after AND j.site_key IS NULL AND p.kind <> 'documents' {only} "
            "ORDER BY j.id LIMIT :n"), {"after": after, "p": project_id, "n": batch}).all()
        if not rows:
            break
        found = []
        for job_id, value, attr in rows:
            try:
                site = keys.for_value(value, attr)
            except keys.InvalidSiteKey:
                bad += 1
                continue
            if site is not None:
                found.append({"i": job_id, "s": site})
        if found:
            db.session.execute(text("UPDATE jobs SET site_key = :s WHERE id = :i AND site_key IS NULL"),
                               found)
        db.session.commit()
        scanned += len(rows)
        keyed += len(found)
        after = rows[-1][0]
    return {"scanned": scanned, "keyed": keyed, "bad_names": bad}
