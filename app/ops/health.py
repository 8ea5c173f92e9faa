"""``/healthz`` (the process answers) and ``/readyz`` (database reachable and migrated)."""
from __future__ import annotations

from flask import Blueprint, current_app, jsonify

from app.extensions import db
from app.ops import schema

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify(status="ok")


@bp.get("/readyz")
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
