"""``/healthz`` (the process answers) and ``/readyz`` (database reachable and migrated)."""
from __future__ import annotations

from flask import Blueprint, current_app, jsonify

from app.api import validate as v
from app.extensions import db
from app.ops import schema

bp = Blueprint("health", __name__)

READY = {"status": v.const("ok"), "revision": v.array(v.text)}
NOT_READY = {"status": v.const("unavailable"), "reason": v.text,
             "database": v.Optional(v.array(v.text)), "code": v.Optional(v.array(v.text))}


@bp.get("/healthz")
@v.declare(auth=None, responses={200: {"status": v.const("ok")}}, operation_id="health",
           summary="The process answers")
def healthz():
    return jsonify(status="ok")


@bp.get("/readyz")
@v.declare(auth=None, responses={200: READY, 503: ("not ready", NOT_READY)},
           summary="The database is reachable and migrated to this release")
def readyz():
    try:
        revisions = schema.database_revisions()
    except Exception as exc:
        db.session.rollback()
        return jsonify(status="unavailable", reason=f"database unreachable: {exc.__class__.__name__}"), 503
    heads = schema.head_revisions(current_app)
    if revisions != heads:
        return jsonify(status="unavailable", reason="database not migrated to this release",
                       database=sorted(revisions or []), code=sorted(heads)), 503
    return jsonify(status="ok", revision=sorted(heads))


def init_app(app) -> None:
    app.register_blueprint(bp)
