"""``flask fleet …``: administration on the master itself."""
from __future__ import annotations

import json
import os
import sys

import click
from flask.cli import AppGroup

from app.accounts import service as accounts
from app.errors import FleetError

fleet = AppGroup("fleet", help="Administer FleetHQ from the master host.")


def _fail(exc: FleetError):
    click.echo(f"error: {exc.code}: {exc.message}", err=True)
    if exc.details:
        click.echo(json.dumps(exc.details), err=True)
    sys.exit(1)


def _emit(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


@fleet.command("bootstrap-user")
@click.option("--user-id", required=True)
@click.option("--roles", default="admin,worker", show_default=True)
@click.option("--machine-token-file", type=click.Path(dir_okay=False),
              help="Write a new machine token here (mode 0600); keeps an existing valid one.")
def bootstrap_user(user_id, roles, machine_token_file):
    """Create (or update) a user and issue its machine token."""
    try:
        accounts.put_user(user_id, [r for r in roles.split(",") if r], "active")
        if machine_token_file and os.path.exists(machine_token_file):
            existing = open(machine_token_file).read().strip()
            try:
                if accounts.authenticate(existing).user_id == user_id:
                    click.echo(f"user {user_id} ready; token kept in {machine_token_file}")
                    return
            except FleetError:
                pass
        token = accounts.rotate_token(user_id)
    except FleetError as exc:
        _fail(exc)
    if machine_token_file:
        fd = os.open(machine_token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
        click.echo(f"user {user_id} ready; token written to {machine_token_file}")
    else:
        click.echo(token)


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
    try:
        summary = savewebhq.run(source_url, dry_run=dry_run, batch=batch_size,
                                progress=lambda line: click.echo(f"import-savewebhq: {line}", err=True))
    except FleetError as exc:
        _fail(exc)
    _emit(summary)


def init_app(app) -> None:
    app.cli.add_command(fleet)
