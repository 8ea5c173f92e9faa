"""``/admin/workers``: enrolled nodes and token workers, their health, and
the fleet actions (approve, reject, drain, enable, revoke), each worker's tier
(first choice or fallback), the master-wide remote switch, and releasing the
held files of revoked workers (DESIGN §8.7).

Fleet actions need a human (DESIGN §11), so each one goes through a
confirmation step: the worker's page shows the action with a checkbox that
must be ticked; no JavaScript ``confirm()`` is involved.
"""
from __future__ import annotations

import secrets
import shlex
from datetime import timedelta
from urllib.parse import urlsplit

from flask import abort, current_app, render_template, request, send_file
from flask_babel import gettext as _

from app import audit
from app.fleet import activity, lanes, listing
from app.fleet import service as fleet
from app.fleet.models import TIERS
from app.pages import aggregates
from app.pages.admin import lookups as admin_lookups
from app.pages.admin.base import actor, attempt, bp, form_reason, refuse, shown_once
from app.pages.auth import LOOPBACK
from app.pages.links import master_url
from app.uploads import held
from app.uploads.spool import Spool, in_store

ENROLLMENT_VALID = timedelta(minutes=15)
ERRORS_PER_WORKER = 3
# Actions that end a worker's access for good: the admin says why (audit log).
REASON_ACTIONS = ("reject", "revoke")


def _actions(kind: str, status: str) -> list[str]:
    table = fleet.TRANSITIONS if kind == "node" else fleet.TOKEN_WORKER_TRANSITIONS
    return [action for action, (allowed, _) in table.items() if status in allowed]


@bp.get("/workers")
def workers():
    stale_s = current_app.config["WORKER_STALE_S"]
    rows = listing.workers(stale_s)
    errors: dict[tuple, list] = {}
    for failure in aggregates.recent_failures(500):
        key = (failure["worker_id"], failure["worker_owner"])
        errors.setdefault(key, [])
        if len(errors[key]) < ERRORS_PER_WORKER:
            errors[key].append(failure)
    done = activity.counts([(row["worker_id"], row["user_id"]) for row in rows])
    for row in rows:
        row["actions"] = _actions(row["kind"], row["status"])
        row["recent_errors"] = errors.get((row["worker_id"], row["user_id"]), [])
        row["activity"] = done.get((row["worker_id"], row["user_id"]), activity.ZERO)
    searched = request.args.get("worker_id", "").strip()
    return render_template("admin/workers.html", workers=rows, stale_after_s=stale_s,
                           summary=aggregates.workers_summary(stale_s), searched=searched,
                           tiers=TIERS, remote_enabled=lanes.remote_enabled(),
                           lane_orders=lanes.lane_orders(),
                           owners=admin_lookups.worker_owners(searched) if searched else None)


def _find(kind: str, worker_id: str, user_id: str | None) -> dict:
    for row in listing.workers(current_app.config["WORKER_STALE_S"]):
        if row["kind"] == kind and row["worker_id"] == worker_id and row["user_id"] == user_id:
            return row
    abort(404)


def _worker_page(kind: str, worker_id: str, user_id: str | None):
    row = _find(kind, worker_id, user_id)
    action = request.args.get("action")
    actions = _actions(kind, row["status"])
    return render_template(
        "admin/worker.html", worker=row, actions=actions,
        confirm=action if action in actions else None,
        live_jobs=admin_lookups.live_jobs_of_worker(worker_id, user_id),
        recent_tasks=activity.recent_tasks(worker_id, user_id),
        activity=activity.counts([(worker_id, user_id)]).get((worker_id, user_id), activity.ZERO),
        held_files=held.listing(worker_id, user_id),
        failures=aggregates.recent_failures(20, worker_id=worker_id, worker_owner=user_id),
        stale_after_s=current_app.config["WORKER_STALE_S"],
        reason_actions=REASON_ACTIONS, reason_max=audit.REASON_MAX)


