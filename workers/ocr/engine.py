"""One OCR run: a local source PDF in, a searchable PDF and its plain text out.

Steps, each a child process under the same tree-wide limits
(:mod:`workers.ocr.supervise`), so a hostile or huge input can only exhaust
its own children:

1. check the installation and the job's languages (``BrokenWorker`` /
   ``PermanentFailure`` before any work);
2. inspect the source with PDFium: page count (the time limit grows with
   it), pages that already have text, encryption, signatures. Encrypted,
   signed or unreadable input is ``PermanentFailure``; text on every page is
   ``AlreadyHasText``, carrying that text (read with PDFium into ``ocr.txt``);
3. ``python -m ocrmypdf --skip-text --output-type pdf --rasterizer pypdfium``:
   pages with text are kept as they are, the others rasterized with PDFium
   and OCRed with Tesseract. Plain PDF output and the PDFium rasterizer need
   no Ghostscript (PDF/A output and the Ghostscript rasterizer would, and
   Debian bookworm's Ghostscript 10.0.0 is a version OCRmyPDF refuses for
   some modes). OCRmyPDF's work folder is inside the scratch directory
   (TMPDIR), on the worker's volume, never in a shared /tmp;
4. the text: OCRmyPDF's sidecar (``--sidecar ocr.txt``) when every page was
   OCRed, else extracted from the derived PDF with PDFium (pages that kept
   their own text have none in the sidecar); either way the page count must
   be the source's.

Files: ``<scratch>/ocr.pdf``, ``<scratch>/ocr.txt``, and ``<scratch>/*.log``
(the children's output, kept for investigation). The caller owns the
scratch directory and deletes it after the upload's receipt; on failure the
engine removes partial outputs itself, so nothing half-made is uploaded.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import AlreadyHasText, BrokenWorker, PermanentFailure, RetryableFailure, failure_for_exit
from .install import check_languages, find_installation, parse_languages
from .limits import OcrLimits, OcrOptions
from .supervise import ChildOutcome, run_limited

PROBE = str(Path(__file__).with_name("pdfprobe.py"))
# Inspection and text extraction are quick; a generous floor keeps a slow
# disk from failing them, the per-page term keeps big books possible.
PROBE_BASE_SECONDS = 30.0
PROBE_SECONDS_PER_PAGE = 1.0


@dataclass(frozen=True)
class OcrResult:
    pdf_path: Path              # the derived, searchable PDF
    text_path: Path             # its plain text, UTF-8, pages separated by form feeds
    pages: int                  # same in source and derived PDF
    pages_skipped: int          # pages left alone because they already had text
    text_chars: int             # non-blank characters of text found, all pages
    languages: tuple[str, ...]
    timings: dict[str, float]   # seconds: inspect, ocr, text, total
    peak_memory_bytes: int      # highest summed PSS of the OCRmyPDF process tree


def run_ocr(source: Path, scratch: Path, languages, limits: OcrLimits = OcrLimits(),
            environ: dict[str, str] | None = None, cancel: threading.Event | None = None,
            options: OcrOptions = OcrOptions()) -> OcrResult:
    """OCR ``source`` into ``scratch``; raises one :class:`~workers.ocr.errors.OcrFailure` subclass per failure class.

    Parameters: ``languages`` are Tesseract pack names ("eng+pol" or a
    list), from the job; ``environ`` is the children's environment (default:
    this process's), whose PATH decides which Tesseract runs; ``cancel``,
    when set (the lease was withdrawn, the worker stops), ends the run at
    once with ``RetryableFailure("cancelled")``.
    """
    started = time.monotonic()
    scratch = Path(scratch).resolve()
    env = _child_env(os.environ if environ is None else environ, scratch)
    langs = parse_languages(languages)
    check_languages(find_installation(env), langs, options.rotates(limits))
    if options.clean and shutil.which("unpaper", path=env.get("PATH", "")) is None:
        # Another worker may have it: the job is not at fault, nor this worker for other jobs.
        raise RetryableFailure("missing_unpaper", "the job's profile asks for clean (unpaper), "
                                                  "which this worker does not have")
    source = Path(source).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    Path(env["TMPDIR"]).mkdir(exist_ok=True)
    pdf_path, text_path = scratch / "ocr.pdf", scratch / "ocr.txt"
    try:
        facts, inspect_s = _inspect(source, scratch, env, limits, cancel)
        pages, skipped = facts["pages"], len(facts["text_pages"])
        if skipped == pages and options.mode == "skip-text":
            raise AlreadyHasText(pages, f"all {pages} page(s) already have text",
                                 text_path=_source_text(source, text_path, pages, scratch, env, limits, cancel))
        # Every page OCRed (the usual scan): OCRmyPDF's own sidecar is the
        # whole text, and a second PDFium pass over the output is saved. With
        # pages that kept their text the sidecar would only say "skipped"
        # there, so the text is read from the derived PDF instead.
        sidecar = text_path if skipped == 0 or options.mode != "skip-text" else None
        ocr = _ocrmypdf(source, pdf_path, langs, limits, sidecar, options, pages, scratch, env, cancel)
        if options.rotates(limits) and _turned_text_dropped(ocr.log_path):
            # A short page scanned sideways: Tesseract's orientation guess was
            # below OCRmyPDF's threshold, so the page was read as it lay and
            # its text layer dropped as improbably shaped (the sidecar keeps
            # the words, the PDF shows none). Run again trusting the guess.
            first = ocr
            ocr = _ocrmypdf(source, pdf_path, langs, limits, sidecar, options, pages, scratch, env,
                            cancel, trust_orientation=True, log_name="ocrmypdf-turned.log")
            ocr = replace(ocr, seconds=first.seconds + ocr.seconds,
                          peak_memory_bytes=max(first.peak_memory_bytes, ocr.peak_memory_bytes))
        if not pdf_path.is_file():
            raise RetryableFailure("invalid_output_pdf", "OCRmyPDF exited 0 but wrote no output")
        if sidecar is not None:
            text, text_s = _sidecar_facts(text_path), 0.0
        else:
            text, text_s = _probe(["text", str(pdf_path), str(text_path)], "text", pages, scratch, env,
                                  limits, cancel)
        if text.get("error") or text["pages"] != pages:
            raise RetryableFailure("invalid_output_pdf",
                                   f"the derived PDF has {text.get('pages')} pages, the source {pages}")
    except BaseException as exc:
        for partial in (pdf_path, text_path):
            if not (isinstance(exc, AlreadyHasText) and partial == exc.text_path):
                partial.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(env["TMPDIR"], ignore_errors=True)
    return OcrResult(pdf_path=pdf_path, text_path=text_path, pages=pages, pages_skipped=skipped,
                     text_chars=sum(text["page_chars"]), languages=langs,
                     timings={"inspect": inspect_s, "ocr": ocr.seconds, "text": text_s,
                              "total": time.monotonic() - started},
                     peak_memory_bytes=ocr.peak_memory_bytes)


_MODE_FLAGS = {"skip-text": "--skip-text", "redo": "--redo-ocr", "force": "--force-ocr"}
# What OCRmyPDF logs when it drops recognized text whose box has the wrong
# shape for it: the sign of a turned page read as it lay.
_DROPPED_TURNED_TEXT = b"Suppressing OCR output text with improbable aspect ratio"


def _ocrmypdf(source: Path, pdf_path: Path, langs, limits: OcrLimits, sidecar, options: OcrOptions,
              pages: int, scratch: Path, env, cancel, trust_orientation: bool = False,
              log_name: str = "ocrmypdf.log") -> ChildOutcome:
    outcome = run_limited(ocrmypdf_argv(source, pdf_path, langs, limits, sidecar=sidecar,
                                        options=options, trust_orientation=trust_orientation),
                          log_path=scratch / log_name, env=env, cwd=scratch,
                          time_limit_s=limits.time_limit(pages), memory_limit_bytes=limits.memory_bytes,
                          nice=limits.nice, cancel=cancel)
    _raise_for(outcome, pages, limits.time_limit(pages), limits.memory_bytes)
    return outcome


def _turned_text_dropped(log_path: Path) -> bool:
    with open(log_path, "rb") as log:
        return any(_DROPPED_TURNED_TEXT in line for line in log)


def ocrmypdf_argv(source: Path, output: Path, languages: tuple[str, ...], limits: OcrLimits,
                  sidecar: Path | None = None, options: OcrOptions = OcrOptions(),
                  trust_orientation: bool = False) -> list[str]:
    """The OCRmyPDF command line the engine runs (the benchmark runs the same one by hand);
    ``sidecar``: where OCRmyPDF writes the text it recognized (pages separated by form feeds);
    ``options``: the job's profile (mode, deskew, rotate, clean, optimize);
    ``trust_orientation``: turn pages by Tesseract's orientation guess however
    unsure it is (OCRmyPDF's default wants confidence 14, which a page of a
    few lines rarely reaches)."""
    argv = [sys.executable, "-m", "ocrmypdf", _MODE_FLAGS[options.mode], "--output-type", "pdf",
            "--rasterizer", "pypdfium", "--jobs", str(limits.effective_jobs()),
            "--language", "+".join(languages)]
    if sidecar is not None:
        argv += ["--sidecar", str(sidecar)]
    if options.rotates(limits):
        argv.append("--rotate-pages")
        if trust_orientation:
            argv += ["--rotate-pages-threshold", "0"]
    if options.deskews(limits):
        argv.append("--deskew")
    if options.clean:
        argv.append("--clean")
    if options.optimize is not None:
        argv += ["--optimize", str(options.optimize)]
    return argv + ["--", str(source), str(output)]



def _source_text(source: Path, text_path: Path, pages: int, scratch: Path, env, limits: OcrLimits,
                 cancel) -> Path | None:
    """The text of a source that needs no OCR, or None when it cannot be read
    (the job still ends as skipped: its text is a nicety, not its result)."""
    try:
        text, _ = _probe(["text", str(source), str(text_path)], "text", pages, scratch, env, limits, cancel)
    except (RetryableFailure, BrokenWorker):
        return None
    return text_path if not text.get("error") and text.get("pages") == pages else None


def _sidecar_facts(text_path: Path) -> dict:
    """Pages and characters of OCRmyPDF's sidecar text, as the text probe reports them."""
    try:
        pages = text_path.read_text("utf-8").split("\f")
    except (OSError, UnicodeDecodeError) as exc:
        return {"error": "invalid_output_pdf", "message": f"unreadable sidecar text: {exc}"}
    return {"pages": len(pages), "page_chars": [len(page.strip()) for page in pages]}


