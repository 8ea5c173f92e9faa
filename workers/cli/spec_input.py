"""Job input read line by line: plain values or JSONL (DESIGN §4.2).

Shared by ``hqctl enqueue`` and ``fleethq-source pack``, so that a file gives
the same jobs, and the same default ids, whichever tool reads it. The rules
are SavewebHQ's (parity H14, H15, S1): a values line is one exact value, only
its line ending removed, so the same text gets the same ``j1_`` id in both
systems.

This module must not import ``app`` (it runs on worker computers).
"""
from __future__ import annotations

import contextlib
import os
import stat
import sys

from workers.wire.protocol import SpecError, default_job_id, normalize_jobspec, strict_json_loads
from workers.wire.source import MAX_LINE

# Go's unicode.IsSpace: what SavewebHQ's hqctl trims to decide that a line is
# blank. (Python's str.isspace also counts \x1c-\x1f.)
_GO_SPACE = ("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
             "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


class InputError(ValueError):
    """A bad input line; the message starts with ``file:line:``."""


def _line_text(text: str) -> str:
    """The line without its ending: the LF, then at most two CRs (SavewebHQ's
    line scanner drops one CR and its caller trims one more)."""
    text = text.removesuffix("\n").removesuffix("\r")
    return text.removesuffix("\r")


def _absent_as_go(obj):
    # SavewebHQ decodes JSONL into Go structs, where "id": "" or null means no
    # id and "type": "" or null means seed. Dropping them gives the same job.
    if isinstance(obj, dict) and any(obj.get(k, 0) in ("", None) for k in ("id", "type")):
        return {k: v for k, v in obj.items() if not (k in ("id", "type") and v in ("", None))}
    return obj


class SpecInput:
    """Iterate ``(where, spec)`` over input files ('-' is stdin), one job per line.

    Parameters:
        paths: input files; empty means stdin.
        identity_mode: the target project's mode; decides whether ``id`` is
            required or refused.
        jsonl: each line is a JobSpec object; otherwise each line is a value.
        default_ids: a job without ``id`` gets :func:`default_job_id` of its
            type and value (external_id projects).
        allow_random_key: enqueue accepts ``random_key``; source files never.
        job_type: the type of plain values (``seed`` or ``asset``).
        keep_space_lines: a values line of only spaces is a job (SavewebHQ's
            ``source pack`` skips only empty lines; its ``hqctl`` skips
            lines that are empty after trimming whitespace).

    ``bytes_read`` and ``total_bytes`` feed progress bars; ``where`` is the
    location of the last job yielded, for errors found after it was yielded.
    """

    def __init__(self, paths, identity_mode: str, *, jsonl: bool = False,
                 default_ids: bool = False, allow_random_key: bool = False,
                 job_type: str = "seed", keep_space_lines: bool = False):
        self.paths = list(paths) or ["-"]
        self.identity_mode = identity_mode
        self.jsonl = jsonl
        self.default_ids = default_ids
        self.allow_random_key = allow_random_key
        self.job_type = job_type
        self.keep_space_lines = keep_space_lines
        self.bytes_read = 0
        self.where: str | None = None

    @property
    def total_bytes(self) -> int | None:
        """Sum of the input sizes; None when any input is a pipe."""
        total = 0
        for path in self.paths:
            try:
                info = os.stat(path) if path != "-" else None
            except OSError:
                return None
            if info is None or not stat.S_ISREG(info.st_mode):
                return None
            total += info.st_size
        return total

    @property
    def rereadable(self) -> bool:
        return self.total_bytes is not None

    def __iter__(self):
        for path in self.paths:
            name = "<stdin>" if path == "-" else path
            with self._open(path) as stream:
                # readline with a cap: a file without newlines must not be
                # slurped into memory.
                for number, raw in enumerate(iter(lambda: stream.readline(MAX_LINE + 1), b""), 1):
                    self.bytes_read += len(raw)
                    where = f"{name}:{number}"
                    if len(raw) > MAX_LINE:
                        raise InputError(f"{where}: line longer than {MAX_LINE} bytes")
                    spec = self._parse(raw, where, first=number == 1)
                    if spec is not None:
                        self.where = where
                        yield where, spec

    @staticmethod
    def _open(path: str):
        if path == "-":
            stdin = sys.stdin
            return contextlib.nullcontext(getattr(stdin, "buffer", stdin))
        try:
            return open(path, "rb")
        except OSError as exc:
            raise InputError(f"{path}: {exc.strerror}") from None

    def _parse(self, raw, where: str, *, first: bool) -> dict | None:
        try:
            text = _line_text(raw if isinstance(raw, str) else raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise InputError(f"{where}: line is not valid UTF-8") from None
        if not text or (not text.strip(_GO_SPACE) and (self.jsonl or not self.keep_space_lines)):
            return None
        if self.jsonl:
            if first:
                text = text.removeprefix("\ufeff")  # byte-order mark left by some editors
            try:
                obj = _absent_as_go(strict_json_loads(text))
            except ValueError as exc:
                raise InputError(f"{where}: not valid JSON: {exc}") from None
        else:
            # The exact value: spaces and any byte-order mark are part of it.
            obj = {"value": text, "type": self.job_type}
        if self.default_ids and isinstance(obj, dict) and "id" not in obj \
                and isinstance(obj.get("value"), str):
            job_type = obj.get("type", "seed")
            # A bad type still gets a placeholder id so that the error below
            # names the type rather than a missing id.
            obj = {**obj, "id": default_job_id(obj["value"],
                                               job_type if isinstance(job_type, str) else "seed")}
        try:
            return normalize_jobspec(obj, self.identity_mode, allow_random_key=self.allow_random_key)
        except SpecError as exc:
            hint = ""
            if exc.field == "id" and isinstance(obj, dict) and "id" not in obj:
                hint = " (default ids are off)"
            raise InputError(f"{where}: {exc}{hint}") from None
