"""``/worker``: an active user's own page — the worker ids their machine
token has run as, and the token itself (view again, generate/rotate, revoke).

A token is rendered only in the response to a POST (rotate, or "View
token"), with ``no-store``: a redirect would need it in the (signed,
readable) cookie, and a GET would put it in every visit to the page.
"""
from __future__ import annotations

import time

from flask import Blueprint, current_app, flash, redirect, render_template, url_for
from flask_babel import gettext as _
from sqlalchemy import text

from app.accounts import service as accounts
from app.extensions import db
from app.pages.auth import current_user, login_required_active
from app.pages.links import master_url

bp = Blueprint("worker_pages", __name__, url_prefix="/worker")

# A user runs a handful of workers; the cap only guards the page against
# an accident (a script inventing a worker id per run).
MAX_WORKERS_SHOWN = 200

_WORKERS = text("""
SELECT worker_id, status, extract(epoch FROM last_seen_at), extract(epoch FROM last_heartbeat_at),
       capacity, browser_ok, last_error
FROM token_workers WHERE user_id = :u
ORDER BY last_seen_at DESC LIMIT :n
""")


def _epoch(value, now: float) -> float | None:
    """A database instant as UNIX seconds for the time filters, never in the future."""
    return None if value is None else min(float(value), now)


def own_workers(user_id: str) -> list[dict]:
    stale_s = current_app.config["WORKER_STALE_S"]
    now = time.time()
    rows = db.session.execute(_WORKERS, {"u": user_id, "n": MAX_WORKERS_SHOWN}).all()
    # A worker on an SDK never heartbeats by design: only one whose
    # heartbeats stopped is stale.
    return [{"worker_id": r[0], "status": r[1], "last_seen_at": _epoch(r[2], now),
             "last_heartbeat_at": _epoch(r[3], now),
             "stale": r[3] is not None and now - float(r[3]) > stale_s,
             "capacity": r[4], "browser_ok": r[5], "last_error": r[6]} for r in rows]


def _token_view(user_id: str) -> dict:
    meta = accounts.token_metadata(user_id)
    return {"exists": meta["exists"], "viewable": meta["viewable"],
            "created_at": meta["created_at"], "last_used_at": meta["last_used_at"]}


def _page(shown_token: str | None = None, rotated: bool = False):
    uid = current_user.id
    return render_template("worker/index.html", workers=own_workers(uid), token=_token_view(uid),
                           shown_token=shown_token, rotated=rotated,
                           max_workers=MAX_WORKERS_SHOWN, master_url=master_url())


@bp.get("")
@login_required_active
def index():
    return _page()


@bp.get("/workers")
@login_required_active
def workers_fragment():
    """The worker table alone, for the page's periodic fetch refresh."""
    return render_template("worker/_workers.html", workers=own_workers(current_user.id),
                           max_workers=MAX_WORKERS_SHOWN)


@bp.post("/token")
@login_required_active
def rotate_token():
    secret = accounts.rotate_token(current_user.id)
    return _page(shown_token=secret, rotated=True)


@bp.post("/token/view")
@login_required_active
def view_token():
    """The current token again (D20), behind a CSRF-checked POST so that the
    page itself never carries it."""
    token = accounts.view_token(current_user.id)
    if token is None:
        flash(_("Your machine token cannot be shown again: rotate it to get a new one."), "error")
        return redirect(url_for("worker_pages.index"), 303)
    return _page(shown_token=token)


@bp.post("/token/revoke")
@login_required_active
def revoke_token():
    accounts.revoke_token(current_user.id)
    flash(_("Machine token revoked: workers using it stop at their next request."), "info")
    return redirect(url_for("worker_pages.index"), 303)
