"""``/admin/projects``: the list, creation, and one project's page — policy
form, status, counts (from the trigger-maintained counters), throughput and
the cursor-paged, filtered job list."""
from __future__ import annotations

from flask import abort, render_template, request
from flask_babel import gettext as _

from app import audit
from app.errors import FleetError, InvalidRequest, NotFound
from app.extensions import db
from app.pages import aggregates, charts
from app.pages.admin import lookups as admin_lookups
from app.pages.admin.base import attempt, bp, done, explain, refuse
from app.projects import bulk, counters, jobs_admin, policy, service
from app.projects.models import JOB_STATES, PROJECT_KINDS
from workers.wire.policy import FIELDS, INTEGER, RATE

PAGE_SIZE = 50
NULLABLE_INTS = {f.name for f in FIELDS if f.type == INTEGER and f.nullable}
INTS = {f.name for f in FIELDS if f.type == INTEGER}
RATES = {f.name for f in FIELDS if f.type == RATE}
EDITABLE = tuple(f for f in policy.POLICY_FIELDS if f not in policy.FIXED_FIELDS)
# The policy form's text boxes, in declaration order, each with its hint.
NUMBER_FIELDS = tuple(f for f in FIELDS if f.type in (INTEGER, RATE) and not f.fixed)


def _int(name: str, raw: str):
    raw = raw.strip()
    if not raw:
        if name in NULLABLE_INTS:
            return None
        raise InvalidRequest(f"{name} is required", details={"field": name})
    digits = raw[1:] if raw[:1] in "+-" else raw
    if not digits.isascii() or not digits.isdigit() or len(digits) > 12:
        raise InvalidRequest(f"{name} must be a whole number", details={"field": name})
    return int(raw)


def _rate(name: str, raw: str):
    raw = raw.strip()
    if not raw:
        return None
    try:
        if len(raw) > 32:
            raise ValueError(raw)
        return float(raw)  # the service refuses inf, nan and values <= 0
    except ValueError:
        raise InvalidRequest(f"{name} must be a number or empty", details={"field": name}) from None


def policy_from_form(form, allowed) -> dict:
    """The policy fields present in a form, typed for ``policy.validate_fields``.

    Only fields the form carries are returned, so a partial form (the status
    buttons) changes only what it shows: PATCH semantics. A checkbox is
    absent when unticked, so its form also carries ``<name>__shown``.
    """
    fields = {}
    for name in allowed:
        if name == "prefer_new_worker":
            if "prefer_new_worker__shown" in form:
                fields[name] = form.get(name) == "on"
            continue
        if name not in form:
            continue
        raw = form.get(name, "")
        if name in INTS:
            fields[name] = _int(name, raw)
        elif name in RATES:
            fields[name] = _rate(name, raw)
        elif name == "client_versions":
            # One version a line; blank lines, stray spaces and repeats are
            # typing slips in a text box, not values (the API refuses them).
            fields[name] = list(dict.fromkeys(v.strip() for v in raw.splitlines() if v.strip()))
        else:
            fields[name] = raw.strip()
    return fields


# The create form shows every policy field; an empty one takes the kind's
# default (DESIGN §5), shown beside it.
CREATE_NUMBERS = tuple(f for f in EDITABLE if f in INTS or f in RATES)


def creation_fields(form) -> dict:
    """The policy of a new project from the create form: what the admin filled in."""
    filled = [name for name in policy.POLICY_FIELDS
              if name in ("kind", "identity_mode", "client_versions")
              or (form.get(name) or "").strip()]
    fields = policy_from_form(form, filled)
    choice = form.get("prefer_new_worker", "")
    if choice in ("yes", "no"):
        fields["prefer_new_worker"] = choice == "yes"
    return fields


@bp.get("/projects")
def projects():
    return render_template("admin/projects.html", projects=service.list_summaries(),
                           numbers=CREATE_NUMBERS, policy_help=policy.HELP,
                           defaults={kind: policy.defaults(kind) for kind in PROJECT_KINDS},
                           states=JOB_STATES)


