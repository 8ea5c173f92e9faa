"""PDFs for the OCR tests: scanned pages of known words (images only, no text layer),
born-digital pages (a real text layer), and the inputs OCR must refuse.

Pages are small (a strip of A4 width at 150 dpi) so Tesseract reads one in
about a second on one core.
"""
from __future__ import annotations

import io
from pathlib import Path

import pikepdf
from PIL import Image, ImageDraw, ImageFont

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
DPI = 150


def page_image(lines: list[str], width: int = 1240, line_height: int = 90, rotate: int = 0) -> Image.Image:
    """Black words on white, the way a flatbed scanner returns a typed page."""
    font = ImageFont.truetype(FONT, 44)
    image = Image.new("L", (width, 120 + line_height * len(lines)), 255)
    draw = ImageDraw.Draw(image)
    for number, line in enumerate(lines):
        draw.text((70, 60 + line_height * number), line, font=font, fill=0)
    return image.rotate(rotate, expand=True, fillcolor=255) if rotate else image


def scanned_pdf(path: Path, pages: list[list[str]], **image_options) -> Path:
    """One image-only page per entry of ``pages`` (each a list of text lines)."""
    images = [page_image(lines, **image_options) for lines in pages]
    images[0].save(path, "PDF", resolution=DPI, save_all=True, append_images=images[1:])
    return path


def text_page_pdf(lines: list[str]) -> pikepdf.Pdf:
    """A born-digital page: Helvetica text in the content stream."""
    pdf = pikepdf.new()
    font = pdf.make_indirect(pikepdf.Dictionary(
        Type=pikepdf.Name.Font, Subtype=pikepdf.Name.Type1, BaseFont=pikepdf.Name.Helvetica))
    page = pdf.add_blank_page(page_size=(595, 842))
    page.Resources = pikepdf.Dictionary(Font=pikepdf.Dictionary(F1=font))
    ops = "".join(f"BT /F1 20 Tf 72 {760 - 30 * n} Td ({line}) Tj ET\n" for n, line in enumerate(lines))
    page.Contents = pdf.make_stream(ops.encode("latin-1"))
    return pdf


def mixed_pdf(path: Path, text_lines: list[str], scanned_lines: list[str]) -> Path:
    """Page 1 born-digital, page 2 scanned."""
    pdf = text_page_pdf(text_lines)
    buffer = io.BytesIO()
    page_image(scanned_lines).save(buffer, "PDF", resolution=DPI)
    with pikepdf.open(io.BytesIO(buffer.getvalue())) as scan:
        pdf.pages.append(scan.pages[0])
        pdf.save(path)
    return path


def encrypted_pdf(source: Path, path: Path, user_password: str) -> Path:
    """``user_password`` "" gives a file anyone can open but that is still encrypted (owner password only)."""
    with pikepdf.open(source) as pdf:
        pdf.save(path, encryption=pikepdf.Encryption(owner="owner-secret", user=user_password))
    return path


def signed_pdf(source: Path, path: Path) -> Path:
    """A signature field with a (dummy) signature value, as a signing tool leaves it."""
    with pikepdf.open(source) as pdf:
        value = pdf.make_indirect(pikepdf.Dictionary(
            Type=pikepdf.Name.Sig, Filter=pikepdf.Name("/Adobe.PPKLite"),
            SubFilter=pikepdf.Name("/adbe.pkcs7.detached"), ByteRange=pikepdf.Array([0, 10, 20, 30]),
            Contents=pikepdf.String(b"\0" * 64)))
        field = pdf.make_indirect(pikepdf.Dictionary(
            FT=pikepdf.Name.Sig, T=pikepdf.String("Signature1"), V=value, Type=pikepdf.Name.Annot,
            Subtype=pikepdf.Name.Widget, Rect=pikepdf.Array([0, 0, 0, 0]), P=pdf.pages[0].obj))
        pdf.pages[0].obj.Annots = pdf.make_indirect(pikepdf.Array([field]))
        pdf.Root.AcroForm = pdf.make_indirect(pikepdf.Dictionary(Fields=pikepdf.Array([field]), SigFlags=3))
        pdf.save(path)
    return path


def image_file(path: Path, pages: list[list[str]], fmt: str, *, mode: str = "L", dpi: int | None = DPI,
               **save_options) -> Path:
    """A scan as a scanner or phone writes it: ``fmt`` TIFF, PNG or JPEG, the
    pages in ``mode`` (``1`` bilevel, ``L`` grey, ``P4`` 4-bit palette,
    ``RGB``); several pages only in a TIFF. ``dpi`` None states no resolution."""
    images = []
    for lines in pages:
        image = page_image(lines)
        if mode == "P4":
            image = image.quantize(16)
            save_options.setdefault("bits", 4)
        elif mode != "L":
            image = image.convert(mode)
        images.append(image)
    if dpi is not None:
        save_options["dpi"] = (dpi, dpi)
    if fmt == "TIFF" and mode == "1":
        save_options.setdefault("compression", "group4")
    if len(images) > 1:
        save_options.update(save_all=True, append_images=images[1:])
    images[0].save(path, fmt, **save_options)
    return path