@bp.get("/workers/node/<node_id>")
def node(node_id):
    return _worker_page("node", node_id, None)


@bp.get("/workers/token/<segment:user_id>/<segment:worker_id>")
def token_worker(user_id, worker_id):
    return _worker_page("token", worker_id, user_id)


def _unconfirmed(action: str, endpoint: str, **values):
    return refuse(_("Tick the box to confirm: %(action)s.", action=action), endpoint, action=action, **values)


@bp.post("/workers/node/<node_id>/<action>")
def decide_node(node_id, action):
    if request.form.get("confirm") != "yes":
        return _unconfirmed(action, "admin.node", node_id=node_id)
    reason = form_reason()
    if action in REASON_ACTIONS and reason is None:
        return refuse(_("Say why: a %(action)s needs a reason.", action=action), "admin.node", action=action,
                      node_id=node_id)
    return attempt(lambda: fleet.decide(node_id, action, actor=actor(), reason=reason),
                   lambda n: _("Node %(name)s (%(id)s) is now %(status)s.", name=n.name, id=n.id, status=n.status),
                   "admin.workers")


@bp.post("/workers/token/<segment:user_id>/<segment:worker_id>/<action>")
def decide_token_worker(user_id, worker_id, action):
    if request.form.get("confirm") != "yes":
        return _unconfirmed(action, "admin.token_worker", user_id=user_id, worker_id=worker_id)
    reason = form_reason()
    if action in REASON_ACTIONS and reason is None:
        return refuse(_("Say why: a %(action)s needs a reason.", action=action), "admin.token_worker", action=action,
                      user_id=user_id, worker_id=worker_id)
    # A revoke ends the user's machine token too unless the admin chose to keep it.
    end_token = request.form.get("token") != "keep"
    return attempt(lambda: fleet.decide_token_worker(user_id, worker_id, action, reason=reason,
                                                     end_token=end_token),
                   lambda decided: _token_worker_message(*decided, token_asked=end_token),
                   "admin.workers")


def _token_worker_message(worker, done: dict, token_asked: bool) -> str:
    """What a token worker action did, in full: a revoke's cancelled attempts
    and what became of the user's machine token."""
    message = _("Token worker %(user_id)s/%(worker_id)s is now %(status)s.",
                user_id=worker.user_id, worker_id=worker.worker_id, status=worker.status)
    if worker.status != "revoked":
        return message
    message += " " + _("Running attempts cancelled: %(n)s.", n=done.get("cancelled_attempts", 0))
    if done.get("token_ended"):
        return message + " " + _("The machine token of %(user)s is ended too: every worker using it is "
                                 "refused until an admin issues a new one (Users).", user=worker.user_id)
    if token_asked:
        return message + " " + _("%(user)s had no machine token left.", user=worker.user_id)
    return message + " " + _("The machine token of %(user)s still works: a worker using it may claim "
                             "again under a new worker id.", user=worker.user_id)


def _tier_message(row: dict) -> str:
    who = f"{row['user_id']}/{row['worker_id']}" if row.get("user_id") else row["worker_id"]
    if row["tier"] == "first":
        return _("Worker %(who)s is now first choice.", who=who)
    if row["tier"] == "auto":
        return _("Worker %(who)s now follows each project's lane order.", who=who)
    return _("Worker %(who)s is now fallback.", who=who)


@bp.post("/workers/node/<node_id>/tier")
def set_node_tier(node_id):
    return attempt(lambda: lanes.set_tier(node_id, request.form.get("tier", "")), _tier_message,
                   "admin.workers")


@bp.post("/workers/token/<segment:user_id>/<segment:worker_id>/tier")
def set_token_worker_tier(user_id, worker_id):
    return attempt(lambda: lanes.set_tier(worker_id, request.form.get("tier", ""), user_id),
                   _tier_message, "admin.workers")


