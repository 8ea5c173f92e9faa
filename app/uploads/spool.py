"""The master's spool: quota-bounded uploads not yet archived.

Quota is reserved in PostgreSQL (one locked ``spool_usage`` row) and the
reservation commits before a file is created, so concurrent uploads on any
number of web processes can never promise more than ``SPOOL_MAX_BYTES``.
Files are named by attempt and generation, created exclusively with mode
0600 in the spool directory while they stream and are verified.

Where a verified upload then waits for the archive (``SPOOL_BACKEND``):

- ``local`` (the default): it stays in the directory, fsynced with it, so
  the web and tasks processes must share that disk;
- ``s3``: it is put, write-once and with its SHA-256, under ``staging/`` in
  the object store before the upload counts as staged, and the local file
  goes. Any tasks process on any host archives it by a copy inside the store.
  The directory is then only each web process's scratch space.

A staged upload's ``spool_file`` is an absolute path (local) or a key under
``staging/`` (s3).
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from sqlalchemy import text

from app import storage
from app.errors import SpoolFull
from app.extensions import db
from app.storage.base import ObjectStore, StorageError, hash_stream

log = logging.getLogger(__name__)
_NAME = re.compile(r"\A(\d+)\.(\d+)\.(part|pdf)\Z")
_STAGED = re.compile(r"\A(\d+)\.(\d+)\.(pdf|held)\Z")
STAGING_PREFIX = "staging/"


def staging_key(attempt_id: int, generation: int, suffix: str = "pdf") -> str:
    return f"{STAGING_PREFIX}{attempt_id}.{generation}.{suffix}"


def in_store(location: str | None) -> bool:
    """Whether a recorded spool location is an object-store key (s3 staging)."""
    return bool(location) and location.startswith(STAGING_PREFIX)


@dataclass(frozen=True)
class Spool:
    directory: str
    max_bytes: int
    # The object store holding staged uploads (SPOOL_BACKEND=s3), or None.
    staging: ObjectStore | None = None

    @classmethod
    def from_config(cls, config) -> "Spool":
        directory = config.get("SPOOL_DIR") or os.path.join(config["DATA_DIR"], "spool")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        # config.load refused any other backend, and s3 without S3_BUCKET.
        staging = storage.shared_store(config) if config.get("SPOOL_BACKEND") == "s3" else None
        return cls(os.path.abspath(directory), int(config["SPOOL_MAX_BYTES"]), staging)

    def publish(self, part: str, attempt_id: int, generation: int, sha256: str, size: int) -> str:
        """Make a verified upload durable where the archive commit can read
        it; returns the location to record as its ``spool_file``.

        Raises:
            StorageError: s3 staging could not store it (the part file stays).
            FileNotFoundError: the part file is gone.
        """
        if self.staging is None:
            return self.seal(part, attempt_id, generation)
        key = staging_key(attempt_id, generation)
        self.staging.put_file(key, part, sha256_hex=sha256, size=size, source_hashed=True)
        remove_quietly(part)
        return key

    def keep(self, path: str, attempt_id: int, generation: int) -> str:
        """Where a held upload's file stays for an admin: the local path, or
        with s3 staging a copy in the store (any instance can then serve it).
        An unreachable store leaves it local."""
        if self.staging is None or in_store(path):
            return path
        try:
            with open(path, "rb") as f:
                sha256, size = hash_stream(f)
            key = staging_key(attempt_id, generation, "held")
            self.staging.put_file(key, path, sha256_hex=sha256, size=size)
        except (OSError, StorageError):
            return path
        remove_quietly(path)
        return key

    def exists(self, location: str) -> bool:
        if in_store(location):
            return self.staging is not None and self.staging.exists(location)
        return os.path.exists(location)

    def remove(self, location: str | None) -> None:
        """Delete a spool file or staged object if present (see :func:`remove_location`)."""
        remove_location(location, self.staging)

    def part_path(self, attempt_id: int, generation: int) -> str:
        return os.path.join(self.directory, f"{attempt_id}.{generation}.part")

    def drop_superseded_parts(self, attempt_id: int, generation: int) -> None:
        """Remove this host's part files of earlier generations of the attempt.

        A new generation supersedes them: their streams died (a web process
        killed mid-upload, a dropped connection) or will be refused at their
        end. With s3 staging nobody else would ever see them: the sweeper
        runs beside the tasks process, on another disk.
        """
        for earlier in range(1, generation):
            remove_quietly(self.part_path(attempt_id, earlier))

    def final_path(self, attempt_id: int, generation: int) -> str:
        return os.path.join(self.directory, f"{attempt_id}.{generation}.pdf")

    def create_exclusive(self, attempt_id: int, generation: int) -> tuple[str, int]:
        path = self.part_path(attempt_id, generation)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        return path, fd

    def seal(self, part: str, attempt_id: int, generation: int) -> str:
        """fsync the file, rename it to its final name, fsync the directory.

        Once durable, the file's pages are dropped from the page cache: the
        bytes are write-once and read at most once more (the archive commit),
        so caching them only evicts what PostgreSQL has cached, and a steady
        stream of uploads would otherwise keep claiming fresh memory for
        pages nobody reads. The next upload reuses the freed pages.
        """
        fd = os.open(part, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        final = self.final_path(attempt_id, generation)
        os.rename(part, final)
        self.sync_directory()
        return final

    def sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def local_files(self) -> list[tuple[str, int, int, float]]:
        """(path, attempt_id, generation, mtime) of every file in this host's
        spool directory."""
        out = []
        for entry in os.scandir(self.directory):
            match = _NAME.match(entry.name)
            if match and entry.is_file():
                out.append((entry.path, int(match[1]), int(match[2]), entry.stat().st_mtime))
        return out

    def files(self) -> list[tuple[str, int, int, float]]:
        """``local_files`` and, with s3 staging, (key, attempt_id, generation,
        modified) of every staged object.

        Raises:
            StorageError: the staging store could not be listed.
        """
        out = self.local_files()
        if self.staging is not None:
            for key, modified in self.staging.list_keys(STAGING_PREFIX):
                match = _STAGED.match(key[len(STAGING_PREFIX):])
                if match:
                    out.append((key, int(match[1]), int(match[2]), modified))
        return out


def stamp(file: str | int) -> str:
    """Identity of a spool file (a path or an open descriptor): device, inode,
    size, modification time.

    Taken when the last byte of an upload is written and recorded when it is
    staged; the archive commit compares it to tell that nobody has written the
    file since its bytes were hashed, so it need not read them again. It shows
    writes through the filesystem (later than the clock's granularity), not
    damage on the medium, which no check before the object store would catch
    either.

    Raises:
        OSError: the file is gone.
    """
    st = os.stat(file)
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def remove_location(location: str | None, store: ObjectStore | None) -> None:
    """Delete a recorded spool location if present: a local file, or a staged
    object in ``store``. A store that cannot be reached now leaves the object
    to the sweeper, which removes it once no upload owns it."""
    if not in_store(location):
        remove_quietly(location)
        return
    try:
        if store is not None:
            store.delete(location)
    except StorageError as exc:
        log.warning("could not delete staged object %s: %s", location, exc)


def remove_quietly(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def ensure_usage_row() -> None:
    db.session.execute(text(
        "INSERT INTO spool_usage (id, reserved_bytes) VALUES (1, 0) ON CONFLICT (id) DO NOTHING"))


def reserved_bytes() -> int:
    """Quota held now by uploads streaming, staged or held (no lock)."""
    return int(db.session.execute(text(
        "SELECT reserved_bytes FROM spool_usage WHERE id = 1")).scalar() or 0)


def reserve(spool: Spool, size: int) -> None:
    """Reserve ``size`` bytes in the open transaction (the caller commits).

    Raises:
        SpoolFull: with a retry hint; nothing is reserved.
    """
    ensure_usage_row()
    used = db.session.execute(text(
        "SELECT reserved_bytes FROM spool_usage WHERE id = 1 FOR UPDATE")).scalar()
    if used + size > spool.max_bytes:
        raise SpoolFull("the master's spool is full; retry later", retry_after_ms=30_000,
                        details={"reserved_bytes": int(used), "max_bytes": spool.max_bytes})
    db.session.execute(text("UPDATE spool_usage SET reserved_bytes = reserved_bytes + :n WHERE id = 1"),
                       {"n": size})


def release(size: int) -> None:
    """Give back a reservation in the open transaction (the caller commits)."""
    if size:
        db.session.execute(text(
            "UPDATE spool_usage SET reserved_bytes = GREATEST(0, reserved_bytes - :n) WHERE id = 1"),
            {"n": size})
