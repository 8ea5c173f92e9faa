"""``/progress``: job progress for role ``reader`` (and admins), the page
twin of ``GET /api/v1/remote-jobs``: the newest jobs with the state a
reader understands (queued, running, uploading, staged, done, failed), by
project and state, at most 500 rows. No worker topology (nodes, tiers,
lanes, hosts) and no credentials: a job shows which worker id has it, its
error and when it last changed."""
from __future__ import annotations

from flask import Blueprint, abort, render_template, request
from flask_babel import gettext as _

from app.fleet import listing
from app.pages.auth import current_user, login_required_active
from app.projects import service

bp = Blueprint("progress_pages", __name__, url_prefix="/progress")

LIMITS = (100, 250, 500)


@bp.get("")
@login_required_active
def index():
    if not current_user.has("reader", "admin"):
        return render_template("auth/error.html", code=403, title=_("Readers only"),
                               message=_("This page needs the reader role.")), 403
    project_ids = [p["id"] for p in service.list_summaries()]
    project = request.args.get("project") or None
    state = request.args.get("state") or None
    raw_limit = request.args.get("limit", "")
    limit = int(raw_limit) if raw_limit in {str(n) for n in LIMITS} else LIMITS[0]
    if (project is not None and project not in project_ids) or (
            state is not None and state not in listing.PUBLIC_STATES):
        abort(404)
    jobs = listing.remote_jobs(project, limit, state)
    return render_template("progress/index.html", jobs=jobs, project=project, state=state, limit=limit,
                           limits=LIMITS, project_ids=project_ids, states=tuple(listing.PUBLIC_STATES))