@bp.post("/workers/remote")
def set_remote():
    """The remote switch. Turning it off stops every remote claim at once, so
    it asks for the same confirmation as the fleet actions."""
    wanted = request.form.get("remote")
    if wanted not in ("on", "off"):
        return refuse(_("Choose on or off for remote delegation."), "admin.workers")
    if wanted == "off" and request.form.get("confirm") != "yes":
        return refuse(_("Tick the box to confirm: stop remote delegation."), "admin.workers")
    return attempt(lambda: lanes.set_remote(wanted == "on", actor()),
                   lambda r: _("Remote delegation is %(remote)s.", remote=r['remote']), "admin.workers")


def _release_held(worker_id: str, user_id: str | None, endpoint: str, **values):
    if request.form.get("confirm") != "yes":
        return refuse(_("Tick the box to confirm: release the held files."), endpoint, **values)
    spool = Spool.from_config(current_app.config)

    def outcome(released) -> str:
        message = _("Released %(n)s held file(s): deleted, quota freed.", n=len(released))
        waiting = len(held.listing(worker_id, user_id))
        if waiting:
            message += " " + _("%(n)s may still be streaming: release them once their upload "
                               "budget is over.", n=waiting)
        return message
    return attempt(lambda: held.release_worker(worker_id, user_id, spool, actor()), outcome,
                   endpoint, **values)


@bp.post("/workers/node/<node_id>/held/release")
def release_held_node(node_id):
    return _release_held(node_id, None, "admin.node", node_id=node_id)


@bp.post("/workers/token/<segment:user_id>/<segment:worker_id>/held/release")
def release_held_token_worker(user_id, worker_id):
    return _release_held(worker_id, user_id, "admin.token_worker", user_id=user_id, worker_id=worker_id)


@bp.get("/workers/held/<int:attempt_id>/file")
def held_file(attempt_id):
    """A held file, for investigation: always a download, never rendered here
    (it came from a revoked, possibly hostile machine)."""
    spool = Spool.from_config(current_app.config)
    found = held.held_file(attempt_id, spool)
    if found is None:
        abort(404)
    path, sha256 = found
    source = spool.staging.open(path) if in_store(path) else path
    response = send_file(source, mimetype="application/octet-stream", as_attachment=True,
                         download_name=f"held-{attempt_id}-{sha256[:12]}.pdf", max_age=0)
    response.headers["Cache-Control"] = "no-store"
    # Should a browser render it anyway: no scripts, no same-origin rights.
    response.headers["Content-Security-Policy"] = "sandbox"
    return response


@bp.post("/workers/enrollments")
def create_enrollment():
    credential = fleet.create_enrollment(actor(), valid_for=ENROLLMENT_VALID)
    return shown_once("admin/enrollment.html", credential=credential,
                      valid_minutes=int(ENROLLMENT_VALID.total_seconds() // 60),
                      command=worker_command(credential))


# The pdf project make dev fills (app.dev.demo.PDF_PROJECT; the pages never
# import the dev stack).
DEV_PROJECT = "demo-papers"


def worker_command(credential: str) -> str:
    """The command that enrolls a node with this credential, as it must be
    typed: plain http is allowed only for a master on a loopback address;
    on a make dev stack it runs from the checkout, works on the demo's
    papers and fetches them from the demo's publisher, so it runs verbatim."""
    master = master_url()
    parts = urlsplit(master)
    dev = bool(current_app.config.get("DEV_MODE"))
    args = [".venv/bin/fleethq-worker" if dev else "fleethq-worker", "run", "--master", master]
    if parts.scheme == "http" and parts.hostname in (*LOOPBACK, "localhost"):
        args.append("--allow-http")
    args += ["--volume", f"var/worker-{secrets.token_hex(3)}" if dev else "/data",
             "--enroll", credential, "--project", DEV_PROJECT if dev else "PROJECT"]
    publisher = current_app.config.get("DEV_PUBLISHER_URL") if dev else None
    if publisher:
        args += ["--doi-resolver", f"{publisher}/doi/",
                 "--allow-networks", f"{urlsplit(publisher).hostname}/32"]
    return shlex.join(args)
