"""The API's blueprint (``/api/v1``) and its error envelope as a response;
the route modules of :mod:`app.api` add their views to :data:`bp`."""
from __future__ import annotations

import math

from flask import Blueprint, jsonify

from app.errors import FleetError

bp = Blueprint("api", __name__, url_prefix="/api/v1")

def error_response(exc: FleetError):
    response = jsonify(exc.envelope())
    response.status_code = exc.status
    if exc.retry_after_ms > 0:
        response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_ms / 1000)))
    return response
