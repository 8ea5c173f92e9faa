"""Synthetic PDFs for tests and benchmarks, good and bad.

``make_pdf`` writes a real, valid PDF of a chosen size quickly: the bulk is one
uncompressed stream of seeded random bytes, so 20 MiB costs a few tens of
milliseconds and the same arguments always give the same bytes (and SHA-256).
The other helpers make the inputs the PDF check must refuse.
"""
from __future__ import annotations

import hashlib
import io
import random
import zlib
from pathlib import Path

import pikepdf

__all__ = ["make_pdf", "html_as_pdf", "truncated_pdf", "tiny_pdf", "spinning_pdf", "blank_scans_pdf"]


def _build(pages: int, seed: int, padding: list[int]) -> bytes:
    pdf = pikepdf.new()
    font = pdf.make_indirect(pikepdf.Dictionary(
        Type=pikepdf.Name.Font, Subtype=pikepdf.Name.Type1, BaseFont=pikepdf.Name.Helvetica))
    rnd = random.Random(seed)
    for number in range(1, pages + 1):
        page = pdf.add_blank_page(page_size=(612, 792))
        page.Resources = pikepdf.Dictionary(Font=pikepdf.Dictionary(F1=font))
        text = f"BT /F1 24 Tf 72 700 Td (FleetHQ test page {number} seed {seed}) Tj ET"
        page.Contents = pdf.make_stream(text.encode())
        if padding:
            # The bulk, spread over the pages like the images of a real paper
            # (so a file cut in half still has its page tree). Random bytes do
            # not compress and the stream is written unfiltered, so the size is
            # predictable. Readers ignore the unknown key; saving keeps the
            # stream because the page refers to it.
            page.obj.FleetHQPadding = pdf.make_stream(rnd.randbytes(padding[number - 1]))
    out = io.BytesIO()
    # deterministic_id: the same arguments give byte-identical files.
    pdf.save(out, compress_streams=False, deterministic_id=True,
             stream_decode_level=pikepdf.StreamDecodeLevel.none)
    return out.getvalue()


def make_pdf(path, *, pages: int = 1, target_bytes: int | None = None, seed: int = 0) -> str:
    """Write a valid PDF of ``pages`` pages; return its SHA-256.

    With ``target_bytes`` the file is padded to that size, give or take a few
    bytes (20 MiB takes ~0.2 s). The same arguments give the same bytes.
    """
    data = _build(pages, seed, [])
    if target_bytes and target_bytes > len(data):
        # Each padding stream costs a dictionary and keywords on top of its
        # bytes: measure that overhead with one-byte streams.
        overhead = len(_build(pages, seed, [1] * pages)) - len(data) - pages
        each = max(1, (target_bytes - len(data) - overhead) // pages)
        each -= len(str(each)) - 1          # "/Length N" grows with the digits of N
        data = _build(pages, seed, [max(1, each)] * pages)
    Path(path).write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def html_as_pdf(path) -> None:
    """An HTML page (a paywall, say) of ~20 KiB, as a server sends with a PDF URL."""
    filler = "<p>Please sign in to read the full text of this article.</p>\n" * 350
    Path(path).write_text(f"<!DOCTYPE html>\n<html><head><title>Sign in</title></head>"
                          f"<body>\n{filler}</body></html>\n")


def truncated_pdf(src, dst, *, fraction: float = 0.5, forge_eof: bool = False) -> None:
    """Copy the first ``fraction`` of ``src`` to ``dst``, like an interrupted download.

    With ``forge_eof`` a ``%%EOF`` line is appended, so the cheap tail check
    passes and only the structural parse can tell (a default ``pikepdf.open``
    would repair the file and report every page).
    """
    data = Path(src).read_bytes()
    cut = data[: int(len(data) * fraction)]
    Path(dst).write_bytes(cut + b"\n%%EOF\n" if forge_eof else cut)


def tiny_pdf(path) -> str:
    """A valid one-page PDF well under 10 KiB; returns its SHA-256."""
    return make_pdf(path, pages=1)


def _zeros_deflated(size: int) -> bytes:
    """zlib data that inflates to ``size`` zero bytes (a multiple of 1 MiB), made in ms.

    After a full flush deflate forgets its history, so every further 1 MiB of
    zeros compresses to the same block: repeat it instead of compressing
    gigabytes. The Adler-32 of n zeros is simply (n mod 65521) << 16 | 1.
    """
    chunk = bytes(1 << 20)
    comp = zlib.compressobj(9)
    first = comp.compress(chunk) + comp.flush(zlib.Z_FULL_FLUSH)
    block = first[2:]                      # the same bytes without the zlib header
    adler = ((size % 65521) << 16) | 1
    return first[:2] + block * (size // len(chunk)) + b"\x03\x00" + adler.to_bytes(4, "big")


def spinning_pdf(path, *, inflated_bytes: int = 4 << 30, pad_to: int = 16 * 1024,
                 filters: tuple[str, ...] = ("/FlateDecode", "/FlateDecode")) -> None:
    """A small valid PDF whose only page's content stream inflates to ``inflated_bytes``.

    A "deflate bomb": zeros compressed twice (``/Filter [/FlateDecode
    /FlateDecode]``), so 4 GiB of content fit in a ~26 KiB file that passes the
    size, head and tail checks. A parse that decodes page content (as
    ``check_pdf_syntax`` does) must inflate it all, and qpdf buffers it: about
    1 s of CPU and 0.5 GiB of memory per 256 MiB. That is what the child's
    limits are for. (The classic alternatives do not spin with qpdf: a /Kids
    loop and deep nesting are detected at once.)
    """
    data = _zeros_deflated(inflated_bytes)
    for name in filters[1:]:
        if name == "/FlateDecode":
            data = zlib.compress(data, 9)
    pdf = pikepdf.new()
    page = pdf.add_blank_page(page_size=(612, 792))
    stream = pikepdf.Stream(pdf, data)
    # The data is already encoded: name the filters by hand and save without
    # decoding anything (saving would otherwise try to inflate the bomb).
    stream.Filter = pikepdf.Array([pikepdf.Name(name) for name in filters])
    page.Contents = pdf.make_indirect(stream)
    # Pad (~16 KiB by default) so the size floor is not what rejects it.
    pdf.Root.FleetHQPadding = pdf.make_stream(random.Random(0).randbytes(pad_to))
    pdf.save(path, compress_streams=False, deterministic_id=True,
             stream_decode_level=pikepdf.StreamDecodeLevel.none)


def blank_scans_pdf(path, *, pages: int = 10, width: int = 2550, height: int = 3300) -> None:
    """White A4 pages scanned at 300 dpi, 8-bit grey, Flate-compressed: each
    inflates about a thousandfold (a real document with the ratio of a bomb)."""
    pixels = zlib.compress(b"\xff" * (width * height), 9)
    pdf = pikepdf.new()
    for _ in range(pages):
        page = pdf.add_blank_page(page_size=(612, 792))
        image = pikepdf.Stream(pdf, pixels)
        image.Type, image.Subtype = pikepdf.Name.XObject, pikepdf.Name.Image
        image.Width, image.Height, image.BitsPerComponent = width, height, 8
        image.ColorSpace, image.Filter = pikepdf.Name.DeviceGray, pikepdf.Name.FlateDecode
        page.Resources = pikepdf.Dictionary(XObject=pikepdf.Dictionary(Im0=image))
        page.Contents = pdf.make_stream(b"q 612 0 0 792 0 0 cm /Im0 Do Q")
    pdf.save(path, compress_streams=False, deterministic_id=True,
             stream_decode_level=pikepdf.StreamDecodeLevel.none)
