"""The machine API (``/api/v1``): bearer tokens only, one error envelope."""
from __future__ import annotations

import logging

from flask import current_app, make_response, request
from werkzeug.exceptions import HTTPException

from app.api.base import bp, error_response
from app.errors import FleetError, InvalidRequest
from app.extensions import use_fleet_pool

__all__ = ["bp", "error_response", "init_app"]
log = logging.getLogger(__name__)

# As SavewebHQ answers them: an unknown route is not_found, every other
# client error of the HTTP layer (405 included) is invalid_request.
_HTTP_CODES = {401: "invalid_machine_token", 403: "permission_denied", 404: "not_found",
               413: "too_large", 415: "unsupported_media_type"}


def _is_api() -> bool:
    return request.path.startswith("/api/")


DATABASE_RETRY_AFTER_MS = 1000

# SavewebHQ's own value, so that an answer's headers match it exactly: its
# clients (and ours) read no-store; older proxies honour no-cache and max-age.
API_CACHE_CONTROL = "no-store, no-cache, max-age=0"
# No browser guesses another type for an answer (an archived file, an error
# envelope) than the one it is sent as.
NO_SNIFF = ("X-Content-Type-Options", "nosniff")


def _database_unreachable(exc: Exception) -> bool:
    """A lost or refused database connection (not a bad statement)."""
    from sqlalchemy.exc import DBAPIError, OperationalError
    return isinstance(exc, OperationalError) or (isinstance(exc, DBAPIError)
                                                 and exc.connection_invalidated)


def init_app(app) -> None:
    from app.api import (admin, admin_users, documents, fleet, fleethq_admin, hooks,  # noqa: F401
                         jobs, openapi, search, sites)  # (routes register on bp)
    app.register_blueprint(bp)

    @app.errorhandler(FleetError)
    def _domain_error(exc: FleetError):
        if not _is_api():
            # A page: the pages' renderer may answer it (app/pages/security.py).
            page = current_app.extensions.get("fleethq.page_domain_errors")
            answer = page(exc) if page is not None else None
            if answer is not None:
                return answer
        return error_response(exc)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        if not _is_api():
            # A page: the pages' renderer if installed (app/pages/security.py).
            page = current_app.extensions.get("fleethq.page_errors")
            if page is None or not exc.code or exc.code < 400:
                return exc
            response = make_response(page(exc))
        else:
            code = _HTTP_CODES.get(exc.code, "invalid_request")
            err = FleetError(exc.description or exc.name, code=code)
            err.status = exc.code
            response = error_response(err)
        if getattr(exc, "valid_methods", None):   # a 405 names what the URL takes (RFC 9110)
            response.headers["Allow"] = ", ".join(exc.valid_methods)
        return response

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        err = FleetError("internal error")  # never leak internals
        if _database_unreachable(exc):
            # A restart or failover of PostgreSQL: nothing was changed (the
            # transaction died with the connection), so the same request may
            # simply be sent again. SavewebHQ answers 500 internal_error here
            # too; retryable tells its clients and ours to try again.
            log.warning("database unreachable: %s", str(getattr(exc, "orig", exc)).splitlines()[0][:300])
            err.retryable, err.retry_after_ms = True, DATABASE_RETRY_AFTER_MS
        else:
            log.exception("unhandled error")
        return error_response(err) if _is_api() else ("internal error", 500)

    @app.url_value_preprocessor
    def _refuse_nul_in_paths(endpoint, values):
        # No identifier holds a NUL, and PostgreSQL refuses one in any text
        # value: a path naming one (%00) is answered here, before a look-up
        # turns it into a database error. (Werkzeug already decoded the path
        # as UTF-8, an invalid sequence as U+FFFD, so no lone surrogate
        # reaches a view.) Pages and API alike.
        for name, value in (values or {}).items():
            if isinstance(value, str) and "\x00" in value:
                raise InvalidRequest(f"{name} must not contain a NUL character", details={"field": name})

    @app.before_request
    def _route_worker_traffic():
        # Heartbeats, claims, outcomes, uploads and receipts use the fleet pool.
        path = request.path
        if path.startswith(("/api/v1/fleet/", "/api/v1/projects/")):
            use_fleet_pool()

    @app.after_request
    def _no_store(response):
        if _is_api():
            response.headers["Cache-Control"] = API_CACHE_CONTROL
            response.headers[NO_SNIFF[0]] = NO_SNIFF[1]
            if response.status_code == 204:
                # Nothing to type: SavewebHQ sends no Content-Type on a 204.
                response.headers.pop("Content-Type", None)
        return response
