"""Rebuilding the text index from the archived PDFs (``flask fleet reindex``).

The index (app/search/index.py) is written by the archive commit from the
text an OCR worker uploaded. When it is lost, damaged, or made under an
older text configuration, the archive still holds every PDF that text came
from; this reads them again, in bounded batches, each batch one transaction:

- a paper or document whose index row names the OCR output it came from
  (``paper_texts.derived_key``) is read from that PDF — the run whose text
  is indexed stays the one that is indexed;
- one with derived PDFs but no index row, from its newest derived PDF;
- one indexed from its own text (a born-digital source an OCR run skipped),
  from the source PDF itself.

Text is read in a child process (workers/ocr/pdfprobe.py, PDFium, the
worker's own reader: the same page breaks the worker sends). The master
stays the only writer of the index; a PDF that cannot be read is counted and
named, and the rest go on.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from sqlalchemy import text as sql

from app import audit
from app.errors import FleetError
from app.extensions import db
from app.search.index import index_paper

PROBE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "workers", "ocr", "pdfprobe.py")
PROBE_TIMEOUT_S = 300
BATCH_MAX = 1000

_KEYS = sql("""
    SELECT k FROM (SELECT derived_from AS k FROM assets WHERE derived_from IS NOT NULL
                   UNION SELECT canonical_key FROM paper_texts) s
    WHERE k > :after ORDER BY k LIMIT :n""")
_COUNT = sql("""
    SELECT count(*) FROM (SELECT derived_from AS k FROM assets WHERE derived_from IS NOT NULL
                          UNION SELECT canonical_key FROM paper_texts) s""")
_SOURCE = sql("""
    SELECT s.canonical_key, s.object_key AS source_object, s.project_id AS source_project,
           t.derived_key, t.project_id AS indexed_project, t.languages,
           COALESCE(named.object_key, newest.object_key) AS derived_object,
           COALESCE(named.canonical_key, newest.canonical_key) AS derived_key_found,
           (SELECT dj.languages FROM derived_jobs dj WHERE dj.source_key = s.canonical_key
            ORDER BY dj.id DESC LIMIT 1) AS run_languages
    FROM assets s
    LEFT JOIN paper_texts t ON t.canonical_key = s.canonical_key
    LEFT JOIN assets named ON named.canonical_key = t.derived_key
    LEFT JOIN LATERAL (SELECT canonical_key, object_key FROM assets d
                       WHERE d.derived_from = s.canonical_key
                       ORDER BY d.created_at DESC, d.canonical_key DESC LIMIT 1) newest ON true
    WHERE s.canonical_key = :k""")


@dataclass
class Progress:
    total: int
    done: int = 0
    pages: int = 0
    failed: list = field(default_factory=list)


def _read_text(store, object_key: str, workdir: str) -> str:
    pdf, out = os.path.join(workdir, "source.pdf"), os.path.join(workdir, "text.txt")
    with store.open(object_key) as src, open(pdf, "wb") as dst:
        shutil.copyfileobj(src, dst, 1024 * 1024)
    done = subprocess.run([sys.executable, PROBE, "text", pdf, out], capture_output=True, text=True,
                          timeout=PROBE_TIMEOUT_S)
    said = json.loads((done.stdout or "{}").strip().splitlines()[-1] or "{}") if done.stdout else {}
    if done.returncode != 0 or "error" in said:
        raise ValueError(said.get("message") or done.stderr.strip()[-300:] or f"exit {done.returncode}")
    with open(out, encoding="utf-8") as fh:
        return fh.read()


def run(store, *, batch: int = 100, report=lambda progress: None) -> Progress:
    """Re-read and re-index every indexed or OCRed paper and document, ``batch``
    at a time (one transaction each); ``report(progress)`` after each batch."""
    batch = max(1, min(batch, BATCH_MAX))
    progress = Progress(total=int(db.session.execute(_COUNT).scalar()))
    db.session.commit()
    after = ""
    with tempfile.TemporaryDirectory(prefix="fleethq-reindex-") as workdir:
        while True:
            keys = list(db.session.execute(_KEYS, {"after": after, "n": batch}).scalars())
            db.session.commit()
            if not keys:
                break
            for key in keys:
                row = db.session.execute(_SOURCE, {"k": key}).mappings().first()
                if row is None:  # the source asset itself is gone (pruned): nothing to read
                    progress.failed.append((key, "the source asset is not registered"))
                    continue
                object_key = row["derived_object"] or row["source_object"]
                try:
                    body = _read_text(store, object_key, workdir)
                    with db.session.begin_nested():
                        index_paper(key, row["indexed_project"] or row["source_project"], body,
                                    derived_key=row["derived_key_found"],
                                    languages=row["languages"] or row["run_languages"])
                except (OSError, ValueError, subprocess.TimeoutExpired, FleetError) as exc:
                    progress.failed.append((key, str(getattr(exc, "message", exc))[:300]))
                    continue
                progress.done += 1
                progress.pages += body.count("\f") + (0 if body.endswith("\f") else 1)
            after = keys[-1]
            db.session.commit()
            report(progress)
    audit.record("search.reindex", "search", "index", {
        "papers": progress.done, "pages": progress.pages, "failed": len(progress.failed)})
    db.session.commit()
    return progress
