"""Turn one scanned image file into a PDF without loss (run as a child process).

    python app/documents/convert.py SOURCE TARGET

img2pdf embeds JPEG and CCITT (fax) TIFF data as it is and stores every other
image losslessly (Flate), one PDF page per image frame: a multi-page TIFF
keeps its pages, and EXIF rotation is applied to the page, not the pixels.
An image that states no resolution is placed at ``ASSUMED_DPI``, the usual
scanner setting, so OCR sees text of a plausible size (img2pdf's own 96 dpi
would make a phone photo a metre wide).

Run by path, not as ``-m app…``: the child imports neither Flask nor the
app, and app/documents/formats.py gives it CPU and memory limits, so a
decompression bomb or a decoder bug can only exhaust this child. Exit status
0: done; 3: the file is refused, the reason on stderr as one JSON object
``{"reason": ..., "message": ...}``.
"""
from __future__ import annotations

import json
import logging
import sys

ASSUMED_DPI = 300
# Pixels of one frame; Pillow refuses more than twice its own default.
MAX_PIXELS = 250_000_000
REFUSED = 3


def refuse(reason: str, message: str) -> int:
    sys.stderr.write(json.dumps({"reason": reason, "message": message}))
    return REFUSED


def main(source: str, target: str) -> int:
    import img2pdf
    from PIL import Image, UnidentifiedImageError

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS // 2   # Pillow errors at twice this
    try:
        with Image.open(source) as image:
            frames = getattr(image, "n_frames", 1)
            dpi = image.info.get("dpi")
            for frame in range(frames):
                # Every frame decoded: img2pdf copies JPEG and CCITT data as
                # it is, so a truncated file would pass unseen otherwise.
                image.seek(frame)
                image.load()
    except Image.DecompressionBombError as exc:
        return refuse("too_many_pixels", f"an image frame is larger than {MAX_PIXELS} pixels: {exc}")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as exc:
        return refuse("unreadable_image", f"the image cannot be read: {exc}")
    options = {"rotation": img2pdf.Rotation.ifvalid}
    if not dpi or min(dpi) <= 1:
        options["layout_fun"] = img2pdf.get_fixed_dpi_layout_fun((ASSUMED_DPI, ASSUMED_DPI))
    logging.getLogger("img2pdf").setLevel(logging.ERROR)  # its notes about alpha masks
    try:
        data = img2pdf.convert(source, nodate=True, **options)  # the same scan, the same PDF
    except img2pdf.ImageOpenError as exc:
        return refuse("unreadable_image", f"the image cannot be read: {exc}")
    except (img2pdf.AlphaChannelError, img2pdf.ExifOrientationError, img2pdf.PdfTooLargeError,
            ValueError, OSError, SyntaxError, EOFError) as exc:
        return refuse("unconvertible_image", f"the image cannot be made a PDF: {exc}")
    with open(target, "wb") as out:
        out.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
