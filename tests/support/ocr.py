"""An OCR worker process and the search that finds its text."""
from __future__ import annotations
from tests.worker_harness import archiver, fleet, master, publisher, sql  # noqa: F401


def _ocr_worker(fleet, project, **env):
    settings = {"FLEETHQ_TASK": "ocr", "FLEETHQ_CONCURRENCY": 1, "FLEETHQ_OCR_LANGUAGES": "eng",
                "FLEETHQ_OCR_NICE": 0, **env}
    return fleet.worker(project, **settings)


def _search(app, words: str) -> list[dict]:
    from app.extensions import db
    from app.search.query import search
    with app.app_context():
        try:
            return search(words)["results"]
        finally:
            db.session.remove()
