"""Merge source files into new ones, dropping duplicates (parity S2–S4).

SavewebHQ's ``source merge`` semantics: inputs are read in the order given;
every job needs an ``id``; a job whose id was seen before is dropped when its
type, value and attr are the same and stops the merge with
``identity_conflict`` when they differ (``via`` and ``hops`` may differ: the
first occurrence wins). Output files are never overwritten, and a failed merge
removes every output it created.

This module must not import ``app`` (it runs on worker computers).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from dataclasses import dataclass

from workers.wire.protocol import compact_json
from workers.wire.source import MAX_LINE, MAX_WINDOW, Limits, SourceError, SourceReader, SourceWriter
from workers.cli.spec_input import InputError

DEFAULT_JOBS_PER_FILE = 100_000
DEFAULT_MAX_JOBS = 10_000_000
DEFAULT_MAX_BYTES = 16 * 1024**3
MAX_JOBS_BOUND = 100_000_000
MAX_BYTES_BOUND = 1024**4
MAX_INPUTS = 100_000


def create_exclusive(path: str):
    """Open a new file for writing; an existing one is an error, never replaced."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise InputError(f"{path}: output file exists; refusing to overwrite it") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot create output: {exc.strerror}") from None
    return os.fdopen(fd, "wb")


def finish_file(handle) -> None:
    """Flush ``handle`` to disk and close it."""
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()


class SplitOutputs:
    """New source files: ``path`` alone, or ``{prefix}-000001.jobs.jsonl.zst``,
    ``-000002`` … with at most ``jobs_per_file`` jobs each. Files are created
    when their first job arrives; ``cleanup()`` removes all of them."""

    def __init__(self, *, path: str | None = None, prefix: str | None = None,
                 jobs_per_file: int | None = None):
        self._path, self._prefix, self._per_file = path, prefix, jobs_per_file
        self.paths: list[str] = []
        self._file = self._writer = None

    def _next_path(self) -> str:
        if self._prefix is None:
            return self._path
        return f"{self._prefix}-{len(self.paths) + 1:06d}.jobs.jsonl.zst"

    def write(self, spec: dict) -> None:
        if self._writer is None:
            path = self._next_path()
            self._file = create_exclusive(path)
            self.paths.append(path)
            self._writer = SourceWriter(self._file)
        self._writer.write(spec)
        if self._per_file is not None and self._writer.jobs >= self._per_file:
            self._close_current()

    def _close_current(self) -> None:
        if self._writer is not None:
            writer, handle, self._writer, self._file = self._writer, self._file, None, None
            writer.close()
            finish_file(handle)

    def finish(self) -> None:
        self._close_current()

    def cleanup(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
        self._file = self._writer = None
        for path in self.paths:
            with contextlib.suppress(OSError):
                os.unlink(path)


@dataclass
class MergeStats:
    inputs: int = 0
    jobs: int = 0          # jobs read, duplicates included
    unique: int = 0
    duplicates: int = 0
    uncompressed_bytes: int = 0

    @property
    def summary_fields(self) -> dict:
        return {"inputs": self.inputs, "jobs": self.jobs, "unique": self.unique,
                "duplicates": self.duplicates}


def _digest(text: str) -> bytes:
    # 16 bytes of SHA-256 keep the duplicate index small for millions of jobs.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:16]


def _identity(spec: dict) -> bytes:
    """What must agree between two jobs with one id: type, value and attr
    (an empty attr is no attr)."""
    return _digest(compact_json([spec["type"], spec["value"], spec.get("attr") or None]))


@contextlib.contextmanager
def _open_input(path: str):
    if path == "-":
        yield getattr(sys.stdin, "buffer", sys.stdin)
        return
    try:
        stream = open(path, "rb")
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None
    with stream:
        yield stream


def _specs(path: str, mode: str, stats: MergeStats, max_jobs: int, max_bytes: int):
    """Yield ``(line, spec)`` of one input within what is left of the limits."""
    name = "<stdin>" if path == "-" else path
    remaining = max_bytes - stats.uncompressed_bytes
    limits = Limits(max_compressed=MAX_BYTES_BOUND, max_expanded=remaining,
                    max_jobs=MAX_JOBS_BOUND, max_line=MAX_LINE, max_window=MAX_WINDOW)
    with _open_input(path) as stream:
        reader = SourceReader(stream, mode, limits)
        try:
            for spec in reader:
                if stats.jobs >= max_jobs:
                    raise InputError(f"{name}:{reader.jobs}: inputs hold more than "
                                     f"--max-jobs {max_jobs} jobs")
                stats.jobs += 1
                yield reader.jobs, spec  # SourceReader allows no blank lines: jobs == line
        except SourceError as exc:
            if exc.kind == "too_large" and "expanded" in str(exc):
                raise InputError(f"{name}: inputs expand to more than --max-uncompressed-bytes "
                                 f"{max_bytes} bytes") from None
            where = f"{name}:{exc.line}" if exc.line else name
            raise InputError(f"{where}: {exc}") from None
        stats.uncompressed_bytes += reader.uncompressed_bytes


def merge_sources(inputs, outputs: SplitOutputs, *, mode: str = "external_id",
                  dedupe: bool = True, max_jobs: int = DEFAULT_MAX_JOBS,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> MergeStats:
    """Merge ``inputs`` (paths, '-' is stdin) into ``outputs``.

    ``mode`` is the identity mode the jobs are read for: ``external_id``
    (SavewebHQ's only one) requires ids and deduplicates by id;
    ``unique_value`` deduplicates by value; ``none`` keeps every job.

    Raises:
        InputError: a bad input, a limit, ``identity_conflict``, or no jobs at
            all; the outputs are removed before it propagates.
    """
    key_field = {"external_id": "id", "unique_value": "value"}.get(mode)
    dedupe = dedupe and key_field is not None
    seen: dict[bytes, bytes] = {}
    stats = MergeStats(inputs=len(inputs))
    try:
        for path in inputs:
            for line, spec in _specs(path, mode, stats, max_jobs, max_bytes):
                if dedupe:
                    key, identity = _digest(spec[key_field]), _identity(spec)
                    first = seen.get(key)
                    if first is None:
                        seen[key] = identity
                    elif first == identity:
                        stats.duplicates += 1
                        continue
                    else:
                        name = "<stdin>" if path == "-" else path
                        raise InputError(
                            f"{name}:{line}: identity_conflict: {key_field} {spec[key_field]!r} "
                            "appeared earlier with a different type, value or attr")
                outputs.write(spec)
                stats.unique += 1
        if stats.unique == 0:
            raise InputError("inputs contain no jobs")
        outputs.finish()
    except BaseException:
        outputs.cleanup()
        raise
    return stats
