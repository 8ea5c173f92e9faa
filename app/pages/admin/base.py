"""The admin pages' blueprint (DESIGN §10), its gates, and the helpers its
views share; the views live beside it in :mod:`app.pages.admin`.

Every view keeps one rhythm (STYLE.md): GET renders; POST validates, calls one
service, flashes and redirects with 303. A domain error (an invalid
transition, a bad field) becomes a flashed message on the page the admin came
from, never a 500.

Secrets shown once (enrollment credentials, machine tokens, hook secrets) are
the one exception: they are rendered straight from the POST, never stored in
the session cookie (signed, not encrypted) and never shown again by a reload.
"""
from __future__ import annotations

import json

from flask import (Blueprint, abort, flash, make_response, redirect, render_template, request,
                   url_for)

from flask_babel import gettext

from app import i18n
from app.errors import FleetError, InvalidRequest
from app.extensions import db
from app.pages.auth import admin_required, current_user

bp = Blueprint("admin", __name__, url_prefix="/admin")


@bp.before_request
@admin_required
def _admins_only():
    """Gate every admin route in one place, including routes added later."""
    return None


@bp.before_request
def _refuse_nul():
    """PostgreSQL text cannot hold NUL characters: such input is malformed
    (400), not a reason for a database error and a 500."""
    fields = [*(request.view_args or {}).values(), *request.args.values()]
    if request.method == "POST":
        fields += [v for values in request.form.listvalues() for v in values]
    if any("\x00" in str(value) for value in fields):
        abort(400)


def actor() -> str:
    return current_user.id


def go(endpoint: str, **values):
    return redirect(url_for(endpoint, **values), code=303)


def done(message: str, endpoint: str, **values):
    flash(message, "success")
    return go(endpoint, **values)


def refuse(message: str, endpoint: str, **values):
    flash(message, "error")
    return go(endpoint, **values)


def explain(exc: FleetError) -> str:
    """A domain error as one sentence an admin can act on."""
    message = exc.message
    details = exc.details or {}
    if details.get("line"):
        message += f" (line {details['line']})"
    if "committed" in details:
        message += f"; {details['committed']} jobs were committed before the error"
    return message


def attempt(call, success, endpoint: str, **values):
    """Run one service call; flash its outcome and redirect (303) either way.

    Parameters:
        call: a no-argument callable that calls the service.
        success: the message, or a callable building it from the result.
    """
    try:
        result = call()
    except FleetError as exc:
        db.session.rollback()
        return refuse(explain(exc), endpoint, **values)
    return done(success(result) if callable(success) else success, endpoint, **values)


def shown_once(template: str, **context):
    response = make_response(render_template(template, **context))
    response.headers["Cache-Control"] = "no-store"
    return response


def form_reason() -> str | None:
    """The reason the admin typed, where a form asks for one (the audit log
    keeps it, trimmed to its limit); None when the field is empty."""
    return (request.form.get("reason") or "").strip() or None


def cursor_arg(name: str = "before_id") -> int | None:
    """A paging cursor from the query string; anything but a decimal id is no cursor."""
    try:
        return decimal_id(request.args.get(name), name) if request.args.get(name) else None
    except InvalidRequest:
        return None


def decimal_id(raw, field: str = "job_id") -> int:
    """A job, attempt or delivery id from a form or URL (decimal, ≤ 18 digits)."""
    raw = (raw or "").strip()
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise InvalidRequest(f"{field} must be a decimal id", details={"field": field})
    return int(raw)


# Numbers, dates and spans in the page's language (app/i18n.py).
@bp.app_template_filter("admin_ago")
def _ago(epoch) -> str:
    """How long ago a UNIX time was, rounded for people ("5 minutes ago")."""
    if epoch is None:
        return gettext("never")
    return i18n.ago_tag(epoch)


@bp.app_template_filter("admin_age")
def _age(seconds) -> str:
    return i18n.span(seconds)


@bp.app_template_filter("admin_bytes")
def _bytes(size) -> str:
    return i18n.byte_size(size)


@bp.app_template_filter("admin_time")
def _time(epoch) -> str:
    """An instant in the viewer's zone, UTC and the UNIX seconds on hover."""
    return i18n.time_tag(epoch)


@bp.app_template_filter("admin_json")
def _json(value) -> str:
    """JSON for reading (attr, outcome, error); the template escapes it as text."""
    if value is None:
        return ""
    return json.dumps(value, indent=1, ensure_ascii=False, sort_keys=True)