@bp.post("/projects")
def create_project():
    project_id = request.form.get("id", "").strip()
    try:
        policy.validate_project_id(project_id)
        if _exists(project_id):
            raise InvalidRequest(f"project {project_id!r} already exists")
        service.put(project_id, creation_fields(request.form), partial=False)
    except FleetError as exc:
        db.session.rollback()
        return refuse(explain(exc), "admin.projects")
    return done(_("Project %(project_id)s created.", project_id=project_id), "admin.project", project_id=project_id)


def _exists(project_id: str) -> bool:
    try:
        service.get(project_id)
    except NotFound:
        return False
    return True


def _filters():
    """``status`` and ``after_job_id`` from the query string, validated."""
    status = request.args.get("status") or None
    if status is not None and not jobs_admin.valid_status(status):
        raise InvalidRequest(f"unknown job state {status!r}", details={"field": "status"})
    after = request.args.get("after_job_id") or None
    if after is not None:
        if not after.isascii() or not after.isdigit() or len(after) > 18:
            raise InvalidRequest("after_job_id must be a decimal job id",
                                 details={"field": "after_job_id"})
        after = int(after)
    return status, after


@bp.get("/projects/<segment:project_id>")
def project(project_id):
    try:
        summary = service.summary(service.get(project_id))
    except NotFound:
        abort(404)
    try:
        status, after = _filters()
    except InvalidRequest as exc:
        return refuse(exc.message, "admin.project", project_id=project_id)
    page = jobs_admin.list_jobs(project_id, status=status, after_job_id=after, limit=PAGE_SIZE)
    now, per_minute = aggregates.throughput([project_id])
    chart = charts.throughput({kind: per_minute[kind][project_id] for kind in aggregates.KINDS}, now,
                              project=project_id)
    requeueable = [j["job_id"] for j in page["jobs"] if j["state"] in ("failed", "reset_exhausted")]
    return render_template("admin/project.html", project=summary, page=page, status=status,
                           after=after, states=JOB_STATES, charts=chart, requeueable=requeueable,
                           editable=EDITABLE, number_fields=NUMBER_FIELDS,
                           policy_choices={f.name: f.choices for f in FIELDS if f.choices},
                           policy_help=policy.HELP, reason_max=audit.REASON_MAX,
                           bulk_actions=bulk.recent(project_id, 5),
                           oldest_queued_s=counters.oldest_queued_s([project_id]).get(project_id),
                           errors=aggregates.error_groups(project_id),
                           worker_names=admin_lookups.node_names(j["worker_id"] for j in page["jobs"]))


@bp.post("/projects/<segment:project_id>/policy")
def update_policy(project_id):
    def save():
        fields = policy_from_form(request.form, EDITABLE)
        if not fields:
            raise InvalidRequest("nothing to change")
        return service.put(project_id, fields, partial=True)[0]

    return attempt(save, lambda p: _("Policy saved (version %(policy_version)s, status %(status)s).",
                                     policy_version=p.policy_version, status=p.status),
                   "admin.project", project_id=project_id)


@bp.post("/projects/<segment:project_id>/delete")
def delete_project(project_id):
    if request.form.get("confirm") != "yes":
        return refuse(_("Tick the box to confirm: deleting a project deletes all its jobs."),
                      "admin.project", project_id=project_id)

    try:
        service.delete(project_id)
    except NotFound:
        abort(404)
    except FleetError as exc:  # jobs in flight: drain it first
        db.session.rollback()
        return refuse(explain(exc), "admin.project", project_id=project_id)
    return done(_("Project %(project_id)s and its jobs deleted.", project_id=project_id), "admin.projects")


@bp.post("/projects/<segment:project_id>/status")
def update_status(project_id):
    status = request.form.get("status", "")
    return attempt(lambda: service.put(project_id, {"status": status}, partial=True)[0],
                   lambda p: _("Project %(id)s is now %(status)s.", id=p.id, status=p.status), "admin.project",
                   project_id=project_id)
