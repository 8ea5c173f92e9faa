"""The four ways an OCR run can fail, and which OCRmyPDF exit status is which.

::

    OcrFailure                 base; ``reason`` is a short machine code, ``message`` says it in words
    ├── PermanentFailure       the input itself: encrypted, signed, not a PDF, a bad language name.
    │                          Fail the job without retry: every worker would answer the same.
    ├── RetryableFailure       this run: a crash, out of memory, the time limit, an invalid output.
    │                          Fail the attempt as retryable, so another worker (or a later run) tries.
    ├── AlreadyHasText         every page already has text: nothing to OCR. Complete the job as skipped.
    └── BrokenWorker           this worker cannot OCR anything: a missing binary, language pack or
                               module, a command line the installed OCRmyPDF refuses. Stop claiming
                               and say so on the heartbeat, instead of burning every job's retries.

The table below is the whole mapping of OCRmyPDF's ``ExitCode`` enum (its
values are stable across releases; they are repeated here so the worker needs
no import of OCRmyPDF in its own process). docs/worker.md shows it too.
"""
from __future__ import annotations


class OcrFailure(Exception):
    """An OCR run that produced no usable result; see the subclasses."""

    failure_class = "failure"

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class PermanentFailure(OcrFailure):
    failure_class = "permanent"


class RetryableFailure(OcrFailure):
    failure_class = "retryable"


class AlreadyHasText(OcrFailure):
    """Every page has text already; ``pages`` is the source's page count and
    ``text_path``, when the engine could read it, the source's own text (so
    a born-digital paper is searchable too, without OCR)."""

    failure_class = "already_has_text"

    def __init__(self, pages: int, message: str = "every page already has text", text_path=None):
        super().__init__("already_has_text", message)
        self.pages = pages
        self.text_path = text_path


class BrokenWorker(OcrFailure):
    failure_class = "broken_worker"


# OCRmyPDF exit status -> (exception class, reason, explanation).
EXIT_STATUSES: dict[int, tuple[type[OcrFailure], str, str]] = {
    1: (BrokenWorker, "bad_args",
        "OCRmyPDF refused the worker's command line: the installed OCRmyPDF does not fit this worker"),
    2: (PermanentFailure, "input_file", "OCRmyPDF cannot read the input as a PDF"),
    3: (BrokenWorker, "missing_dependency", "a program or language pack OCRmyPDF needs is missing"),
    4: (RetryableFailure, "invalid_output_pdf", "OCRmyPDF produced a PDF that failed its own check"),
    5: (RetryableFailure, "file_access_error", "OCRmyPDF could not read or write its files on this worker"),
    6: (AlreadyHasText, "already_done_ocr", "the input already has text"),
    7: (RetryableFailure, "child_process_error", "Tesseract or another helper program crashed"),
    8: (PermanentFailure, "encrypted_pdf", "the input PDF is encrypted"),
    9: (BrokenWorker, "invalid_config", "OCRmyPDF's configuration on this worker is invalid"),
    10: (BrokenWorker, "pdfa_conversion_failed",
         "OCRmyPDF attempted PDF/A although the worker asks for plain PDF output"),
    15: (RetryableFailure, "other_error", "OCRmyPDF failed with an unexpected error"),
    130: (RetryableFailure, "ctrl_c", "OCRmyPDF was interrupted"),
}


def failure_for_exit(returncode: int, stderr_tail: str, pages: int) -> OcrFailure:
    """The failure an OCRmyPDF exit status (other than 0) stands for.

    A negative status is a death by signal that the engine's own watchdog did
    not cause (the kernel's OOM killer, a segfault): retryable. Exit 2 is
    refined by the message, because OCRmyPDF reports a signed PDF, an image it
    cannot read and a file that is no PDF at all under the same status.
    """
    detail = _last_line(stderr_tail)
    if returncode < 0:
        return RetryableFailure("crash", f"OCRmyPDF died of signal {-returncode}")
    known = EXIT_STATUSES.get(returncode)
    if known is None:
        return RetryableFailure("crash", f"OCRmyPDF exited with unknown status {returncode}: {detail}")
    cls, reason, text = known
    if cls is AlreadyHasText:
        return AlreadyHasText(pages, f"{text}: {detail}")
    if returncode == 2:
        reason = "signed" if "digital signature" in stderr_tail.lower() else "not_pdf"
    if returncode == 8:
        reason = "encrypted"
    return cls(reason, f"{text} (exit {returncode}): {detail}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:500] if lines else "no message"
