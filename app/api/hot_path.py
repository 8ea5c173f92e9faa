"""The hot path: a token worker's completion, failure report or lease
renewal, served without Flask's request machinery.

SavewebHQ's Go SDK, which its real workers run, sends one ``complete``
request per job. Through Flask such a request cost the web about four times
the CPU of the same answer from a bare Flask app (request and app contexts,
the hooks of every extension, a SQLAlchemy session's life): see
``bench/vs_savewebhq.py``. This WSGI layer, in front of the Flask app,
serves the plain case of ``POST /api/v1/projects/<p>/jobs/complete``,
``…/fail`` and ``…/extend-lease`` itself, with the same checks, the same
statements (``app.projects.outcomes``, run on a fleet-pool connection that
commits each statement) and the same answer, byte for byte but for the
request id. A worker's look-up (token, user, project) is remembered per
process; the write re-checks it in the same statement (``_STILL_AUTHORIZED``),
so a plain request is at most one statement, and requests of one worker that
arrive while its previous statement runs share the next one
(``app.api.hot_batches``).

Plain means: a well-formed JSON body the route's schema accepts, a token
worker's machine token stored under FleetHQ's digest, an active user with
the worker role, a known project whose client versions include the caller's,
a worker id not revoked and already mapped to that user, no failure that
would pause a site (a pushback code), and no app context pushed (tests
calling in-process keep their session). Anything else goes on to the Flask
app unchanged, which answers it as it always did (its errors, its
envelopes). That is decided before anything is written; after the write, a
batch the write did not wholly move (the re-check refused it, or an item was
stale: the Flask app explains) or a surprise (a dropped connection) also
hands the request on: the routes give the same answer to the same body sent
again (a replayed completion or failure is ``applied``, a renewal keeps the
later lease), so the Flask app's answer is the one the first try would have
given.
"""
from __future__ import annotations

import functools
import hmac
import io
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from flask.globals import _cv_app
from psycopg.pq import TransactionStatus

from app.accounts import service as accounts
from app.accounts import tokens
from app.api import API_CACHE_CONTROL, NO_SNIFF, auth, hot_batches, jobs
from app.api import validate as v
from app.extensions import FLEET_BIND, db, driver_rows
from app.fleet.service import NODE_SECRET_PREFIX
from app.ops import logging as ops_logging
from app.ops.metrics import HOT_PATH_BATCH, observe_request
from app.projects import outcomes
from app.projects.leasing import Worker
from app.projects.service import ProjectView, view_from_named
from workers import logs
from workers.wire.protocol import is_identifier, strict_json_loads

log = logging.getLogger(__name__)

_ROUTES = {
    "complete": (jobs.COMPLETE, jobs.complete_checked, "/api/v1/projects/<project_id>/jobs/complete"),
    "fail": (jobs.FAIL, jobs.fail_checked, "/api/v1/projects/<project_id>/jobs/fail"),
    "extend-lease": (jobs.EXTEND, jobs.extend_checked, "/api/v1/projects/<project_id>/jobs/extend-lease"),
}
_PATH = re.compile(r"\A/api/v1/projects/([^/]+)/jobs/(complete|fail|extend-lease)\Z")


def _connection_statements(driver: psycopg.Connection) -> outcomes.Statements:
    # Each statement committed as it ran (autocommit): nothing left to commit.
    return outcomes.Statements(functools.partial(driver_rows, driver), lambda: None)


# What the write re-checks of a remembered call, in its own statement: the
# token still names the user, who is still an active worker; the worker id is
# still theirs and not revoked; the project row is the one the view was read
# from (xmin changes with every update of the row: a policy change, a new
# client version, an archive).
_STILL_AUTHORIZED = """EXISTS (
    SELECT 1 FROM machine_tokens gt JOIN users gu ON gu.id = gt.user_id
    JOIN projects gp ON gp.id = :p AND gp.xmin::text = :row_version
    JOIN worker_users gwu ON gwu.worker_id = :w AND gwu.user_id = gu.id
    LEFT JOIN token_workers gtw ON gtw.user_id = gu.id AND gtw.worker_id = :w
    WHERE gt.token_hash = :h AND gu.id = :o AND gu.status = 'active' AND 'worker' = ANY(gu.roles)
      AND gtw.status IS DISTINCT FROM 'revoked')"""
