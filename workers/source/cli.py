"""``fleethq-source``: pack, merge and inspect ``jobs-jsonl-zstd-v1`` files (DESIGN §4.4).

    fleethq-source pack --input F --output OUT [--identity-mode M] [--jsonl]
    fleethq-source merge --input A --input B ... (--output OUT | --output-prefix P
                         [--jobs-per-file N]) [--max-jobs N] [--max-uncompressed-bytes N]
    fleethq-source stat [--project-mode M] FILE

``pack`` and ``merge`` take SavewebHQ's ``source pack``/``source merge`` command
lines unchanged (parity S1–S4); FleetHQ's older spellings (positional inputs,
``-o``, ``--project-mode``) are accepted too. Every job is checked with the
master's own rules (``workers.wire.protocol``), so a file that packs cleanly
imports cleanly. Outputs are new files: an existing file is never replaced.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from workers.cli.args import SAVEWEBHQ_USAGE_EXIT, CliParser, parse_args
from workers.wire.protocol import IDENTITY_MODES
from workers.wire.source import SourceError, SourceReader, SourceWriter
from workers.source.merge import (DEFAULT_JOBS_PER_FILE, DEFAULT_MAX_BYTES, DEFAULT_MAX_JOBS,
                                  MAX_BYTES_BOUND, MAX_INPUTS, MAX_JOBS_BOUND, SplitOutputs,
                                  create_exclusive, finish_file, merge_sources)
from workers.cli.spec_input import InputError, SpecInput

__all__ = ["InputError", "SpecInput", "build_parser", "main", "parse_args"]


def _usage(args, message: str):
    args.parser.error(message)  # exits with the subcommand's usage code


def _inputs(args) -> list[str]:
    return list(args.input or []) + list(args.inputs)


def cmd_pack(args) -> int:
    if args.default_ids and args.project_mode != "external_id":
        _usage(args, "--default-ids only applies to --identity-mode external_id")
    if not args.output or args.output == "-":
        _usage(args, "--output FILE is required (a new file; not '-')")
    # Plain values get default ids in external_id mode, always (SavewebHQ's
    # pack does the same), so that `pack` of a URL list simply works.
    specs = SpecInput(_inputs(args), args.project_mode, jsonl=args.jsonl,
                      default_ids=args.project_mode == "external_id", keep_space_lines=True)
    out = create_exclusive(args.output)
    try:
        writer = SourceWriter(out)
        try:
            for _, spec in specs:
                writer.write(spec)
        except UnicodeEncodeError:  # lone surrogates from \ud800 escapes inside attr
            raise InputError(f"{specs.where}: job is not valid UTF-8") from None
        writer.close()
        finish_file(out)
    except BaseException:
        out.close()
        with contextlib.suppress(OSError):  # no half-written file that could pass for a source
            os.unlink(args.output)
        raise
    print(json.dumps({"jobs": writer.jobs, "output": args.output}))
    return 0


def _detect_mode(path: str) -> str:
    """external_id when the first job carries an id; otherwise none (no ids)."""
    try:
        with open(path, "rb") as stream:
            for raw in SourceReader(stream).raw_lines():
                obj = json.loads(raw)
                return "external_id" if isinstance(obj, dict) and "id" in obj else "none"
    except (OSError, SourceError, ValueError):
        pass  # the real pass reports the problem with its line number
    return "none"


def _mode_for(mode: str, paths) -> str:
    if mode != "auto":
        return mode
    first = next((p for p in paths if p != "-"), None)
    return _detect_mode(first) if first else "external_id"


def _merge_outputs(args, max_jobs: int) -> SplitOutputs:
    if (args.output is None) == (args.output_prefix is None):
        _usage(args, "give one of --output FILE and --output-prefix PREFIX")
    if "-" in (args.output, args.output_prefix) or "" in (args.output, args.output_prefix):
        _usage(args, "outputs are new files: '-' and an empty name are not accepted")
    if args.output is not None:
        if args.jobs_per_file is not None:
            _usage(args, "--jobs-per-file applies to --output-prefix")
        return SplitOutputs(path=args.output)
    per_file = args.jobs_per_file
    if per_file is None:
        per_file = min(DEFAULT_JOBS_PER_FILE, max_jobs)
    if not 1 <= per_file <= max_jobs:
        _usage(args, f"--jobs-per-file must be 1..--max-jobs ({max_jobs})")
    return SplitOutputs(prefix=args.output_prefix, jobs_per_file=per_file)


def cmd_merge(args) -> int:
    inputs = _inputs(args)
    if not 1 <= len(inputs) <= MAX_INPUTS or "" in inputs:
        _usage(args, f"give 1..{MAX_INPUTS} inputs (--input FILE, repeatable)")
    if inputs.count("-") > 1:
        _usage(args, "stdin ('-') can be used only once")
    if not 1 <= args.max_jobs <= MAX_JOBS_BOUND:
        _usage(args, f"--max-jobs must be 1..{MAX_JOBS_BOUND}")
    if not 1 <= args.max_uncompressed_bytes <= MAX_BYTES_BOUND:
        _usage(args, f"--max-uncompressed-bytes must be 1..{MAX_BYTES_BOUND}")
    outputs = _merge_outputs(args, args.max_jobs)
    stats = merge_sources(inputs, outputs, mode=_mode_for(args.project_mode, inputs),
                          dedupe=not args.no_dedupe, max_jobs=args.max_jobs,
                          max_bytes=args.max_uncompressed_bytes)
    fields = {**stats.summary_fields, "outputs": len(outputs.paths)}
    print(" ".join(f"{key}={value}" for key, value in fields.items()))
    return 0


def cmd_stat(args) -> int:
    mode = _mode_for(args.project_mode, [args.file])
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


def _mode_flags(parser, choices, default, help_text) -> None:
    parser.add_argument("--identity-mode", "--project-mode", dest="project_mode",
                        choices=choices, default=default, help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(prog="fleethq-source",
                       description="Pack and inspect jobs-jsonl-zstd-v1 source files.")
    sub = parser.add_subparsers(dest="command", required=True)
    modes_auto = ("auto",) + IDENTITY_MODES

    pack = sub.add_parser("pack", help="values or JSONL -> a new source file",
                          usage_exit=SAVEWEBHQ_USAGE_EXIT)
    pack.add_argument("--input", action="append", metavar="FILE",
                      help="input file, '-' for stdin (repeatable; default stdin)")
    pack.add_argument("inputs", nargs="*", metavar="INPUT", help="more input files")
    pack.add_argument("--output", "-o", metavar="OUT", help="new source file (required)")
    _mode_flags(pack, IDENTITY_MODES, "external_id",
                "identity mode of the target project (default external_id: "
                "every job gets its default j1_ id unless it has one)")
    pack.add_argument("--jsonl", action="store_true", help="each line is a JobSpec object")
    pack.add_argument("--default-ids", action="store_true",
                      help="accepted for older scripts; external_id always fills ids")
    pack.set_defaults(func=cmd_pack, parser=pack)

    merge = sub.add_parser("merge", help="merge source files in order, dropping duplicates",
                           usage_exit=SAVEWEBHQ_USAGE_EXIT)
    merge.add_argument("--input", action="append", metavar="FILE",
                       help="input source file, repeatable, merged in order; '-' once for stdin")
    merge.add_argument("inputs", nargs="*", metavar="IN", help="more input files")
    merge.add_argument("--output", "-o", metavar="OUT", help="one new output file")
    merge.add_argument("--output-prefix", metavar="PREFIX",
                       help="split outputs PREFIX-000001.jobs.jsonl.zst, ...")
    merge.add_argument("--jobs-per-file", type=int, metavar="N",
                       help=f"jobs per split output (default {DEFAULT_JOBS_PER_FILE})")
    merge.add_argument("--max-jobs", type=int, default=DEFAULT_MAX_JOBS, metavar="N",
                       help=f"most input jobs, duplicates included (default {DEFAULT_MAX_JOBS}, "
                            f"at most {MAX_JOBS_BOUND})")
    merge.add_argument("--max-uncompressed-bytes", type=int, default=DEFAULT_MAX_BYTES,
                       metavar="N", help=f"most decoded bytes of all inputs (default "
                                         f"{DEFAULT_MAX_BYTES}, at most {MAX_BYTES_BOUND})")
    _mode_flags(merge, modes_auto, "external_id",
                "external_id (default): ids required, duplicates by id; unique_value: "
                "duplicates by value; none: keep all; auto: from the first job")
    merge.add_argument("--no-dedupe", action="store_true",
                       help="keep duplicate identities (saves memory on huge inputs)")
    merge.set_defaults(func=cmd_merge, parser=merge)

    stat_ = sub.add_parser("stat", help="validate a source file and count its jobs")
    stat_.add_argument("file", metavar="FILE")
    _mode_flags(stat_, modes_auto, "auto", "auto: external_id if the first job has an id")
    stat_.set_defaults(func=cmd_stat, parser=stat_)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parse_args(parser, argv)
        return args.func(args)
    except SystemExit as exc:  # --help (0) or a usage error
        return exc.code if isinstance(exc.code, int) else 0
    except (InputError, OSError) as exc:
        print(f"fleethq-source: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
