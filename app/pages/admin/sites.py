"""``/admin/sites``: the fleet's politeness towards each site (app.sites,
docs/politeness.md): paused sites with the reason and when they resume,
limits with their attempts in flight now, groups of keys; forms to limit,
pause, resume and group."""
from __future__ import annotations

import math

from flask import render_template, request
from flask_babel import gettext as _

from app.errors import InvalidRequest
from app.pages.admin.base import attempt, bp
from app.projects import service as projects
from app.sites import service


def _number(name: str, kind):
    """A form box: blank is None; anything else must read as ``kind``."""
    raw = request.form.get(name, "").strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise InvalidRequest(_("%(field)s must be a number", field=name), details={"field": name}) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequest(_("%(field)s must be a number", field=name), details={"field": name})
    return value


def _form(name: str) -> str:
    return request.form.get(name, "").strip()


@bp.get("/sites")
def sites():
    return render_template("admin/sites.html", found=service.overview(),
                           project_ids=[p["id"] for p in projects.list_summaries()])


@bp.post("/sites/limit")
def limit_site():
    def call():
        return service.set_limit(_form("site"), project_id=_form("project_id") or None,
                                 max_in_flight=_number("max_in_flight", int),
                                 max_starts_per_s=_number("max_starts_per_s", float),
                                 reason=_form("reason") or None)
    return attempt(call, lambda r: _("%(site)s is limited.", site=r["site"]), "admin.sites")


@bp.post("/sites/unlimit")
def unlimit_site():
    return attempt(lambda: service.remove_limit(_form("site"), project_id=_form("project_id") or None),
                   lambda r: _("The limit on %(site)s is removed.", site=r["site"]), "admin.sites")


@bp.post("/sites/pause")
def pause_site():
    def call():
        minutes = _number("minutes", float)
        if minutes is None:
            raise InvalidRequest(_("How many minutes?"), details={"field": "minutes"})
        return service.pause(_form("site"), minutes * 60, reason=_form("reason") or _("paused by hand"))
    return attempt(call, lambda r: _("%(site)s is paused for every worker.", site=r["site"]), "admin.sites")


@bp.post("/sites/resume")
def resume_site():
    return attempt(lambda: service.resume(_form("site")),
                   lambda r: _("%(site)s resumes now.", site=r["site"]), "admin.sites")


@bp.post("/sites/group")
def group_site():
    return attempt(lambda: service.set_group(_form("site"), _form("keys").replace(",", " ").split()),
                   lambda r: _("%(site)s now groups %(count)s keys.", site=r["site"], count=len(r["keys"]))
                   if r["keys"] else _("%(site)s is no longer a group.", site=r["site"]), "admin.sites")
