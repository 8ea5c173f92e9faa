"""Users and their machine tokens."""
from __future__ import annotations

import hmac
import threading
import time
from dataclasses import dataclass

from flask import current_app
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError

from app import audit
from app.accounts import sealing, tokens
from app.accounts.models import ROLES, USER_STATUSES, MachineToken, User
from app.errors import InvalidRequest, InvalidToken, NotFound
from app.extensions import app_cache, db
from app.fleet.service import NODE_SECRET_PREFIX
from workers.wire.protocol import is_identifier


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of a machine API request."""
    user_id: str | None
    roles: frozenset
    node_id: str | None = None
    node_status: str | None = None
    # A user's status; their token authenticates whatever it is, and routes
    # that need a role want an active user.
    user_status: str | None = None

    def has(self, *roles: str) -> bool:
        return any(role in self.roles for role in roles)


def _validate_user(user_id, roles, status) -> None:
    if not is_identifier(user_id):
        raise InvalidRequest("user id must be 1..128 of [A-Za-z0-9._:-]", details={"field": "user_id"})
    if not isinstance(roles, list) or any(r not in ROLES for r in roles):
        raise InvalidRequest(f"roles must be a list drawn from {', '.join(ROLES)}",
                             details={"field": "roles"})
    if status not in USER_STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(USER_STATUSES)}",
                             details={"field": "status"})


def put_user(user_id: str, roles: list[str], status: str = "active", *,
             keep: tuple[str, ...] = ()) -> tuple[User, bool]:
    """Create or replace a user's roles and status. Commits.

    Parameters:
        keep: roles the user keeps if they have them, whatever ``roles`` says
            (a caller that cannot name them must not remove them).
    """
    user, created = _put_user(user_id, roles, status, keep)
    db.session.commit()
    return user, created


def put_user_and_token(user_id: str, roles: list[str], token: str) -> None:
    """Make ``user_id`` an active user with exactly ``roles`` and ``token``
    as machine token, in one transaction (``bootstrap-user``). Commits.

    Raises:
        InvalidRequest: a bad user id, role or token.
    """
    try:
        _put_user(user_id, roles, "active", ())
        db.session.flush()
        _install(user_id, token)
        audit.record("token.install", "user", user_id)
    except Exception:
        db.session.rollback()
        raise
    db.session.commit()


def _put_user(user_id, roles, status, keep) -> tuple[User, bool]:
    _validate_user(user_id, roles, status)
    user = db.session.get(User, user_id)
    created = user is None
    if created:
        user = User(id=user_id)
        db.session.add(user)
    kept = [role for role in (user.roles or ()) if role in keep]
    before = (None, None) if created else (list(user.roles or ()), user.status)
    user.roles = sorted(set(roles) | set(kept))
    user.status = status
    user.updated_at = db.func.now()
    if created:
        audit.record("user.create", "user", user_id, {"roles": user.roles, "status": status})
    elif before != (user.roles, status):
        audit.record("user.update", "user", user_id, {
            "roles": {"from": before[0], "to": user.roles}, "status": {"from": before[1], "to": status}})
    return user, created


def get_user(user_id: str) -> User:
    user = db.session.get(User, user_id)
    if user is None:
        raise NotFound(f"user {user_id!r} not found", details={"user_id": user_id})
    return user


def delete_user(user_id: str) -> None:
    db.session.delete(get_user(user_id))
    audit.record("user.delete", "user", user_id)
    db.session.commit()


def list_users(limit: int = 500) -> list[User]:
    return list(db.session.scalars(select(User).order_by(User.id).limit(limit)))


# The roles SavewebHQ's contract knows; FleetHQ's ``reader`` is not listed there.
SAVEWEBHQ_ROLES = ("admin", "worker")


def user_summaries() -> list[dict]:
    """Every user as SavewebHQ's ``AdminUserSummary``, in id order."""
    rows = db.session.execute(text(
        "SELECT u.id, u.github_login, u.status, u.roles, u.created_at, u.updated_at, "
        "t.token_hash, t.sealed FROM users u LEFT JOIN machine_tokens t ON t.user_id = u.id "
        "ORDER BY u.id")).all()
    out = []
    for user_id, login, status, roles, created, updated, token_hash, sealed in rows:
        summary = {"id": user_id}
        if login:
            summary["github_login"] = login
        summary.update(
            status=status, roles=[r for r in roles if r in SAVEWEBHQ_ROLES],
            machine_token_active=token_hash is not None,
            machine_token_viewable=viewable(user_id, token_hash, sealed),
            created_at=int(created.timestamp()), updated_at=int(updated.timestamp()))
        out.append(summary)
    return out


