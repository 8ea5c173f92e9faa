"""Full-text search of archived papers' OCR text (``index`` writes, ``query`` reads)."""
