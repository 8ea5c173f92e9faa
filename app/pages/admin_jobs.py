"""``/admin/jobs/<job_id>``: spec, attempt history, receipts and hook
deliveries; requeue and delete, one by one or for a page of jobs."""
from __future__ import annotations

from flask import abort, render_template, request

from app import audit
from app.errors import Conflict, FleetError, InvalidRequest, NotFound
from app.extensions import db
from app.pages import admin_lookups
from app.pages.admin import attempt, bp, decimal_id, done, explain, refuse
from app.projects import jobs_admin, service
from app.uploads import receipts

MAX_BULK = 200


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

    return attempt(run, lambda jid: f"Job {jid} is back in the queue.", "admin.job",
                   job_id=job_id)


@bp.post("/jobs/<job_id>/delete")
def delete_job(job_id):
    try:
        project_id, jid = _project_of(job_id)
        if request.form.get("confirm") != "yes":
            return refuse("Tick the confirmation box to delete the job.", "admin.job",
                          job_id=job_id)
        jobs_admin.delete(project_id, jid)
    except FleetError as exc:
        db.session.rollback()
        return refuse(explain(exc), "admin.job", job_id=job_id)
    return done(f"Job {jid} deleted.", "admin.project", project_id=project_id)


def _back(project_id):
    """Return to the page the admin acted on: same filter, same cursor."""
    values = {"project_id": project_id}
    for name in ("status", "after_job_id"):
        if request.form.get(f"back_{name}"):
            values[name] = request.form[f"back_{name}"]
    return values


@bp.post("/projects/<project_id>/jobs/bulk")
def bulk_jobs(project_id):
    """Requeue or delete the ticked jobs, or requeue every failed job on the page."""
    action = request.form.get("action", "")
    if action == "requeue_page":
        raw_ids = request.form.getlist("page_job_id")
    else:
        raw_ids = request.form.getlist("job_id")
    back = _back(project_id)
    if action not in ("requeue", "requeue_page", "delete"):
        return refuse("Unknown action.", "admin.project", **back)
    if not raw_ids:
        return refuse("No jobs selected.", "admin.project", **back)
    if len(raw_ids) > MAX_BULK:
        return refuse(f"At most {MAX_BULK} jobs at once.", "admin.project", **back)
    if action == "delete" and request.form.get("confirm") != "yes":
        return refuse("Tick the confirmation box to delete the selected jobs.", "admin.project",
                      **back)
    reason = (request.form.get("reason") or "").strip()[:audit.REASON_MAX] or None
    if action == "delete" and reason is None:
        return refuse("Say why in the reason field: a bulk delete is kept in the audit log.",
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
    verb = "deleted" if action == "delete" else "requeued"
    message = f"{changed} job{'s' if changed != 1 else ''} {verb}."
    if refused:
        message += f" {len(refused)} refused — " + "; ".join(refused[:5])
        return refuse(message, "admin.project", **back)
    return done(message, "admin.project", **back)
