"""Users and machine tokens (machine token with role admin).

``/api/v1/admin/users…`` answers SavewebHQ's contract exactly (A11–A16):
roles there are ``admin`` and ``worker`` only. FleetHQ's ``reader`` role is
managed on FleetHQ's own route, ``PUT /api/v1/fleethq/users/{user_id}``; a
SavewebHQ-style PUT leaves it as it is, since that contract cannot name it.
"""
from __future__ import annotations

from flask import jsonify

from app.accounts import service as accounts
from app.api import bp, contract
from app.api import validate as v
from app.api.auth import body_limit, require
from app.errors import InvalidRequest, NotFound
from workers.protocol import is_identifier

STATUS = v.one_of("pending", "active", "suspended")
# At most a handful of roles; a longer list is refused as not unique.
USER = {"status": STATUS, "roles": v.list_of(v.one_of("admin", "worker"), 0, 16, unique=True)}
FLEETHQ_USER = {"status": STATUS,
                "roles": v.list_of(v.one_of("admin", "worker", "reader"), 0, 16, unique=True)}


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
def list_users():
    require("admin")
    return jsonify(users=accounts.user_summaries())


@bp.put("/admin/users/<user_id>")
def put_user(user_id):
    require("admin")
    body = _savewebhq_body(USER)
    accounts.put_user(_user_id(user_id), body["roles"], body["status"], keep=("reader",))
    return "", 204


@bp.put("/fleethq/users/<user_id>")
def put_fleethq_user(user_id):
    require("admin")
    body = v.check(v.json_body(body_limit("api")), FLEETHQ_USER)
    user, created = accounts.put_user(_user_id(user_id), body["roles"], body["status"])
    return jsonify(accounts.user_dict(user)), 201 if created else 200


@bp.delete("/admin/users/<user_id>")
def delete_user(user_id):
    require("admin")
    accounts.delete_user(_user_id(user_id))
    return "", 204


@bp.get("/admin/users/<user_id>/machine-token")
def view_token(user_id):
    require("admin")
    token = accounts.view_token(_user_id(user_id))
    if token is None:
        raise NotFound("machine token not found (none, revoked, or not viewable)",
                       details={"user_id": user_id})
    return jsonify(user_id=user_id, token=token)


@bp.post("/admin/users/<user_id>/machine-token")
def rotate_token(user_id):
    require("admin")
    return jsonify(user_id=user_id, token=accounts.rotate_token(_user_id(user_id))), 201


@bp.delete("/admin/users/<user_id>/machine-token")
def revoke_token(user_id):
    require("admin")
    if not accounts.revoke_token(_user_id(user_id)):
        raise NotFound("active machine token not found", details={"user_id": user_id})
    return "", 204
