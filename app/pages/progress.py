"""``/progress``: how far each project has come, for role ``reader`` (and
admins), as the ArchiveTeam tracker's pages show it: per project a bar of
done and failed against the total, the rate over the last hour and the time
left at that rate; a leaderboard of workers by jobs done and bytes uploaded
over the last hour and day; then the page twin of ``GET
/api/v1/remote-jobs``: the newest jobs with the state a reader understands
(queued, running, uploading, staged, done, failed), by project and state, at
most 500 rows.

No worker topology (nodes' names, tiers, lanes, hosts) and no credentials
for readers: a job and a leaderboard row show a worker id, or for token
workers the user who runs them; admins see nodes by name."""
from __future__ import annotations

from flask import Blueprint, abort, render_template, request
from flask_babel import gettext as _

from app.fleet import listing
from app.pages import aggregates, charts
from app.pages.admin import lookups
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
    summaries = service.list_summaries()
    project_ids = [p["id"] for p in summaries]
    project = request.args.get("project") or None
    state = request.args.get("state") or None
    raw_limit = request.args.get("limit", "")
    limit = int(raw_limit) if raw_limit in {str(n) for n in LIMITS} else LIMITS[0]
    if (project is not None and project not in project_ids) or (
            state is not None and state not in listing.PUBLIC_STATES):
        abort(404)
    jobs = listing.remote_jobs(project, limit, state)
    board = aggregates.leaderboard(project_ids)
    return render_template("progress/index.html", jobs=jobs, project=project, state=state, limit=limit,
                           limits=LIMITS, project_ids=project_ids, states=tuple(listing.PUBLIC_STATES),
                           projects=project_progress(summaries), board=board,
                           names=_worker_names(board), board_ttl_s=aggregates.LEADERBOARD_TTL_S)


REMAINING = ("todo", "wip", "staged")
FAILED = ("failed", "reset_exhausted")


def project_progress(summaries: list[dict]) -> list[dict]:
    """Each project's bar, rate and ETA: done and failed of the total from
    the counters, the rate from the last hour's completions, the time left if
    that rate holds (None when nothing completed in the hour)."""
    now, per_minute = aggregates.throughput([p["id"] for p in summaries])
    out = []
    for p in summaries:
        counts = p["job_counts"]
        total = sum(counts.values())
        done, failed = counts.get("done", 0), sum(counts.get(s, 0) for s in FAILED)
        remaining = sum(counts.get(s, 0) for s in REMAINING)
        per_hour = sum(per_minute["completions"][p["id"]][-charts.HOUR:])
        out.append({"id": p["id"], "status": p["status"], "total": total, "done": done, "failed": failed,
                    "remaining": remaining, "percent": 100 * (done + failed) / total if total else 0,
                    "per_hour": per_hour,
                    "eta_s": remaining * 3600 / per_hour if per_hour and remaining else None,
                    "bar": charts.progress_bar(done, failed, total,
                                               title=_("%(project)s: %(done)s done, %(failed)s failed, "
                                                       "%(left)s left of %(total)s", project=p["id"],
                                                       done=done, failed=failed, left=remaining, total=total))})
    return out


def _worker_names(board: dict) -> dict[str, str]:
    """Display names for the leaderboard: users by GitHub login; nodes by
    name for admins only (a node's name is topology a reader does not get)."""
    rows = board["hour"] + board["day"]
    owners = sorted({r["worker_owner"] for r in rows if r["worker_owner"]})
    names = lookups.user_logins(owners)
    if current_user.has("admin"):
        names.update(lookups.node_names(r["node_id"] for r in rows))
    return names
