"""The worker's OCR engine (workers/ocr) with the real OCRmyPDF and Tesseract.

Inputs are generated: pages of known words rendered to images and put in a
PDF with no text layer, born-digital pages, encrypted, signed and fake PDFs.
Each failure class of docs/worker.md ("OCR failures") is produced for real,
and after every kill no process of the run is left.
"""
from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path

import ocrmypdf.exceptions
import pypdfium2 as pdfium
import pytest

from tests.scans import encrypted_pdf, mixed_pdf, scanned_pdf, signed_pdf, text_page_pdf
from workers.ocr import (EXIT_STATUSES, AlreadyHasText, BrokenWorker, OcrLimits, PermanentFailure,
                         RetryableFailure, check_free_disk, check_installation, run_ocr,
                         scratch_bytes_needed)
from workers.ocr.errors import failure_for_exit
from workers.ocr.supervise import run_limited

PAGE_ONE = ["Invoice number 4711 from Lisbon", "Harbour freight twelve crates"]
PAGE_TWO = ["Quarterly report of the museum", "Visitors counted seventy thousand"]
PAGE_THREE = ["Minutes of the garden society", "Tomatoes planted along the wall"]


def words(lines: list[str]) -> list[str]:
    return " ".join(lines).split()


def pdf_text(path: Path) -> list[str]:
    doc = pdfium.PdfDocument(path)
    try:
        return [doc[i].get_textpage().get_text_range() for i in range(len(doc))]
    finally:
        doc.close()


def processes_of(scratch: Path) -> list[int]:
    """Processes of a run still alive: every child of the engine has TMPDIR inside its scratch."""
    marker = f"TMPDIR={scratch.resolve() / 'tmp'}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as environ:
                if marker in environ.read().split(b"\0"):
                    with open(f"/proc/{entry.name}/stat", "rb") as stat:
                        if stat.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                            found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def scan(tmp_path):
    return scanned_pdf(tmp_path / "scan.pdf", [PAGE_ONE, PAGE_TWO])


def test_scanned_pages_come_back_with_their_words_in_the_text_and_the_text_layer(scan, tmp_path):
    assert pdf_text(scan) == ["", ""]  # really no text layer in the source
    result = run_ocr(scan, tmp_path / "work", "eng")

    assert (result.pages, result.pages_skipped, result.languages) == (2, 0, ("eng",))
    assert result.pdf_path == tmp_path / "work" / "ocr.pdf"
    assert result.text_path == tmp_path / "work" / "ocr.txt"
    pages = result.text_path.read_text("utf-8").split("\f")
    assert len(pages) == 2
    for page, lines in zip(pages, (PAGE_ONE, PAGE_TWO)):
        assert page.split() == words(lines)
    layer = pdf_text(result.pdf_path)
    assert len(layer) == 2
    for page, lines in zip(layer, (PAGE_ONE, PAGE_TWO)):
        assert page.split() == words(lines)
    assert result.text_chars == sum(len(page.strip()) for page in pages)
    assert set(result.timings) == {"inspect", "ocr", "text", "total"}
    assert result.timings["total"] >= result.timings["ocr"] > 0
    assert result.peak_memory_bytes > 0
    assert not (tmp_path / "work" / "tmp").exists()  # OCRmyPDF's work folder is gone


def test_the_job_language_is_used_polish_letters_come_back(tmp_path):
    lines = ["Zażółć gęślą jaźń", "Łódź leży w Polsce"]
    source = scanned_pdf(tmp_path / "pl.pdf", [lines])
    result = run_ocr(source, tmp_path / "work", ["pol"], OcrLimits(rotate_pages=False))
    assert result.languages == ("pol",)
    assert result.text_path.read_text("utf-8").split() == words(lines)


def test_a_page_scanned_upside_down_is_turned_and_read(tmp_path):
    # Orientation detection needs a page's worth of text to be confident.
    lines = (PAGE_ONE + PAGE_TWO + PAGE_THREE) * 2
    source = scanned_pdf(tmp_path / "upside-down.pdf", [lines], rotate=180)
    result = run_ocr(source, tmp_path / "work", "eng")
    assert result.text_path.read_text("utf-8").split() == words(lines)
    assert pdf_text(result.pdf_path)[0].split() == words(lines)


