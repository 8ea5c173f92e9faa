"""Documents that people put in (DESIGN §14): intake, formats, reading.

A project of kind ``documents`` takes files, not URLs. Each file is checked
(and an image converted to a PDF without loss), archived and registered as
the asset ``doc:<sha256 of the file>``, and then OCRed through the derived-job
path (app/hooks/derived.py, app/uploads/derived.py): the project's own jobs
are those OCR runs, claimed by ``fleethq-worker run --task ocr``.
"""
