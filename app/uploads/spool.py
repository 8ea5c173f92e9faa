"""The master's spool: a quota-bounded directory of uploads not yet archived.

Quota is reserved in PostgreSQL (one locked ``spool_usage`` row) and the
reservation commits before a file is created, so concurrent uploads on any
number of web processes can never promise more than ``SPOOL_MAX_BYTES``.
Files are named by attempt and generation, created exclusively with mode
0600, and fsynced with their directory before an upload counts as staged.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from sqlalchemy import text

from app.errors import FleetError
from app.extensions import db

_NAME = re.compile(r"\A(\d+)\.(\d+)\.(part|pdf)\Z")


class SpoolFull(FleetError):
    status, code, retryable = 507, "spool_full", True


@dataclass(frozen=True)
class Spool:
    directory: str
    max_bytes: int

    @classmethod
    def from_config(cls, config) -> "Spool":
        directory = config.get("SPOOL_DIR") or os.path.join(config["DATA_DIR"], "spool")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        return cls(os.path.abspath(directory), int(config["SPOOL_MAX_BYTES"]))

    def part_path(self, attempt_id: int, generation: int) -> str:
        return os.path.join(self.directory, f"{attempt_id}.{generation}.part")

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

    def files(self) -> list[tuple[str, int, int, float]]:
        """(path, attempt_id, generation, mtime) of every spool file."""
        out = []
        for entry in os.scandir(self.directory):
            match = _NAME.match(entry.name)
            if match and entry.is_file():
                out.append((entry.path, int(match[1]), int(match[2]), entry.stat().st_mtime))
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
