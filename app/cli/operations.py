"""``flask fleet`` upkeep on the master: migrate, web-keygen, audit, sweep,
held files (held, release-held), import-savewebhq."""
from __future__ import annotations

import base64
import json
import os
import secrets
import sys
from datetime import UTC, datetime, timedelta

import click
from sqlalchemy import text

from app import audit
from app.cli.group import database_url_option, emit, fail, fleet
from app.cli.tables import Column, answer, json_option, key, size
from app.errors import FleetError
from app.extensions import db


@fleet.command("migrate")
@database_url_option
def migrate_database():
    """Apply every pending migration (as `flask db upgrade`; SavewebHQ's tracker migrate)."""
    from flask_migrate import upgrade
    upgrade()


@fleet.command("web-keygen")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="New file for the secret; an existing file is never overwritten.")
def web_keygen(out):
    """Write a new random session secret (mode 0600) for FLEETHQ_SECRET_KEY_FILE."""
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=") + b"\n"
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        click.echo(f"error: web-keygen: cannot create {out}: {exc.strerror}", err=True)
        sys.exit(1)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secret)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        os.unlink(out)  # never leave a partial secret behind
        click.echo(f"error: web-keygen: cannot write {out}: {exc.strerror}", err=True)
        sys.exit(1)


class When(click.ParamType):
    """A point in time: ISO 8601 (UTC when it names no zone) or an age ago."""
    name = "time"
    _UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

    def convert(self, value, param, ctx):
        if isinstance(value, datetime):
            return value
        text_value = str(value).strip()
        unit = self._UNITS.get(text_value[-1:].lower())
        if unit and text_value[:-1].isdigit():
            try:
                return datetime.now(UTC) - timedelta(seconds=int(text_value[:-1]) * unit)
            except OverflowError:
                self.fail(f"{value!r} reaches before the year 1", param, ctx)
        try:
            when = datetime.fromisoformat(text_value)
        except ValueError:
            self.fail(f"{value!r} is neither an ISO 8601 time (2026-12-06T09:00Z) "
                      "nor an age (90s, 30m, 2h, 7d)", param, ctx)
        return when if when.tzinfo else when.replace(tzinfo=UTC)


@fleet.command("audit")
@click.option("--actor", default=None, help="Only this actor (user:<id>, node:<id>, cli@<host>, system).")
@click.option("--action", default=None, help="Only this action; ending in '.' a prefix (node.).")
@click.option("--object", "obj", default=None, metavar="KIND[:ID]", help="Only this object (project:papers).")
@click.option("--since", type=When(), default=None, metavar="TIME",
              help="Only rows at or after TIME: ISO 8601 (2026-12-06T09:00Z; no zone is UTC) "
                   "or an age (90s, 30m, 2h, 7d).")
@click.option("--until", type=When(), default=None, metavar="TIME", help="Only rows before TIME (as --since).")
@click.option("--before-id", type=click.IntRange(1), default=None, metavar="ID",
              help="The next page: rows older than this id (the last line says which).")
@click.option("--limit", type=click.IntRange(1, audit.PAGE_MAX), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def audit_log(actor, action, obj, since, until, before_id, limit, as_json):
    """Print who did what, newest first, a page at a time."""
    kind, _, object_id = (obj or "").partition(":")
    page = audit.listing(actor=actor, action=action, object_kind=kind or None,
                         object_id=object_id or None, limit=limit, since=since, until=until,
                         before_id=before_id)
    entries = page["entries"]
    for e in entries:
        if as_json:
            click.echo(json.dumps({**e, "at": e["at"].isoformat()}, sort_keys=True, default=str))
            continue
        target = f"{e['object_kind']}:{e['object_id']}" if e["object_id"] else e["object_kind"]
        line = f"{e['at'].astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC  {e['actor']}  {e['action']}  {target}"
        if e["details"]:
            line += "  " + json.dumps(e["details"], sort_keys=True, separators=(",", ":"))
        if e["reason"]:
            line += f"  reason: {e['reason']}"
        click.echo(line)
    if page["next_before_id"] is not None:
        # On stderr: --json output stays one object per line.
        click.echo(f"more: the same command with --before-id {page['next_before_id']}", err=True)



@fleet.command("sweep")
def sweep():
    """Reset expired leases and fail overdue jobs now."""
    from flask import current_app

    from app.projects import counters, leasing
    from app.uploads import sweeper
    emit({**leasing.sweep(), **sweeper.sweep(current_app.config)})
    counters.fold()


HELD_COLUMNS = [key("attempt_id", "ATTEMPT", right=True), key("job_id", "JOB", right=True),
                key("project_id", "PROJECT"), key("worker_id", "WORKER"), key("user_id", "USER"),
                Column("SIZE", lambda r: size(r["size"]), right=True), key("file_present", "FILE")]


@fleet.command("held")
@click.option("--worker", "worker_id", default=None, help="Only this worker's held files.")
@click.option("--user", "user_id", default=None, help="With --worker: a token worker of this user.")
@json_option
def list_held(worker_id, user_id, as_json):
    """Held files of revoked workers, kept for investigation (DESIGN §8.7)."""
    from app.uploads import held
    if user_id and not worker_id:
        raise click.UsageError("--user goes with --worker")
    answer(held.listing(worker_id, user_id), HELD_COLUMNS, as_json, empty="(no held files)")


@fleet.command("release-held")
@click.argument("attempt_ids", nargs=-1, type=int)
@click.option("--worker", "worker_id", default=None, help="Every held file of this worker.")
@click.option("--user", "user_id", default=None, help="With --worker: a token worker of this user.")
def release_held(attempt_ids, worker_id, user_id):
    """Delete held files (by attempt id, or all of one worker) and free their quota."""
    from flask import current_app

    from app.uploads import held
    from app.uploads.spool import Spool
    if bool(attempt_ids) == bool(worker_id):
        raise click.UsageError("give either attempt ids or --worker")
    if user_id and not worker_id:
        raise click.UsageError("--user goes with --worker")
    spool = Spool.from_config(current_app.config)
    released = []
    try:
        if worker_id:
            released = held.release_worker(worker_id, user_id, spool, "cli")
        else:
            for attempt_id in attempt_ids:
                released.append(held.release(attempt_id, spool, "cli"))
    except FleetError as exc:
        emit(released)
        fail(exc)
    emit(released)


@fleet.command("import-savewebhq")
@click.option("--from-database-url", "source_url", required=True,
              help="libpq URL of the SavewebHQ database (only read).")
@click.option("--dry-run", is_flag=True, help="Read and check everything, write nothing.")
@click.option("--batch-size", type=click.IntRange(1000), default=100_000, show_default=True,
              help="Jobs per read and per insert statement.")
def import_savewebhq(source_url, dry_run, batch_size):
    """Copy a SavewebHQ tracker database into FleetHQ (progress on stderr,
    the JSON summary on stdout)."""
    from app.imports import savewebhq
    # The target first: an unreachable FleetHQ database is reported before a
    # large source is read.
    db.session.execute(text("SELECT 1"))
    try:
        summary = savewebhq.run(source_url, dry_run=dry_run, batch=batch_size,
                                progress=lambda line: click.echo(f"import-savewebhq: {line}", err=True))
    except FleetError as exc:
        fail(exc)
    emit(summary)
