"""Sign-in: GitHub OAuth (state + PKCE S256, scope ``read:org``), the
development login, logout, and the decorators every page view uses.

For page views (the admin pages build on these; the names are stable)::

    from app.pages.auth import admin_required, login_required_active, current_user

``login_required_active``
    The view needs a signed-in, active user. Signed out (or the session was
    revoked, or the user is no longer active) → redirect to ``/login?next=…``.
``admin_required``
    Same, and the user must hold role ``admin``; signed in without it → a
    403 page.
``current_user``
    flask-login's proxy: a ``sessions.SessionUser`` (``id``, ``roles``,
    ``github_login``, ``is_admin``, ``has(*roles)``, ``display_name``) or an
    anonymous user answering the same attributes. Roles are read from the
    database on every request.

Pages accept only this browser session; nothing here reads an
``Authorization`` header, so a machine token never opens a page.

Sign-in rules: ``app.accounts.signin``; the GitHub client: ``app.accounts.github``.
"""
from __future__ import annotations

import functools
import hmac
import logging
import time
from urllib.parse import urlsplit

from flask import Blueprint, abort, current_app, redirect, render_template, request, session, url_for
from flask_babel import gettext as _
from flask_login import LoginManager, current_user, login_user, logout_user
from sqlalchemy import text

from app.extensions import db
from app.accounts import github, signin
from app.pages import sessions
from app.pages.links import master_url
from app.ratelimit import limit_login

__all__ = ["admin_required", "bp", "current_user", "init_app", "login_required_active"]

log = logging.getLogger(__name__)
bp = Blueprint("auth", __name__)
login_manager = LoginManager()

DEV_USER = "dev-admin"
DEV_READER = "dev-reader"  # reads documents and progress; nothing else
LOOPBACK = ("127.0.0.1", "::1")
# A proxy on the same host makes every client look like loopback.
FORWARDED_HEADERS = ("X-Forwarded-For", "X-Real-IP", "Forwarded")
OAUTH_STATE_MAX_AGE_S = 600


def login_required_active(view):
    """Page view decorator: signed-in active user, else redirect to /login."""
    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        if not current_user.is_authenticated:
            return redirect(url_for("auth.login", next=request.full_path.rstrip("?")))
        return view(*args, **kwargs)
    return wrapped


def admin_required(view):
    """Page view decorator: signed-in admin; signed out → /login, no admin role → 403 page."""
    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        if not current_user.is_authenticated:
            return redirect(url_for("auth.login", next=request.full_path.rstrip("?")))
        if not current_user.is_admin:
            return render_template("auth/error.html", code=403, title=_("Admins only"),
                                   message=_("This page needs the admin role.")), 403
        return view(*args, **kwargs)
    return wrapped


def home_url() -> str:
    if current_user.is_admin:
        return "/admin"
    if current_user.has("reader") and not current_user.has("worker"):
        # A document service's readers come to read documents; an archive
        # team's readers to watch progress.
        has_documents = db.session.execute(text(
            "SELECT EXISTS (SELECT 1 FROM projects WHERE kind = 'documents')")).scalar()
        return url_for("documents_pages.index" if has_documents else "progress_pages.index")
    return url_for("worker_pages.index")


def _safe_next(target: str | None) -> str | None:
    """A local path to return to after sign-in; anything else is dropped
    (an open redirect would lend our name to phishing)."""
    if not target or len(target) > 2048 or "\\" in target or not target.isprintable():
        return None   # control characters (CR/LF) cannot go into a Location header
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return None
    return target


def dev_login_allowed() -> bool:
    return (bool(current_app.config.get("DEV_MODE")) and request.remote_addr in LOOPBACK
            and not any(h in request.headers for h in FORWARDED_HEADERS))


def _sign_in(user_id: str, next_url: str | None):
    if current_user.is_authenticated:  # signing in again replaces, not adds, a session
        sessions.end(current_user.get_id())
    session.clear()  # nothing from before sign-in (old CSRF token, oauth state) carries over
    lifetime = int(current_app.config["SESSION_LIFETIME_S"])
    user = sessions.load(sessions.start(user_id, lifetime))
    login_user(user)
    session.permanent = True
    return redirect(next_url or home_url(), 303)


@bp.get("/")
def root():
    return redirect(home_url() if current_user.is_authenticated else url_for("auth.login"))


