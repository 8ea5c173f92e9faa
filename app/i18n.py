"""Pages in English and Simplified Chinese (Flask-Babel, gettext catalogs in
``app/translations``, compiled by ``make dev`` / ``make test``).

Which language a page speaks, first that applies:

1. a language prefix in the URL: ``/zh/admin`` or ``/en/admin``. The
   :class:`LanguagePrefix` WSGI middleware moves the prefix from the path
   into ``SCRIPT_NAME``, so the app routes ``/admin`` as always and every URL
   it builds (``url_for``, redirects) keeps the prefix: a page in Chinese
   links to pages in Chinese;
2. the ``lang`` cookie, set when a prefixed page is visited (the switcher in
   the header links the same page under the other prefix), so an unprefixed
   URL — a bookmark, GitHub's callback — keeps the reader's choice;
3. ``Accept-Language`` on the first visit;
4. English.

Only pages translate: the machine API's answers (``/api/``, ``/metrics``,
``/healthz``) stay English whatever the request says.
"""
from __future__ import annotations

from datetime import datetime, timedelta, UTC

from flask import Flask, g, request
from flask_babel import Babel, format_datetime, format_decimal, format_timedelta, get_locale
from markupsafe import Markup

LANGUAGES = ("en", "zh")
LABELS = {"en": "English", "zh": "中文"}
COOKIE = "lang"
COOKIE_MAX_AGE_S = 365 * 86400
ENVIRON_KEY = "fleethq.language"
# Where the master is mounted (SCRIPT_NAME before a language prefix joined
# it): the switcher's links go under it, as every other URL does.
MOUNT_KEY = "fleethq.mount"
# Babel's locale for each URL language (Simplified Chinese).
LOCALES = {"en": "en", "zh": "zh_Hans_CN"}
MACHINE_PREFIXES = ("/api/", "/metrics", "/healthz", "/readyz")
# 24-hour, year first: a fleet's times are compared across zones and logs.
TIME_PATTERNS = {"en": "yyyy-MM-dd HH:mm:ss", "zh": "yyyy年M月d日 HH:mm:ss"}


class LanguagePrefix:
    """WSGI middleware: ``/<lang>/rest`` → ``SCRIPT_NAME += /<lang>``, path ``/rest``."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        environ[MOUNT_KEY] = environ.get("SCRIPT_NAME", "")
        for lang in LANGUAGES:
            prefix = f"/{lang}"
            if path == prefix or path.startswith(prefix + "/"):
                environ[ENVIRON_KEY] = lang
                environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "") + prefix
                environ["PATH_INFO"] = path[len(prefix):] or "/"
                break
        return self.app(environ, start_response)


def page_language() -> str:
    """The language of this request (see the module's docstring), worked
    out once per request: a page formats many times and numbers."""
    if "language" not in g:
        g.language = _choose()
    return g.language


def _choose() -> str:
    if request.path.startswith(MACHINE_PREFIXES):
        return "en"
    chosen = request.environ.get(ENVIRON_KEY) or request.cookies.get(COOKIE)
    if chosen in LANGUAGES:
        return chosen
    return request.accept_languages.best_match(LANGUAGES, default="en") or "en"


def _locale() -> str:
    return LOCALES[page_language()]


def switch_links() -> list[dict]:
    """The header's language switcher: this page under each prefix."""
    here = page_language()
    path = request.full_path.rstrip("?")
    mount = request.environ.get(MOUNT_KEY, "").rstrip("/")
    return [{"lang": lang, "label": LABELS[lang], "url": f"{mount}/{lang}{path}", "current": lang == here}
            for lang in LANGUAGES]


# --------------------------------------------------------------- formatting

def number(value) -> str:
    """A count or quantity with the language's grouping (12,345 / 12,345)."""
    if value is None:
        return "—"
    return format_decimal(value)


def utc_time(epoch) -> str:
    """An instant as the UTC date and time in the language's form ("2025-12-01 19:03:49 UTC")."""
    if epoch is None:
        return "—"
    moment = datetime.fromtimestamp(float(epoch), tz=UTC)
    return f"{format_datetime(moment, TIME_PATTERNS[page_language()], rebase=False)} UTC"


def _time_element(epoch, text, mode: str) -> Markup:
    """``<time>`` carrying the instant for ``static/local-time.js``, which
    shows in the viewer's zone: as the text (mode "text") or, beside a
    relative age, on hover (mode "hover"). The hover keeps UTC and the UNIX
    seconds that SavewebHQ's API and scripts speak. Without script the UTC
    text stays."""
    iso = datetime.fromtimestamp(float(epoch), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    hover = f"{utc_time(epoch)} · {int(float(epoch))}"
    return Markup('<time datetime="{}" title="{}" data-local="{}">{}</time>').format(iso, hover, mode, text)


def time_tag(epoch) -> Markup:
    """The one way pages show an instant: its date and time in the viewer's
    zone (UTC until the script runs), UTC on hover."""
    if epoch is None:
        return Markup("—")
    return _time_element(epoch, utc_time(epoch), "text")


def ago_tag(epoch) -> Markup:
    """How long ago an instant was ("5 minutes ago"), its exact time on hover."""
    if epoch is None:
        return Markup("—")
    return _time_element(epoch, ago(epoch), "hover")


def span(seconds) -> str:
    """A duration or an age: "3 minutes" / "3分钟"."""
    if seconds is None:
        return "—"
    return format_timedelta(timedelta(seconds=max(0.0, float(seconds))), threshold=1.0)


def ago(epoch) -> str:
    """How long ago an instant was: "5 minutes ago" / "5分钟前"."""
    if epoch is None:
        return "—"
    delta = datetime.now(UTC) - datetime.fromtimestamp(float(epoch), tz=UTC)
    return format_timedelta(-max(delta, timedelta(0)), add_direction=True, threshold=1.0)


def byte_size(size) -> str:
    if size is None:
        return "—"
    size = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{format_decimal(round(size))} {unit}" if unit == "B" else \
                f"{format_decimal(round(size, 1), format='#,##0.0')} {unit}"
        size /= 1024
    return f"{format_decimal(round(size, 1), format='#,##0.0')} TiB"


def init_app(app: Flask) -> None:
    Babel(app, locale_selector=_locale)
    app.wsgi_app = LanguagePrefix(app.wsgi_app)
    app.jinja_env.globals.update(language_links=switch_links, page_language=page_language)
    app.jinja_env.filters.update(num=number)

    @app.after_request
    def _remember(response):
        chosen = request.environ.get(ENVIRON_KEY)
        if chosen and request.cookies.get(COOKIE) != chosen:
            response.set_cookie(COOKIE, chosen, max_age=COOKIE_MAX_AGE_S, samesite="Lax",
                                secure=request.is_secure, httponly=True)
        return response


__all__ = ["LANGUAGES", "LanguagePrefix", "ago", "ago_tag", "byte_size", "get_locale", "init_app", "number",
           "page_language", "span", "switch_links", "time_tag", "utc_time"]