def _child_env(environ, scratch: Path) -> dict[str, str]:
    env = dict(environ)
    env["TMPDIR"] = str(scratch.resolve() / "tmp")
    # One Tesseract thread per OCRmyPDF worker, so --jobs bounds the threads
    # too (OCRmyPDF would otherwise give Tesseract up to 3 on short files).
    env["OMP_THREAD_LIMIT"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _inspect(source: Path, scratch: Path, env, limits: OcrLimits, cancel) -> tuple[dict, float]:
    with open(source, "rb") as head:
        if b"%PDF-" not in head.read(1024):
            raise PermanentFailure("not_pdf", "the source does not start like a PDF (no %PDF- header)")
    # The page count is not known yet: a size-based guess bounds this step.
    guess = max(1, source.stat().st_size // (50 * 1024))
    facts, seconds = _probe(["inspect", str(source)], "inspect", guess, scratch, env, limits, cancel)
    error = facts.get("error")
    if error:
        raise PermanentFailure(error, facts["message"])
    if facts["signed"]:
        raise PermanentFailure("signed", "the PDF has a digital signature, which OCR would invalidate")
    if facts["pages"] < 1:
        raise PermanentFailure("not_pdf", "the PDF has no pages")
    return facts, seconds


def _probe(args: list[str], step: str, pages: int, scratch: Path, env, limits: OcrLimits,
           cancel) -> tuple[dict, float]:
    time_limit = min(limits.max_seconds, PROBE_BASE_SECONDS + PROBE_SECONDS_PER_PAGE * pages)
    outcome = run_limited([sys.executable, PROBE, *args], log_path=scratch / f"{step}.log", env=env,
                          cwd=scratch, time_limit_s=time_limit, memory_limit_bytes=limits.memory_bytes,
                          nice=limits.nice, cancel=cancel)
    if outcome.killed:
        _raise_for(outcome, pages, time_limit, limits.memory_bytes)
    lines = [line for line in outcome.log_tail().splitlines() if line.startswith("{")]
    if outcome.returncode != 0 or not lines:
        if "No module named 'pypdfium2'" in outcome.log_tail():
            raise BrokenWorker("missing_binary", f"the pypdfium2 package is not installed for {sys.executable}")
        raise RetryableFailure("crash", f"reading the PDF ({step}) failed with status {outcome.returncode}")
    return json.loads(lines[-1]), outcome.seconds


def _raise_for(outcome: ChildOutcome, pages: int, time_limit: float, memory_limit: int) -> None:
    if outcome.killed == "time_limit":
        raise RetryableFailure("time_limit", f"stopped after {time_limit:.0f} s (limit for {pages} page(s))")
    if outcome.killed == "cancelled":
        raise RetryableFailure("cancelled", "the run was cancelled by the worker")
    if outcome.killed == "memory_limit":
        raise RetryableFailure("out_of_memory",
                               f"stopped at {outcome.peak_memory_bytes // 2**20} MiB "
                               f"(limit {memory_limit // 2**20} MiB for the whole process tree)")
    if outcome.returncode != 0:
        raise failure_for_exit(outcome.returncode, outcome.log_tail(), pages)
