"""``/admin/jobs/<job_id>``: spec, attempt history, receipts and hook
deliveries; requeue and delete, one by one or for a page of jobs."""
from __future__ import annotations

from flask import abort, current_app, redirect, render_template, request, url_for
from flask_babel import gettext as _, ngettext
from sqlalchemy import text

from app.errors import Conflict, FleetError, InvalidRequest, NotFound
from app.extensions import db
from app.pages.admin import lookups as admin_lookups
from app.pages.admin.base import attempt, bp, decimal_id, done, explain, form_reason, refuse
from app.projects import jobs_admin, service
from app.uploads import receipts

MAX_BULK = 200


def _worker_url(job_id: int) -> str | None:
    """The page of the worker holding (or last holding) the job: a token
    worker's, a node's, or the worker id search when neither is known."""
    row = db.session.execute(text(
        "SELECT j.worker_id, j.worker_owner, n.id IS NOT NULL FROM jobs j "
        "LEFT JOIN fleet_nodes n ON n.id = j.worker_id AND j.worker_owner IS NULL WHERE j.id = :j"),
        {"j": job_id}).first()
    if row is None or row[0] is None:
        return None
    if row[1] is not None:
        return url_for("admin.token_worker", user_id=row[1], worker_id=row[0])
    if row[2]:
        return url_for("admin.node", node_id=row[0])
    return url_for("admin.workers", worker_id=row[0]) + "#worker-search"


# Long enough to read a paper, short enough that a copied link soon dies.
FILE_LINK_TTL_S = 600


@bp.get("/jobs/<job_id>/file/<attempt_id>")
def job_file(job_id, attempt_id):
    """Open the archived file of one of the job's uploads: a short-lived
    signed link (local store) or presigned URL (S3), so the browser reads it
    from the store, not through a page worker."""
    from app.storage import shared_store
    from app.uploads import downloads
    try:
        job_id, attempt_id = decimal_id(job_id), decimal_id(attempt_id, "attempt_id")
    except InvalidRequest:
        abort(404)
    object_key = db.session.execute(text(
        "SELECT a.object_key FROM uploads u JOIN assets a ON a.canonical_key = u.canonical_key "
        "WHERE u.job_id = :j AND u.attempt_id = :a AND u.state = 'done'"),
        {"j": job_id, "a": attempt_id}).scalar()
    if object_key is None:
        abort(404)
    cfg = current_app.config
    url, _ = downloads.url_for(shared_store(cfg), {"PUBLIC_URL": "", "SECRET_KEY": cfg["SECRET_KEY"]},
                               object_key, FILE_LINK_TTL_S)
    return redirect(url, 303)


@bp.get("/jobs/<job_id>")
def job(job_id):
    try:
        job_id = decimal_id(job_id)
        project_id = admin_lookups.project_of_job(job_id)
        detail = jobs_admin.detail(project_id, job_id)
    except (InvalidRequest, NotFound):
        abort(404)
    attempt_ids = [a["number"] for a in detail["attempt_history"]]
    return render_template("admin/job.html", project_id=project_id, job=detail,
                           worker_url=_worker_url(job_id),
                           task_timeout_s=service.view(project_id).task_timeout_seconds,
                           receipts=receipts.for_job(job_id),
                           deliveries=admin_lookups.deliveries_for_attempts(project_id, attempt_ids))


def _project_of(raw_job_id):
    job_id = decimal_id(raw_job_id)
    return admin_lookups.project_of_job(job_id), job_id


@bp.post("/jobs/<job_id>/requeue")
def requeue_job(job_id):
    def run():
        project_id, jid = _project_of(job_id)
        jobs_admin.requeue(project_id, jid)
        return jid

    return attempt(run, lambda jid: _("Job %(jid)s is back in the queue.", jid=jid), "admin.job",
                   job_id=job_id)


@bp.post("/jobs/<job_id>/delete")
def delete_job(job_id):
    try:
        project_id, jid = _project_of(job_id)
        if request.form.get("confirm") != "yes":
            return refuse(_("Tick the confirmation box to delete the job."), "admin.job",
                          job_id=job_id)
        jobs_admin.delete(project_id, jid)
    except FleetError as exc:
        db.session.rollback()
        return refuse(explain(exc), "admin.job", job_id=job_id)
    return done(_("Job %(jid)s deleted.", jid=jid), "admin.project", project_id=project_id)


def _back(project_id):
    """Return to the page the admin acted on: same filter, same cursor."""
    values = {"project_id": project_id}
    for name in ("status", "after_job_id"):
        if request.form.get(f"back_{name}"):
            values[name] = request.form[f"back_{name}"]
    return values


@bp.post("/projects/<segment:project_id>/jobs/bulk")
def bulk_jobs(project_id):
    """Requeue or delete the ticked jobs, or requeue every failed job on the page."""
    action = request.form.get("action", "")
    if action == "requeue_page":
        raw_ids = request.form.getlist("page_job_id")
    else:
        raw_ids = request.form.getlist("job_id")
    back = _back(project_id)
    if action not in ("requeue", "requeue_page", "delete"):
        return refuse(_("Unknown action."), "admin.project", **back)
    if not raw_ids:
        return refuse(_("No jobs selected."), "admin.project", **back)
    if len(raw_ids) > MAX_BULK:
        return refuse(_("At most %(max_bulk)s jobs at once.", max_bulk=MAX_BULK), "admin.project", **back)
    if action == "delete" and request.form.get("confirm") != "yes":
        return refuse(_("Tick the confirmation box to delete the selected jobs."), "admin.project",
                      **back)
    reason = form_reason()
    if action == "delete" and reason is None:
        return refuse(_("Say why in the reason field: a bulk delete is kept in the audit log."),
                      "admin.project", **back)
    changed, refused = 0, []
    for raw in raw_ids:
        try:
            jid = decimal_id(raw)
            if action == "delete":
                jobs_admin.delete(project_id, jid, reason=reason)
            else:
                jobs_admin.requeue(project_id, jid, reason=reason)
            changed += 1
        except (Conflict, NotFound, InvalidRequest) as exc:
            db.session.rollback()
            refused.append(f"{raw}: {exc.message}")
    message = (ngettext("%(num)s job deleted.", "%(num)s jobs deleted.", changed) if action == "delete"
               else ngettext("%(num)s job requeued.", "%(num)s jobs requeued.", changed))
    if refused:
        message += " " + _("%(n)s refused — ", n=len(refused)) + "; ".join(refused[:5])
        return refuse(message, "admin.project", **back)
    return done(message, "admin.project", **back)
