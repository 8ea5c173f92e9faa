"""``/admin/audit``: who did what, newest first, filtered by actor, action
or object, paged by id (``app.audit``)."""
from __future__ import annotations

from flask import render_template, request, url_for

from app import audit
from app.pages.admin.base import bp, cursor_arg

PAGE_SIZE = 100
FILTERS = ("actor", "action", "object_kind", "object_id")


@bp.get("/audit")
def audit_log():
    filters = {name: request.args.get(name, "").strip() or None for name in FILTERS}
    page = audit.listing(**filters, before_id=cursor_arg(), limit=PAGE_SIZE)
    older = page["next_before_id"] and url_for(
        "admin.audit_log", before_id=page["next_before_id"], **{k: v for k, v in filters.items() if v})
    return render_template("admin/audit.html", filters=filters, page=page, older=older,
                           max_chars=audit.FILTER_MAX_CHARS)
