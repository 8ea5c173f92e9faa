"""Find any job of a project and act on a whole filter.

``/admin/projects/<p>/jobs/search``: the filter (state, type, error code,
worker, value prefix, time range) and a search term (id, external id, value
prefix, ``attr:key=value``, ``error:text``; app/projects/job_search.py),
newest first, a page at a time. From there an admin can requeue or delete
every matching job: a confirmation shows the count first, then the action
runs in bounded batches in the background (app/projects/bulk.py) with a
progress page, and the audit log records it.
"""
from __future__ import annotations

from flask import abort, render_template, request, url_for
from flask_babel import gettext as _

from app import audit
from app.errors import FleetError, InvalidRequest, NotFound
from app.extensions import db
from app.pages.admin import lookups as admin_lookups
from app.pages.admin.base import actor, bp, cursor_arg, done, explain, form_reason, go, refuse
from app.projects import bulk, counters, job_search, service
from app.projects.models import BULK_ACTIONS, JOB_STATES
from workers.wire.protocol import JOB_TYPES


def _project_or_404(project_id: str):
    try:
        return service.get(project_id)
    except NotFound:
        abort(404)


def _filter_args(found: job_search.JobFilter) -> dict:
    return {k: str(v) for k, v in found.as_dict().items()}


@bp.get("/projects/<segment:project_id>/jobs/search")
def job_search_page(project_id):
    _project_or_404(project_id)
    error, result, found = None, None, job_search.JobFilter()
    try:
        found = job_search.JobFilter.from_args(request.args)
        result = job_search.search(project_id, found, before_id=cursor_arg())
    except InvalidRequest as exc:
        error = exc.message
    matches = _match_count(project_id, found, result) if result and cursor_arg() is None else None
    older = result and result["next_before_id"] and url_for(
        "admin.job_search_page", project_id=project_id, before_id=result["next_before_id"],
        **_filter_args(found))
    listed = (result or {}).get("jobs", [])
    page = render_template("admin/job_search.html", project_id=project_id, found=found,
                           args=request.args, result=result, error=error, older=older, matches=matches,
                           states=JOB_STATES, types=JOB_TYPES, actions=BULK_ACTIONS,
                           filter_args=_filter_args(found), max_chars=job_search.Q_MAX_CHARS,
                           worker_names=admin_lookups.node_names(j["worker_id"] for j in listed))
    return page, 400 if error else 200


def _match_count(project_id: str, found, result: dict) -> tuple[int, bool] | None:
    """How many jobs the search's first page stands for, (count, exact),
    when that costs nothing more than the page: it shows them all, or the
    filter is every job or one state (the counters know). Any other filter is
    counted only when asked (``count=1``): a rare error among millions takes
    a scan the page would otherwise never pay for."""
    if result["next_before_id"] is None:
        return len(result["jobs"]), True
    asked = found.as_dict()
    if not asked or set(asked) == {"state"}:
        by_state = counters.job_counts([project_id])[project_id]
        return (by_state[asked["state"]] if asked else sum(by_state.values())), True
    if request.args.get("count") == "1":
        return job_search.count(project_id, found)
    return None


@bp.get("/projects/<segment:project_id>/jobs/bulk-confirm")
def bulk_confirm(project_id):
    _project_or_404(project_id)
    action = request.args.get("action", "")
    try:
        found = job_search.JobFilter.from_args(request.args)
        if action not in BULK_ACTIONS:
            raise InvalidRequest("unknown bulk action")
        if found.is_empty():
            raise InvalidRequest("set a filter first: a bulk action never acts on every job at once")
        preview = bulk.preview(project_id, found)
    except FleetError as exc:
        return refuse(explain(exc), "admin.job_search_page", project_id=project_id,
                      **{k: v for k, v in request.args.items() if k in job_search.JobFilter.FIELDS})
    return render_template("admin/bulk_confirm.html", project_id=project_id, action=action, found=found,
                           filter_args=_filter_args(found), preview=preview, cap=job_search.COUNT_CAP,
                           reason_max=audit.REASON_MAX)


@bp.post("/projects/<segment:project_id>/jobs/bulk-start")
def bulk_start(project_id):
    action = request.form.get("action", "")
    back = {k: v for k, v in request.form.items() if k in job_search.JobFilter.FIELDS}
    if request.form.get("confirm") != "yes":
        return refuse(_("Tick the confirmation box first."), "admin.bulk_confirm", project_id=project_id,
                      action=action, **back)
    reason = form_reason()
    if action == "delete" and reason is None:
        return refuse(_("Say why in the reason field: a bulk delete is kept in the audit log."),
                      "admin.bulk_confirm", project_id=project_id, action=action, **back)
    try:
        found = job_search.JobFilter.from_args(request.form)
        action_id = bulk.start(project_id, action, found, actor=actor(), reason=reason)
    except FleetError as exc:
        db.session.rollback()
        return refuse(explain(exc), "admin.job_search_page", project_id=project_id, **back)
    return go("admin.bulk_progress", project_id=project_id, action_id=action_id)


def _action_or_404(project_id: str, action_id: int) -> dict:
    try:
        return bulk.get(project_id, action_id)
    except NotFound:
        abort(404)


@bp.get("/projects/<segment:project_id>/bulk/<int:action_id>")
def bulk_progress(project_id, action_id):
    return render_template("admin/bulk_progress.html", project_id=project_id,
                           bulk=_action_or_404(project_id, action_id))


@bp.get("/projects/<segment:project_id>/bulk/<int:action_id>/live")
def bulk_progress_live(project_id, action_id):
    return render_template("admin/_bulk_live.html", project_id=project_id,
                           bulk=_action_or_404(project_id, action_id))


@bp.post("/projects/<segment:project_id>/bulk/<int:action_id>/cancel")
def bulk_cancel(project_id, action_id):
    _action_or_404(project_id, action_id)
    state = bulk.cancel(project_id, action_id)["state"]
    return done(_("Bulk action %(action_id)s is %(state)s.", action_id=action_id, state=state),
                "admin.bulk_progress", project_id=project_id, action_id=action_id)
