"""``flask fleet …``: administration on the master itself.

One module per command group, each adding its commands to :data:`fleet`
(:mod:`app.cli.group`): accounts, projects, workers (and hooks), lanes,
documents, operations."""
from __future__ import annotations

from app.cli import accounts, documents, lanes, operations, projects, sites, workers  # noqa: F401 (register)
from app.cli.group import fleet

__all__ = ["fleet", "init_app"]


def init_app(app) -> None:
    app.cli.add_command(fleet)
