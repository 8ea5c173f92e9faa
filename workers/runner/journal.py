"""The results journal: what this worker holds for which attempt.

One JSON file, replaced atomically (volume.atomic_write) on every change, so
a crash leaves either the state before or after a change. Entry states:

    downloading  claimed; the fetch ladder runs (no file yet, or a partial one in tmp/)
    ready        a checked PDF is in ready/ with its SHA-256 and size
    uploaded     the master answered ``staged``; waiting for the ``done`` receipt
    done         archived (receipt matched); the file is deleted
    failed       given up; ``reported`` tells whether the master heard about it

Each change is made durable before the caller moves on (a file enters ready/
before its entry says ``ready``; an entry says ``done`` before the file is
deleted), so the journal never points at a file that is not there — except by
outside damage, which startup refuses (recovery.py).

Writes are group-committed: threads that change entries while a write is in
progress are covered by the next single write instead of one write each.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from workers.runner.volume import VolumeCorrupt, atomic_write

VERSION = 1
# skipped: a derived job whose input needs no work (OCR of a source that
# already has text), to be reported to the master as done without a file.
STATES = ("downloading", "ready", "uploaded", "done", "failed", "skipped")
LIVE = ("downloading", "ready", "uploaded")
# Terminal entries are kept a while for investigation, then pruned: the file is
# rewritten on every change, so it must stay small.
KEEP_TERMINAL = 128

_REQUIRED = {"attempt_id": str, "job_id": str, "project": str, "value": str, "state": str,
             "created_at": (int, float), "updated_at": (int, float)}
_OPTIONAL = {"file": str, "sha256": str, "size": int, "source_url": str, "strategy": str,
             "ready_at": (int, float), "error": dict, "reported": bool, "result": dict, "asset_key": str,
             # ocr task: the extracted text sent before the PDF, and a skip's outcome
             "text_file": str, "text_sha256": str, "text_size": int, "outcome": dict,
             # a failure whose report waits for fitness.py's verdict (UNIX seconds)
             "hold_since": (int, float)}


def _check_entry(key: str, entry) -> None:
    if not isinstance(entry, dict):
        raise ValueError(f"entry {key!r} is not an object")
    for name, kind in _REQUIRED.items():
        if not isinstance(entry.get(name), kind) or isinstance(entry.get(name), bool):
            raise ValueError(f"entry {key!r}: field {name!r} missing or of the wrong type")
    for name, kind in _OPTIONAL.items():
        if entry.get(name) is not None and not isinstance(entry[name], kind):
            raise ValueError(f"entry {key!r}: field {name!r} has the wrong type")
    if entry["attempt_id"] != key:
        raise ValueError(f"entry {key!r} names attempt {entry['attempt_id']!r}")
    if entry["state"] not in STATES:
        raise ValueError(f"entry {key!r}: unknown state {entry['state']!r}")
    if entry["state"] in ("ready", "uploaded"):
        for name in ("file", "sha256", "size"):
            if entry.get(name) is None:
                raise ValueError(f"entry {key!r} is {entry['state']} without {name!r}")
        if "/" in entry["file"] or entry["file"].startswith("."):
            raise ValueError(f"entry {key!r}: file name {entry['file']!r} is not a plain name")


class Journal:
    def __init__(self, path: Path, worker_id: str, entries: dict[str, dict] | None = None):
        self.path = path
        self.worker_id = worker_id
        self._entries: dict[str, dict] = entries or {}
        self._mem = threading.Lock()     # guards _entries and _changes
        self._io = threading.Lock()      # one writer at a time
        self._changes = 0
        self._written = 0

    @classmethod
    def load(cls, path: Path, worker_id: str) -> "Journal":
        """Read the journal (an absent file is an empty journal).

        Raises:
            VolumeCorrupt: unreadable JSON, wrong shape, or another worker's journal.
        """
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(path, worker_id)
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError(f"not a version {VERSION} journal")
            if data.get("worker_id") != worker_id:
                raise ValueError(f"it belongs to worker {data.get('worker_id')!r}, "
                                 f"not to this volume's identity {worker_id!r}")
            entries = data.get("entries")
            if not isinstance(entries, dict):
                raise ValueError("'entries' is not an object")
            for key, entry in entries.items():
                _check_entry(key, entry)
        except (ValueError, UnicodeDecodeError) as exc:
            raise VolumeCorrupt(
                f"results journal {path} is corrupt: {exc}. The runner will not guess which "
                f"ready files are safe to upload or delete; inspect {path.parent / 'ready'}, "
                f"then move the journal aside to start with an empty one") from None
        return cls(path, worker_id, entries)

    # --- reading -------------------------------------------------------------

    def get(self, attempt_id: str) -> dict | None:
        with self._mem:
            entry = self._entries.get(attempt_id)
            return dict(entry) if entry is not None else None

    def entries(self, *states: str) -> list[dict]:
        with self._mem:
            return [dict(e) for e in self._entries.values() if not states or e["state"] in states]

    # --- writing -------------------------------------------------------------

    def add(self, *entries: dict) -> None:
        """New entries, made durable with one write."""
        now = time.time()
        fresh = [{**entry, "created_at": now, "updated_at": now} for entry in entries]
        for entry in fresh:
            _check_entry(entry["attempt_id"], entry)
        with self._mem:
            for entry in fresh:
                self._entries[entry["attempt_id"]] = entry
            self._changes += 1
        self._commit()

    def update(self, attempt_id: str, **fields) -> dict:
        with self._mem:
            entry = {**self._entries[attempt_id], **fields, "updated_at": time.time()}
            _check_entry(attempt_id, entry)
            self._entries[attempt_id] = entry
            self._changes += 1
        self._commit()
        return dict(entry)

    def _commit(self) -> None:
        with self._mem:
            wanted = self._changes
        with self._io:
            if self._written >= wanted:
                return  # another thread's write already covered this change
            with self._mem:
                self._prune()
                data = json.dumps({"version": VERSION, "worker_id": self.worker_id,
                                   "entries": self._entries}, separators=(",", ":")).encode()
                covers = self._changes
            atomic_write(self.path, data, 0o600)
            self._written = covers

    def _prune(self) -> None:
        terminal = [e for e in self._entries.values()
                    if e["state"] == "done"
                    or (e["state"] in ("failed", "skipped") and e.get("reported", True))]
        if len(terminal) > KEEP_TERMINAL:
            terminal.sort(key=lambda e: e["updated_at"])
            for entry in terminal[:len(terminal) - KEEP_TERMINAL]:
                del self._entries[entry["attempt_id"]]

    def flush(self) -> None:
        with self._mem:
            self._changes += 1
        self._commit()
