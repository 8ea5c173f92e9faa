"""Who a GitHub sign-in makes of a person: the user row it creates or
updates, and whether that user may have a page session.

The user id of a GitHub user is ``gh-<numeric GitHub id>`` (logins can be
renamed and reused; ids cannot), or ``gh_<id>`` when a user of that spelling
was imported from SavewebHQ;
``github_login`` keeps the current login. Members of ``GITHUB_ORG`` /
``GITHUB_ADMIN_TEAM`` become active with roles admin+worker; at every sign-in
a non-member loses ``admin``. A new non-member is created ``pending`` with
role worker and gets no session until an admin sets them active. A
suspended user stays suspended whatever the team says.
"""
from __future__ import annotations

from sqlalchemy import text

from app.accounts import github
from app.extensions import db

_RECONCILE = text("""
INSERT INTO users (id, status, roles, github_login)
VALUES (:id, CASE WHEN :admin THEN 'active' ELSE 'pending' END,
        CASE WHEN :admin THEN ARRAY['admin', 'worker'] ELSE ARRAY['worker'] END, :login)
ON CONFLICT (id) DO UPDATE SET
    github_login = EXCLUDED.github_login,
    roles = CASE WHEN :admin
                 THEN ARRAY(SELECT DISTINCT r FROM unnest(users.roles || ARRAY['admin', 'worker']) r
                            ORDER BY r)
                 ELSE array_remove(users.roles, 'admin') END,
    status = CASE WHEN :admin AND users.status = 'pending' THEN 'active' ELSE users.status END,
    updated_at = now()
RETURNING id, status
""")


def _user_id_of(identity: github.Identity) -> str:
    """``gh-<id>``, or ``gh_<id>`` for a user imported from SavewebHQ (its
    spelling), so an imported admin signs in as the same user."""
    imported = f"gh_{identity.id}"
    exists = db.session.execute(text("SELECT 1 FROM users WHERE id = :id"), {"id": imported}).first()
    return imported if exists else f"gh-{identity.id}"


def reconcile(identity: github.Identity, is_admin: bool) -> tuple[str, str]:
    """Apply the sign-in rules (module docstring) in one statement. Commits.

    Returns:
        (user id, status after sign-in)
    """
    row = db.session.execute(_RECONCILE, {"id": _user_id_of(identity), "login": identity.login,
                                          "admin": bool(is_admin)}).one()
    db.session.commit()
    return row[0], row[1]
