"""Refuse to run against a database migrated by newer code (DESIGN §13)."""
from __future__ import annotations

import logging
import os

import click
from alembic.script import ScriptDirectory
from sqlalchemy import text

from app.extensions import db

log = logging.getLogger(__name__)


class SchemaTooNew(RuntimeError):
    pass


def known_revisions(app) -> set[str]:
    script = ScriptDirectory(app.extensions["migrate"].directory)
    return {rev.revision for rev in script.walk_revisions()}


def head_revisions(app) -> set[str]:
    return set(ScriptDirectory(app.extensions["migrate"].directory).get_heads())


def database_revisions() -> set[str] | None:
    """The revisions stamped in the database, or None before the first migration."""
    exists = db.session.execute(text("SELECT to_regclass('alembic_version') IS NOT NULL")).scalar()
    if not exists:
        return None
    return {row[0] for row in db.session.execute(text("SELECT version_num FROM alembic_version"))}


def refuse_newer_schema(app) -> None:
    with app.app_context():
        try:
            revisions = database_revisions()
        except Exception as exc:  # database down: /readyz reports it; the process may start
            # Under the `flask` command line the command itself says so, in one line.
            on_the_command_line = os.environ.get("FLASK_RUN_FROM_CLI") or click.get_current_context(silent=True)
            level = logging.DEBUG if on_the_command_line else logging.WARNING
            log.log(level, "schema check skipped: database unreachable (%s)", exc.__class__.__name__)
            return
        finally:
            db.session.remove()
        if not revisions:
            return
        unknown = revisions - known_revisions(app)
        if unknown:
            raise SchemaTooNew(
                f"database schema revision {', '.join(sorted(unknown))} is newer than this code "
                "knows; deploy the newer release, or downgrade with it first (flask db downgrade)")
