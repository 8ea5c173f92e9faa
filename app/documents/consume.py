"""The consume folder: files dropped into a folder on the master become documents.

``flask --app wsgi fleet documents consume`` (the Procfile's ``consume``
process) watches ``CONSUME_DIR``. A file at its top level goes into the
project ``CONSUME_PROJECT``; a file in a subfolder named after a documents
project goes into that project. A file is taken once it has stopped growing
(its size and modification time unchanged for ``CONSUME_SETTLE_S``), so a
scanner or a copy still writing it is left alone. Then:

1. it is moved (one rename, on the same filesystem) into ``.processing/``
   under a name that keeps its project and its own name; from here nothing
   else takes it, and a consumer that dies leaves it there;
2. it goes through the intake (app/documents/intake.py), which answers an
   existing document for bytes already in the project: a file taken again
   after a crash is never a second document;
3. it is moved to ``done/`` — or to ``failed/`` with ``<name>.reason.txt``
   beside it when the file is refused (empty, truncated, not a scan). A
   failure that is not the file's (the database or the store down) leaves
   it in ``.processing/`` to be tried again.

At start, and then at every pass, files left in ``.processing/`` are taken
first. Nothing is ever deleted: every file ends in ``done/`` or ``failed/``.

Where the folder is local, inotify (watchdog) wakes the loop the moment a
file lands; with ``CONSUME_POLLING_S`` (network mounts, where inotify sees
nothing) the folder is listed at that interval. Either way a full listing
runs every few seconds, so a missed event only delays a file.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from app.errors import InvalidDocument
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from workers.wire.protocol import is_identifier
from workers.runner.volume import fsync_dir

log = logging.getLogger(__name__)
PROCESSING, DONE, FAILED = ".processing", "done", "failed"
RESERVED = {PROCESSING, DONE, FAILED}
RESCAN_S = 5.0


@dataclass
class Outcome:
    name: str
    project_id: str
    state: str                      # done, failed, retry
    document_id: int | None = None
    reason: str | None = None


@dataclass
class _Seen:
    size: int
    mtime_ns: int
    since: float


@dataclass
class Folder:
    """One consume folder; ``add(project_id, path, name)`` puts a file in
    (returns a document id; raises ``Refused`` for the file's own faults and
    anything else for a failure to retry)."""
    root: str
    default_project: str | None
    settle_s: float
    add: object
    seen: dict = field(default_factory=dict)

    def __post_init__(self):
        self.root = os.path.abspath(self.root)
        for name in RESERVED:
            os.makedirs(os.path.join(self.root, name), exist_ok=True)

    # ---------------------------------------------------------------- listing

    def _candidates(self):
        """(path, project id, name) of every file in the folder and in the
        project subfolders, dot files and partial downloads aside."""
        with os.scandir(self.root) as top:
            for entry in top:
                if entry.name in RESERVED or entry.name.startswith("."):
                    continue
                if entry.is_file(follow_symlinks=False):
                    # No default project: taken all the same, and failed
                    # with the reason (a file is never left unexplained).
                    yield entry.path, self.default_project or "", entry.name
                elif entry.is_dir(follow_symlinks=False) and is_identifier(entry.name):
                    with os.scandir(entry.path) as sub:
                        for inner in sub:
                            if inner.is_file(follow_symlinks=False) and not inner.name.startswith("."):
                                yield inner.path, entry.name, inner.name

    def settled(self, now: float) -> list[tuple[str, str, str]]:
        """The files that have not changed for ``settle_s``."""
        ready, present = [], set()
        for path, project, name in self._candidates():
            try:
                st = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                continue
            present.add(path)
            seen = self.seen.get(path)
            if seen is None or (seen.size, seen.mtime_ns) != (st.st_size, st.st_mtime_ns):
                self.seen[path] = _Seen(st.st_size, st.st_mtime_ns, now)
            elif now - seen.since >= self.settle_s:
                ready.append((path, project, name))
        for gone in set(self.seen) - present:
            del self.seen[gone]
        return ready

    # ---------------------------------------------------------------- moving

    def _processing_name(self, project: str, name: str) -> str:
        # The project and the name in one file name, reversible, no "/".
        return f"{quote(project, safe='')}~{quote(name, safe='')}"

    def _parse_processing(self, name: str) -> tuple[str, str]:
        project, _, rest = name.partition("~")
        return unquote(project), unquote(rest)

    def _free_name(self, folder: str, name: str) -> str:
        path = os.path.join(self.root, folder, name)
        stem, dot, suffix = name.rpartition(".")
        n = 1
        while os.path.exists(path) or os.path.exists(path + ".reason.txt"):
            n += 1
            path = os.path.join(self.root, folder,
                                f"{stem}-{n}.{suffix}" if dot and stem else f"{name}-{n}")
        return path

    def _finish(self, processing_path: str, name: str, folder: str, reason: str | None) -> None:
        target = self._free_name(folder, name)
        if reason is not None:
            # The reason first: a file in failed/ always has its reason beside it.
            with open(target + ".reason.txt", "w", encoding="utf-8") as out:
                out.write(reason.rstrip("\n") + "\n")
        os.rename(processing_path, target)
        fsync_dir(os.path.join(self.root, folder))

    # ---------------------------------------------------------------- passes

    def take(self, path: str, project: str, name: str) -> str | None:
        """Move a settled file into .processing/ (None if it went meanwhile)."""
        target = os.path.join(self.root, PROCESSING, self._processing_name(project, name))
        if os.path.exists(target):
            return None  # the same name is still being worked on: next pass
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return None
        fsync_dir(os.path.join(self.root, PROCESSING))
        self.seen.pop(path, None)
        return target

    def process(self, processing_path: str) -> Outcome:
        from app.documents.formats import Refused
        project, name = self._parse_processing(os.path.basename(processing_path))
        try:
            document_id = self.add(project, processing_path, name)
        except Refused as exc:
            self._finish(processing_path, name, FAILED, exc.message)
            log.warning("consume: %s refused: %s", name, exc.message,
                        extra={"project_id": project, "reason": exc.reason})
            return Outcome(name, project, "failed", reason=exc.message)
        except Exception as exc:  # noqa: BLE001 - not the file's fault: tried again later
            log.warning("consume: %s not taken yet: %s", name, exc, extra={"project_id": project})
            return Outcome(name, project, "retry", reason=str(exc))
        self._finish(processing_path, name, DONE, None)
        log.info("consume: %s is document %s", name, document_id,
                 extra={"project_id": project, "document_id": document_id})
        return Outcome(name, project, "done", document_id=document_id)

    def pass_once(self, now: float | None = None) -> list[Outcome]:
        """Files left in .processing/ first (a consumer died there), then the
        settled new ones."""
        now = time.monotonic() if now is None else now
        outcomes = []
        with os.scandir(os.path.join(self.root, PROCESSING)) as left:
            leftovers = sorted(e.path for e in left if e.is_file(follow_symlinks=False))
        for path in leftovers:
            outcomes.append(self.process(path))
        for path, project, name in self.settled(now):
            taken = self.take(path, project, name)
            if taken is not None:
                outcomes.append(self.process(taken))
        return outcomes

    def run(self, stop: threading.Event, *, polling_s: float = 0.0) -> None:
        """Pass after pass until ``stop`` is set; inotify wakes it early
        unless ``polling_s`` asks for plain listing."""
        wake = threading.Event()
        observer = None if polling_s else _watch(self.root, wake)
        interval = polling_s or min(RESCAN_S, max(self.settle_s / 2, 0.2))
        try:
            while not stop.is_set():
                outcomes = self.pass_once()
                retrying = any(o.state == "retry" for o in outcomes)
                # Files still settling need another look soon, events or not.
                timeout = 5.0 if retrying else (min(interval, self.settle_s) if self.seen else interval)
                wake.wait(timeout)
                wake.clear()
        finally:
            if observer is not None:
                observer.stop()
                observer.join(5)


def intake_adder(config):
    """``Folder.add`` over the intake: a refusal that is the file's or the
    folder's (a broken file, no such documents project) becomes
    :class:`Refused`; anything else (the database or the store down) is
    raised as it is, and the file is tried again."""
    from app.documents import intake
    from app.documents.formats import Refused
    from app.errors import Conflict, InvalidRequest, NotFound
    from app.extensions import db
    from app.storage import shared_store
    from app.uploads.spool import Spool
    store, spool = shared_store(config), Spool.from_config(config)

    def add(project_id: str, path: str, name: str) -> int:
        if not project_id:
            raise Refused("no_project", f"{name}: no project for the consume folder's top level: "
                          "set FLEETHQ_CONSUME_PROJECT, or drop files into a subfolder named "
                          "after a documents project")
        scratch = intake.scratch_dir(spool.directory)
        try:
            sha256, _ = intake.sha256_file(path)
            return intake.add_file(project_id, path, sha256, name, via="consume", by="consume",
                                   store=store, workdir=scratch.name,
                                   max_bytes=config["UPLOAD_MAX_BYTES"]).document_id
        except (InvalidDocument, NotFound, InvalidRequest, Conflict) as exc:
            db.session.rollback()
            raise Refused((exc.details or {}).get("reason", exc.code),
                          exc.message if exc.message.startswith(name) else f"{name}: {exc.message}") from None
        except Exception:
            db.session.rollback()
            raise
        finally:
            intake.remove_scratch(scratch)
    return add


def _watch(root: str, wake: threading.Event):
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    class Handler(FileSystemEventHandler):
        def on_any_event(self, event):
            wake.set()
    observer = Observer()
    observer.schedule(Handler(), root, recursive=True)
    observer.daemon = True
    observer.start()
    return observer

