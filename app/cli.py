"""``flask fleet …``: administration on the master itself."""
from __future__ import annotations

import contextlib
import json
import os
import sys

import click
from flask.cli import AppGroup
from sqlalchemy.exc import SQLAlchemyError

from app.accounts import service as accounts
from app.accounts import tokens
from app.accounts.models import ROLES
from app.errors import FleetError
from workers.protocol import is_identifier

fleet = AppGroup("fleet", help="Administer FleetHQ from the master host.")


def _fail(exc: FleetError):
    click.echo(f"error: {exc.code}: {exc.message}", err=True)
    if exc.details:
        click.echo(json.dumps(exc.details), err=True)
    sys.exit(1)


def _emit(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


@fleet.command("bootstrap-user")
@click.option("--database-url", default=None, metavar="URL",
              help="PostgreSQL URL for this run (default: DATABASE_URL).")
@click.option("--user-id", required=True)
@click.option("--roles", default="worker", show_default=True,
              help="Comma-separated: admin, worker (and FleetHQ's reader).")
@click.option("--machine-token-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="0600 file holding the token to install; when it is empty or missing, "
                   "a new token is written to it.")
def bootstrap_user(database_url, user_id, roles, machine_token_file):
    """Make the user active with these roles and install its machine token.

    As SavewebHQ's "tracker bootstrap-user": the token already in the file is
    installed (any well-formed token, e.g. an hq_… one); the file must not be
    group- or world-accessible. Prints nothing on success. Without
    --machine-token-file a new token is printed instead.
    """
    role_list = _bootstrap_roles(roles)
    if not is_identifier(user_id):
        _refuse("bootstrap-user: user id must be 1..128 of [A-Za-z0-9._:-]")
    token = _read_token_file(machine_token_file) if machine_token_file else ""
    fresh = not token
    if fresh:
        token = tokens.new_secret(tokens.USER_TOKEN_PREFIX)
        if machine_token_file:
            # Written before it is installed: if installing fails, running
            # the command again installs the token the file holds.
            _write_token_file(machine_token_file, token)
    try:
        with _database(database_url):
            accounts.put_user_and_token(user_id, role_list, token)
    except FleetError as exc:
        _fail(exc)
    except SQLAlchemyError as exc:
        _refuse(f"bootstrap-user: database: {getattr(exc, 'orig', None) or exc}")
    if fresh and not machine_token_file:
        click.echo(token)


def _refuse(message: str):
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def _bootstrap_roles(text: str) -> list[str]:
    roles = []
    for role in (part.strip() for part in text.split(",")):
        if role not in ROLES:
            _refuse(f'bootstrap-user: unknown role "{role}"')
        roles.append(role)
    return sorted(set(roles))


# A token and some blank lines; a bigger file is not a token file.
_TOKEN_FILE_MAX_BYTES = 64 * 1024


def _read_token_file(path: str) -> str:
    """The token in ``path``, or "" when the file is empty or missing.

    Refuses a file whose permissions let the group or others in, and one
    holding more than a token's 1024 bytes (SavewebHQ's readSecretFile).
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return ""
    except OSError as exc:
        _refuse(f"{path}: {exc.strerror}")
    if mode & 0o077:
        _refuse(f"{path}: secret file permissions must not allow group or other access "
                f"(chmod 600 {path})")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_TOKEN_FILE_MAX_BYTES + 1)
    except OSError as exc:
        _refuse(f"{path}: {exc.strerror}")
    token = tokens.from_bytes(raw).strip()
    if len(raw) > _TOKEN_FILE_MAX_BYTES or len(tokens.token_bytes(token)) > tokens.MAX_TOKEN_BYTES:
        _refuse(f"{path}: invalid secret: more than {tokens.MAX_TOKEN_BYTES} bytes")
    return token


def _write_token_file(path: str, token: str) -> None:
    # O_EXCL for a missing file; an empty one (already 0600) is reused.
    flags = os.O_WRONLY | (os.O_TRUNC if os.path.exists(path) else os.O_CREAT | os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        _refuse(f"{path}: {exc.strerror}")


@contextlib.contextmanager
def _database(url: str | None):
    """Run against ``url`` instead of the configured database, for this run."""
    if not url:
        yield
        return
    from flask import current_app

    from app import create_app
    from app.extensions import db
    from app.ops.schema import SchemaTooNew
    config = current_app.config
    try:
        other = create_app({
            "DATABASE_URL": url, "LOG_JSON": config["LOG_JSON"],
            # The same secret as the configured app, so what it seals opens there.
            "SECRET_KEY": None if config.get("SECRET_KEY_GENERATED") else config["SECRET_KEY"],
            "MACHINE_TOKENS_VIEWABLE": config["MACHINE_TOKENS_VIEWABLE"]})
    except SchemaTooNew as exc:
        _refuse(str(exc))
    with other.app_context():
        try:
            yield
        finally:
            db.session.remove()
            for engine in db.engines.values():
                engine.dispose()


def _policy_options(fn):
    from app.projects.policy import RULES
    for name in reversed(list(RULES)):
        fn = click.option(f"--{name.replace('_', '-')}", name, default=None,
                          help="JSON value (null clears)" if name != "client_versions"
                          else "comma-separated list")(fn)
    return fn


def _parse_policy(values: dict) -> dict:
    fields = {}
    for name, raw in values.items():
        if raw is None:
            continue
        if name == "client_versions":
            fields[name] = [v for v in raw.split(",") if v]
        elif name in ("kind", "status", "identity_mode", "claim_order"):
            fields[name] = raw
        else:
            try:
                fields[name] = json.loads(raw)
            except ValueError:
                raise click.BadParameter(f"{name} must be a JSON value") from None
    return fields


@fleet.command("put-project")
@click.argument("project_id")
@click.option("--patch", is_flag=True, help="Change only the given fields.")
@_policy_options
def put_project(project_id, patch, **values):
    """Create a project or change its policy."""
    from app.projects import service
    try:
        project, created = service.put(project_id, _parse_policy(values), partial=patch)
        _emit({"created": created, **service.summary(project)})
    except FleetError as exc:
        _fail(exc)


@fleet.command("projects")
def list_projects():
    """List projects with their job counts."""
    from app.projects import service
    _emit(service.list_summaries())


@fleet.command("enqueue-source")
@click.argument("project_id")
@click.argument("source", type=click.File("rb"))
@click.option("--batch-size", type=int, default=None, help="Jobs per commit (default SOURCE_BATCH).")
def enqueue_source(project_id, source, batch_size):
    """Import a jobs-jsonl-zstd-v1 file (streamed, committed in batches)."""
    from flask import current_app

    from app.projects import source_import
    from workers.source import Limits
    cfg = current_app.config
    limits = Limits(max_compressed=cfg["SOURCE_MAX_COMPRESSED"], max_expanded=cfg["SOURCE_MAX_EXPANDED"],
                    max_jobs=cfg["SOURCE_MAX_JOBS"], max_line=cfg["SOURCE_MAX_LINE"],
                    max_window=cfg["SOURCE_MAX_WINDOW"])
    try:
        result = source_import.import_source(project_id, source, limits=limits,
                                             batch_size=batch_size or cfg["SOURCE_BATCH"])
    except FleetError as exc:
        _fail(exc)
    _emit({"jobs": result.jobs, "inserted": result.inserted,
           "uncompressed_bytes": result.uncompressed_bytes})


@fleet.command("users")
def list_users():
    """List users."""
    _emit([accounts.user_dict(u) for u in accounts.list_users()])


@fleet.command("put-user")
@click.argument("user_id")
@click.option("--roles", default="")
@click.option("--status", default="active", type=click.Choice(["active", "pending", "suspended"]))
def put_user(user_id, roles, status):
    """Create a user or change its roles and status."""
    try:
        user, _ = accounts.put_user(user_id, [r for r in roles.split(",") if r], status)
        _emit(accounts.user_dict(user))
    except FleetError as exc:
        _fail(exc)


@fleet.command("rotate-token")
@click.argument("user_id")
def rotate_token(user_id):
    """Issue a new machine token for a user (printed once)."""
    try:
        click.echo(accounts.rotate_token(user_id))
    except FleetError as exc:
        _fail(exc)


@fleet.command("revoke-token")
@click.argument("user_id")
def revoke_token(user_id):
    """Revoke a user's machine token."""
    try:
        accounts.revoke_token(user_id)
    except FleetError as exc:
        _fail(exc)


@fleet.command("sweep")
def sweep():
    """Reset expired leases and fail overdue jobs now."""
    from flask import current_app

    from app.projects import counters, leasing
    from app.uploads import sweeper
    _emit({**leasing.sweep(), **sweeper.sweep(current_app.config)})
    counters.fold()


@fleet.command("enroll")
@click.option("--valid-minutes", default=15, show_default=True, type=click.IntRange(1, 24 * 60))
@click.option("--created-by", default="cli")
def enroll(valid_minutes, created_by):
    """Create a one-use enrollment credential (printed once)."""
    from datetime import timedelta

    from app.fleet import service as fleet_service
    click.echo(fleet_service.create_enrollment(created_by, timedelta(minutes=valid_minutes)))


@fleet.command("worker")
@click.argument("action", type=click.Choice(["approve", "reject", "drain", "enable", "revoke"]))
@click.argument("worker_id")
@click.option("--user", "user_id", default=None,
              help="For a token worker: the user whose machine token it uses.")
def worker_action(action, worker_id, user_id):
    """Approve, reject, drain, enable or revoke a node (or a token worker with --user)."""
    from app.fleet import service as fleet_service
    try:
        if user_id:
            worker = fleet_service.decide_token_worker(user_id, worker_id, action)
            _emit({"worker_id": worker.worker_id, "user_id": worker.user_id, "status": worker.status})
        else:
            node = fleet_service.decide(worker_id, action, actor="cli")
            _emit({"worker_id": node.id, "name": node.name, "status": node.status})
    except FleetError as exc:
        _fail(exc)


@fleet.command("workers")
def list_workers():
    """Nodes and token workers with capacity, running attempts and heartbeat age."""
    from flask import current_app

    from app.fleet import listing
    _emit(listing.workers(current_app.config["WORKER_STALE_S"]))


@fleet.command("held")
@click.option("--worker", "worker_id", default=None, help="Only this worker's held files.")
@click.option("--user", "user_id", default=None, help="With --worker: a token worker of this user.")
def list_held(worker_id, user_id):
    """Held files of revoked workers, kept for investigation (DESIGN §8.7)."""
    from app.uploads import held
    if user_id and not worker_id:
        raise click.UsageError("--user goes with --worker")
    _emit(held.listing(worker_id, user_id))


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
        _emit(released)
        _fail(exc)
    _emit(released)


@fleet.command("add-hook")
@click.argument("project_id")
@click.option("--name", required=True)
@click.option("--url", required=True)
@click.option("--secret", default=None, help="Shared HMAC secret (generated when omitted).")
def add_hook(project_id, name, url, secret):
    """Add a webhook consumer to a project (the secret is printed once)."""
    from app.hooks import consumers
    from app.projects import service
    try:
        service.get(project_id)
        _emit(consumers.create(project_id, name, url, secret))
    except FleetError as exc:
        _fail(exc)


def init_app(app) -> None:
    app.cli.add_command(fleet)
