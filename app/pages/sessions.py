"""Server-side records of browser sessions, so that sessions can be revoked.

Flask's cookie is signed, not stored: on its own it could not be ended
before it expires. The cookie therefore carries only a random session id
(flask-login's ``_user_id`` holds it, see ``SessionUser.get_id``) and every
request resolves it here, in one query joined with ``users``:

- logout deletes the row (``end``);
- ``end_user_sessions`` deletes all rows of a user ("sign out everywhere";
  call it when an admin wants someone out now);
- a user who is suspended, pending or deleted matches nothing (status is
  checked in the query; deletion cascades), so their next request is
  anonymous;
- ``expires_at`` bounds a session absolutely (``SESSION_LIFETIME_S``).

Roles are read from ``users`` on every request too, so a role change
(admin removed at the next GitHub login) applies to every open session.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy import text

from app import audit
from app.accounts import tokens
from app.extensions import db

# token_urlsafe(32) is 43 characters; anything much longer is not ours.
_MAX_ID_CHARS = 64


@dataclass(frozen=True)
class SessionUser:
    """``current_user`` of a signed-in page request (flask-login protocol).

    ``id`` is the user id; ``get_id()`` is the *session* id that flask-login
    keeps in the cookie, so that resolving the cookie goes through the
    revocable record.
    """
    id: str
    roles: frozenset
    github_login: str | None
    session_id: str

    is_authenticated = True
    is_active = True
    is_anonymous = False

    def get_id(self) -> str:
        return self.session_id

    def has(self, *roles: str) -> bool:
        return any(role in self.roles for role in roles)

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    @property
    def display_name(self) -> str:
        return self.github_login or self.id


class AnonymousUser:
    """``current_user`` when signed out; answers the same questions."""
    id = None
    roles = frozenset()
    github_login = None
    is_authenticated = False
    is_active = False
    is_anonymous = True
    is_admin = False
    display_name = ""

    def get_id(self):
        return None

    def has(self, *roles: str) -> bool:
        return False


def start(user_id: str, lifetime_s: int) -> str:
    """Record a new session for ``user_id``. Commits.

    Returns:
        The session id, for the cookie only (its SHA-256 is stored).
    """
    session_id = secrets.token_urlsafe(32)
    # Tidy this user's expired rows while we are here: sessions are few per
    # user and this keeps the table from growing without a sweeper.
    db.session.execute(text("DELETE FROM page_sessions WHERE user_id = :u AND expires_at <= now()"),
                       {"u": user_id})
    db.session.execute(text(
        "INSERT INTO page_sessions (id_hash, user_id, expires_at) "
        "VALUES (:h, :u, now() + make_interval(secs => :s))"),
        {"h": tokens.digest(session_id), "u": user_id, "s": int(lifetime_s)})
    db.session.commit()
    return session_id


_LOAD = text("""
SELECT u.id, u.roles, u.github_login
FROM page_sessions s JOIN users u ON u.id = s.user_id
WHERE s.id_hash = :h AND s.expires_at > now() AND u.status = 'active'
""")


def load(session_id: str | None) -> SessionUser | None:
    """The signed-in user of this session id, or None when the session was
    ended, expired, or its user is no longer active."""
    if not session_id or len(session_id) > _MAX_ID_CHARS:
        return None
    row = db.session.execute(_LOAD, {"h": tokens.digest(session_id)}).first()
    if row is None:
        return None
    audit.acting_as(f"user:{row[0]}")  # whatever this request changes, this user did
    return SessionUser(id=row[0], roles=frozenset(row[1]), github_login=row[2],
                       session_id=session_id)


def end(session_id: str | None) -> None:
    """End one session (logout). Commits."""
    if not session_id or len(session_id) > _MAX_ID_CHARS:
        return
    db.session.execute(text("DELETE FROM page_sessions WHERE id_hash = :h"),
                       {"h": tokens.digest(session_id)})
    db.session.commit()


def end_user_sessions(user_id: str) -> int:
    """End every session of ``user_id``. Commits.

    Returns:
        How many sessions were ended.
    """
    result = db.session.execute(text("DELETE FROM page_sessions WHERE user_id = :u"), {"u": user_id})
    db.session.commit()
    return result.rowcount


def count_active(user_id: str) -> int:
    """Open (unexpired) sessions of ``user_id``, for the users page."""
    return db.session.execute(text(
        "SELECT count(*) FROM page_sessions WHERE user_id = :u AND expires_at > now()"),
        {"u": user_id}).scalar_one()
