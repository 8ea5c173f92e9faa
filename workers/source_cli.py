"""``fleethq-source``: pack, merge and inspect ``jobs-jsonl-zstd-v1`` files (DESIGN §4.4).

    fleethq-source pack [--jsonl] [--project-mode M] [--default-ids] [-o OUT] [INPUT ...]
    fleethq-source merge [--project-mode M] [--no-dedupe] -o OUT IN.zst ...
    fleethq-source stat [--project-mode M] FILE

Every job is checked with the master's own rules (``workers.protocol``), so a
file that packs cleanly imports cleanly. :class:`SpecInput` (plain values or
JSONL, errors naming ``file:line``) is shared with ``hqctl enqueue``.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import stat
import sys
import tempfile

from workers.protocol import (IDENTITY_MODES, SpecError, compact_json, default_job_id,
                              normalize_jobspec)
from workers.source import MAX_LINE, Limits, SourceError, SourceReader, write_source


class InputError(ValueError):
    """A bad input line; the message starts with ``file:line:``."""


def _no_constants(name):
    # Python's json accepts NaN/Infinity, which are not JSON and which the
    # master would store as something no other client can read.
    raise ValueError(f"{name} is not valid JSON")


class SpecInput:
    """Iterate ``(where, spec)`` over input files ('-' is stdin), one job per line.

    Plain text: each line is a value (surrounding whitespace dropped). JSONL:
    each line is a JobSpec object. Blank lines are skipped. With
    ``default_ids`` a job without ``id`` gets :func:`default_job_id`.
    ``bytes_read`` and ``total_bytes`` feed progress bars; ``where`` is the
    location of the last job yielded, for errors found after it was yielded.
    """

    def __init__(self, paths, identity_mode: str, *, jsonl: bool = False,
                 default_ids: bool = False, allow_random_key: bool = False):
        self.paths = list(paths) or ["-"]
        self.identity_mode = identity_mode
        self.jsonl = jsonl
        self.default_ids = default_ids
        self.allow_random_key = allow_random_key
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
            text = raw if isinstance(raw, str) else raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{where}: line is not valid UTF-8") from None
        if first:
            text = text.removeprefix("\ufeff")  # byte-order mark left by some editors
        text = text.rstrip("\r\n")
        if not text.strip():
            return None
        if self.jsonl:
            try:
                obj = json.loads(text, parse_constant=_no_constants)
            except ValueError as exc:
                raise InputError(f"{where}: not valid JSON: {exc}") from None
        else:
            obj = {"value": text.strip()}
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
                hint = " (use --default-ids to derive it from the value)"
            raise InputError(f"{where}: {exc}{hint}") from None


@contextlib.contextmanager
def _output(path: str | None):
    """Write to a temporary file renamed over ``path`` on success, so a failed
    run never leaves a truncated file that looks valid; '-' or None is stdout."""
    if path in (None, "-"):
        out = getattr(sys.stdout, "buffer", None)
        if out is None or sys.stdout.isatty():
            raise InputError("refusing to write compressed data to a terminal; use -o FILE")
        yield out
        out.flush()
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".fleethq-source-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _report(summary: dict, to_stdout: bool) -> None:
    print(json.dumps(summary), file=sys.stdout if to_stdout else sys.stderr)


def cmd_pack(args) -> int:
    if args.default_ids and args.project_mode != "external_id":
        raise _Usage("--default-ids only applies to --project-mode external_id")
    specs = SpecInput(args.inputs, args.project_mode, jsonl=args.jsonl,
                      default_ids=args.default_ids)
    with _output(args.output) as out:
        try:
            count = write_source((spec for _, spec in specs), out)
        except UnicodeEncodeError:  # lone surrogates from \ud800 escapes inside attr
            raise InputError(f"{specs.where}: job is not valid UTF-8") from None
    _report({"jobs": count, "output": args.output or "-"}, to_stdout=args.output not in (None, "-"))
    return 0


def _detect_mode(path: str) -> str:
    """external_id when the first job carries an id; otherwise none (no ids)."""
    try:
        with open(path, "rb") as stream:
            for raw in SourceReader(stream).raw_lines():
                obj = json.loads(raw)
                return "external_id" if isinstance(obj, dict) and "id" in obj else "none"
    except (SourceError, ValueError):
        pass  # the real pass reports the problem with its line number
    return "none"


def _read_source(path: str, mode: str):
    """Yield ``(line, spec)`` of a source file, errors prefixed with ``path:line``."""
    try:
        with open(path, "rb") as stream:
            reader = SourceReader(stream, mode)
            try:
                for spec in reader:
                    yield reader.jobs, spec  # SourceReader allows no blank lines: jobs == line
            except SourceError as exc:
                where = f"{path}:{exc.line}" if exc.line else path
                raise InputError(f"{where}: {exc}") from None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None


def _mode_for(args, paths) -> str:
    if args.project_mode != "auto":
        return args.project_mode
    return _detect_mode(paths[0]) if paths else "none"


def _digest(text: str) -> bytes:
    # 16 bytes of SHA-256 keep the duplicate index small for millions of jobs.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:16]


def cmd_merge(args) -> int:
    mode = _mode_for(args, args.inputs)
    key_field = {"external_id": "id", "unique_value": "value"}.get(mode)
    dedupe = key_field is not None and not args.no_dedupe
    seen: dict[bytes, bytes] = {}
    counts = {"jobs": 0, "read": 0, "duplicates": 0, "inputs": len(args.inputs)}
    max_jobs = Limits().max_jobs

    def merged():
        for path in args.inputs:
            for line, spec in _read_source(path, mode):
                counts["read"] += 1
                if dedupe:
                    key, body = _digest(spec[key_field]), _digest(compact_json(spec))
                    first = seen.get(key)
                    if first is None:
                        seen[key] = body
                    elif first == body:  # exact duplicate: the master would ignore it too
                        counts["duplicates"] += 1
                        continue
                    else:
                        raise InputError(f"{path}:{line}: identity_conflict: {key_field} "
                                         f"{spec[key_field]!r} appeared earlier with other fields")
                if counts["jobs"] >= max_jobs:
                    raise InputError(f"{path}:{line}: merged file would exceed {max_jobs} jobs")
                counts["jobs"] += 1
                yield spec

    with _output(args.output) as out:
        write_source(merged(), out)
    _report({**counts, "identity_mode": mode}, to_stdout=args.output != "-")
    return 0


def cmd_stat(args) -> int:
    mode = _mode_for(args, [args.file])
    try:
        with open(args.file, "rb") as stream:
            reader = SourceReader(stream, mode)
            for _ in reader:
                pass
    except SourceError as exc:
        where = f"{args.file}:{exc.line}" if exc.line else args.file
        raise InputError(f"{where}: {exc}") from None
    except OSError as exc:
        raise InputError(f"{args.file}: {exc.strerror}") from None
    print(json.dumps({"jobs": reader.jobs, "uncompressed_bytes": reader.uncompressed_bytes}))
    return 0


class _Usage(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleethq-source",
                                     description="Pack and inspect jobs-jsonl-zstd-v1 source files.")
    sub = parser.add_subparsers(dest="command", required=True)
    modes_auto = ("auto",) + IDENTITY_MODES

    pack = sub.add_parser("pack", help="values or JSONL -> source file")
    pack.add_argument("inputs", nargs="*", metavar="INPUT", help="files; '-' or none: stdin")
    pack.add_argument("--jsonl", action="store_true", help="each line is a JobSpec object")
    pack.add_argument("--project-mode", choices=IDENTITY_MODES, default="external_id",
                      help="identity mode of the target project (default external_id)")
    pack.add_argument("--default-ids", action="store_true",
                      help="give jobs without id the default j1_ id (external_id)")
    pack.add_argument("-o", "--output", metavar="OUT", help="output file (default stdout)")
    pack.set_defaults(func=cmd_pack)

    merge = sub.add_parser("merge", help="concatenate source files, dropping duplicates")
    merge.add_argument("inputs", nargs="+", metavar="IN")
    merge.add_argument("-o", "--output", metavar="OUT", required=True)
    merge.add_argument("--project-mode", choices=modes_auto, default="auto",
                       help="auto: external_id if the first job has an id, else none")
    merge.add_argument("--no-dedupe", action="store_true",
                       help="keep duplicate identities (saves memory on huge inputs)")
    merge.set_defaults(func=cmd_merge)

    stat_ = sub.add_parser("stat", help="validate a source file and count its jobs")
    stat_.add_argument("file", metavar="FILE")
    stat_.add_argument("--project-mode", choices=modes_auto, default="auto")
    stat_.set_defaults(func=cmd_stat)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """``parse_args`` that also takes input files given after options.

    Python 3.11's argparse fills a ``nargs="*"`` positional at its first chance
    (``enqueue P --jsonl FILE`` leaves it empty) and rejects later files.
    """
    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "inputs", None), list) \
            and all(item == "-" or not item.startswith("-") for item in extra):
        args.inputs.extend(extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parse_args(parser, argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return args.func(args)
    except _Usage as exc:
        parser.print_usage(sys.stderr)
        print(f"fleethq-source: error: {exc}", file=sys.stderr)
        return 2
    except InputError as exc:
        print(f"fleethq-source: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"fleethq-source: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