# A remembered call is looked up again after this long: the guard keeps it
# correct; the limit keeps the memo to the workers of the last minute.
CALL_TTL_S = 60.0
_MAX_CALLS = 10_000
# Connections the hot path keeps between requests, per process: the fleet
# pool (FLEET_POOL_SIZE, 20 by default) lends the rest to the Flask app.
KEEP_CONNECTIONS = 4


@dataclass(frozen=True)
class _Call:
    """A plain call's look-up, remembered per (token digest, project, worker id)."""
    user_id: str
    project: ProjectView
    project_row_version: str
    expires: float


class HotPath:
    """WSGI middleware: ``app.wsgi_app = HotPath(app, app.wsgi_app)``."""

    def __init__(self, app, full):
        self.app = app
        self.full = full
        self._calls: dict[tuple[str, str, str], _Call] = {}
        self._engine = None
        self._pid = os.getpid()
        self._kept: list[tuple[Any, outcomes.Statements]] = []
        self._body_limit = app.config["API_BODY_LIMIT"]
        self._access_log = bool(app.config.get("ACCESS_LOG", False))
        # Requests of one worker arriving together share a statement, at
        # most as many items as one request may carry.
        self._batches = {route: hot_batches.Batches(jobs.ITEMS_PER_REQUEST, HOT_PATH_BATCH.labels(route).observe)
                         for route in _ROUTES}

    def __call__(self, environ, start_response):
        match = _PATH.match(environ.get("PATH_INFO", ""))
        if match is None or environ.get("REQUEST_METHOD") != "POST" or _cv_app.get(None) is not None:
            return self.full(environ, start_response)
        started = time.perf_counter()
        data = self._read_body(environ)
        answer = None
        if data is not None:
            try:
                answer = self._serve(environ, match[1], match[2], data)
            except Exception:  # noqa: BLE001 — the Flask app answers it (module doc)
                log.debug("hot path handed a request on", exc_info=True)
        if answer is None:
            return self.full(environ, start_response)
        request_id = ops_logging.request_id(environ.get("HTTP_X_REQUEST_ID", ""))
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(answer))),
                                  ("Cache-Control", API_CACHE_CONTROL), NO_SNIFF,
                                  ("X-Request-ID", request_id)])
        observe_request("POST", _ROUTES[match[2]][2], 200, started)
        if self._access_log:
            logs.bind(request_id=request_id, method="POST", path=environ["PATH_INFO"])
            try:
                ops_logging.log_access(200, started)
            finally:
                logs.unbind("request_id", "method", "path")
        return [answer]

    def _read_body(self, environ) -> bytes | None:
        """The body, put back for the Flask app to read again; None (nothing
        read) when it is not a plain JSON body of a declared length."""
        content_type = environ.get("CONTENT_TYPE", "").partition(";")[0].strip().lower()
        length = environ.get("CONTENT_LENGTH", "")
        if content_type != "application/json" or not length.isdigit() or int(length) > self._body_limit:
            return None
        try:
            data = environ["wsgi.input"].read(int(length))
        except Exception:  # noqa: BLE001 — the client went away mid-body
            # What was read is lost: the Flask app meets a short body and
            # answers it as such (400), as it would have met the break.
            environ["wsgi.input"] = io.BytesIO(b"")
            return None
        environ["wsgi.input"] = io.BytesIO(data)
        return data

    def _serve(self, environ, project_id: str, route: str, data: bytes) -> bytes | None:
        token = auth.parse_bearer(environ.get("HTTP_AUTHORIZATION", ""))
        if token is None or token.startswith(NODE_SECRET_PREFIX) or not is_identifier(project_id):
            return None
        raw = strict_json_loads(data)
        worker_id = raw.get("worker_id") if isinstance(raw, dict) else None
        if not is_identifier(worker_id):
            return None
        schema = _ROUTES[route][0]
        try:
            body = v.check(raw, schema)
        except v.InvalidRequest:
            return None
        if route == "fail" and outcomes.pauses_sites(body["items"]):
            return None   # pausing a site takes the session (app.sites.pushback)
        version = (environ.get("HTTP_X_CLIENT_VERSION")
                   or environ.get("HTTP_X_SAVEWEBHQ_CLIENT_VERSION"))
        token_hash = tokens.digest(token)
        key = (token_hash, project_id, worker_id)
        call = self._calls.get(key)
        if call is None or call.expires < time.monotonic():
            with self._statements() as run:
                call = self._look_up(run, token, project_id, worker_id)
            if call is None:
                return None
            if len(self._calls) >= _MAX_CALLS:
                self._calls.clear()
            self._calls[key] = call
        project = call.project
        if version is None or version not in project.client_versions \
                or (route == "complete" and project.kind != "generic"):
            return None
        extend_seconds = body.get("extend_seconds")
        results = self._batches[route].submit(
            (key, call.project_row_version, extend_seconds), body["items"],
            functools.partial(self._write, route, key, call, extend_seconds))
        if results is None:
            return None
        # Flask's JSON answer, exactly: compact, ASCII, a newline at the end.
        return (json.dumps({"results": results}, separators=(",", ":")) + "\n").encode()

    def _write(self, route: str, key: tuple[str, str, str], call: _Call, extend_seconds: int | None,
               items: list[dict]) -> list[dict] | None:
        """The statement of a batch of plain requests that share ``key`` and
        the call's look-up (app.api.hot_batches): their items' results, or
        None for the Flask app to answer them."""
        if len({(item["job_id"], item["attempt_id"]) for item in items}) < len(items):
            # An item named twice, perhaps by two requests with different
            # outcomes: one statement would apply the first and answer both
            # "applied". The Flask app answers each request in turn instead.
            return None
        token_hash, _, worker_id = key
        body: dict = {"worker_id": worker_id, "items": items}
        if extend_seconds is not None:
            body["extend_seconds"] = extend_seconds
        with self._statements() as run:
            if accounts.touch_due(token_hash, self.app):
                run.rows(accounts.TOUCH_SQL, {"h": token_hash})
            guarded = outcomes.Statements(run.rows, run.commit, _STILL_AUTHORIZED,
                                          {"h": token_hash, "row_version": call.project_row_version})
            try:
                return _ROUTES[route][1](call.project, Worker(worker_id=worker_id, owner=call.user_id),
                                         body, guarded)
            except outcomes.Unconfirmed:
                # The guard refused (something changed since the look-up) or
                # an item was stale: the Flask app looks again and explains.
                self._calls.pop(key, None)
                return None

    @staticmethod
    def _look_up(run: outcomes.Statements, token: str, project_id: str, worker_id: str) -> _Call | None:
        """The caller and the project (``auth.TOKEN_CALL``), if the call is plain."""
        params = accounts.lookup_params(token)
        rows = run.rows(auth.TOKEN_CALL, {"p": project_id, "w": worker_id, **params}, named=True)
        row = rows[0] if rows else None
        if (row is None or not hmac.compare_digest(row.token_hash, params["h"]) or row.user_status != "active"
                or "worker" not in row.user_roles or row.standing == "revoked"
                or row.mapped_user != row.user_id):
            return None
        project = view_from_named(row)
        if project is None:
            return None
        return _Call(row.user_id, project, row.project_row_version, time.monotonic() + CALL_TTL_S)

    @contextmanager
    def _statements(self) -> Iterator[outcomes.Statements]:
        """A fleet-pool connection, each statement committing alone.

        Up to ``KEEP_CONNECTIONS`` of them stay with the hot path between
        requests (in autocommit): a pool checkout and checkin cost a plain
        request about a tenth of its CPU. A connection that fails is given
        back to the pool to be replaced, and its request goes to the Flask app.
        """
        if self._pid != os.getpid():   # a forked worker: nothing of the parent's
            self._pid, self._kept = os.getpid(), []
        try:
            pooled, run = self._kept.pop()
        except IndexError:
            if self._engine is None:
                with self.app.app_context():
                    self._engine = db.engines[FLEET_BIND]
            pooled = self._engine.raw_connection()
            pooled.driver_connection.autocommit = True
            run = _connection_statements(pooled.driver_connection)
        driver = pooled.driver_connection
        try:
            yield run
        except psycopg.Error:
            if driver.broken:
                pooled.invalidate()
            raise
        finally:
            if not driver.closed and not driver.broken and len(self._kept) < KEEP_CONNECTIONS \
                    and driver.info.transaction_status == TransactionStatus.IDLE:
                self._kept.append((pooled, run))
            else:
                if not driver.closed:
                    driver.autocommit = False
                pooled.close()
