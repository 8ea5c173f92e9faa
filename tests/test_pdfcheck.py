"""workers.wire.pdfcheck: the PDF check of DESIGN §8 step 4 (no database needed)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pikepdf
import pytest

from tests import pdfs
from workers.wire.pdfcheck import (ParseLimits, PdfCheckError, PdfInfo, PdfRejected, check_pdf_file,
                              sha256_file)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Shared inputs, made once: a valid 3-page 64 KiB PDF and the deflate bomb."""
    d = tmp_path_factory.mktemp("pdfs")
    valid = d / "valid.pdf"
    sha = pdfs.make_pdf(valid, pages=3, target_bytes=64 * 1024)
    spinning = d / "spinning.pdf"
    pdfs.spinning_pdf(spinning)
    return {"valid": valid, "valid_sha": sha, "spinning": spinning}


def rejected(path, **kwargs) -> PdfRejected:
    with pytest.raises(PdfRejected) as info:
        check_pdf_file(path, **kwargs)
    return info.value


# --- accepted ------------------------------------------------------------------

def test_valid_pdf_passes(files):
    size = files["valid"].stat().st_size
    info = check_pdf_file(files["valid"], expected_size=size, expected_sha256=files["valid_sha"])
    assert info == PdfInfo(size=size, sha256=files["valid_sha"], pages=3, pdf_version="1.3",
                           font_pages=3)
    assert info.sha256 == hashlib.sha256(files["valid"].read_bytes()).hexdigest()


def test_20_mib_pdf_passes(tmp_path):
    path = tmp_path / "big.pdf"
    sha = pdfs.make_pdf(path, pages=12, target_bytes=20 * 1024 * 1024)
    info = check_pdf_file(path, expected_sha256=sha)
    assert (info.pages, info.sha256) == (12, sha)


def test_known_digest_stands_in_for_rehashing_but_not_for_the_parse(files, tmp_path):
    # The master hashes an upload while streaming it and passes that digest on.
    info = check_pdf_file(files["valid"], known_sha256=files["valid_sha"].upper(),
                          expected_sha256=files["valid_sha"])
    assert (info.sha256, info.pages) == (files["valid_sha"], 3)
    assert rejected(files["valid"], known_sha256="0" * 64,
                    expected_sha256=files["valid_sha"]).reason == "hash_mismatch"
    cut = tmp_path / "cut.pdf"
    pdfs.truncated_pdf(files["valid"], cut, forge_eof=True)
    assert rejected(cut, known_sha256=sha256_file(cut)).reason == "unparseable"


def test_leading_bytes_before_header_are_accepted(files, tmp_path):
    # The spec allows %PDF- anywhere in the first 1024 bytes, and qpdf copes.
    path = tmp_path / "bom.pdf"
    path.write_bytes(b"\xef\xbb\xbf\n" + b" " * 500 + b"\n" + files["valid"].read_bytes())
    assert check_pdf_file(path).pages == 3


def test_parse_false_skips_the_child(files):
    info = check_pdf_file(files["valid"], parse=False)
    assert (info.pages, info.pdf_version, info.sha256) == (None, "1.3", files["valid_sha"])


def test_sha256_file_matches_hashlib(files):
    assert sha256_file(files["valid"]) == files["valid_sha"]


def test_pdf_generator_is_deterministic_and_sized(tmp_path):
    a, b = tmp_path / "a.pdf", tmp_path / "b.pdf"
    assert pdfs.make_pdf(a, pages=2, target_bytes=100_000, seed=7) == \
        pdfs.make_pdf(b, pages=2, target_bytes=100_000, seed=7)
    assert abs(a.stat().st_size - 100_000) < 16
    assert pdfs.make_pdf(b, pages=2, target_bytes=100_000, seed=8) != sha256_file(a)


# --- cheap checks ------------------------------------------------------------------

def test_wrong_hash(files):
    exc = rejected(files["valid"], expected_sha256="0" * 64)
    assert exc.reason == "hash_mismatch"
    assert files["valid_sha"] in str(exc)


