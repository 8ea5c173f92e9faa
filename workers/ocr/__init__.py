"""The worker program's OCR engine: OCRmyPDF + Tesseract on a local file, under limits.

Used by the ``ocr`` task of ``fleethq-worker``; imports nothing of the
master and nothing outside the standard library in the worker's own process
(OCRmyPDF and PDFium run only in child processes).

::

    from workers.ocr import OcrLimits, run_ocr, check_free_disk, check_installation

    check_installation(["eng"])                 # at start-up: BrokenWorker if not
    if check_free_disk(volume, job_size, job_pages).ok:   # before claiming
        ...
        result = run_ocr(source_pdf, scratch_dir, "eng+pol", OcrLimits.from_env())
        result.pdf_path, result.text_path, result.pages, result.pages_skipped

Failures (:mod:`workers.ocr.errors`)::

    OcrFailure
    ├── PermanentFailure     fail the job, no retry (encrypted, signed, not a PDF, bad language name)
    ├── RetryableFailure     fail the attempt, retry elsewhere (crash, out_of_memory, time_limit, ...)
    ├── AlreadyHasText       complete the job as skipped (.pages)
    └── BrokenWorker         stop claiming, report on the heartbeat (missing binary or language pack)
"""
from __future__ import annotations

import os

from .engine import OcrResult, ocrmypdf_argv, run_ocr
from .errors import (AlreadyHasText, BrokenWorker, OcrFailure, PermanentFailure, RetryableFailure,
                     EXIT_STATUSES)
from .install import Installation, check_languages, find_installation, parse_languages
from .limits import DiskCheck, OcrLimits, OcrOptions, check_free_disk, scratch_bytes_needed


def check_installation(languages=(), rotate_pages: bool = True, environ=None) -> Installation:
    """What this worker can OCR; raises :class:`BrokenWorker` if it cannot OCR ``languages``."""
    installation = find_installation(dict(os.environ if environ is None else environ))
    check_languages(installation, parse_languages(languages) if languages else (), rotate_pages)
    return installation


__all__ = [
    "AlreadyHasText", "BrokenWorker", "DiskCheck", "EXIT_STATUSES", "Installation", "OcrFailure",
    "OcrLimits", "OcrOptions", "OcrResult", "PermanentFailure", "RetryableFailure", "check_free_disk",
    "check_installation", "ocrmypdf_argv", "run_ocr", "scratch_bytes_needed",
]
