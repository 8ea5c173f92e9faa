"""Child program reading PDFs with pypdfium2, run under the engine's limits.

The source is untrusted and the derived PDF is made from it, so neither is
opened in the worker's own process: the engine runs this file (by path, so
only the standard library and pypdfium2 are imported) under the same
tree-wide time and memory watchdog as OCRmyPDF.

``pdfprobe.py inspect PDF`` prints ``{"pages", "text_pages", "signed"}`` or
``{"error": "not_pdf" | "encrypted", "message"}``; any encryption counts,
also an owner password alone. A page "has text" when
PDFium finds any non-blank character on it; those are the pages
``--skip-text`` leaves alone.

``pdfprobe.py text PDF TXT`` writes the plain text of every page to TXT
(UTF-8, pages separated by a form feed, as pdftotext does, so page numbers
survive) and prints ``{"pages", "page_chars"}``.

pypdfium2 is used because OCRmyPDF already depends on it (it is the
rasterizer the engine selects), so text extraction adds no package.
"""
from __future__ import annotations

import json
import os
import sys


def _open(path: str):
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    try:
        return pdfium.PdfDocument(path), None
    except pdfium.PdfiumError as exc:
        if getattr(exc, "err_code", None) == pdfium_c.FPDF_ERR_PASSWORD:
            return None, {"error": "encrypted", "message": "the PDF is encrypted (a password is needed)"}
        return None, {"error": "not_pdf", "message": f"PDFium cannot open the file: {exc}"}


def _page_text(page) -> str:
    textpage = page.get_textpage()
    try:
        return textpage.get_text_range()
    finally:
        textpage.close()


def inspect(path: str) -> dict:
    import pypdfium2.raw as pdfium_c

    doc, error = _open(path)
    if error:
        return error
    try:
        text_pages = [index for index in range(len(doc)) if _page_text(doc[index]).strip()]
        if pdfium_c.FPDF_GetSecurityHandlerRevision(doc.raw) != -1:
            # Opens without a password (an owner password only), but its owner
            # restricted it, and OCR would write it out without those restrictions.
            return {"error": "encrypted", "message": "the PDF is encrypted (owner password and permissions)"}
        signed = pdfium_c.FPDF_GetSignatureCount(doc.raw) > 0
        return {"pages": len(doc), "text_pages": text_pages, "signed": signed}
    finally:
        doc.close()


def extract(path: str, text_path: str) -> dict:
    doc, error = _open(path)
    if error:
        return error
    partial = text_path + ".part"
    page_chars = []
    try:
        with open(partial, "w", encoding="utf-8") as out:
            for index in range(len(doc)):
                # PDFium ends lines with CRLF; plain text on the master is LF.
                text = _page_text(doc[index]).replace("\r\n", "\n")
                if index:
                    out.write("\f")
                out.write(text)
                page_chars.append(len(text.strip()))
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, text_path)
        return {"pages": len(doc), "page_chars": page_chars}
    finally:
        doc.close()


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "inspect":
        answer = inspect(argv[1])
    elif len(argv) == 3 and argv[0] == "text":
        answer = extract(argv[1], argv[2])
    else:
        print("usage: pdfprobe.py inspect PDF | text PDF TXT", file=sys.stderr)
        return 2
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
