"""``jobs-jsonl-zstd-v1`` source files: read with limits, write, merge (DESIGN §4.4).

The reader streams: it never holds more than one line (≤ 64 KiB) plus the
decoder's window in memory, and it enforces every limit as it goes, so a
hostile file fails fast instead of exhausting the machine.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import BinaryIO
from collections.abc import Iterator

import zstandard

from workers.wire.protocol import JsonTooDeep, SpecError, normalize_jobspec, strict_json_loads

MAX_COMPRESSED = 256 * 1024 * 1024
MAX_EXPANDED = 4 * 1024**3
MAX_JOBS = 10_000_000
MAX_LINE = 64 * 1024
MAX_WINDOW = 64 * 1024 * 1024
_CHUNK = 256 * 1024


@dataclass(frozen=True)
class Limits:
    max_compressed: int = MAX_COMPRESSED
    max_expanded: int = MAX_EXPANDED
    max_jobs: int = MAX_JOBS
    max_line: int = MAX_LINE
    max_window: int = MAX_WINDOW


class SourceError(ValueError):
    """A source file that breaks the format or a limit.

    ``kind`` is ``too_large`` for size limits and ``invalid`` otherwise;
    ``line`` is the 1-based line number when known.
    """

    def __init__(self, message: str, *, kind: str = "invalid", line: int | None = None,
                 field: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.line = line
        self.field = field


_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MASK, _SKIPPABLE_MAGIC = 0xFFFFFFF0, 0x184D2A50


class _FrameTracker:
    """Follows zstd frame boundaries (RFC 8878 §3.1) in the compressed bytes.

    The streaming decoder simply stops when its input ends, even in the middle
    of a frame; this tracker is how a truncated upload is told apart from a
    complete one without buffering anything.
    """

    def __init__(self):
        self._state, self._need, self._buf, self._skip = "magic", 4, bytearray(), 0
        self._checksum = False

    def feed(self, data) -> None:
        view = memoryview(data)
        while view:
            if self._skip:
                n = min(self._skip, len(view))
                self._skip -= n
                view = view[n:]
                if not self._skip and self._state == "last_block":
                    self._end_frame()
                continue
            take = min(self._need - len(self._buf), len(view))
            self._buf += view[:take]
            view = view[take:]
            if len(self._buf) == self._need:
                field, self._buf = bytes(self._buf), bytearray()
                self._advance(field)

    def _end_frame(self) -> None:
        self._state, self._need = ("checksum", 4) if self._checksum else ("magic", 4)

    def _advance(self, field: bytes) -> None:
        state = self._state
        if state == "magic":
            magic = int.from_bytes(field, "little")
            if magic == _ZSTD_MAGIC:
                self._state, self._need = "descriptor", 1
            elif magic & _SKIPPABLE_MASK == _SKIPPABLE_MAGIC:
                self._state, self._need = "skippable_size", 4
            else:
                raise SourceError("not a valid zstd stream: bad frame magic")
        elif state == "skippable_size":
            self._skip = int.from_bytes(field, "little")
            self._state, self._need = "magic", 4
        elif state == "descriptor":
            fhd = field[0]
            single_segment = (fhd >> 5) & 1
            self._checksum = bool((fhd >> 2) & 1)
            rest = ((0 if single_segment else 1) + (0, 1, 2, 4)[fhd & 3]
                    + ((1 if single_segment else 0), 2, 4, 8)[fhd >> 6])
            self._state, self._need = ("header_rest", rest) if rest else ("block", 3)
        elif state == "header_rest":
            self._state, self._need = "block", 3
        elif state == "block":
            header = int.from_bytes(field, "little")
            last, block_type = header & 1, (header >> 1) & 3
            self._skip = 1 if block_type == 1 else header >> 3  # RLE blocks carry one byte
            if last:
                self._state = "last_block"
                if not self._skip:
                    self._end_frame()
        elif state == "checksum":
            self._state, self._need = "magic", 4

    def complete(self) -> bool:
        return self._state == "magic" and not self._buf and not self._skip


class _CountingReader(io.RawIOBase):
    """Counts compressed bytes, stops at the limit, and tracks frame ends."""

    def __init__(self, raw: BinaryIO, limit: int):
        self._raw = raw
        self._limit = limit
        self.count = 0
        self.frames = _FrameTracker()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._raw.read(len(buffer))
        if not data:
            return 0
        self.count += len(data)
        if self.count > self._limit:
            raise SourceError(f"compressed source exceeds {self._limit} bytes", kind="too_large")
        self.frames.feed(data)
        buffer[: len(data)] = data
        return len(data)


class SourceReader:
    """Iterate the JobSpecs of a source stream, validating each line.

    Attributes after (or during) iteration: ``jobs``, ``uncompressed_bytes``,
    ``compressed_bytes``.
    """

    def __init__(self, stream: BinaryIO, identity_mode: str = "external_id",
                 limits: Limits = Limits()):
        self._counting = _CountingReader(stream, limits.max_compressed)
        self._limits = limits
        self._identity_mode = identity_mode
        self.jobs = 0
        self.uncompressed_bytes = 0

    @property
    def compressed_bytes(self) -> int:
        return self._counting.count

    def _chunks(self) -> Iterator[bytes]:
        dctx = zstandard.ZstdDecompressor(max_window_size=self._limits.max_window)
        try:
            reader = dctx.stream_reader(self._counting, read_size=_CHUNK, read_across_frames=True)
            while True:
                chunk = reader.read(_CHUNK)
                if not chunk:
                    if self._counting.count == 0:
                        raise SourceError("empty source: expected a zstd stream")
                    if not self._counting.frames.complete():
                        raise SourceError("zstd stream is truncated (the last frame is incomplete)")
                    return
                self.uncompressed_bytes += len(chunk)
                if self.uncompressed_bytes > self._limits.max_expanded:
                    raise SourceError(f"expanded source exceeds {self._limits.max_expanded} bytes",
                                      kind="too_large")
                yield chunk
        except zstandard.ZstdError as exc:
            if "too much memory" in str(exc):
                raise SourceError(f"zstd window larger than {self._limits.max_window} bytes",
                                  kind="too_large") from None
            raise SourceError(f"not a valid zstd stream: {exc}") from None

    def raw_lines(self) -> Iterator[bytes]:
        pending = bytearray()
        line_no = 0
        for chunk in self._chunks():
            pending += chunk
            start = 0
            while True:
                end = pending.find(b"\n", start)
                if end < 0:
                    break
                line_no += 1
                if end - start > self._limits.max_line:
                    raise SourceError(f"line longer than {self._limits.max_line} bytes",
                                      kind="too_large", line=line_no)
                yield bytes(pending[start:end])
                start = end + 1
            del pending[:start]
            if len(pending) > self._limits.max_line:
                raise SourceError(f"line longer than {self._limits.max_line} bytes",
                                  kind="too_large", line=line_no + 1)
        if pending:
            yield bytes(pending)

    def __iter__(self) -> Iterator[dict]:
        for raw in self.raw_lines():
            line_no = self.jobs + 1
            if self.jobs >= self._limits.max_jobs:
                raise SourceError(f"source holds more than {self._limits.max_jobs} jobs",
                                  kind="too_large", line=line_no)
            try:
                obj = strict_json_loads(raw)
            except JsonTooDeep as exc:
                raise SourceError(f"line refused: {exc}", line=line_no) from None
            except (UnicodeDecodeError, ValueError) as exc:
                raise SourceError(f"line is not JSON: {exc}", line=line_no) from None
            try:
                spec = normalize_jobspec(obj, self._identity_mode, allow_random_key=False)
            except SpecError as exc:
                raise SourceError(str(exc), line=line_no, field=exc.field) from None
            self.jobs += 1
            yield spec


class SourceWriter:
    """Writes normalized JobSpecs to ``out`` as one zstd frame, line by line.

    ``close()`` ends the frame (it does not close ``out``); ``jobs`` counts
    the lines written.
    """

    def __init__(self, out: BinaryIO, *, level: int = 10):
        self._writer = zstandard.ZstdCompressor(level=level).stream_writer(out, closefd=False)
        self.jobs = 0

    def write(self, spec: dict) -> None:
        line = json.dumps(spec, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        self._writer.write(line + b"\n")
        self.jobs += 1

    def close(self) -> None:
        self._writer.close()


def write_source(specs, out: BinaryIO, *, level: int = 10) -> int:
    """Write JobSpecs (already normalized) as one zstd frame; returns the count."""
    writer = SourceWriter(out, level=level)
    for spec in specs:
        writer.write(spec)
    writer.close()
    return writer.jobs
