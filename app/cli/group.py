"""The ``flask fleet`` group, how its commands reach their database, and how they answer.

- :data:`fleet`: the group every command module of :mod:`app.cli` adds to;
  :func:`fail` (a refusal: ``error: code: message`` on stderr, exit 1) and
  :func:`emit` (a result: indented JSON on stdout).

- :func:`database_url_option` adds ``--database-url URL`` (SavewebHQ's
  ``tracker`` flag) to a command: the command then runs against that database
  instead of ``DATABASE_URL``. An empty value means "not given", so
  ``--database-url "$HQ_DATABASE_URL"`` with the variable unset uses the
  configured database.
- :class:`FleetGroup` turns a database that cannot be reached (or is not
  migrated, or is newer than this code) into one ``error: …`` line on stderr
  and exit status 1, for every command of the group, instead of a traceback.
"""
from __future__ import annotations

import functools
import json
import sys

import click
from flask import current_app
from flask.cli import AppGroup

from app.errors import FleetError

__all__ = ["FleetGroup", "database_url_option", "emit", "fail", "fleet"]

# Where a --database-url override leaves its URL for the error message.
_META_URL = "fleethq.database_url"


def database_url_option(fn):
    """Decorator: ``--database-url URL`` overrides ``DATABASE_URL`` for this run.

    The command body runs in the application context of an app built on that
    URL (same settings otherwise), so every ``db.session`` use inside it goes
    there; the app's connections are closed when the command ends.
    """
    @click.option("--database-url", "database_url", default=None, metavar="URL",
                  help="PostgreSQL URL for this run (default: DATABASE_URL).")
    @functools.wraps(fn)
    def wrapper(*args, database_url=None, **kwargs):
        if not database_url:
            return fn(*args, **kwargs)
        click.get_current_context().meta[_META_URL] = database_url
        app = _app_on(database_url)
        from app.extensions import db
        with app.app_context():
            try:
                return fn(*args, **kwargs)
            finally:
                db.session.remove()
                for engine in db.engines.values():
                    engine.dispose()
    return wrapper


def _app_on(database_url: str):
    from app import create_app
    settings = {k: v for k, v in current_app.config.items() if k.isupper()} if current_app else {}
    settings["DATABASE_URL"] = database_url
    return create_app(settings)


class FleetGroup(AppGroup):
    """An :class:`AppGroup` whose commands report database trouble in one line."""

    def invoke(self, ctx: click.Context):
        from app.ops.schema import SchemaTooNew
        from workers import logs
        # A command's lines in FleetHQ's one format; long-running commands
        # (documents consume) name their own role.
        logs.configure("cli")
        try:
            return super().invoke(ctx)
        except SchemaTooNew as exc:
            _die(str(exc))
        except Exception as exc:
            message = _database_trouble(exc, ctx)
            if message is None:
                raise
            _die(message)


def _die(message: str):
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def _database_trouble(exc: BaseException, ctx: click.Context) -> str | None:
    """The one-line explanation of a connection failure or a missing schema, else None."""
    import psycopg
    from psycopg import errors as pg_errors
    from sqlalchemy.exc import DBAPIError

    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    # A failure to connect never reached a server that could name an SQLSTATE
    # (refused, timed out, unknown database or role, bad password).
    if isinstance(orig, psycopg.OperationalError) and orig.sqlstate is None:
        reason = "; ".join(line.strip() for line in str(orig).splitlines() if line.strip())
        return (f"cannot connect to the database {_shown_url(ctx)}: {reason} "
                "(set DATABASE_URL or --database-url, or start `make dev`)")
    if isinstance(orig, pg_errors.UndefinedTable):
        return (f"the database {_shown_url(ctx)} is not migrated: "
                "run `flask --app wsgi fleet migrate` first")
    return None


def _shown_url(ctx: click.Context) -> str:
    """The URL the command used, with any password hidden."""
    from flask.cli import ScriptInfo
    from sqlalchemy.engine import make_url
    url = ctx.meta.get(_META_URL)
    if url is None:
        info = ctx.find_object(ScriptInfo)
        app = current_app if current_app else info.load_app() if info else None
        url = app.config.get("DATABASE_URL") if app else None
    if not url:
        return "(unknown)"
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy can parse: show nothing of it
        return "(unparsable URL)"


fleet = FleetGroup("fleet", help="Administer FleetHQ from the master host.")


def fail(exc: FleetError):
    click.echo(f"error: {exc.code}: {exc.message}", err=True)
    if exc.details:
        click.echo(json.dumps(exc.details), err=True)
    sys.exit(1)


def emit(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))