def user_dict(user: User) -> dict:
    token = db.session.get(MachineToken, user.id)
    return {"user_id": user.id, "status": user.status, "roles": list(user.roles),
            "has_machine_token": token is not None,
            "created_at": int(user.created_at.timestamp()),
            "updated_at": int(user.updated_at.timestamp())}


def install_token(user_id: str, token: str) -> None:
    """Make ``token`` the user's machine token (the previous one stops
    working). Any well-formed token may be installed, e.g. one carried over
    from SavewebHQ. Commits.

    Raises:
        InvalidRequest: a token that could never authenticate, one shaped
            like an enrolled-node secret, or one another user holds.
        NotFound: no such user.
    """
    get_user(user_id)
    _install(user_id, token)
    audit.record("token.install", "user", user_id)
    db.session.commit()


def new_machine_token() -> str:
    """A fresh machine token with the installation's prefix (``fhq_``, or
    ``hq_`` where SavewebHQ's tokens are kept, MACHINE_TOKEN_PREFIX)."""
    return tokens.new_secret(current_app.config.get("MACHINE_TOKEN_PREFIX") or tokens.USER_TOKEN_PREFIX)


def rotate_token(user_id: str) -> str:
    """Issue a new machine token (the old one stops working). Commits.

    Returns:
        The token in clear.
    """
    get_user(user_id)
    token = new_machine_token()
    _install(user_id, token)
    audit.record("token.rotate", "user", user_id)
    db.session.commit()
    return token


def _install(user_id: str, token: str) -> None:
    reason = tokens.refusal(token)
    if reason is None and token.startswith(NODE_SECRET_PREFIX):
        reason = f"tokens starting with {NODE_SECRET_PREFIX} are enrolled-node secrets"
    if reason is not None:
        raise InvalidRequest(reason, details={"field": "token"})
    token_hash = tokens.digest(token)
    holder = db.session.execute(text("SELECT user_id FROM machine_tokens WHERE token_hash = :h"),
                                {"h": token_hash}).scalar()
    if holder is not None and holder != user_id:
        raise InvalidRequest("this token is already another user's machine token",
                             details={"field": "token"})
    key = _sealing_key()
    sealed = sealing.seal(key, user_id, token_hash, token) if key is not None else None
    # Installing the same token again (bootstrap-user run twice) keeps its
    # history; a different token starts afresh.
    statement = text(
        "INSERT INTO machine_tokens (user_id, token_hash, sealed) VALUES (:u, :h, :s) "
        "ON CONFLICT (user_id) DO UPDATE SET token_hash = EXCLUDED.token_hash, "
        "sealed = EXCLUDED.sealed, "
        "created_at = CASE WHEN machine_tokens.token_hash = EXCLUDED.token_hash "
        "THEN machine_tokens.created_at ELSE now() END, "
        "last_used_at = CASE WHEN machine_tokens.token_hash = EXCLUDED.token_hash "
        "THEN machine_tokens.last_used_at END")
    try:
        with db.session.begin_nested():
            db.session.execute(statement, {"u": user_id, "h": token_hash, "s": sealed})
    except IntegrityError:  # another user got the same token in the meantime
        raise InvalidRequest("this token is already another user's machine token",
                             details={"field": "token"}) from None


def _sealing_key() -> str | bytes | None:
    """The secret that seals and opens token copies; None when tokens are
    not to be viewable, or the secret key is this process's own (unset)."""
    config = current_app.config
    if not config["MACHINE_TOKENS_VIEWABLE"] or config.get("SECRET_KEY_GENERATED"):
        return None
    return config["SECRET_KEY"]


def view_token(user_id: str) -> str | None:
    """The user's current machine token in clear, or None: no such user or
    token, tokens configured as not viewable, or a sealed copy that no
    longer opens (the secret key changed)."""
    key = _sealing_key()
    if key is None:
        return None
    row = db.session.execute(text(
        "SELECT token_hash, sealed FROM machine_tokens WHERE user_id = :u"), {"u": user_id}).first()
    if row is None:
        return None
    return sealing.unseal(key, user_id, row[0], row[1])


def viewable(user_id: str, token_hash: str | None, sealed: bytes | None) -> bool:
    """Whether :func:`view_token` would answer for this stored row (listings
    already hold the columns)."""
    key = _sealing_key()
    if key is None or token_hash is None or sealed is None:
        return False
    return sealing.unseal(key, user_id, token_hash, sealed) is not None


def revoke_token(user_id: str) -> bool:
    """Delete the user's machine token. Commits.

    Returns:
        Whether there was one.

    Raises:
        NotFound: no such user.
    """
    get_user(user_id)
    deleted = end_token(user_id)
    db.session.commit()
    return deleted


def end_token(user_id: str) -> bool:
    """Delete the user's machine token in the open transaction (the caller
    commits): every worker using it is refused from the next request on.
    Returns whether there was one."""
    deleted = db.session.execute(text("DELETE FROM machine_tokens WHERE user_id = :u"),
                                 {"u": user_id}).rowcount
    if deleted:
        audit.record("token.revoke", "user", user_id)
    return deleted > 0


