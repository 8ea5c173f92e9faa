"""Limits of one OCR run, their FLEETHQ_OCR_* environment settings, and the free-disk check.

Defaults are sized for a scanned A4 page at 300 dpi on one core: Tesseract
takes 2–6 s for a page (twice that with orientation detection), OCRmyPDF
plus one Tesseract use 300–600 MB. The time limit grows with the page count,
so a 300-page book is not held to a leaflet's limit.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

MiB = 1024**2
GiB = 1024**3

# Scratch space per page for OCRmyPDF's work folder: it keeps each page's
# raster (a lossless PNG, 1–25 MB at 300 dpi depending on colour), its hOCR
# and its one-page text PDF until the output is assembled.
SCRATCH_PER_PAGE = 16 * MiB
SCRATCH_MARGIN = 64 * MiB
# Source copy + derived PDF (the source's images plus a text layer; the
# optimizer rarely makes it larger) + the text, with room to spare.
SCRATCH_PER_SOURCE_BYTE = 4
MIN_MEMORY_BYTES = 32 * MiB


@dataclass(frozen=True)
class OcrLimits:
    base_seconds: float = 60.0          # FLEETHQ_OCR_BASE_SECONDS
    seconds_per_page: float = 30.0      # FLEETHQ_OCR_SECONDS_PER_PAGE
    max_seconds: float = 4 * 3600.0     # FLEETHQ_OCR_MAX_SECONDS: no job runs longer, whatever its size
    memory_bytes: int = 2 * GiB         # FLEETHQ_OCR_MEMORY_BYTES: summed PSS of the whole process tree
    jobs: int = 1                       # FLEETHQ_OCR_JOBS: pages OCRed at once (processes, 1 thread each)
    nice: int = 10                      # FLEETHQ_OCR_NICE: 0 (normal) .. 19 (lowest)
    deskew: bool = False                # FLEETHQ_OCR_DESKEW
    rotate_pages: bool = True           # FLEETHQ_OCR_ROTATE_PAGES

    def __post_init__(self):
        for name in ("base_seconds", "seconds_per_page", "max_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"OCR limit {name} must be > 0, not {getattr(self, name)!r}")
        # Below this not even the PDFium inspection (~20 MB) fits, and every job would fail.
        if self.memory_bytes < MIN_MEMORY_BYTES:
            raise ValueError(f"OCR limit memory_bytes must be at least 32 MiB, not {self.memory_bytes}")
        if not 1 <= self.jobs <= 64:
            raise ValueError(f"OCR limit jobs must be 1..64, not {self.jobs}")
        if not 0 <= self.nice <= 19:
            raise ValueError(f"OCR limit nice must be 0..19, not {self.nice}")

    def time_limit(self, pages: int) -> float:
        """Seconds one run on ``pages`` pages may take (all children included)."""
        return min(self.max_seconds, self.base_seconds + self.seconds_per_page * max(pages, 1))

    def effective_jobs(self) -> int:
        """Never more OCRmyPDF workers than this machine's cores."""
        return max(1, min(self.jobs, os.cpu_count() or 1))

    @classmethod
    def from_env(cls, environ=os.environ) -> "OcrLimits":
        """Defaults overridden by FLEETHQ_OCR_<FIELD> variables; a bad value is a ValueError naming it."""
        values = {}
        for field in fields(cls):
            name = "FLEETHQ_OCR_" + field.name.upper()
            raw = environ.get(name)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[field.name] = _parse(field.type, raw.strip())
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a valid {field.type}") from None
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"FLEETHQ_OCR_*: {exc}") from None


def _parse(kind: str, raw: str):
    if kind == "bool":
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ValueError(raw)
    return int(raw) if kind == "int" else float(raw)


def scratch_bytes_needed(source_bytes: int, pages: int | None = None) -> int:
    """Free bytes one run needs on the worker's volume, estimated before the source is downloaded.

    ``pages`` comes from the job's content facts when it has them; without
    it the source's size stands in (a scan rarely has less than 50 KB a page).
    """
    if pages is None:
        pages = max(1, source_bytes // (50 * 1024))
    return SCRATCH_PER_SOURCE_BYTE * source_bytes + SCRATCH_PER_PAGE * pages + SCRATCH_MARGIN


@dataclass(frozen=True)
class DiskCheck:
    free_bytes: int
    needed_bytes: int

    @property
    def ok(self) -> bool:
        return self.free_bytes >= self.needed_bytes


def check_free_disk(volume: Path, source_bytes: int, pages: int | None = None,
                    reserve_bytes: int = 0) -> DiskCheck:
    """May a job with this source be claimed? ``reserve_bytes`` is kept free besides (the runner's floor)."""
    stat = os.statvfs(volume)
    return DiskCheck(free_bytes=stat.f_bavail * stat.f_frsize,
                     needed_bytes=scratch_bytes_needed(source_bytes, pages) + reserve_bytes)


MODES = ("skip-text", "redo", "force")


@dataclass(frozen=True)
class OcrOptions:
    """What one OCR job asks of OCRmyPDF beyond its languages (the job's
    profile, from the master): ``mode`` skip-text (pages with text are left
    alone; a source whose every page has text is skipped), redo (every
    page's text layer made again) or force (every page rasterized and
    OCRed); ``deskew``/``rotate`` override the worker's own settings when
    given; ``clean`` runs unpaper before OCR; ``optimize`` 0 or 1."""
    mode: str = "skip-text"
    deskew: bool | None = None
    rotate: bool | None = None
    clean: bool = False
    optimize: int | None = None

    @classmethod
    def from_job(cls, raw) -> "OcrOptions":
        raw = raw if isinstance(raw, dict) else {}
        mode = raw.get("mode", "skip-text")
        optimize = raw.get("optimize")
        return cls(mode=mode if mode in MODES else "skip-text",
                   deskew=raw["deskew"] if isinstance(raw.get("deskew"), bool) else None,
                   rotate=raw["rotate"] if isinstance(raw.get("rotate"), bool) else None,
                   clean=raw.get("clean") is True,
                   optimize=optimize if optimize in (0, 1) else None)

    def deskews(self, limits: "OcrLimits") -> bool:
        return limits.deskew if self.deskew is None else self.deskew

    def rotates(self, limits: "OcrLimits") -> bool:
        return limits.rotate_pages if self.rotate is None else self.rotate
