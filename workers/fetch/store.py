"""Recognise a PDF response, stream it to disk under the size cap, verify it.

The bytes go to a temp file in ``dest_dir`` chunk by chunk (never the whole
body in memory), then :func:`workers.wire.pdfcheck.check_pdf_file` — the check the
master runs on uploads — decides; a file it refuses is deleted. An accepted
file is renamed to ``<sha256>.pdf``: content-addressed, so fetching the same
paper twice leaves one file.
"""
from __future__ import annotations

import os
import tempfile

from workers.wire.pdfcheck import HEAD_WINDOW, PdfCheckError, PdfRejected, check_pdf_file

from .types import DISK, FetchFailure, INTERNAL, INVALID_PDF

PDF_TYPES = frozenset({"application/pdf", "application/x-pdf", "application/acrobat",
                       "applications/vnd.pdf", "text/pdf"})


def looks_pdf(head: bytes) -> bool:
    """The same head rule as the PDF check: ``%PDF-`` within the first 1024 bytes."""
    return b"%PDF-" in head[:HEAD_WINDOW]


def declared_pdf(headers) -> bool:
    """Does the server say this is a PDF (type, or an attachment named *.pdf)?"""
    ctype = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
    disposition = (headers.get("Content-Disposition") or "").lower()
    return ctype in PDF_TYPES or ".pdf" in disposition


def check_declared_size(headers, max_bytes: int, url: str) -> None:
    """Refuse before reading when Content-Length already says too much."""
    try:
        length = int(headers.get("Content-Length") or -1)
    except ValueError:
        return
    # With Content-Encoding the length is of the compressed bytes: the
    # streamed count decides then.
    if length > max_bytes and not headers.get("Content-Encoding"):
        raise FetchFailure(INVALID_PDF, f"{url} declares {length} bytes, more than {max_bytes}",
                           reason="too_large", url=url, size=length)


def stream_to_temp(chunks, dest_dir: str, max_bytes: int, url: str) -> str:
    """Write ``chunks`` to a temp file in ``dest_dir``; return its path."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".fetch-", suffix=".part", dir=dest_dir)
    except OSError as exc:
        raise FetchFailure(DISK, f"cannot create a file in {dest_dir}: {exc}") from None
    total = 0
    try:
        with os.fdopen(fd, "wb") as out:
            for data in chunks:
                total += len(data)
                if total > max_bytes:
                    raise FetchFailure(INVALID_PDF, f"{url} sent more than {max_bytes} bytes",
                                       reason="too_large", url=url)
                out.write(data)
    except OSError as exc:
        _unlink(tmp)
        raise FetchFailure(DISK, f"cannot write {tmp}: {exc}") from None
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def finalize(tmp: str, dest_dir: str, max_bytes: int, url: str):
    """Check the temp file as the master will; return (path, PdfInfo) or raise."""
    try:
        info = check_pdf_file(tmp, max_bytes=max_bytes, parse=True)
    except PdfRejected as exc:
        _unlink(tmp)
        message = exc.message.replace(tmp, "the file")    # the temp name means nothing to anyone
        raise FetchFailure(INVALID_PDF, f"{url}: {message}", reason=exc.reason, url=url) from None
    except PdfCheckError as exc:
        _unlink(tmp)
        raise FetchFailure(INTERNAL, f"PDF check failed to run: {exc}", url=url) from None
    except OSError as exc:
        _unlink(tmp)
        raise FetchFailure(DISK, f"cannot read back {tmp}: {exc}") from None
    path = os.path.join(dest_dir, f"{info.sha256}.pdf")
    try:
        os.replace(tmp, path)
    except OSError as exc:
        _unlink(tmp)
        raise FetchFailure(DISK, f"cannot rename {tmp}: {exc}") from None
    return path, info


def save_response(response, dest_dir: str, max_bytes: int):
    """Stream an (already sniffed) PDF response to disk and verify it."""
    check_declared_size(response.headers, max_bytes, response.url)
    tmp = stream_to_temp(response.chunks(), dest_dir, max_bytes, response.url)
    return finalize(tmp, dest_dir, max_bytes, response.url)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