@bp.get("/login")
def login():
    next_url = _safe_next(request.args.get("next"))
    if current_user.is_authenticated:
        return redirect(next_url or home_url())
    return render_template("auth/login.html", next_url=next_url or "",
                           github_ready=github.client() is not None,
                           dev_login=dev_login_allowed())


@bp.get("/auth/github/start")  # SavewebHQ's path (registered second: url_for keeps ours)
@bp.get("/login/github")
def github_start():
    # A plain link, not a form: Chromium applies the CSP's form-action 'self'
    # to the redirects that follow a form submission, which would block the
    # hop to GitHub. Nothing changes server-side here; the state and PKCE
    # verifier in the signed cookie protect the callback.
    limit_login()
    client = github.client()
    if client is None:
        abort(404)
    auth = client.start(_callback_url())
    session["oauth"] = {"state": auth.state, "verifier": auth.code_verifier, "at": int(time.time()),
                        "next": _safe_next(request.args.get("next"))}
    return redirect(auth.url, 303)


def _callback_url() -> str:
    # Behind a proxy the Host header is not to be trusted: PUBLIC_URL wins.
    # GITHUB_CALLBACK_PATH: the path registered with the GitHub OAuth App
    # (SavewebHQ's apps have /auth/github/callback); both paths are served.
    return master_url() + current_app.config["GITHUB_CALLBACK_PATH"]


def _failed(code: int, title: str, message: str):
    return render_template("auth/error.html", code=code, title=title, message=message), code


@bp.get("/auth/github/callback")  # SavewebHQ's path
@bp.get("/login/github/callback")
def github_callback():
    limit_login()
    client = github.client()
    pending = session.pop("oauth", None)
    if client is None:
        abort(404)
    state = request.args.get("state", "")
    if (not isinstance(pending, dict)
            or not hmac.compare_digest(str(pending.get("state")).encode(), state.encode())
            or time.time() - pending.get("at", 0) > OAUTH_STATE_MAX_AGE_S):
        return _failed(400, _("Sign-in expired"),
                       _("The sign-in could not be matched to this browser. Please start again."))
    if request.args.get("error") or not request.args.get("code"):
        return _failed(403, _("Sign-in cancelled"), _("GitHub did not grant access."))
    try:
        access_token = client.exchange(request.args["code"], _callback_url(), pending["verifier"])
        identity = client.identity(access_token)
        is_admin = client.is_admin(access_token, identity.login)
    except github.SignInRefused:
        return _failed(403, _("Sign-in refused"), _("GitHub refused the sign-in. Please start again."))
    except github.GitHubError as exc:
        log.warning("github sign-in failed: %s", exc)
        return _failed(502, _("GitHub unavailable"), _("GitHub could not be reached. Try again shortly."))
    del access_token  # used for these three calls only; never stored
    user_id, status = signin.reconcile(identity, is_admin)
    log.info("github sign-in user=%s login=%s admin=%s status=%s", user_id, identity.login,
             is_admin, status)
    if status == "pending":
        return render_template("auth/pending.html", user_id=user_id, login=identity.login)
    if status != "active":
        return _failed(403, _("Account suspended"), _("Your account is suspended. Ask an admin."))
    return _sign_in(user_id, pending.get("next"))


@bp.post("/login/dev")
def dev_login():
    if not dev_login_allowed():
        abort(404)
    limit_login()
    from app.accounts import service as accounts
    if request.form.get("as") == "reader":
        accounts.put_user(DEV_READER, ["reader"], "active")
        return _sign_in(DEV_READER, _safe_next(request.form.get("next")))
    accounts.put_user(DEV_USER, ["admin", "worker"], "active")
    return _sign_in(DEV_USER, _safe_next(request.form.get("next")))


@bp.post("/logout")
def logout():
    if current_user.is_authenticated:
        sessions.end(current_user.get_id())
    logout_user()
    session.clear()
    return redirect(url_for("auth.login"), 303)


def _hide_dev_login():
    # Runs before CSRF and routing errors so that, outside development on
    # loopback, /login/dev answers 404 to any method: it does not exist.
    if request.path == "/login/dev" and not dev_login_allowed():
        abort(404)


def init_app(app) -> None:
    login_manager.init_app(app)
    login_manager.user_loader(sessions.load)
    login_manager.anonymous_user = sessions.AnonymousUser
    # Revocation is server-side (sessions.py); flask-login's IP/User-Agent
    # fingerprint would add nothing but false sign-outs.
    login_manager.session_protection = None
    app.before_request_funcs.setdefault(None, []).insert(0, _hide_dev_login)