@pytest.mark.parametrize("turn", [90, 270])
def test_a_short_page_scanned_sideways_is_turned_and_read(tmp_path, turn):
    # Two lines: orientation detection is unsure (below OCRmyPDF's threshold),
    # the first pass drops the text it read as improbably shaped, the second
    # turns the page by the unsure guess.
    source = scanned_pdf(tmp_path / "sideways.pdf", [PAGE_ONE], rotate=turn)
    result = run_ocr(source, tmp_path / "work", "eng")
    assert result.text_path.read_text("utf-8").split() == words(PAGE_ONE)
    assert pdf_text(result.pdf_path)[0].split() == words(PAGE_ONE)
    assert (tmp_path / "work" / "ocrmypdf-turned.log").is_file()


def test_a_blank_page_is_read_as_no_words(tmp_path):
    source = scanned_pdf(tmp_path / "blank.pdf", [[]])
    result = run_ocr(source, tmp_path / "work", "eng")
    assert (result.pages, result.text_chars) == (1, 0)
    assert pdf_text(result.pdf_path) == [""]


def test_pages_with_text_are_kept_and_only_the_scanned_page_is_read(tmp_path):
    source = mixed_pdf(tmp_path / "mixed.pdf", ["Born digital page one"], PAGE_TWO)
    result = run_ocr(source, tmp_path / "work", "eng")
    assert (result.pages, result.pages_skipped) == (2, 1)
    first, second = result.text_path.read_text("utf-8").split("\f")
    assert first.split() == ["Born", "digital", "page", "one"]
    assert second.split() == words(PAGE_TWO)


def test_a_pdf_with_text_on_every_page_is_already_done(tmp_path):
    source = tmp_path / "digital.pdf"
    text_page_pdf(["Nothing to read here"]).save(source)
    with pytest.raises(AlreadyHasText) as caught:
        run_ocr(source, tmp_path / "work", "eng")
    assert (caught.value.failure_class, caught.value.pages) == ("already_has_text", 1)
    assert not (tmp_path / "work" / "ocr.pdf").exists()
    # Its own text comes along, so search finds a born-digital paper too.
    assert caught.value.text_path.read_text("utf-8").split() == ["Nothing", "to", "read", "here"]


@pytest.mark.parametrize("user_password", ["reader-secret", ""],
                         ids=["needs-a-password", "owner-password-only"])
def test_an_encrypted_pdf_is_permanent(scan, tmp_path, user_password):
    # With a user password nobody can open it; with only an owner password
    # anyone can, but its owner restricted it and OCR would drop that.
    source = encrypted_pdf(scan, tmp_path / "locked.pdf", user_password)
    with pytest.raises(PermanentFailure) as caught:
        run_ocr(source, tmp_path / "work", "eng")
    assert caught.value.reason == "encrypted"
    assert caught.value.failure_class == "permanent"
    assert not (tmp_path / "work" / "ocr.pdf").exists()


def test_a_signed_pdf_is_permanent(scan, tmp_path):
    with pytest.raises(PermanentFailure) as caught:
        run_ocr(signed_pdf(scan, tmp_path / "signed.pdf"), tmp_path / "work", "eng")
    assert caught.value.reason == "signed"


@pytest.mark.parametrize("body", [b"<!doctype html><html><body>Sign in to read</body></html>",
                                  b"%PDF-1.7\n" + b"\x00garbage" * 4000 + b"\n%%EOF\n"],
                         ids=["html", "pdf-header-then-garbage"])
def test_something_that_is_not_a_pdf_is_permanent(tmp_path, body):
    source = tmp_path / "paper.pdf"
    source.write_bytes(body)
    with pytest.raises(PermanentFailure) as caught:
        run_ocr(source, tmp_path / "work", "eng")
    assert caught.value.reason == "not_pdf"


def test_a_language_pack_that_is_not_installed_breaks_the_worker(scan, tmp_path):
    installed = check_installation(["eng"]).languages
    assert {"eng", "pol", "osd"} <= installed
    assert "deu" not in installed
    with pytest.raises(BrokenWorker) as caught:
        run_ocr(scan, tmp_path / "work", "eng+deu")
    assert caught.value.reason == "missing_language"
    assert "deu" in caught.value.message
    with pytest.raises(BrokenWorker):
        check_installation(["deu"])


@pytest.mark.parametrize("languages", ["", "eng;rm -rf", ["eng"] * 3 + list("abcdefgh")])
def test_a_bad_language_name_is_the_jobs_fault(scan, tmp_path, languages):
    with pytest.raises(PermanentFailure) as caught:
        run_ocr(scan, tmp_path / "work", languages)
    assert caught.value.reason == "bad_language"


