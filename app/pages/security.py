"""Security plumbing of the pages: cookie flags, CSRF, response headers, and
error pages in the reader's language. The rate limiter that login and
enrollment share is :mod:`app.ratelimit` (the API uses it too)."""
from __future__ import annotations

import math
from datetime import timedelta

from flask import render_template, request
from flask_babel import gettext as _
from flask_babel import lazy_gettext
from flask_wtf.csrf import CSRFError, CSRFProtect

from app.errors import TooManyAttempts

csrf = CSRFProtect()

HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; "
                                "base-uri 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}

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
PAGE_DOMAIN_ERRORS = "fleethq.page_domain_errors"
_HTTP_PAGES = {
    400: (lazy_gettext("Bad request"), lazy_gettext("The request could not be understood.")),
    403: (lazy_gettext("Not allowed"), lazy_gettext("You do not have access to this page.")),
    404: (lazy_gettext("Not found"), lazy_gettext("There is no such page, or what it showed is gone.")),
    405: (lazy_gettext("Method not allowed"), lazy_gettext("This page does not take that kind of request.")),
    413: (lazy_gettext("Too large"), lazy_gettext("What was sent is larger than this page takes.")),
}


def _domain_error_page(exc):
    """A domain error that left a page view, as a page (None: the API's
    envelope answers it). Only sign-in's rate limit gets here today."""
    if not isinstance(exc, TooManyAttempts):
        return None
    seconds = max(1, math.ceil(exc.retry_after_ms / 1000))
    body = render_template("auth/error.html", code=429, title=_("Too many attempts"),
                           message=_("Please wait %(seconds)s s and try again.", seconds=seconds))
    return body, 429, {"Retry-After": str(seconds)}


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

    # The machine API takes bearer tokens only (no cookie, nothing to forge):
    # create_app exempts its blueprint.
    csrf.init_app(app)

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
    app.extensions[PAGE_DOMAIN_ERRORS] = _domain_error_page

    @app.errorhandler(CSRFError)
    def _csrf_error(exc):
        return render_template("auth/error.html", code=400, title=_("Form expired or forged"),
                               message=_("The form was missing its security token or it expired. "
                                         "Go back, reload the page and try again.")), 400

