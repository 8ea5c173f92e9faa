"""Structured (JSON) logs carrying the request id of the request being served."""
from __future__ import annotations

import json
import logging
import re
import secrets
import sys
import time

from flask import g, has_request_context, request

REQUEST_ID_HEADER = "X-Request-ID"
_VALID_REQUEST_ID = re.compile(r"\A[A-Za-z0-9._:-]{1,128}\Z")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if has_request_context():
            entry["request_id"] = getattr(g, "request_id", None)
            entry["method"] = request.method
            entry["path"] = request.path
        for key in ("status", "duration_ms", "project_id", "worker_id", "attempt_id", "size",
                    "timings_ms"):
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def init_app(app) -> None:
    if app.config.get("LOG_JSON"):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        root = logging.getLogger()
        if not any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
            root.addHandler(handler)
        root.setLevel(app.config.get("LOG_LEVEL", "INFO"))
    access = logging.getLogger("fleethq.access")

    @app.before_request
    def _assign_request_id():
        incoming = request.headers.get(REQUEST_ID_HEADER, "")
        g.request_id = incoming if _VALID_REQUEST_ID.match(incoming) else secrets.token_hex(8)
        g.started = time.perf_counter()

    @app.after_request
    def _log_request(response):
        response.headers[REQUEST_ID_HEADER] = getattr(g, "request_id", "")
        started = getattr(g, "started", None)
        if started is not None and app.config.get("ACCESS_LOG", False):
            access.info("request", extra={
                "status": response.status_code,
                "duration_ms": round((time.perf_counter() - started) * 1000, 2)})
        return response
