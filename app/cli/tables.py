"""How ``flask fleet`` list commands answer: a table for a person at a
terminal, JSON (the same objects as before, epoch times and all) with
``--json`` or whenever stdout is not a terminal (``--table`` asks for the
table anyway), so scripts and pipes keep
reading what they always read."""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

import click

from app.cli.group import emit


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[dict], object]
    right: bool = False  # numbers line up on the right


def key(name: str, header: str | None = None, *, right: bool = False) -> Column:
    return Column(header or name.upper(), lambda row: row.get(name), right)


def when(epoch) -> str:
    """An instant in this computer's zone, with the zone: 2026-12-06 13:05:09 CET."""
    if epoch is None:
        return "—"
    return datetime.fromtimestamp(float(epoch)).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def age(seconds) -> str:
    """12s, 3m, 2h, 4d."""
    if seconds is None:
        return "—"
    seconds = max(0, int(float(seconds)))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def size(count) -> str:
    """Bytes for a terminal (app.i18n.byte_size is the pages' one, in the page's language)."""
    if count is None:
        return "—"
    count = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def _cell(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "—"
    return str(value).replace("\n", " ")


def render(rows: Iterable[dict], columns: list[Column]) -> str:
    """Columns padded to their widest cell, a header line, two spaces between."""
    cells = [[_cell(c.value(row)) for c in columns] for row in rows]
    widths = [max([len(c.header)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if c.right else v.ljust(w)
                         for v, w, c in zip(values, widths, columns)).rstrip()
    return "\n".join([line([c.header for c in columns]), *(line(r) for r in cells)])


def json_option(fn):
    return click.option("--json/--table", "as_json", default=None,
                        help="JSON or a table (default: a table on a terminal, else JSON).")(fn)


def table_wanted(as_json: bool | None) -> bool:
    return sys.stdout.isatty() if as_json is None else not as_json


def answer(rows: list[dict], columns: list[Column], as_json: bool | None, *, empty: str = "(none)") -> None:
    """The command's answer: the rows as JSON, or as a table."""
    if not table_wanted(as_json):
        emit(rows)
        return
    click.echo(render(rows, columns) if rows else empty)