def test_wrong_size(files):
    size = files["valid"].stat().st_size
    assert rejected(files["valid"], expected_size=size + 1).reason == "size_mismatch"


def test_html_served_as_pdf(tmp_path):
    path = tmp_path / "paywall.pdf"
    pdfs.html_as_pdf(path)
    assert path.stat().st_size > 10 * 1024          # so the size floor is not what catches it
    exc = rejected(path)
    assert exc.reason == "not_pdf" and "<!DOCTYPE" in exc.message


def test_header_beyond_first_kib(files, tmp_path):
    path = tmp_path / "late.pdf"
    path.write_bytes(b"x" * 1024 + files["valid"].read_bytes())
    assert rejected(path).reason == "not_pdf"


def test_under_10_kib(tmp_path):
    path = tmp_path / "tiny.pdf"
    pdfs.tiny_pdf(path)
    assert path.stat().st_size < 10 * 1024
    assert rejected(path).reason == "too_small"
    assert check_pdf_file(path, min_bytes=0).pages == 1      # valid, only small


def test_over_max_bytes(files, tmp_path):
    assert rejected(files["valid"], max_bytes=32 * 1024).reason == "too_large"
    # The default ceiling is 100 MiB; a sparse file costs no disk.
    huge = tmp_path / "huge.pdf"
    with open(huge, "wb") as f:
        f.truncate(100 * 1024 * 1024 + 1)
    assert rejected(huge).reason == "too_large"


def test_missing_eof(files, tmp_path):
    data = files["valid"].read_bytes()
    no_marker = tmp_path / "no_marker.pdf"
    no_marker.write_bytes(data.replace(b"%%EOF", b"%%EOX"))
    assert rejected(no_marker).reason == "no_eof"
    # %%EOF present, but followed by more than 4 KiB of something else.
    buried = tmp_path / "buried.pdf"
    buried.write_bytes(data + b"\0" * 5000)
    assert rejected(buried).reason == "no_eof"


def test_truncated_pdf_fails_the_tail_check(files, tmp_path):
    path = tmp_path / "half.pdf"
    pdfs.truncated_pdf(files["valid"], path)
    assert rejected(path).reason == "no_eof"


# --- structural parse ------------------------------------------------------------------

def test_truncated_pdf_with_forged_eof_fails_the_parse(files, tmp_path):
    path = tmp_path / "half_eof.pdf"
    pdfs.truncated_pdf(files["valid"], path, forge_eof=True)
    # Why recovery must be off: a default open() repairs it, pages and all.
    with pikepdf.open(path) as repaired:
        assert len(repaired.pages) == 3
    exc = rejected(path)
    assert exc.reason == "unparseable" and "startxref" in exc.message


def test_bytes_missing_from_the_middle_fail_the_parse(files, tmp_path):
    # A download with a gap: head and tail intact, xref offsets now wrong.
    data = files["valid"].read_bytes()
    path = tmp_path / "gap.pdf"
    path.write_bytes(data[:300] + data[1300:])
    assert rejected(path).reason == "unparseable"


def test_garbage_with_pdf_markers_fails_the_parse(tmp_path):
    path = tmp_path / "fake.pdf"
    path.write_bytes(b"%PDF-1.7\n" + os.urandom(20 * 1024) + b"\n%%EOF\n")
    assert rejected(path).reason == "unparseable"


# --- limits: the deflate bomb (4 GiB of page content in a 26 KiB file) -----------------------

# The resource limits stand behind the inflation bound (off here): a file
# the count lets through still cannot take more than they allow.
@pytest.mark.parametrize("limits, reason", [
    # Memory: decoding needs ~2x the inflated size; qpdf hits RLIMIT_AS in ~2 s.
    (ParseLimits(inflated_bytes=None), "parse_limit"),
    # CPU: with room for 2 GiB, inflating outlasts 1 s of CPU: SIGXCPU.
    (ParseLimits(cpu_seconds=1, memory_bytes=2 << 30, wall_seconds=15, inflated_bytes=None), "parse_limit"),
    # Wall clock: the parent kills the child after 1 s.
    (ParseLimits(cpu_seconds=30, memory_bytes=2 << 30, wall_seconds=1, inflated_bytes=None),
     "parse_timeout"),
], ids=["memory", "cpu", "wall"])
def test_spinning_pdf_hits_the_limits(files, limits, reason):
    started = time.monotonic()
    exc = rejected(files["spinning"], limits=limits)
    elapsed = time.monotonic() - started
    assert exc.reason == reason, exc.message
    assert elapsed < limits.wall_seconds + 2


