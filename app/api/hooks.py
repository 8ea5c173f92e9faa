"""Hook consumers and deliveries (admin), the consumer callback, and signed
downloads of archived objects from the local store."""
from __future__ import annotations

import re

from flask import Response, current_app, jsonify, request, stream_with_context

from app.api.base import bp
from app.api import validate as v
from app.api.auth import bearer, body_limit, require
from app.errors import NotFound, PermissionDenied
from app.hooks import consumers, deliveries
from app.hooks.models import COMPLETION_TIMEOUT_BOUNDS_S, COMPLETION_TIMEOUT_DEFAULT_S
from app.projects import service as projects
from app.storage import shared_store
from app.uploads import downloads

# The consumer service also requires an http(s) URL with a host.
_URL = v.string(2048, min_bytes=1).with_schema(pattern="^https?://[^/?#@\x00]+[^\x00]*$")
# After a 202, the consumer has this long to call back before the delivery is sent again.
_COMPLETION_TIMEOUT = v.int_range(*COMPLETION_TIMEOUT_BOUNDS_S).describe(
    "seconds a consumer that answered 202 has to call back before the delivery is sent again")
_PROFILE = v.named("DeriveProfile", {
    "name": v.string(32, min_bytes=1).with_schema(pattern="^[a-z0-9][a-z0-9-]{0,31}$"),
    "languages": v.Optional(v.string(256, min_bytes=1).describe(
        "Tesseract language names joined by '+', at most 8 (default eng)")),
})
CONSUMER = {"name": v.string(128, min_bytes=1),
            "kind": v.Optional(v.one_of("webhook", "derive").describe(
                "webhook: POST each archived asset to url; derive: enqueue a job of profile "
                "into target_project in the archive's own transaction"), default="webhook"),
            "url": v.Optional(_URL.describe("webhook consumers only")),
            "target_project": v.Optional(v.identifier.describe("derive consumers only")),
            "profile": v.Optional(_PROFILE),
            "secret": v.Optional(v.string(256, min_bytes=16)), "enabled": v.Optional(v.boolean),
            "completion_timeout_seconds": v.Optional(_COMPLETION_TIMEOUT,
                                                     default=COMPLETION_TIMEOUT_DEFAULT_S)}
CONSUMER_PATCH = {"name": v.Optional(v.string(128, min_bytes=1)),
                  "url": v.Optional(_URL), "enabled": v.Optional(v.boolean),
                  "completion_timeout_seconds": v.Optional(_COMPLETION_TIMEOUT)}

DELIVERIES_QUERY = {"project": v.Optional(v.identifier),
                    "state": v.Optional(v.one_of(*deliveries.STATES))}

# Response bodies.
HOOK_CONSUMER = v.named("HookConsumer", {
    "consumer_id": v.text.describe("decimal"), "project_id": v.identifier, "name": v.text,
    "kind": v.one_of("webhook", "derive"), "url": v.text.or_null(),
    "target_project": v.identifier.or_null(), "profile": _PROFILE.or_null(), "enabled": v.boolean,
    "completion_timeout_seconds": _COMPLETION_TIMEOUT,
    "created_at": v.timestamp, "secret": v.Optional(v.text.describe("only in the answer that created the consumer")),
})
HOOK_DELIVERY = v.named("HookDelivery", {
    "delivery_id": v.text.describe("decimal"), "consumer_id": v.text.describe("decimal"),
    "url": v.text.or_null(), "kind": v.one_of("webhook", "derive"), "project_id": v.identifier,
    "attempt_id": v.text.describe("decimal"),
    "asset_key": v.text, "state": v.one_of(*deliveries.STATES),
    "tries": v.int_range(0, v.INT64_MAX),
    "last_status": v.int_range(0, 999, nullable=True), "last_error": v.text.or_null(),
    "created_at": v.timestamp, "updated_at": v.timestamp, "delivered_at": v.timestamp.or_null(),
})


