"""``/admin/hooks``: webhook consumers per project (add, enable, disable,
completion timeout, backfill progress), deliveries and failures (``skipped``
deliveries of a disabled consumer are not failures), and "retry now"."""
from __future__ import annotations

from flask import render_template, request
from flask_babel import gettext as _

from app.errors import FleetError, InvalidRequest
from app.extensions import db
from app.hooks import backfill, consumers, deliveries
from app.hooks.models import COMPLETION_TIMEOUT_BOUNDS_S, COMPLETION_TIMEOUT_DEFAULT_S, DELIVERY_STATES
from app.pages.admin.base import attempt, bp, decimal_id, explain, refuse, shown_once
from app.projects import service

DELIVERY_ROWS = 100
FAILURE_ROWS = 20


def _filters(project_ids: list[str]) -> tuple[str | None, str | None]:
    project = request.args.get("project") or None
    state = request.args.get("state") or None
    if project is not None and project not in project_ids:
        raise InvalidRequest(f"unknown project {project!r}")
    if state is not None and state not in DELIVERY_STATES:
        raise InvalidRequest(f"unknown delivery state {state!r}")
    return project, state


@bp.get("/hooks")
def hooks():
    project_ids = [p["id"] for p in service.list_summaries()]
    try:
        project, state = _filters(project_ids)
    except InvalidRequest as exc:
        return refuse(exc.message, "admin.hooks")
    pdf_ids = [p["id"] for p in service.list_summaries() if p["kind"] == "pdf"]
    shown = [project] if project else project_ids
    listed = {p: consumers.list_for(p) for p in shown}
    progress = backfill.progress([int(c["consumer_id"]) for rows in listed.values() for c in rows])
    return render_template(
        "admin/hooks.html", project_ids=project_ids, pdf_ids=pdf_ids, project=project, state=state,
        states=DELIVERY_STATES, consumers=listed, progress=progress,
        timeout_bounds=COMPLETION_TIMEOUT_BOUNDS_S, timeout_default=COMPLETION_TIMEOUT_DEFAULT_S,
        deliveries=deliveries.list_deliveries(project_id=project, state=state, limit=DELIVERY_ROWS),
        failures=deliveries.list_deliveries(project_id=project, state="failed", limit=FAILURE_ROWS))


def _back():
    values = {}
    for name in ("project", "state"):
        if request.form.get(f"back_{name}"):
            values[name] = request.form[f"back_{name}"]
    return values


def _timeout_field(default=None):
    """The completion timeout from the form: whole seconds."""
    raw = request.form.get("completion_timeout_seconds", "").strip()
    if not raw and default is not None:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
        lo, hi = COMPLETION_TIMEOUT_BOUNDS_S
        raise InvalidRequest(f"completion_timeout_seconds must be an integer from {lo} to {hi}",
                             details={"field": "completion_timeout_seconds"})
    return int(raw)


@bp.post("/hooks/consumers")
def add_consumer():
    project_id = request.form.get("project_id", "")
    try:
        service.get(project_id)  # the page names the project; the table's key would 500
        consumer = consumers.create(project_id, request.form.get("name", "").strip(),
                                    request.form.get("url", "").strip(),
                                    request.form.get("secret", "").strip() or None,
                                    completion_timeout_seconds=_timeout_field(
                                        COMPLETION_TIMEOUT_DEFAULT_S))
    except FleetError as exc:
        db.session.rollback()
        return refuse(explain(exc), "admin.hooks", **_back())
    # The consumer verifies signatures with this secret: show it once.
    return shown_once("admin/hook_secret.html", consumer=consumer)


@bp.post("/hooks/derive")
def add_derive_consumer():
    """A derive consumer: every archived asset of the project becomes a job
    (an OCR run, say) in the target pdf project; it has no URL and no secret."""
    project_id = request.form.get("project_id", "")

    def create():
        service.get(project_id)
        return consumers.create(project_id, request.form.get("name", "").strip(), kind="derive",
                                target_project=request.form.get("target_project", ""),
                                profile={"name": request.form.get("profile", "").strip() or "ocr",
                                         "languages": request.form.get("languages", "").strip() or "eng"})
    return attempt(create, lambda c: _("Derive consumer %(name)s added: every archived asset of "
                                       "%(project)s becomes a job in %(target)s.", name=c["name"],
                                       project=project_id, target=c["target_project"]),
                   "admin.hooks", **_back())


def _toggle(consumer_id, enabled: bool):
    project_id = request.form.get("project_id", "")
    return attempt(lambda: consumers.update(project_id, decimal_id(consumer_id, "consumer_id"),
                                            enabled=enabled),
                   lambda c: (_("Consumer %(name)s enabled.", name=c["name"]) if enabled
                              else _("Consumer %(name)s disabled.", name=c["name"])), "admin.hooks", **_back())


@bp.post("/hooks/consumers/<consumer_id>/enable")
def enable_consumer(consumer_id):
    return _toggle(consumer_id, True)


@bp.post("/hooks/consumers/<consumer_id>/disable")
def disable_consumer(consumer_id):
    return _toggle(consumer_id, False)


@bp.post("/hooks/consumers/<consumer_id>/timeout")
def set_consumer_timeout(consumer_id):
    project_id = request.form.get("project_id", "")
    return attempt(lambda: consumers.update(project_id, decimal_id(consumer_id, "consumer_id"),
                                            completion_timeout_seconds=_timeout_field()),
                   lambda c: _("Consumer %(name)s: completion timeout %(seconds)s s.", name=c['name'],
                               seconds=c['completion_timeout_seconds']), "admin.hooks", **_back())


@bp.post("/hooks/deliveries/<delivery_id>/retry")
def retry_delivery(delivery_id):
    return attempt(lambda: deliveries.retry_now(decimal_id(delivery_id, "delivery_id")),
                   lambda d: _("Delivery %(delivery_id)s is due now.", delivery_id=d['delivery_id']),
                   "admin.hooks", **_back())
