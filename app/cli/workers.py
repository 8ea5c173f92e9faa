"""``flask fleet`` workers: enroll, worker (approve, reject, drain, enable,
revoke), workers, add-hook."""
from __future__ import annotations

import click

from app.cli.group import emit, fail, fleet
from app.cli.tables import Column, age, answer, json_option, key
from app.errors import FleetError


@fleet.command("enroll")
@click.option("--valid-minutes", default=15, show_default=True, type=click.IntRange(1, 24 * 60))
@click.option("--created-by", default="cli")
def enroll(valid_minutes, created_by):
    """Create a one-use enrollment credential (printed once)."""
    from datetime import timedelta

    from app.fleet import service as fleet_service
    click.echo(fleet_service.create_enrollment(created_by, timedelta(minutes=valid_minutes)))


@fleet.command("worker")
@click.argument("action", type=click.Choice(["approve", "reject", "drain", "enable", "revoke"]))
@click.argument("worker_id")
@click.option("--user", "user_id", default=None,
              help="For a token worker: the user whose machine token it uses.")
@click.option("--reason", default=None, help="Why (kept in the audit log).")
@click.option("--keep-token", is_flag=True,
              help="Revoking a token worker: keep the user's machine token (by default it ends too, or "
                   "the same token could claim again under a new worker id).")
def worker_action(action, worker_id, user_id, reason, keep_token):
    """Approve, reject, drain, enable or revoke a node (or a token worker with --user)."""
    from app.fleet import service as fleet_service
    try:
        if user_id:
            worker, done = fleet_service.decide_token_worker(user_id, worker_id, action, reason=reason,
                                                             end_token=not keep_token)
            emit({"worker_id": worker.worker_id, "user_id": worker.user_id, "status": worker.status, **done})
        else:
            node = fleet_service.decide(worker_id, action, actor="cli", reason=reason)
            emit({"worker_id": node.id, "name": node.name, "status": node.status})
    except FleetError as exc:
        fail(exc)


def _heartbeat(w: dict) -> str:
    if not w["heartbeats"]:
        return f"none (seen {age(w['heartbeat_age_s'])} ago)" if w["heartbeat_age_s"] is not None else "none"
    state = " STALE" if w["stale"] else " signed off" if w["signed_off"] else ""
    return f"{age(w['heartbeat_age_s'])} ago{state}"


WORKER_COLUMNS = [key("kind"), Column("WORKER", lambda w: w["name"] or w["worker_id"]),
                  Column("USER", lambda w: w["user_id"]), key("status"), key("tier"),
                  key("capacity", right=True), key("running", right=True),
                  Column("HEARTBEAT", _heartbeat), Column("BROWSER", lambda w: w["browser_ok"]),
                  Column("ID", lambda w: w["worker_id"] if w["name"] not in (None, w["worker_id"]) else None)]


@fleet.command("workers")
@json_option
def list_workers(as_json):
    """Nodes and token workers with capacity, running attempts and heartbeat age."""
    from flask import current_app

    from app.fleet import listing
    answer(listing.workers(current_app.config["WORKER_STALE_S"]), WORKER_COLUMNS, as_json,
           empty="(no workers)")


@fleet.command("add-hook")
@click.argument("project_id")
@click.option("--name", required=True)
@click.option("--url", required=True)
@click.option("--secret", default=None, help="Shared HMAC secret (generated when omitted).")
@click.option("--completion-timeout-seconds", type=int, default=3600, show_default=True,
              help="After a 202 answer, send the delivery again when no callback came within this.")
def add_hook(project_id, name, url, secret, completion_timeout_seconds):
    """Add a webhook consumer to a project (the secret is printed once).
    Assets the project archived before are delivered to it too (backfill)."""
    from app.hooks import consumers
    from app.projects import service
    try:
        service.get(project_id)
        emit(consumers.create(project_id, name, url, secret,
                               completion_timeout_seconds=completion_timeout_seconds))
    except FleetError as exc:
        fail(exc)
