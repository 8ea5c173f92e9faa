"""How the SavewebHQ v1 operations read a JSON body: up to 8 MiB, and a
wrong content type or an oversized body is ``400 invalid_request``, as
SavewebHQ answers them (FleetHQ's own routes keep 413 and 415)."""
from __future__ import annotations

from flask import request

from app.api import validate as v
from app.api.auth import body_limit
from app.errors import InvalidRequest, TooLarge, UnsupportedMediaType


def json_body() -> dict:
    if request.mimetype != "application/json":  # SavewebHQ requires it, even when absent
        raise InvalidRequest("content type must be application/json",
                             details={"content_type": request.mimetype or None})
    try:
        return v.json_body(body_limit("api"))
    except (TooLarge, UnsupportedMediaType) as exc:
        raise InvalidRequest(exc.message, details=exc.details) from None
