"""The documents demo of ``make dev`` (:mod:`app.dev`), after the OCR demo.

A scanned letter (a two-page one-bit TIFF, as a flatbed scanner writes it)
is dropped into the consume folder (``var/consume``), which the ``consume``
process watches; it becomes a document of the ``documents`` project, the
OCR lanes of the OCR demo read it, and the demo ends with the page where
the development reader reads it.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from app.dev.demo import WORKER_VERSION, api
from app.dev.procs import Stack, StepFailed, say

PROJECT = "documents"
LETTER = "letter-to-the-harbour-master.tif"
PAGES = [["Dear harbour master,", "the lantern on the north pier", "has been dark since Tuesday."],
         ["Please send a keeper", "before the autumn storms.", "Yours, the falcon society"]]


def make_project(base: str, token: str) -> None:
    """Before the OCR lanes start, so that they serve it from their first claim."""
    api(base, token, "PUT", f"/api/v1/fleethq/projects/{PROJECT}",
        {"kind": "documents", "client_versions": [WORKER_VERSION], "retry_backoff_seconds": 2})


def _letter(var: Path) -> Path:
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.scans import image_file  # the test suite's scanner doubles as the demo's
    path = var / "scans" / LETTER
    path.parent.mkdir(parents=True, exist_ok=True)
    return image_file(path, PAGES, "TIFF", mode="1")


def documents_demo(stack: Stack, base: str, token: str) -> None:
    folder = stack.var / "consume"
    letter = _letter(stack.var)
    staged = folder / f".{LETTER}.part"  # dot files are not taken: copy, then rename
    folder.mkdir(parents=True, exist_ok=True)
    staged.write_bytes(letter.read_bytes())
    os.rename(staged, folder / LETTER)
    say("documents", f"dropped {LETTER} into {folder.relative_to(stack.var.parent)}/ (the consume folder)")
    deadline = time.monotonic() + 600
    while True:
        stack.check_children()
        listed = api(base, token, "GET", f"/api/v1/fleethq/projects/{PROJECT}/documents?limit=200")
        found = [d for d in listed["documents"] if d["filename"] == LETTER]
        if found and found[0]["state"] in ("done", "failed"):
            break
        if time.monotonic() > deadline:
            raise StepFailed(f"the letter was not OCRed: {found or 'not consumed'}")
        time.sleep(1)
    doc = found[0]
    if doc["state"] != "done":
        raise StepFailed(f"the letter's OCR failed: {doc['ocr']['error']}")
    say("documents", f"{LETTER} is document {doc['document_id']}, searchable; sign in as the "
                     f"development reader at {base}/login and open {base}/documents/"
                     f"{doc['document_id']}?q=lantern")
