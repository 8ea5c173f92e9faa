"""Fleet API (DESIGN §7): registration, status, heartbeats, uploads, receipts.

Fleet actions (enroll, approve, reject, drain, enable, revoke) need a human:
the machine API answers them 403 whatever the token.
"""
from __future__ import annotations

from flask import current_app, jsonify, request

from app.api.base import bp
from app.api import validate as v
from app.api.admin_schemas import POLICY_RULES
from app.api.auth import body_limit, principal, require, require_worker
from app.errors import InvalidRequest, NotFound
from app.fleet import listing
from app.fleet.models import TIERS
from app.fleet import service as fleet
from app.projects.leasing import Worker
from app.ratelimit import limit_enrollment
from app.storage import shared_store
from app.uploads import derived as derived_uploads
from app.uploads import downloads, ingest, receipts, transitions
from app.uploads.spool import Spool
from workers.wire import pdfcheck

NODE_STATUSES = ("pending", "active", "draining", "rejected", "revoked")

REGISTER = {"id": v.string(128, min_bytes=16).with_schema(pattern=v.json_pattern(fleet.NODE_ID_RE)),
            "name": v.string(128, min_bytes=1).describe("printable"),
            "enrollment_token": v.string(256, min_bytes=1).describe(
                "the one-use credential an admin made"),
            "secret": v.string(256, min_bytes=1).with_schema(
                pattern=v.json_pattern(fleet.NODE_SECRET_RE))}

HEARTBEAT = {
    "capacity": v.int_range(0, 1024),
    "browser_ok": v.boolean.or_null().describe(
        "the browser lane's health; null: this worker has none (OCR, --no-browser)"),
    "disk_free_bytes": v.int_range(0, 2**63 - 1),
    "spool_bytes": v.int_range(0, 2**63 - 1),
    "last_error": v.Optional(v.string(2048, nullable=True)),
    "running_attempt_ids": v.list_of(v.identifier, 0, 128),
    "worker_id": v.Optional(v.identifier.describe("token workers only; a node is its own id")),
    "projects": v.Optional(v.list_of(v.identifier, 0, 64).describe(
        "the projects this worker claims from: a fallback worker then waits only for "
        "first-choice workers that serve the project (omitted: counted for every project)")),
}

# Response bodies.
NODE = v.named("Node", {
    "worker_id": v.identifier, "name": v.text, "status": v.one_of(*NODE_STATUSES),
    "created_at": v.timestamp, "last_heartbeat_at": v.timestamp.or_null(),
})
HEARTBEAT_RESPONSE = {
    "status": v.one_of(*NODE_STATUSES),
    "lease_expires": v.map_of(v.timestamp).describe(
        "attempt id → new lease end; stop every running attempt missing here"),
    "shares": v.Optional(v.map_of(POLICY_RULES["share_weight"]).describe(
        "project id → share_weight, for the heartbeat's projects that exist: a worker that "
        "serves several takes jobs from them in these proportions")),
}
RECEIPT = v.named("Receipt", {
    "job_id": v.int_range(1, v.INT64_MAX), "attempt_id": v.text.describe("decimal"),
    "state": v.one_of("uploading", "staged", "done", "failed", "expired", "held"),
    "sha256": v.text, "size": v.int_range(0, v.INT64_MAX), "asset_key": v.text.or_null(),
    "error": v.any_object.or_null(),
})
FLEET_WORKER = v.named("FleetWorker", {
    "kind": v.one_of("node", "token"), "worker_id": v.text, "user_id": v.text.or_null(),
    "name": v.text, "status": v.one_of(*NODE_STATUSES),
    "capacity": v.int_range(0, v.INT64_MAX, nullable=True), "running": v.int_range(0, v.INT64_MAX),
    "browser_ok": v.boolean.or_null(),
    "disk_free_bytes": v.int_range(0, v.INT64_MAX, nullable=True),
    "spool_bytes": v.int_range(0, v.INT64_MAX, nullable=True), "last_error": v.text.or_null(),
    "created_at": v.timestamp, "last_heartbeat_at": v.timestamp.or_null(),
    "heartbeat_age_s": v.number(nullable=True), "stale": v.boolean,
    "heartbeats": v.boolean.describe(
        "false: a token worker that never sent a heartbeat (an SDK worker that only claims): "
        "its heartbeat_age_s is when it was last seen, and it is never stale"),
    "signed_off": v.boolean.describe(
        "its last heartbeat offered no slot (it stopped cleanly): silence after it is not stale"),
    "held_files": v.int_range(0, v.INT64_MAX), "held_bytes": v.int_range(0, v.INT64_MAX),
    "tier": v.one_of(*TIERS).describe(
        "first: offered every job; fallback: a job only once it waited the project's "
        "fallback_after_seconds, or while no first-choice worker is free; auto: by each "
        "project's lane_order (local_first: the local fetcher first, remote_first: the "
        "remote workers first)"),
    "local": v.boolean.describe("the master's own fetcher (flask fleet local-worker)"),
})
REMOTE_JOB = v.named("RemoteJob", {
    "job_id": v.int_range(1, v.INT64_MAX), "project_id": v.identifier, "id": v.text.or_null(),
    "value": v.text,
    "state": v.one_of("queued", "running", "uploading", "staged", "done", "failed"),
    "worker_id": v.text.or_null(), "error": v.any_value, "updated_at": v.timestamp,
})
RECEIPT_QUERY = {"wait_ms": v.Optional(v.int_range(0, 30_000).describe(
    "long-poll for a change, at most 30 s"), default=0)}
