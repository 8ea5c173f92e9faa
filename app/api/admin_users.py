"""Users and machine tokens (machine token with role admin).

``/api/v1/admin/users…`` answers SavewebHQ's contract exactly (A11–A16):
roles there are ``admin`` and ``worker`` only. FleetHQ's ``reader`` role is
managed on FleetHQ's own route, ``PUT /api/v1/fleethq/users/{user_id}``; a
SavewebHQ-style PUT leaves it as it is, since that contract cannot name it.
"""
from __future__ import annotations

from flask import jsonify

from app.accounts import service as accounts
from app.api import contract
from app.api.base import bp
from app.api import validate as v
from app.api.auth import body_limit, require
from app.errors import InvalidRequest, NotFound
from workers.wire.protocol import is_identifier

STATUS = v.one_of("pending", "active", "suspended")
# At most a handful of roles; a longer list is refused as not unique.
USER = {"status": STATUS, "roles": v.list_of(v.one_of("admin", "worker"), 0, 16, unique=True)}
FLEETHQ_USER = {"status": STATUS,
                "roles": v.list_of(v.one_of("admin", "worker", "reader"), 0, 16, unique=True)}

# A user id in the path that is no identifier is refused with 400.
_BAD_ID = (400,)

# Response bodies (SavewebHQ's AdminUserSummary, AdminMachineTokenResponse).
USER_SUMMARY = v.named("AdminUserSummary", {
    "id": v.identifier, "github_login": v.Optional(v.text.describe("only when set")),
    "status": STATUS, "roles": v.array(v.one_of("admin", "worker")),
    "machine_token_active": v.boolean, "machine_token_viewable": v.boolean,
    "created_at": v.timestamp, "updated_at": v.timestamp,
})
MACHINE_TOKEN = v.named("AdminMachineTokenResponse", {
    "user_id": v.identifier, "token": v.text.with_schema(minLength=1)})
FLEETHQ_USER_VIEW = v.named("FleetHQUser", {
    "user_id": v.identifier, "status": STATUS,
    "roles": v.array(v.one_of("admin", "worker", "reader")), "has_machine_token": v.boolean,
    "created_at": v.timestamp, "updated_at": v.timestamp,
})


def _user_id(raw: str) -> str:
    if not is_identifier(raw):
        raise InvalidRequest("user id must be 1..128 of [A-Za-z0-9._:-]",
                             details={"field": "user_id"})
    return raw


def _savewebhq_body(schema: dict) -> dict:
    """A body as SavewebHQ reads it on its operations: up to 8 MiB, and a
    wrong content type or an oversized body is 400 invalid_request."""
    return v.check(contract.json_body(), schema)


@bp.get("/admin/users")
@v.declare(responses={200: {"users": v.array(USER_SUMMARY)}}, operation_id="listAdminUsers",
           summary="Users and their token state")
def list_users():
    require("admin")
    return jsonify(users=accounts.user_summaries())


@bp.put("/admin/users/<user_id>")
@v.declare(body=USER, responses={204: None}, operation_id="putAdminUser",
           summary="Create or update a user (FleetHQ's reader role is left as it is)")
def put_user(user_id):
    require("admin")
    body = _savewebhq_body(USER)
    accounts.put_user(_user_id(user_id), body["roles"], body["status"], keep=("reader",))
    return "", 204


@bp.put("/fleethq/users/<user_id>")
@v.declare(body=FLEETHQ_USER, responses={200: FLEETHQ_USER_VIEW, 201: FLEETHQ_USER_VIEW},
           summary="Create or update a user, roles including reader (201 when created)")
def put_fleethq_user(user_id):
    require("admin")
    body = v.check(v.json_body(body_limit("api")), FLEETHQ_USER)
    user, created = accounts.put_user(_user_id(user_id), body["roles"], body["status"])
    return jsonify(accounts.user_dict(user)), 201 if created else 200


@bp.delete("/admin/users/<user_id>")
@v.declare(responses={204: None}, operation_id="deleteAdminUser", errors=_BAD_ID,
           summary="Delete a user, with its token and sessions")
def delete_user(user_id):
    require("admin")
    accounts.delete_user(_user_id(user_id))
    return "", 204


@bp.get("/admin/users/<user_id>/machine-token")
@v.declare(responses={200: MACHINE_TOKEN}, operation_id="getAdminMachineToken", errors=_BAD_ID,
           summary="The current token again (404 when none or not viewable)")
def view_token(user_id):
    require("admin")
    token = accounts.view_token(_user_id(user_id))
    if token is None:
        raise NotFound("machine token not found (none, revoked, or not viewable)",
                       details={"user_id": user_id})
    return jsonify(user_id=user_id, token=token)


@bp.post("/admin/users/<user_id>/machine-token")
@v.declare(responses={201: MACHINE_TOKEN}, operation_id="rotateAdminMachineToken", errors=_BAD_ID,
           summary="Rotate: a new fhq_ token")
def rotate_token(user_id):
    require("admin")
    return jsonify(user_id=user_id, token=accounts.rotate_token(_user_id(user_id))), 201


@bp.delete("/admin/users/<user_id>/machine-token")
@v.declare(responses={204: None}, operation_id="revokeAdminMachineToken", errors=_BAD_ID,
           summary="Revoke the token (404 when there is none)")
def revoke_token(user_id):
    require("admin")
    if not accounts.revoke_token(_user_id(user_id)):
        raise NotFound("active machine token not found", details={"user_id": user_id})
    return "", 204
