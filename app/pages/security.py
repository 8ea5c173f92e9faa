"""Security plumbing of the pages: cookie flags, CSRF, response headers, and
the fixed-window rate limiter shared by login and enrollment.

Rate limiting is a counter per key in PostgreSQL (``rate_limits``), bumped by
one ``INSERT … ON CONFLICT DO UPDATE`` in its own short transaction. Why not
in-process: gunicorn runs several workers (and maybe several hosts), each of
which would count separately, multiplying the limit and forgetting it at
every restart. The price is one round trip per login or enrollment attempt,
which are rare and already talk to the database. Fixed windows (aligned to
multiples of ``per_seconds``) are crude: a burst straddling a boundary gets
up to twice the limit, which is fine for slowing down guessing.
"""
from __future__ import annotations

import math
import random
from datetime import timedelta

from flask import current_app, render_template, request
from flask_babel import gettext as _
from flask_babel import lazy_gettext
from flask_wtf.csrf import CSRFError, CSRFProtect
from sqlalchemy import text

from app.errors import RateLimited
from app.extensions import db

csrf = CSRFProtect()

HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; "
                                "base-uri 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}

# Keys are built from client addresses and scope names; bound them so a
# hostile header cannot grow the table's keys without limit.
MAX_KEY_CHARS = 200


class TooManyAttempts(RateLimited):
    """429 with Retry-After: a rate-limited key used up its window."""
    code = "rate_limited"


_BUMP = text("""
INSERT INTO rate_limits AS r (key, window_end, hits)
VALUES (:k, to_timestamp((floor(extract(epoch FROM now()) / :per) + 1) * :per), 1)
ON CONFLICT (key) DO UPDATE SET
    hits = CASE WHEN r.window_end = EXCLUDED.window_end THEN r.hits + 1 ELSE 1 END,
    window_end = EXCLUDED.window_end
RETURNING hits, extract(epoch FROM window_end - now())
""")


def rate_limit(key: str, limit: int, per_seconds: int) -> None:
    """Count one hit for ``key``; at most ``limit`` hits per ``per_seconds`` window.

    The count commits on its own connection, so attempts that fail later
    in the request still count.

    Raises:
        TooManyAttempts: over the limit; ``retry_after_ms`` is the time left
            in the window. Pages answer 429 with ``Retry-After``; under
            ``/api/`` the error envelope does (code ``rate_limited``).
    """
    if limit < 1 or per_seconds < 1:
        raise ValueError("limit and per_seconds must be at least 1")
    with db.engine.begin() as conn:
        hits, left_s = conn.execute(_BUMP, {"k": key[:MAX_KEY_CHARS], "per": int(per_seconds)}).one()
        # Expired windows of keys never seen again would pile up; a cheap
        # sweep now and then keeps the table at the size of recent traffic.
        if random.random() < 0.01:
            conn.execute(text("DELETE FROM rate_limits WHERE window_end < now()"))
    if hits > limit:
        raise TooManyAttempts("too many attempts, try again later",
                              details={"limit": limit, "per_seconds": per_seconds},
                              retry_after_ms=max(1000, math.ceil(float(left_s) * 1000)))


def client_key(scope: str) -> str:
    """``scope:remote address``. Behind a reverse proxy the address is the
    proxy's unless the deployment applies ProxyFix (docs/pages.md)."""
    return f"{scope}:{request.remote_addr or '-'}"


def limit_login() -> None:
    """The limit shared by every sign-in entry point (per client address)."""
    cfg = current_app.config
    rate_limit(client_key("login"), int(cfg.get("LOGIN_RATE_LIMIT", 20)),
               int(cfg.get("LOGIN_RATE_WINDOW_S", 60)))


def limit_enrollment() -> None:
    """For ``POST /api/v1/fleet/register`` (per client address): call it first
    thing in the view; the API's error envelope answers 429."""
    cfg = current_app.config
    rate_limit(client_key("enroll"), int(cfg.get("ENROLL_RATE_LIMIT", 10)),
               int(cfg.get("ENROLL_RATE_WINDOW_S", 60)))


def _is_api() -> bool:
    return request.path.startswith("/api/")


def _cookie_secure(cfg) -> bool:
    # Secure everywhere except plain-HTTP development: a cookie that leaks
    # over HTTP once is a stolen session.
    https = (cfg.get("PREFERRED_URL_SCHEME") == "https"
             or str(cfg.get("PUBLIC_URL") or "").startswith("https://"))
    return https or not cfg.get("DEV_MODE")


# HTTP errors a browser meets, as pages in the reader's language; the API
# keeps its JSON envelope (app/api answers those itself).
PAGE_ERRORS = "fleethq.page_errors"
_HTTP_PAGES = {
    400: (lazy_gettext("Bad request"), lazy_gettext("The request could not be understood.")),
    403: (lazy_gettext("Not allowed"), lazy_gettext("You do not have access to this page.")),
    404: (lazy_gettext("Not found"), lazy_gettext("There is no such page, or what it showed is gone.")),
    405: (lazy_gettext("Method not allowed"), lazy_gettext("This page does not take that kind of request.")),
    413: (lazy_gettext("Too large"), lazy_gettext("What was sent is larger than this page takes.")),
}


def _http_error_page(exc):
    title, message = _HTTP_PAGES.get(exc.code, (exc.name, exc.description))
    return render_template("auth/error.html", code=exc.code, title=title, message=message), exc.code


def init_app(app) -> None:
    cfg = app.config
    cfg["SESSION_COOKIE_HTTPONLY"] = True
    cfg["SESSION_COOKIE_SAMESITE"] = "Lax"
    cfg["SESSION_COOKIE_SECURE"] = _cookie_secure(cfg)
    cfg["PERMANENT_SESSION_LIFETIME"] = timedelta(seconds=int(cfg["SESSION_LIFETIME_S"]))
    # A form left open for an hour should still submit while the session lives.
    cfg["WTF_CSRF_TIME_LIMIT"] = int(cfg["SESSION_LIFETIME_S"])

    from app.api import bp as api_bp
    csrf.init_app(app)
    # The machine API takes bearer tokens only; no cookie means nothing to forge.
    csrf.exempt(api_bp)

    @app.after_request
    def _headers(response):
        if _is_api():
            return response
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        if not request.path.startswith("/static/"):
            # Pages carry CSRF tokens and private data: never from a cache.
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    app.extensions[PAGE_ERRORS] = _http_error_page

    @app.errorhandler(CSRFError)
    def _csrf_error(exc):
        return render_template("auth/error.html", code=400, title=_("Form expired or forged"),
                               message=_("The form was missing its security token or it expired. "
                                         "Go back, reload the page and try again.")), 400

    @app.errorhandler(TooManyAttempts)
    def _too_many(exc):
        if _is_api():
            from app.api import error_response
            return error_response(exc)
        seconds = max(1, math.ceil(exc.retry_after_ms / 1000))
        body = render_template("auth/error.html", code=429, title=_("Too many attempts"),
                               message=_("Please wait %(seconds)s s and try again.", seconds=seconds))
        return body, 429, {"Retry-After": str(seconds)}
