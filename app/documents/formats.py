"""What a document file is, and the PDF that OCR gets from it.

Scanners and publishers produce PDFs (with or without text on some pages),
TIFF (single and multi-page; bilevel, greyscale, 4-bit, colour), PNG and
JPEG. A file is recognised by its first bytes, never by its name or the
type a client claims. PDFs are checked as worker uploads are
(:mod:`workers.wire.pdfcheck`: complete, parseable in a limited child process)
but with no minimum size, since a one-bit scan of a page can be 2 KB; images
are converted without loss by ``convert.py`` in a child with CPU, memory and
time limits, and the PDF it made is checked the same way.

Every refusal is a :class:`Refused` with a short reason and a message that
names the file by the name its sender gave, never a path on the master.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from dataclasses import dataclass

from workers.wire import pdfcheck

MEDIA_TYPES = {"pdf": "application/pdf", "tiff": "image/tiff", "png": "image/png",
               "jpeg": "image/jpeg"}
SUFFIXES = {"application/pdf": "pdf", "image/tiff": "tif", "image/png": "png", "image/jpeg": "jpg"}
_SIGNATURES = ((b"II*\x00", "tiff"), (b"MM\x00*", "tiff"), (b"\x89PNG\r\n\x1a\n", "png"),
               (b"\xff\xd8\xff", "jpeg"))
CONVERT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "convert.py")
# The converter child: a 250-megapixel frame decodes in about 1 GiB.
CONVERT_CPU_S = 120
CONVERT_WALL_S = 180
CONVERT_MEMORY_BYTES = 3 * 1024**3
# A PDF made or put in may be larger and slower to check than a paper, and
# a scan converted losslessly (PNG pages are Flate) inflates more than one.
PDF_LIMITS = pdfcheck.ParseLimits(cpu_seconds=60, memory_bytes=1024**3, wall_seconds=90,
                                  inflated_bytes=8 << 30, inflation_ratio=1000, inflation_floor=512 << 20)


class Refused(ValueError):
    """The file cannot be a document; ``reason`` is a short machine code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


@dataclass(frozen=True)
class Prepared:
    media_type: str
    pdf_path: str        # the file itself when it is a PDF
    pdf_sha256: str
    pdf_size: int
    pages: int


def sniff(head: bytes) -> str | None:
    """The format of a file from its first 1024 bytes, or None."""
    for signature, name in _SIGNATURES:
        if head.startswith(signature):
            return name
    return "pdf" if b"%PDF-" in head[:pdfcheck.HEAD_WINDOW] else None


def _limit_child() -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_CPU, (CONVERT_CPU_S, CONVERT_CPU_S))
    resource.setrlimit(resource.RLIMIT_AS, (CONVERT_MEMORY_BYTES, CONVERT_MEMORY_BYTES))
    os.nice(5)


def _convert(source: str, target: str, label: str) -> None:
    try:
        done = subprocess.run([sys.executable, CONVERT, source, target], capture_output=True,
                              timeout=CONVERT_WALL_S, preexec_fn=_limit_child, close_fds=True)
    except subprocess.TimeoutExpired:
        raise Refused("convert_timeout", f"{label}: converting it took longer than "
                                         f"{CONVERT_WALL_S} s") from None
    if done.returncode == 3:
        said = json.loads(done.stderr.decode("utf-8", "replace").strip().splitlines()[-1])
        raise Refused(said["reason"], f"{label}: {said['message'].replace(source, label)}")
    if done.returncode != 0:
        # Killed at a limit (SIGXCPU, out of memory) or a decoder crash.
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise Refused("unconvertible_image", f"{label}: the image could not be converted "
                      f"(exit {done.returncode}) {tail[0].replace(source, label)}".rstrip())


def _check_pdf(path: str, label: str, max_bytes: int, sha256: str | None) -> pdfcheck.PdfInfo:
    try:
        return pdfcheck.check_pdf_file(path, min_bytes=1, max_bytes=max_bytes, limits=PDF_LIMITS,
                                       known_sha256=sha256)
    except pdfcheck.PdfRejected as exc:
        raise Refused(exc.reason, f"{label}: {exc.message}") from None


def prepare(path: str, sha256: str, label: str, workdir: str, *, max_bytes: int) -> Prepared:
    """Check the file at ``path`` (its SHA-256 known) and make the PDF OCR
    gets. ``label`` names the file in messages. Raises :class:`Refused`;
    :class:`workers.wire.pdfcheck.PdfCheckError` when the check itself failed."""
    size = os.path.getsize(path)
    if size == 0:
        raise Refused("empty", f"{label}: the file is empty (0 bytes)")
    with open(path, "rb") as f:
        kind = sniff(f.read(pdfcheck.HEAD_WINDOW))
    if kind is None:
        raise Refused("unsupported_format", f"{label}: not a PDF, TIFF, PNG or JPEG file "
                                            "(recognised by its first bytes, not its name)")
    if kind == "pdf":
        info = _check_pdf(path, label, max_bytes, sha256)
        if not info.pages:
            raise Refused("no_pages", f"{label}: the PDF has no pages")
        return Prepared(MEDIA_TYPES["pdf"], path, info.sha256, info.size, info.pages)
    target = os.path.join(workdir, "converted.pdf")
    _convert(path, target, label)
    # img2pdf keeps JPEG data as it is, so a PDF may outgrow the limit only by its wrapping.
    info = _check_pdf(target, f"{label} (as PDF)", max_bytes + 1024 * 1024, None)
    return Prepared(MEDIA_TYPES[kind], target, info.sha256, info.size, info.pages)
