"""Is this worker able to OCR at all? Tesseract, its language packs and OCRmyPDF.

A failure here is :class:`BrokenWorker`: the runner checks it at start-up
and before each run, stops claiming while it holds, and puts the message on
its heartbeat. Job languages are checked against the installed packs before
OCRmyPDF starts, so a missing pack is named as such rather than found in
OCRmyPDF's log.
"""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata

from .errors import BrokenWorker, PermanentFailure

# Tesseract pack names: eng, pol, chi_sim, deu_latf, script/Latin ...
LANGUAGE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}(/[A-Za-z][A-Za-z0-9_]{0,31})?$")
MAX_LANGUAGES = 8
# --rotate-pages asks Tesseract's orientation detection, which is the "osd" pack.
ORIENTATION_PACK = "osd"


@dataclass(frozen=True)
class Installation:
    tesseract: str                  # path of the binary
    tesseract_version: str
    languages: frozenset[str]       # installed packs
    ocrmypdf_version: str


def parse_languages(languages) -> tuple[str, ...]:
    """A job's languages ("eng+pol", "eng,pol" or a list) as a tuple; a bad name is the job's fault."""
    if isinstance(languages, str):
        names = [part.strip() for part in re.split(r"[+,]", languages)]
    else:
        names = [str(part).strip() for part in languages]
    names = [name for name in names if name]
    if not names:
        raise PermanentFailure("bad_language", "the job names no OCR language")
    if len(names) > MAX_LANGUAGES:
        raise PermanentFailure("bad_language", f"the job names {len(names)} languages; at most {MAX_LANGUAGES}")
    for name in names:
        if not LANGUAGE_NAME.match(name):
            raise PermanentFailure("bad_language", f"{name[:40]!r} is not a Tesseract language name")
    return tuple(dict.fromkeys(names))


def find_installation(env: dict[str, str]) -> Installation:
    """What is installed, looked up along the child environment's PATH."""
    tesseract = shutil.which("tesseract", path=env.get("PATH", ""))
    if tesseract is None:
        raise BrokenWorker("missing_binary", "tesseract is not installed (not found on PATH)")
    if importlib.util.find_spec("ocrmypdf") is None:
        raise BrokenWorker("missing_binary", f"the ocrmypdf package is not installed for {sys.executable}")
    try:
        listed = subprocess.run([tesseract, "--list-langs"], env=env, capture_output=True,
                                text=True, timeout=30)
        version = subprocess.run([tesseract, "--version"], env=env, capture_output=True,
                                 text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrokenWorker("missing_binary", f"{tesseract} does not run: {exc}") from exc
    if listed.returncode != 0:
        raise BrokenWorker("missing_binary", f"{tesseract} --list-langs failed: {listed.stderr.strip()[-300:]}")
    # The first line is a header ("List of available languages in ...").
    packs = frozenset(line.strip() for line in listed.stdout.splitlines()[1:] if line.strip())
    first = (version.stdout or version.stderr).splitlines()
    return Installation(tesseract=tesseract, tesseract_version=first[0].strip() if first else "unknown",
                        languages=packs, ocrmypdf_version=metadata.version("ocrmypdf"))


def check_languages(installation: Installation, languages: tuple[str, ...], rotate_pages: bool) -> None:
    needed = set(languages) | ({ORIENTATION_PACK} if rotate_pages else set())
    missing = sorted(needed - installation.languages)
    if missing:
        raise BrokenWorker("missing_language",
                           f"Tesseract language pack(s) {', '.join(missing)} not installed "
                           f"(installed: {', '.join(sorted(installation.languages)) or 'none'})")
