"""``flask fleet`` users and machine tokens: bootstrap-user (SavewebHQ's
``tracker bootstrap-user``), users, put-user, rotate-token, revoke-token."""
from __future__ import annotations

import os
import sys

import click

from app.accounts import service as accounts
from app.accounts import tokens
from app.accounts.models import ROLES
from app.cli.group import database_url_option, emit, fail, fleet
from app.cli.tables import Column, answer, json_option, key, when
from app.errors import FleetError
from workers.wire.private_file import OpenToOthers, read_private
from workers.wire.protocol import is_identifier


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
        token = accounts.new_machine_token()
        if machine_token_file:
            # Written before it is installed: if installing fails, running
            # the command again installs the token the file holds.
            _write_token_file(machine_token_file, token)
    try:
        accounts.put_user_and_token(user_id, role_list, token)
    except FleetError as exc:
        fail(exc)
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


USER_COLUMNS = [key("user_id", "USER"), key("status"), key("roles"), key("has_machine_token", "TOKEN"),
                Column("CREATED", lambda u: when(u["created_at"]))]


@fleet.command("users")
@json_option
def list_users(as_json):
    """List users."""
    answer([accounts.user_dict(u) for u in accounts.list_users()], USER_COLUMNS, as_json, empty="(no users)")


@fleet.command("put-user")
@click.argument("user_id")
@click.option("--roles", default="")
@click.option("--status", default="active", type=click.Choice(["active", "pending", "suspended"]))
def put_user(user_id, roles, status):
    """Create a user or change its roles and status."""
    try:
        user, _ = accounts.put_user(user_id, [r for r in roles.split(",") if r], status)
        emit(accounts.user_dict(user))
    except FleetError as exc:
        fail(exc)


@fleet.command("rotate-token")
@click.argument("user_id")
def rotate_token(user_id):
    """Issue a new machine token for a user (printed once)."""
    try:
        click.echo(accounts.rotate_token(user_id))
    except FleetError as exc:
        fail(exc)


@fleet.command("revoke-token")
@click.argument("user_id")
def revoke_token(user_id):
    """Revoke a user's machine token."""
    try:
        accounts.revoke_token(user_id)
    except FleetError as exc:
        fail(exc)
