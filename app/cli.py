"""``flask fleet …``: administration on the master itself."""
from __future__ import annotations

import base64
import json
import os
import secrets
import sys
from datetime import timezone

import click
from sqlalchemy import text

from app import audit
from app.accounts import service as accounts
from app.accounts import tokens
from app.accounts.models import ROLES
from app.cli_database import FleetGroup, database_url_option
from app.errors import FleetError, InvalidRequest
from app.extensions import db
from workers.private_file import OpenToOthers, read_private
from workers.protocol import is_identifier

fleet = FleetGroup("fleet", help="Administer FleetHQ from the master host.")


def _fail(exc: FleetError):
    click.echo(f"error: {exc.code}: {exc.message}", err=True)
    if exc.details:
        click.echo(json.dumps(exc.details), err=True)
    sys.exit(1)


def _emit(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


@fleet.command("bootstrap-user")
@database_url_option
@click.option("--user-id", required=True)
@click.option("--roles", default="worker", show_default=True,
              help="Comma-separated: admin, worker (and FleetHQ's reader).")
@click.option("--machine-token-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="0600 file holding the token to install; when it is empty or missing, "
                   "a new token is written to it.")
def bootstrap_user(user_id, roles, machine_token_file):
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
        accounts.put_user_and_token(user_id, role_list, token)
    except FleetError as exc:
        _fail(exc)
    if fresh and not machine_token_file:
        click.echo(token)


def _refuse(message: str):
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def _bootstrap_roles(raw: str) -> list[str]:
    roles = []
    for role in (part.strip() for part in raw.split(",")):
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
        raw = read_private(path, _TOKEN_FILE_MAX_BYTES)
    except FileNotFoundError:
        return ""
    except OpenToOthers:
        _refuse(f"{path}: secret file permissions must not allow group or other access "
                f"(chmod 600 {path})")
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


def _policy_options(fn):
    from app.projects.policy import RULES
    for name in reversed(list(RULES)):
        fn = click.option(f"--{name.replace('_', '-')}", name, default=None,
                          help=_POLICY_HELP.get(name) or _json_help(name))(fn)
    return fn


def _json_help(name: str) -> str:
    from app.projects.policy import HELP
    return "JSON value (null clears)" + (f": {HELP[name]}" if name in HELP else "")


_POLICY_HELP = {
    "kind": "generic, pdf or documents (fixed at creation)",
    "status": "active (default), draining or archived",
    "identity_mode": "external_id (default), unique_value or none (fixed at creation)",
    "claim_order": "fifo (default) or random; kept when omitted",
    "max_resets": "0..1000 (default 3)",
    "recommended_lease_seconds": "1..3600 (default 300)",
    "dispatch_qps": "jobs per second for the project; empty means unlimited",
    "worker_claim_qps": "claims per second per worker; empty means unlimited",
    "max_jobs_per_claim": "1..256 (0 means 256)",
    "client_versions": "comma-separated allowed worker client versions",
    "fallback_after_seconds": "FleetHQ only: 0..86400 (default 60), seconds a job waits before a "
                              "fallback-tier worker may take it",
}


def _text(raw: str):
    return raw


def _rate(raw: str):
    """tracker's QPS flags: empty (or FleetHQ's ``null``) means unlimited."""
    text = raw.strip()
    if text in ("", "null"):
        return None
    try:
        return float(text)
    except ValueError:
        return raw  # the policy check names the field and its range


def _integer(raw: str):
    try:
        return int(raw.strip())
    except ValueError:
        return raw


def _claim_batch(raw: str):
    value = _integer(raw)
    return 256 if value == 0 else value  # tracker: 0 means the largest batch


def _client_versions(raw: str):
    """tracker's parsing: comma-separated, each entry trimmed; empty means none."""
    if raw == "":
        return []
    versions = [v.strip() for v in raw.split(",")]
    if len(set(versions)) != len(versions):
        raise InvalidRequest("client_versions entries must be unique",
                             details={"field": "client_versions"})
    return versions


# SavewebHQ's tracker flags parse their values as tracker does; FleetHQ's own
# fields take JSON values (null clears a nullable one).
_PARSERS = {
    "kind": _text, "status": _text, "identity_mode": _text, "claim_order": _text,
    "dispatch_qps": _rate, "worker_claim_qps": _rate,
    "max_jobs_per_claim": _claim_batch, "max_resets": _integer,
    "recommended_lease_seconds": _integer, "client_versions": _client_versions,
}
# tracker put-project always sets these (their defaults when a flag is
# omitted) and leaves every other field of an existing project as it is.
_TRACKER_FIELDS = ("status", "dispatch_qps", "worker_claim_qps", "max_jobs_per_claim",
                   "max_resets", "recommended_lease_seconds", "client_versions")


def _parse_policy(values: dict) -> dict:
    fields = {}
    for name, raw in values.items():
        if raw is None or (raw == "" and name in ("identity_mode", "claim_order")):
            continue  # not given; tracker: an empty mode or order means the default
        parser = _PARSERS.get(name)
        if parser is not None:
            fields[name] = parser(raw)
            continue
        try:
            fields[name] = json.loads(raw)
        except ValueError:
            raise InvalidRequest(f"{name} must be a JSON value", details={"field": name}) from None
    return fields


def _one_value(name: str, positional, flag):
    if positional is not None and flag is not None and positional != flag:
        raise click.UsageError(f"give the {name} once (argument or flag)")
    value = flag if flag is not None else positional
    if value is None:
        raise click.UsageError(f"the {name} is required")
    return value


@fleet.command("put-project")
@database_url_option
@click.argument("project_id", required=False)
@click.option("--project-id", "project_id_flag", default=None, metavar="P",
              help="Project identifier (or give it as the argument).")
@click.option("--patch", is_flag=True, help="Change only the given fields.")
@_policy_options
def put_project(project_id, project_id_flag, patch, **values):
    """Create a project or change its policy (SavewebHQ's tracker put-project).

    Without --patch, an existing project gets the given fields, tracker's
    defaults for its omitted ones (status, both QPS, max jobs per claim, max
    resets, lease, client versions), and keeps everything else (claim order,
    FleetHQ's scheduling fields).
    """
    from app.errors import NotFound
    from app.projects import policy, service
    project_id = _one_value("project ID (--project-id)", project_id, project_id_flag)
    try:
        fields = _parse_policy(values)
        partial = patch
        if not patch:
            try:
                kind = service.view(project_id).kind
            except NotFound:
                kind = None
            if kind is not None:
                defaults = policy.defaults(kind)
                fields = {**{name: defaults[name] for name in _TRACKER_FIELDS}, **fields}
                partial = True
        project, created = service.put(project_id, fields, partial=partial)
        _emit({"created": created, **service.summary(project)})
    except FleetError as exc:
        _fail(exc)


@fleet.command("projects")
def list_projects():
    """List projects with their job counts."""
    from app.projects import service
    _emit(service.list_summaries())


# A local import reads a file the operator chose: tracker's limits, not the
# HTTP route's (SOURCE_MAX_*).
SOURCE_CLI_MAX_BYTES = 1 << 40
SOURCE_CLI_MAX_JOBS = 100_000_000


@fleet.command("enqueue-source")
@database_url_option
@click.argument("project_id", required=False)
@click.argument("source", type=click.File("rb"), required=False)
@click.option("--project-id", "project_id_flag", default=None, metavar="P",
              help="Existing project (or give it as the first argument).")
@click.option("--input", "input_file", type=click.File("rb"), default=None, metavar="FILE",
              help="jobs-jsonl-zstd-v1 source file, - for stdin (or the second argument).")
@click.option("--max-jobs", type=click.IntRange(min=1), default=SOURCE_CLI_MAX_JOBS,
              show_default=True, help="Stop with too_large past this many jobs.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Jobs per commit (default SOURCE_BATCH).")
def enqueue_source(project_id, source, project_id_flag, input_file, max_jobs, batch_size):
    """Import a jobs-jsonl-zstd-v1 file (streamed, committed in batches)."""
    from flask import current_app

    from app.projects import source_import
    from workers.source import Limits
    project_id = _one_value("project ID (--project-id)", project_id, project_id_flag)
    if source is not None and input_file is not None:
        raise click.UsageError("give the source file once (argument or --input)")
    stream = input_file or source
    if stream is None:
        raise click.UsageError("the source file (--input) is required")
    cfg = current_app.config
    limits = Limits(max_compressed=SOURCE_CLI_MAX_BYTES, max_expanded=SOURCE_CLI_MAX_BYTES,
                    max_jobs=max_jobs, max_line=cfg["SOURCE_MAX_LINE"],
                    max_window=cfg["SOURCE_MAX_WINDOW"])
    try:
        result = source_import.import_source(project_id, stream, limits=limits,
                                             batch_size=batch_size or cfg["SOURCE_BATCH"])
    except FleetError as exc:
        _fail(exc)
    _emit({"project_id": project_id, "jobs": result.jobs, "inserted": result.inserted,
           "uncompressed_bytes": result.uncompressed_bytes})


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


@fleet.command("audit")
@click.option("--actor", default=None, help="Only this actor (user:<id>, node:<id>, cli@<host>, system).")
@click.option("--action", default=None, help="Only this action; ending in '.' a prefix (node.).")
@click.option("--object", "obj", default=None, metavar="KIND[:ID]", help="Only this object (project:papers).")
@click.option("--limit", type=click.IntRange(1, audit.PAGE_MAX), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def audit_log(actor, action, obj, limit, as_json):
    """Print who did what, newest first."""
    kind, _, object_id = (obj or "").partition(":")
    entries = audit.listing(actor=actor, action=action, object_kind=kind or None,
                            object_id=object_id or None, limit=limit)["entries"]
    for e in entries:
        if as_json:
            click.echo(json.dumps({**e, "at": e["at"].isoformat()}, sort_keys=True, default=str))
            continue
        target = f"{e['object_kind']}:{e['object_id']}" if e["object_id"] else e["object_kind"]
        line = f"{e['at'].astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC  {e['actor']}  {e['action']}  {target}"
        if e["details"]:
            line += "  " + json.dumps(e["details"], sort_keys=True, separators=(",", ":"))
        if e["reason"]:
            line += f"  reason: {e['reason']}"
        click.echo(line)


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
@click.option("--reason", default=None, help="Why (kept in the audit log).")
def worker_action(action, worker_id, user_id, reason):
    """Approve, reject, drain, enable or revoke a node (or a token worker with --user)."""
    from app.fleet import service as fleet_service
    try:
        if user_id:
            worker = fleet_service.decide_token_worker(user_id, worker_id, action, reason=reason)
            _emit({"worker_id": worker.worker_id, "user_id": worker.user_id, "status": worker.status})
        else:
            node = fleet_service.decide(worker_id, action, actor="cli", reason=reason)
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
@click.option("--completion-timeout-seconds", type=int, default=3600, show_default=True,
              help="After a 202 answer, send the delivery again when no callback came within this.")
def add_hook(project_id, name, url, secret, completion_timeout_seconds):
    """Add a webhook consumer to a project (the secret is printed once).
    Assets the project archived before are delivered to it too (backfill)."""
    from app.hooks import consumers
    from app.projects import service
    try:
        service.get(project_id)
        _emit(consumers.create(project_id, name, url, secret,
                               completion_timeout_seconds=completion_timeout_seconds))
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
    # The target first: an unreachable FleetHQ database is reported before a
    # large source is read.
    db.session.execute(text("SELECT 1"))
    try:
        summary = savewebhq.run(source_url, dry_run=dry_run, batch=batch_size,
                                progress=lambda line: click.echo(f"import-savewebhq: {line}", err=True))
    except FleetError as exc:
        _fail(exc)
    _emit(summary)


def init_app(app) -> None:
    app.cli.add_command(fleet)


from app import cli_lanes  # noqa: E402,F401  (registers set-tier, remote, local-worker)
from app import cli_documents  # noqa: E402,F401  (registers documents add)