REMOTE_JOBS_QUERY = {"project": v.Optional(v.identifier),
                     "limit": v.Optional(v.int_range(1, 500), default=100)}
_UPLOAD_HEADERS = {
    "X-PDF-SHA256": v.text.with_schema(pattern="^[0-9A-Fa-f]{64}$"),
    "X-PDF-Size": v.text.with_schema(pattern="^[0-9]{1,15}$").describe("= Content-Length"),
    "X-Source-URL": v.Optional(v.text),
    "X-Download-Strategy": v.Optional(v.text),
    "X-Download-Result": v.Optional(v.text.describe("base64url JSON object, at most 16 KiB")),
}


SOURCE = v.named("DerivedSource", {
    "url": v.text.describe("short-lived; GET it without the bearer token"),
    "expires_at": v.timestamp, "sha256": v.text, "size": v.int_range(0, v.INT64_MAX),
    "pages": v.int_range(0, v.INT64_MAX, nullable=True), "languages": v.text, "profile": v.text,
    "source_key": v.text,
    "options": v.any_object.describe("the profile's OCR options: mode (skip-text, redo, force), "
                                     "deskew, rotate, clean, optimize; {} for the worker's own"),
})
TEXT_RECEIPT = {"attempt_id": v.text, "sha256": v.text, "size": v.int_range(0, v.INT64_MAX)}
_TEXT_HEADERS = {"X-Text-SHA256": v.text.with_schema(pattern="^[0-9A-Fa-f]{64}$")}
SKIP = {"reason": v.one_of("already_has_text").describe("why the input needs no work"),
        "pages": v.Optional(v.int_range(0, 1_000_000))}
SKIPPED = {"job_id": v.int_range(1, v.INT64_MAX), "attempt_id": v.text, "state": v.const("done")}


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
@v.declare(body=REGISTER, responses={201: NODE}, auth=None, errors=(403, 409, 429),
           summary="Register a node identity with an enrollment credential",
           description="The same identity retrying after a lost answer gets 201 again.")
def register():
    limit_enrollment()  # credentials are secrets: no guessing at speed
    body = v.check(v.json_body(body_limit("worker")), REGISTER)
    node = fleet.register(body["id"], body["name"], body["enrollment_token"], body["secret"])
    return jsonify(_node_dict(node)), 201


@bp.get("/fleet/status")
@v.declare(responses={200: NODE}, errors=(404,),
           summary="The calling node's record (allowed while pending; 404 for token workers)")
def status():
    who = principal()
    if who.node_id is None:
        raise NotFound("status is for enrolled nodes")
    return jsonify(_node_dict(fleet.get_node(who.node_id)))


