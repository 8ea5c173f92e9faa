"""``/admin/users``: status (activate pending users), roles, machine tokens
(view again, rotate, revoke) and open browser sessions (sign out everywhere)."""
from __future__ import annotations

from flask import render_template, request
from flask_babel import gettext as _, ngettext

from app.accounts import service as accounts
from app.accounts.models import ROLES, USER_STATUSES
from app.errors import InvalidRequest, NotFound
from app.pages import sessions
from app.pages.admin import lookups as admin_lookups
from app.pages.admin.base import actor, attempt, bp, refuse, shown_once


@bp.get("/users")
def users():
    rows = admin_lookups.users_overview()
    pending = [r for r in rows if r["status"] == "pending"]
    return render_template("admin/users.html", users=rows, pending=pending, roles=ROLES,
                           statuses=USER_STATUSES, me=actor())


def _guard_self(user_id: str, roles: list[str], status: str) -> None:
    """An admin cannot lock themselves out by mistake; another admin can."""
    if user_id == actor() and ("admin" not in roles or status != "active"):
        raise InvalidRequest("you cannot remove your own admin role or deactivate yourself; "
                             "ask another admin")


@bp.post("/users")
def create_user():
    user_id = request.form.get("user_id", "").strip()
    roles = request.form.getlist("roles")

    def create():
        try:
            accounts.get_user(user_id)
        except NotFound:
            return accounts.put_user(user_id, roles, request.form.get("status", "active"))[0]
        raise InvalidRequest(f"user {user_id!r} already exists")

    return attempt(create, lambda u: _("User %(id)s created (%(status)s).", id=u.id, status=u.status), "admin.users")


@bp.post("/users/<segment:user_id>")
def update_user(user_id):
    roles = request.form.getlist("roles")
    status = request.form.get("status", "")

    def save():
        accounts.get_user(user_id)
        _guard_self(user_id, roles, status)
        return accounts.put_user(user_id, roles, status)[0]

    return attempt(save, lambda u: _("User %(id)s: %(status)s, roles %(roles)s.", id=u.id, status=u.status,
                                     roles=", ".join(u.roles) or _("none")), "admin.users")


@bp.post("/users/<segment:user_id>/activate")
def activate_user(user_id):
    def activate():
        user = accounts.get_user(user_id)
        if user.status == "active":
            raise InvalidRequest(f"user {user_id!r} is already active")
        # A pending user signed in as a worker; activating them is what lets them in.
        roles = list(user.roles) or ["worker"]
        return accounts.put_user(user_id, roles, "active")[0]

    return attempt(activate, lambda u: _("User %(id)s is active; they can sign in now.", id=u.id),
                   "admin.users")


@bp.post("/users/<segment:user_id>/token")
def rotate_token(user_id):
    try:
        token = accounts.rotate_token(user_id)
    except NotFound as exc:
        return refuse(exc.message, "admin.users")
    return shown_once("admin/token.html", user_id=user_id, token=token, rotated=True,
                      viewable=accounts.view_token(user_id) is not None)


@bp.post("/users/<segment:user_id>/token/view")
def view_token(user_id):
    """The current token again, behind a POST (CSRF-checked, never cached) so
    that the users page itself never carries a token."""
    token = accounts.view_token(user_id)
    if token is None:
        return refuse(_("The machine token of %(user_id)s cannot be shown: there is none, tokens "
                        "are not kept viewable, or it was sealed under another secret key. "
                        "Rotate it to get a new one.", user_id=user_id), "admin.users")
    return shown_once("admin/token.html", user_id=user_id, token=token, rotated=False,
                      viewable=True)


@bp.post("/users/<segment:user_id>/token/revoke")
def revoke_token(user_id):
    if request.form.get("confirm") != "yes":
        return refuse(_("Tick the confirmation box to revoke the token."), "admin.users")
    return attempt(lambda: accounts.revoke_token(user_id),
                   _("Machine token of %(user_id)s revoked.", user_id=user_id), "admin.users")


@bp.post("/users/<segment:user_id>/delete")
def delete_user(user_id):
    """As the API's DELETE: the user goes, and their machine token and
    browser sessions with them."""
    if request.form.get("confirm") != "yes":
        return refuse(_("Tick the confirmation box to delete %(user_id)s.", user_id=user_id), "admin.users")
    if user_id == actor():
        return refuse(_("You cannot delete yourself; ask another admin."), "admin.users")
    return attempt(lambda: accounts.delete_user(user_id), _("User %(user_id)s deleted.", user_id=user_id),
                   "admin.users")


@bp.post("/users/<segment:user_id>/sessions/end")
def end_sessions(user_id):
    return attempt(lambda: sessions.end_user_sessions(user_id),
                   lambda n: ngettext("%(num)s browser session of %(user_id)s ended.",
                                      "%(num)s browser sessions of %(user_id)s ended.", n, user_id=user_id),
                   "admin.users")
