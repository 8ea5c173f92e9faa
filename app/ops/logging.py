"""The web side of FleetHQ's logging (workers/logs.py): the process's
format when no entry point set one, and a request id for every request,
bound to every line logged while it is served and handed on to the tasks its
outbox hints start (tasks/sender.py)."""
from __future__ import annotations

import logging
import re
import secrets
import time

from flask import g, request

from workers import logs

REQUEST_ID_HEADER = "X-Request-ID"
_VALID_REQUEST_ID = re.compile(r"\A[A-Za-z0-9._:-]{1,128}\Z")


_ACCESS = logging.getLogger("fleethq.access")


def log_access(status: int, started: float) -> None:
    """The access log's line for a request served since ``started``
    (``time.perf_counter()``); its id, method and path are bound."""
    _ACCESS.info("request", extra={"status": status,
                                   "duration_ms": round((time.perf_counter() - started) * 1000, 2)})


def request_id(incoming: str) -> str:
    """The id of a request: the caller's ``X-Request-ID`` if well-formed, else a new one."""
    return incoming if _VALID_REQUEST_ID.match(incoming) else secrets.token_hex(8)


def init_app(app) -> None:
    if not logs.configured():
        # No entry point named a role (a WSGI server other than the documented
        # gunicorn, a script calling create_app): the web's.
        logs.configure("web", json=app.config.get("LOG_JSON"),
                       level=app.config.get("LOG_LEVEL", "INFO"))

    @app.before_request
    def _assign_request_id():
        g.request_id = request_id(request.headers.get(REQUEST_ID_HEADER, ""))
        g.started = time.perf_counter()
        logs.bind(request_id=g.request_id, method=request.method, path=request.path)

    @app.teardown_request
    def _forget_request_id(_exc):
        logs.unbind("request_id", "method", "path")

    @app.after_request
    def _log_request(response):
        response.headers[REQUEST_ID_HEADER] = getattr(g, "request_id", "")
        started = getattr(g, "started", None)
        if started is not None and app.config.get("ACCESS_LOG", False):
            log_access(response.status_code, started)
        return response