def _id(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise NotFound("not found")
    return int(raw)


@bp.get("/admin/projects/<project_id>/hooks")
@v.declare(responses={200: {"consumers": v.array(HOOK_CONSUMER)}}, summary="List webhook consumers")
def list_consumers(project_id):
    require("admin")
    projects.get(project_id)
    return jsonify(consumers=consumers.list_for(project_id))


@bp.post("/admin/projects/<project_id>/hooks")
@v.declare(body=CONSUMER, responses={201: HOOK_CONSUMER},
           summary="Add a webhook consumer (its secret is shown once)")
def create_consumer(project_id):
    require("admin")
    projects.get(project_id)
    body = v.check(v.json_body(body_limit("worker")), CONSUMER)
    return jsonify(consumers.create(project_id, body["name"], body.get("url"), body.get("secret"),
                                    body.get("enabled", True), body["completion_timeout_seconds"],
                                    kind=body["kind"], target_project=body.get("target_project"),
                                    profile=body.get("profile"))), 201


@bp.patch("/admin/projects/<project_id>/hooks/<consumer_id>")
@v.declare(body=CONSUMER_PATCH, responses={200: HOOK_CONSUMER}, summary="Change a consumer")
def update_consumer(project_id, consumer_id):
    require("admin")
    body = v.check(v.json_body(body_limit("worker")), CONSUMER_PATCH)
    return jsonify(consumers.update(project_id, _id(consumer_id), **body))


@bp.delete("/admin/projects/<project_id>/hooks/<consumer_id>")
@v.declare(responses={204: None}, summary="Remove a consumer")
def delete_consumer(project_id, consumer_id):
    require("admin")
    consumers.delete(project_id, _id(consumer_id))
    return "", 204


@bp.get("/admin/hooks/deliveries")
@v.declare(query=DELIVERIES_QUERY,
           responses={200: {"deliveries": v.array(HOOK_DELIVERY)}},
           summary="Hook deliveries, newest first (at most 200)")
def list_deliveries():
    require("admin")
    args = v.query(DELIVERIES_QUERY)
    return jsonify(deliveries=deliveries.list_deliveries(
        project_id=args.get("project"), state=args.get("state")))


@bp.post("/admin/hooks/deliveries/<delivery_id>/retry")
@v.declare(responses={200: HOOK_DELIVERY}, summary="Retry a delivery now")
def retry_delivery(delivery_id):
    require("admin")
    return jsonify(deliveries.retry_now(_id(delivery_id)))


@bp.post("/hooks/deliveries/<delivery_id>/complete")
@v.declare(responses={200: {"delivery_id": v.text, "state": v.const("delivered")}},
           summary="Consumer's completion callback (bearer: the delivery's callback token); "
                   "idempotent, ends the delivery in any state")
def delivery_callback(delivery_id):
    token = bearer()
    if not token.startswith(deliveries.CALLBACK_PREFIX):
        raise PermissionDenied("callbacks take the delivery's callback token")
    return jsonify(deliveries.confirm(_id(delivery_id), token))


@bp.get("/assets/<path:object_key>")
@v.declare(auth=None, query={"expires": v.text, "sig": v.text}, errors=(403,),
           responses={200: v.Media("application/pdf")}, path={"object_key": v.text},
           summary="Signed, time-limited download of an archived object (local store)")
def download(object_key):
    cfg = current_app.config
    if not downloads.verify(cfg["SECRET_KEY"], object_key, request.args.get("expires", ""),
                            request.args.get("sig", "")):
        raise PermissionDenied("invalid or expired download link")
    store = shared_store(cfg)
    try:
        stream = store.open(object_key)
    except Exception:
        raise NotFound("no such object") from None

    def chunks():
        with stream:
            while True:
                data = stream.read(1024 * 1024)
                if not data:
                    return
                yield data
    response = Response(stream_with_context(chunks()), mimetype="application/pdf")
    # The file came from a worker and is served from the master's own origin:
    # a download, and should a browser render it anyway, without scripts or
    # same-origin rights (as held files are).
    name = re.sub(r"[^A-Za-z0-9._-]", "_", object_key.rsplit("/", 1)[-1])[:100] or "asset"
    response.headers["Content-Disposition"] = f'attachment; filename="{name}.pdf"' \
        if not name.endswith(".pdf") else f'attachment; filename="{name}"'
    response.headers["Content-Security-Policy"] = "sandbox"
    return response
