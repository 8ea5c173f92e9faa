"""Startup: bring the volume back to a state the loops can trust.

- Partial downloads (tmp/) are deleted: a fetch is cheap to redo, and a
  half-written file must never be uploaded.
- Every ``ready``/``uploaded`` entry's file is re-hashed. A missing file or a
  different size or SHA-256 stops startup (VolumeCorrupt): uploading it would
  send something else than what was journaled, deleting it could lose the
  only copy of a download. An operator decides.
- Files of ``done``/``failed`` entries still on disk (a crash between the
  journal write and the unlink) are deleted now.
- ``downloading`` entries are kept: the first heartbeat tells which of those
  attempts are still live on the master; those are fetched again under the
  same attempt, the others dropped (runner.py).
"""
from __future__ import annotations

import hashlib
import logging
import shutil

from workers.runner.journal import Journal
from workers.runner.volume import Volume, VolumeCorrupt

log = logging.getLogger("fleethq.worker")


def _sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def recover(volume: Volume, journal: Journal) -> dict:
    """Check and tidy the volume; return counts by state for the startup log line.

    Raises:
        VolumeCorrupt: a ready file is missing or differs from its journal entry.
    """
    for leftover in volume.tmp.iterdir():
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
    counts: dict[str, int] = {}
    known = set()
    for entry in journal.entries():
        counts[entry["state"]] = counts.get(entry["state"], 0) + 1
        if not entry.get("file"):
            continue
        path = volume.ready / entry["file"]
        known.add(entry["file"])
        text_path = volume.ready / entry["text_file"] if entry.get("text_file") else None
        if text_path is not None:
            known.add(entry["text_file"])
            if entry["state"] in ("ready", "uploaded") and not text_path.exists():
                raise VolumeCorrupt(f"text file {text_path} of attempt {entry['attempt_id']} "
                                    "is missing; its PDF is kept, the journal entry must go")
            if entry["state"] not in ("ready", "uploaded"):
                text_path.unlink(missing_ok=True)
        if entry["state"] in ("ready", "uploaded"):
            try:
                size = path.stat().st_size
                digest = _sha256(path) if size == entry["size"] else None
            except FileNotFoundError:
                raise VolumeCorrupt(
                    f"ready file {path} of attempt {entry['attempt_id']} (job {entry['job_id']}, "
                    f"project {entry['project']}) is missing; the journal says it holds "
                    f"{entry['size']} bytes with SHA-256 {entry['sha256']}") from None
            if size != entry["size"] or digest != entry["sha256"]:
                raise VolumeCorrupt(
                    f"ready file {path} of attempt {entry['attempt_id']} (job {entry['job_id']}, "
                    f"project {entry['project']}) differs from the journal: {size} bytes"
                    f"{f', SHA-256 {digest}' if digest else ''}; journaled {entry['size']} bytes, "
                    f"SHA-256 {entry['sha256']}. Refusing to start: move the file away "
                    "to investigate, and remove its entry from journal.json")
        elif path.exists():
            path.unlink()
            log.info("removed %s left over from finished attempt %s", path.name, entry["attempt_id"])
    strays = [p.name for p in volume.ready.iterdir() if p.name not in known]
    if strays:
        # Not ours to delete: the journal never wrote them (manual copies?).
        log.warning("ready/ holds %d file(s) no journal entry knows (%s); they are left alone",
                    len(strays), ", ".join(sorted(strays)[:5]))
    return counts