def test_tesseract_missing_from_path_breaks_the_worker(scan, tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    env = dict(os.environ, PATH=str(bare))
    assert shutil.which("tesseract", path=env["PATH"]) is None
    with pytest.raises(BrokenWorker) as caught:
        run_ocr(scan, tmp_path / "work", "eng", environ=env)
    assert caught.value.reason == "missing_binary"
    with pytest.raises(BrokenWorker):
        check_installation(["eng"], environ=env)


class RunWatcher(threading.Thread):
    """Records the programs of a run while it goes; sets ``cancel`` once Tesseract is seen, if given."""

    def __init__(self, scratch: Path, cancel: threading.Event | None = None):
        super().__init__(daemon=True)
        self.scratch, self.cancel, self.seen, self.done = scratch, cancel, set(), threading.Event()

    def run(self):
        while not self.done.is_set():
            for pid in processes_of(self.scratch):
                try:
                    self.seen.add(Path(f"/proc/{pid}/exe").resolve().name)
                except OSError:
                    pass
            if self.cancel is not None and "tesseract" in self.seen:
                self.cancel.set()
            time.sleep(0.05)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join()


LONG_PAGE = (PAGE_ONE + PAGE_TWO + PAGE_THREE) * 3   # ~1.5 s of Tesseract a page


def test_the_time_limit_kills_the_whole_tree_and_is_retryable(tmp_path):
    # Eight long pages take 10 s or more; the limit stops the run while
    # Tesseract is reading.
    source = scanned_pdf(tmp_path / "eight.pdf", [LONG_PAGE] * 8)
    limits = OcrLimits(base_seconds=2.0, seconds_per_page=0.1)
    assert limits.time_limit(8) == pytest.approx(2.8)
    started = time.monotonic()
    with RunWatcher(tmp_path / "work") as watcher, pytest.raises(RetryableFailure) as caught:
        run_ocr(source, tmp_path / "work", "eng", limits)
    assert caught.value.reason == "time_limit"
    assert time.monotonic() - started < 2.8 + 5   # stopped, not run to the end
    assert "tesseract" in watcher.seen
    assert processes_of(tmp_path / "work") == []
    assert not (tmp_path / "work" / "ocr.pdf").exists()


def test_a_cancelled_run_stops_at_once_and_is_retryable(tmp_path):
    source = scanned_pdf(tmp_path / "three.pdf", [LONG_PAGE] * 3)
    cancel = threading.Event()
    with RunWatcher(tmp_path / "work", cancel) as watcher, pytest.raises(RetryableFailure) as caught:
        run_ocr(source, tmp_path / "work", "eng", cancel=cancel)
    assert caught.value.reason == "cancelled"
    assert "tesseract" in watcher.seen
    assert processes_of(tmp_path / "work") == []
    assert not (tmp_path / "work" / "ocr.pdf").exists()


def test_the_memory_limit_kills_the_whole_tree_and_is_retryable(scan, tmp_path):
    with pytest.raises(RetryableFailure) as caught:
        run_ocr(scan, tmp_path / "work", "eng", OcrLimits(memory_bytes=40 * 2**20))
    assert caught.value.reason == "out_of_memory"
    assert "whole process tree" in caught.value.message
    assert (tmp_path / "work" / "ocrmypdf.log").exists()  # OCRmyPDF was the one stopped
    assert processes_of(tmp_path / "work") == []


def test_the_memory_limit_is_on_the_sum_of_the_tree_not_each_process(tmp_path):
    # Three processes of ~30 MiB each: none alone reaches 64 MiB, together they do.
    program = ("import os, time\n"
               "for _ in range(2):\n"
               "    if os.fork() == 0: break\n"
               "block = bytearray(30 * 2**20)\n"
               "time.sleep(30)\n")
    outcome = run_limited([sys.executable, "-c", program], log_path=tmp_path / "log", env=dict(os.environ),
                          cwd=tmp_path, time_limit_s=20, memory_limit_bytes=64 * 2**20)
    assert outcome.killed == "memory_limit"
    assert outcome.peak_memory_bytes > 64 * 2**20
    assert outcome.seconds < 15


def test_niceness_reaches_every_process_of_the_tree(tmp_path):
    program = "import os\nif os.fork() == 0: print('child', os.nice(0))\nelse: os.wait(); print('parent', os.nice(0))"
    outcome = run_limited([sys.executable, "-c", program], log_path=tmp_path / "log", env=dict(os.environ),
                          cwd=tmp_path, time_limit_s=20, memory_limit_bytes=2**30, nice=7)
    base = os.nice(0)
    assert outcome.returncode == 0
    lines = outcome.log_tail().splitlines()
    assert sorted(line for line in lines if line.startswith(("child ", "parent "))) == [f"child {base + 7}",
                                                                                       f"parent {base + 7}"]


def test_every_ocrmypdf_exit_status_has_its_failure_class():
    statuses = {code.value for code in ocrmypdf.exceptions.ExitCode} - {0}
    assert set(EXIT_STATUSES) == statuses
    expected = {1: "broken_worker", 2: "permanent", 3: "broken_worker", 4: "retryable",
                5: "retryable", 6: "already_has_text", 7: "retryable", 8: "permanent",
                9: "broken_worker", 10: "broken_worker", 15: "retryable", 130: "retryable"}
    assert {code: failure_for_exit(code, "", 1).failure_class for code in statuses} == expected
    assert failure_for_exit(2, "DigitalSignatureError: Input PDF has a digital signature.", 1).reason == "signed"
    assert failure_for_exit(-9, "", 1).reason == "crash"        # the kernel's OOM killer, not ours
    assert failure_for_exit(77, "", 1).failure_class == "retryable"


def test_limits_come_from_the_environment_and_bad_values_are_named():
    limits = OcrLimits.from_env({"FLEETHQ_OCR_BASE_SECONDS": "10", "FLEETHQ_OCR_SECONDS_PER_PAGE": "2.5",
                                 "FLEETHQ_OCR_MAX_SECONDS": "100", "FLEETHQ_OCR_MEMORY_BYTES": "1073741824",
                                 "FLEETHQ_OCR_JOBS": "64", "FLEETHQ_OCR_NICE": "19",
                                 "FLEETHQ_OCR_DESKEW": "yes", "FLEETHQ_OCR_ROTATE_PAGES": "off"})
    assert (limits.time_limit(4), limits.time_limit(1000)) == (20.0, 100.0)
    assert (limits.memory_bytes, limits.nice, limits.deskew, limits.rotate_pages) == (2**30, 19, True, False)
    assert limits.effective_jobs() == os.cpu_count()   # never more OCR processes than cores
    assert OcrLimits.from_env({}) == OcrLimits()
    for name, raw in [("FLEETHQ_OCR_JOBS", "0"), ("FLEETHQ_OCR_NICE", "20"), ("FLEETHQ_OCR_DESKEW", "maybe"),
                      ("FLEETHQ_OCR_MEMORY_BYTES", "lots"), ("FLEETHQ_OCR_MEMORY_BYTES", str(31 * 2**20)),
                      ("FLEETHQ_OCR_BASE_SECONDS", "-1")]:
        with pytest.raises(ValueError, match="FLEETHQ_OCR_"):
            OcrLimits.from_env({name: raw})


def test_deskew_jobs_and_rotation_reach_the_ocrmypdf_run(scan, tmp_path):
    result = run_ocr(scan, tmp_path / "work", "eng", OcrLimits(deskew=True, jobs=2, rotate_pages=False))
    assert result.text_path.read_text("utf-8").split() == words(PAGE_ONE) + words(PAGE_TWO)
    command = (tmp_path / "work" / "ocrmypdf.log").read_text().splitlines()[0].split()
    assert "--deskew" in command and "--rotate-pages" not in command
    assert command[command.index("--jobs") + 1] == str(min(2, os.cpu_count()))
    assert {"--skip-text", "--rasterizer", "pypdfium"} <= set(command)
    assert command[command.index("--output-type") + 1] == "pdf"   # no PDF/A: no Ghostscript needed


def test_the_free_disk_check_counts_the_source_and_its_pages(tmp_path):
    small = scratch_bytes_needed(1_000_000, pages=2)
    assert scratch_bytes_needed(10_000_000, pages=2) > small
    assert scratch_bytes_needed(1_000_000, pages=200) > small
    assert scratch_bytes_needed(1_000_000) == scratch_bytes_needed(1_000_000, pages=1_000_000 // 51200)
    room = check_free_disk(tmp_path, 1_000_000, pages=2)
    assert room.ok and room.needed_bytes == small and room.free_bytes > small
    assert not check_free_disk(tmp_path, 1_000_000, pages=2, reserve_bytes=room.free_bytes).ok