def token_metadata(user_id: str) -> dict:
    get_user(user_id)
    token = db.session.get(MachineToken, user_id)
    if token is None:
        return {"user_id": user_id, "exists": False, "viewable": False, "created_at": None,
                "last_used_at": None}
    last = token.last_used_at
    return {"user_id": user_id, "exists": True,
            "viewable": viewable(user_id, token.token_hash, token.sealed),
            "created_at": int(token.created_at.timestamp()),
            "last_used_at": int(last.timestamp()) if last else None}


# Writing last_used_at on every request would turn each read into a write;
# once a minute per token per process is plenty for an admin to see activity.
_TOUCH_EVERY_S = 60.0
_touched_lock = threading.Lock()


# In this order (authenticate reads them so), named to share a row with others.
TOKEN_LOOKUP_COLUMNS = "u.id AS user_id, u.roles AS user_roles, u.status AS user_status, t.token_hash"
TOKEN_LOOKUP_FROM = "machine_tokens t JOIN users u ON u.id = t.user_id"
# A token is found by FleetHQ's digest (:h) or, imported from SavewebHQ
# without its clear text, by SavewebHQ's (:s); FleetHQ's wins a tie.
TOKEN_LOOKUP_WHERE = "t.token_hash IN (:h, :s) ORDER BY t.token_hash = :h DESC LIMIT 1"


def lookup_params(bearer: str) -> dict:
    return {"h": tokens.digest(bearer), "s": tokens.savewebhq_key(bearer)}


def authenticate(bearer: str, *, row=None) -> Principal:
    """Resolve a bearer token to its user, whatever the user's status (as
    SavewebHQ: whoami answers a pending user's id; routes needing a role
    refuse users who are not active).

    Parameters:
        row: the ``TOKEN_LOOKUP_COLUMNS`` of this token when the caller already
            fetched them together with other data (one round trip per request).

    Raises:
        InvalidToken: malformed, unknown or revoked.
    """
    if not tokens.well_formed(bearer):
        raise InvalidToken("invalid machine token")
    params = lookup_params(bearer)
    if row is None:
        row = db.session.execute(text(
            f"SELECT {TOKEN_LOOKUP_COLUMNS} FROM {TOKEN_LOOKUP_FROM} WHERE {TOKEN_LOOKUP_WHERE}"),
            params).first()
    if row is None or row[0] is None:
        raise InvalidToken("invalid machine token")
    if hmac.compare_digest(row[3], params["s"]):
        # Stamp the row this token is stored under after its adoption, never
        # another user's row that already held the plain digest.
        _touch(params["h"] if _adopt_imported(row[0], bearer, params["s"]) else params["s"])
    elif not hmac.compare_digest(row[3], params["h"]):
        raise InvalidToken("invalid machine token")
    else:
        _touch(params["h"])
    return Principal(user_id=row[0], roles=frozenset(row[1]), user_status=row[2])


def _adopt_imported(user_id: str, token: str, savewebhq_key: str) -> bool:
    """The first use of a token imported by its SavewebHQ digest reveals it:
    store it under FleetHQ's digest, sealed, so that it becomes viewable.
    Best effort: the token works either way. Returns whether it moved."""
    token_hash = tokens.digest(token)
    key = _sealing_key()
    sealed = sealing.seal(key, user_id, token_hash, token) if key is not None else None
    try:
        with db.session.begin_nested():
            db.session.execute(text(
                "UPDATE machine_tokens SET token_hash = :h, sealed = :sealed "
                "WHERE user_id = :u AND token_hash = :s"),
                {"h": token_hash, "sealed": sealed, "u": user_id, "s": savewebhq_key})
        db.session.commit()
    except IntegrityError:  # another user holds the same token under FleetHQ's digest
        db.session.rollback()
        return False
    return True


TOUCH_SQL = "UPDATE machine_tokens SET last_used_at = now() WHERE token_hash = :h"


def touch_due(token_hash: str, app=None) -> bool:
    """Whether a use of this token should now be stamped (``TOUCH_SQL``): at
    most once a minute per token and process. Counts as stamped from now."""
    now = time.monotonic()
    touched: dict[str, float] = app_cache("tokens_touched", app)
    with _touched_lock:
        due = now - touched.get(token_hash, -_TOUCH_EVERY_S) >= _TOUCH_EVERY_S
        if due:
            if len(touched) > 100_000:
                touched.clear()
            touched[token_hash] = now
    return due


def _touch(token_hash: str) -> None:
    if touch_due(token_hash):
        db.session.execute(text(TOUCH_SQL), {"h": token_hash})
        db.session.commit()