# --- inflation: what the streams decode to, bounded (ratio and total) -------------------

def test_deflate_bomb_is_refused_by_the_inflation_bound_before_any_limit(files):
    exc = rejected(files["spinning"])   # 4 GiB of zeros in a few KiB
    size = files["spinning"].stat().st_size
    assert exc.reason == "too_inflated"
    assert f"more than {128 << 20} bytes" in exc.message and f"file's {size}" in exc.message
    assert str(files["spinning"]) not in exc.message and "pdfs" not in exc.message


def test_a_204_kib_file_inflating_to_200_mib_is_refused(tmp_path):
    path = tmp_path / "bomb.pdf"
    pdfs.spinning_pdf(path, inflated_bytes=200 << 20, pad_to=204 * 1024)
    assert 200 * 1024 <= path.stat().st_size <= 210 * 1024
    assert rejected(path).reason == "too_inflated"
    # Without the bound the same file passes every other check: qpdf decodes
    # 200 MiB within the default memory and CPU limits.
    assert check_pdf_file(path, limits=ParseLimits(inflated_bytes=None)).pages == 1


def test_a_bomb_behind_an_image_filter_is_counted_through_its_flate_stage(tmp_path):
    path = tmp_path / "dct.pdf"
    pdfs.spinning_pdf(path, inflated_bytes=256 << 20, filters=("/FlateDecode", "/DCTDecode"))
    assert rejected(path).reason == "too_inflated"


def test_blank_greyscale_flate_scans_inflate_a_thousandfold_and_pass(tmp_path):
    # Ten white A4 pages scanned at 300 dpi, 8-bit grey, Flate: 84 MB of
    # pixels in a file of ~100 KiB. A document, not a bomb.
    path = tmp_path / "blank_scans.pdf"
    pdfs.blank_scans_pdf(path, pages=10)
    size = path.stat().st_size
    assert size * 500 < 10 * 2550 * 3300
    info = check_pdf_file(path)
    assert info.pages == 10


def test_the_ratio_governs_above_the_floor(tmp_path):
    path = tmp_path / "blank_scans.pdf"
    pdfs.blank_scans_pdf(path, pages=2)
    size = path.stat().st_size
    low_floor = ParseLimits(inflation_floor=1 << 20)
    assert rejected(path, limits=low_floor).reason == "too_inflated"  # ~1000x the file
    # Room for the ratio (or a higher floor) lets it through.
    assert check_pdf_file(path, limits=ParseLimits(inflation_floor=1 << 20, inflation_ratio=2000)).pages == 2
    assert ParseLimits().inflation_allowed(size) == 128 << 20
    assert ParseLimits().inflation_allowed(50 << 20) == 2 << 30  # the total cap
    assert ParseLimits().inflation_allowed(10 << 20) == 1000 << 20


def test_checker_failure_is_not_a_rejection(files):
    # Too little address space for Python + pikepdf even to start: the check
    # could not run, which must not be blamed on the file.
    with pytest.raises(PdfCheckError):
        check_pdf_file(files["valid"], limits=ParseLimits(memory_bytes=16 << 20))


def test_rejection_is_a_value_error():
    exc = PdfRejected("not_pdf", "no header")
    assert isinstance(exc, ValueError) and exc.reason == "not_pdf" and str(exc) == "no header"


# --- isolation ------------------------------------------------------------------------

def test_module_imports_without_flask_or_app():
    code = ("import workers.wire.pdfcheck, sys; "
            "bad = [m for m in ('flask', 'app', 'pikepdf') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=30)
