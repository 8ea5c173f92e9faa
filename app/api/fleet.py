"""Fleet API (DESIGN §7): registration, status, heartbeats, uploads, receipts.

Fleet actions (enroll, approve, reject, drain, enable, revoke) need a human:
the machine API answers them 403 whatever the token.
"""
from __future__ import annotations

import time

from flask import current_app, jsonify, request

from app.api import bp
from app.api import validate as v
from app.api.auth import body_limit, principal, require, require_worker
from app.errors import InvalidRequest, NotFound
from app.extensions import db
from app.fleet import listing
from app.fleet import service as fleet
from app.projects import wakeups
from app.projects.leasing import Worker
from app.pages.security import limit_enrollment
from app.uploads import ingest, receipts, transitions
from app.uploads.spool import Spool
from workers import pdfcheck

REGISTER = {"id": v.string(128, min_bytes=16), "name": v.string(128, min_bytes=1),
            "enrollment_token": v.string(256, min_bytes=1), "secret": v.string(256, min_bytes=1)}

HEARTBEAT = {
    "capacity": v.int_range(0, 1024),
    "browser_ok": v.boolean,
    "disk_free_bytes": v.int_range(0, 2**63 - 1),
    "spool_bytes": v.int_range(0, 2**63 - 1),
    "last_error": v.Optional(v.string(2048, nullable=True)),
    "running_attempt_ids": v.list_of(v.identifier, 0, 128),
    "worker_id": v.Optional(v.identifier),
}


def _node_dict(node) -> dict:
    return {"worker_id": node.id, "name": node.name, "status": node.status,
            "created_at": int(node.created_at.timestamp()),
            "last_heartbeat_at": int(node.last_heartbeat_at.timestamp()) if node.last_heartbeat_at
            else None}


def _caller_worker(worker_id: str | None = None) -> Worker:
    who = require_worker()
    if who.node_id is not None:
        return Worker(worker_id=who.node_id, owner=None)
    return Worker(worker_id=worker_id, owner=who.user_id)


def _attempt_id(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise NotFound("no such attempt")
    return int(raw)


@bp.post("/fleet/register")
def register():
    limit_enrollment()  # credentials are secrets: no guessing at speed
    body = v.check(v.json_body(body_limit("worker")), REGISTER)
    node = fleet.register(body["id"], body["name"], body["enrollment_token"], body["secret"])
    return jsonify(_node_dict(node)), 201


@bp.get("/fleet/status")
def status():
    who = principal()
    if who.node_id is None:
        raise NotFound("status is for enrolled nodes")
    return jsonify(_node_dict(fleet.get_node(who.node_id)))


@bp.post("/fleet/heartbeat")
def heartbeat():
    who = principal()
    body = v.check(v.json_body(body_limit("worker")), HEARTBEAT)
    if who.node_id is not None:
        worker = Worker(worker_id=who.node_id, owner=None)
    else:
        require_worker()
        if "worker_id" not in body:
            raise InvalidRequest("token workers send their worker_id", details={"field": "worker_id"})
        worker = Worker(worker_id=body["worker_id"], owner=who.user_id)
    return jsonify(fleet.heartbeat(worker, body, current_app.config["NODE_LEASE_S"]))


@bp.put("/fleet/uploads/<attempt_id>")
def upload(attempt_id):
    cfg = current_app.config
    worker = _caller_worker()
    meta = ingest.parse_headers(request.headers, request.content_length,
                                max_bytes=cfg["UPLOAD_MAX_BYTES"])
    attempt = _attempt_id(attempt_id)
    sock = request.environ.get("gunicorn.socket") or request.environ.get("werkzeug.socket")
    status_code, _ = ingest.receive(
        attempt, worker, meta, request.stream, sock, Spool.from_config(cfg),
        min_bytes=cfg["UPLOAD_MIN_BYTES"], max_bytes=cfg["UPLOAD_MAX_BYTES"],
        parse_limits=pdfcheck.ParseLimits())
    return jsonify(receipts.get(attempt, worker)), status_code


@bp.get("/fleet/receipts/<attempt_id>")
def receipt(attempt_id):
    worker = _caller_worker()
    attempt = _attempt_id(attempt_id)
    raw_wait = request.args.get("wait_ms", "0")
    if not (raw_wait.isascii() and raw_wait.isdigit()) or int(raw_wait) > 30_000:
        raise InvalidRequest("wait_ms must be 0..30000", details={"field": "wait_ms"})
    deadline = time.monotonic() + int(raw_wait) / 1000
    listener = wakeups.listener(current_app.config["LISTEN_DSN"]) if int(raw_wait) else None
    key = transitions.receipt_key(attempt)
    while True:
        seen = listener.generation(key) if listener else None
        current = receipts.get(attempt, worker)
        left = deadline - time.monotonic()
        if current["state"] not in ("uploading", "staged") or left <= 0:
            return jsonify(current)
        db.session.commit()  # no connection held while waiting
        listener.wait(key, seen, left)


# Fleet actions need a human (DESIGN §7): never through the machine API.
@bp.post("/fleet/enroll")
@bp.post("/admin/fleet/enrollments")
@bp.post("/admin/fleet/workers/<worker_id>/<action>")
def fleet_action(worker_id=None, action=None):
    principal()
    fleet.refuse_machine_fleet_action()


@bp.get("/admin/fleet/workers")
def fleet_workers():
    require("admin")
    return jsonify(workers=listing.workers(current_app.config["WORKER_STALE_S"]))


@bp.get("/remote-jobs")
def remote_jobs():
    require("reader", "admin")
    raw_limit = request.args.get("limit", "100")
    if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= 500:
        raise InvalidRequest("limit must be 1..500", details={"field": "limit"})
    return jsonify(jobs=listing.remote_jobs(request.args.get("project") or None, int(raw_limit)))
