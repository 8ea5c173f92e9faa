"""Argument parsing shared by ``hqctl`` and ``fleethq-source``.

The commands that SavewebHQ's tools also have (``hqctl enqueue``,
``hqctl enqueue-source``, ``fleethq-source pack``, ``fleethq-source merge``)
exit 1 on every failure, usage errors included, as SavewebHQ's do, so that
scripts written for those tools see the same exit codes. FleetHQ's own
commands keep the conventional 2 for a usage error.

This module must not import ``app`` (it runs on worker computers).
"""
from __future__ import annotations

import argparse
import re
import sys

SAVEWEBHQ_USAGE_EXIT = 1
USAGE_EXIT = 2


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors exit with ``usage_exit``."""

    def __init__(self, *args, usage_exit: int = USAGE_EXIT, **kwargs):
        super().__init__(*args, **kwargs)
        self.usage_exit = usage_exit

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(self.usage_exit, f"{self.prog}: error: {message}\n")


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
        leaf = getattr(args, "parser", parser)  # the subcommand's own parser, for its exit code
        leaf.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3,
             "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(?:\d+\.?\d*|\.\d+)"
_GO_TERM = re.compile(rf"({_NUMBER})(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_SECONDS = re.compile(rf"[+-]?{_NUMBER}")


def duration(text: str) -> float:
    """Seconds from a Go duration (``10m``, ``30s``, ``1h30m``, ``1.5h``,
    ``250ms``), as SavewebHQ's ``--timeout`` takes it. A bare number is seconds
    (FleetHQ's older ``--timeout SECONDS``); Go itself accepts only ``0`` bare.

    Raises:
        argparse.ArgumentTypeError: for anything else.
    """
    raw = text.strip()
    if _SECONDS.fullmatch(raw):
        return float(raw)
    sign = -1.0 if raw.startswith("-") else 1.0
    body = raw[1:] if raw[:1] in "+-" else raw
    total, pos = 0.0, 0
    while pos < len(body):
        match = _GO_TERM.match(body, pos)
        if not match:
            break
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        pos = match.end()
    if not body or pos != len(body):
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use Go syntax such as 10m, 30s, 1h30m or 250ms")
    return sign * total