@bp.post("/fleet/heartbeat")
@v.declare(body=HEARTBEAT, responses={200: HEARTBEAT_RESPONSE},
           summary="Heartbeat; renews the leases of the running attempts it lists")
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
@v.declare(body=v.Media("application/pdf"), headers=_UPLOAD_HEADERS,
           responses={200: ("already archived", RECEIPT), 202: ("staged", RECEIPT)},
           errors=(409, 422, 503, 507),
           summary="Upload the PDF of a pdf attempt (raw body, at most 100 MiB)")
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


@bp.get("/fleet/attempts/<attempt_id>/source")
@v.declare(responses={200: SOURCE}, errors=(404, 409),
           summary="A derived job's source: a fresh, short-lived download URL and its facts")
def derived_source(attempt_id):
    cfg = current_app.config
    store = shared_store(cfg)
    # The master's own signed link is built on the address this worker used.
    base = request.host_url.rstrip("/")

    def url_for(object_key: str, ttl_s: int):
        return downloads.url_for(store, {"PUBLIC_URL": base, "SECRET_KEY": cfg["SECRET_KEY"]},
                                 object_key, ttl_s)
    return jsonify(derived_uploads.source_for(_attempt_id(attempt_id), _caller_worker(), url_for))


@bp.put("/fleet/uploads/<attempt_id>/text")
@v.declare(body=v.Media("text/plain"), headers=_TEXT_HEADERS, responses={200: TEXT_RECEIPT},
           errors=(404, 409, 413, 422),
           summary="Upload the plain text (UTF-8) of a derived attempt, before its PDF")
def upload_text(attempt_id):
    meta_sha = (request.headers.get("X-Text-SHA256") or "").lower()
    if len(meta_sha) != 64 or any(c not in "0123456789abcdef" for c in meta_sha):
        raise InvalidRequest("X-Text-SHA256 must be 64 hex digits", details={"field": "X-Text-SHA256"})
    worker = _caller_worker()
    data = v.read_body(derived_uploads.TEXT_MAX_BYTES)
    return jsonify(derived_uploads.store_text(_attempt_id(attempt_id), worker, meta_sha, data))


@bp.post("/fleet/attempts/<attempt_id>/skip")
@v.declare(body=SKIP, responses={200: SKIPPED}, errors=(404, 409),
           summary="Finish a derived job whose input needs no work (e.g. it already has text)")
def skip_derived(attempt_id):
    worker = _caller_worker()
    body = v.check(v.json_body(body_limit("worker")), SKIP)
    details = {"pages": body["pages"]} if "pages" in body else {}
    return jsonify(transitions.skip_derived(_attempt_id(attempt_id), worker, body["reason"], details))


@bp.get("/fleet/receipts/<attempt_id>")
@v.declare(query=RECEIPT_QUERY, responses={200: RECEIPT},
           summary="Read a receipt; wait_ms long-polls for a change")
def receipt(attempt_id):
    worker = _caller_worker()
    wait_s = v.query(RECEIPT_QUERY)["wait_ms"] / 1000
    return jsonify(receipts.wait(_attempt_id(attempt_id), worker, wait_s,
                                 current_app.config["LISTEN_DSN"]))


# Fleet actions need a human (DESIGN §7): never through the machine API.
@bp.post("/fleet/enroll")
@bp.post("/admin/fleet/enrollments")
@bp.post("/admin/fleet/workers/<worker_id>/<action>")
@v.declare(responses={}, summary="Always 403: fleet actions need a human")
def fleet_action(worker_id=None, action=None):
    principal()
    fleet.refuse_machine_fleet_action()


@bp.get("/admin/fleet/workers")
@v.declare(responses={200: {"workers": v.array(FLEET_WORKER)}},
           summary="Nodes and token workers (at most 500)")
def fleet_workers():
    require("admin")
    return jsonify(workers=listing.workers(current_app.config["WORKER_STALE_S"]))


@bp.get("/remote-jobs")
@v.declare(query=REMOTE_JOBS_QUERY,
           responses={200: {"jobs": v.array(REMOTE_JOB)}}, summary="Job progress for readers")
def remote_jobs():
    require("reader", "admin")
    args = v.query(REMOTE_JOBS_QUERY)
    return jsonify(jobs=listing.remote_jobs(args.get("project"), args["limit"]))
