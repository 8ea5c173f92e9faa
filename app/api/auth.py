"""Bearer-token authentication and the client-version gate for API views.

Two kinds of bearer: enrolled-node secrets (``fhqn_``) and user machine tokens
(anything else well-formed: ``fhq_`` ones FleetHQ issued, or tokens an operator
installed). A browser session cookie is never accepted here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import current_app, g, request

from app import audit
from app.accounts import service as accounts
from app.accounts import tokens
from app.accounts.service import Principal
from app.errors import AwaitingApproval, InvalidToken, PermissionDenied, UpgradeRequired
from app.extensions import fetch_rows
from app.fleet import service as fleet
from app.fleet.lanes import Lane
from app.projects import service as projects
from app.projects.leasing import Worker
from workers.wire.protocol import CLIENT_VERSION_HEADER, CLIENT_VERSION_HEADER_ALIAS


@dataclass(frozen=True)
class WorkerCall:
    """An authenticated worker call on a project's job routes."""
    principal: Principal
    project: "projects.ProjectView"
    worker: Worker
    status: str                 # node or token-worker status: active, draining, pending…
    heartbeat_age_s: float | None
    lane: Lane = Lane()
    # The user the worker map names for this worker id now (token workers;
    # None when unmapped), read in the same round trip so that an unchanged
    # mapping costs no statement of its own.
    mapped_user: str | None = None


def parse_bearer(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value (as
    WSGI hands it over), parsed as SavewebHQ does: one space after the
    scheme, then a token without whitespace. None if there is none."""
    scheme, found, token = tokens.from_header(authorization).strip().partition(" ")
    if not found or scheme.lower() != "bearer" or not tokens.well_formed(token):
        return None
    return token


def bearer() -> str:
    """The request's bearer token (``parse_bearer``)."""
    token = parse_bearer(request.headers.get("Authorization", ""))
    if token is None:
        raise InvalidToken("missing or malformed bearer token")
    return token


def principal() -> Principal:
    """The caller, from ``Authorization: Bearer``."""
    cached = getattr(g, "principal", None)
    if cached is not None:
        return cached
    token = bearer()
    if token.startswith(fleet.NODE_SECRET_PREFIX):
        node = fleet.authenticate_node(token)
        g.principal = Principal(user_id=None, roles=frozenset({"worker"}), node_id=node.id,
                                node_status=node.status)
    else:
        g.principal = accounts.authenticate(token)
    _acting(g.principal)
    return g.principal


def _acting(who: Principal) -> None:
    audit.acting_as(f"user:{who.user_id}" if who.user_id else f"node:{who.node_id}")


_NODE_CALL = f"""
SELECT n.id AS node_id, n.status AS standing, n.secret_hash,
       extract(epoch FROM now() - n.last_heartbeat_at) AS heartbeat_age_s, n.tier, n.local,
       {projects.VIEW_COLUMNS}
FROM fleet_nodes n LEFT JOIN projects p ON p.id = :p
WHERE n.secret_hash = :h
"""

# A token worker's call: one row with the token's user, the worker's standing,
# its mapped user and the project (LEFT JOINs: None when absent). The
# project row's version (xmin: it changes with every update of the row) lets
# app.api.hot_path keep the view and check at write time that it still holds.
TOKEN_CALL = f"""
SELECT {accounts.TOKEN_LOOKUP_COLUMNS}, tw.status AS standing,
       extract(epoch FROM now() - tw.last_heartbeat_at) AS heartbeat_age_s, tw.tier,
       wu.user_id AS mapped_user, p.xmin::text AS project_row_version, {projects.VIEW_COLUMNS}
FROM {accounts.TOKEN_LOOKUP_FROM}
LEFT JOIN projects p ON p.id = :p
LEFT JOIN token_workers tw ON tw.user_id = u.id AND tw.worker_id = :w
LEFT JOIN worker_users wu ON wu.worker_id = :w
WHERE {accounts.TOKEN_LOOKUP_WHERE}
"""


# An admin's call on one project: the token's user and the project's view
# (LEFT JOIN: None when there is no such project).
_ADMIN_CALL = f"""
SELECT {accounts.TOKEN_LOOKUP_COLUMNS}, {projects.VIEW_COLUMNS}
FROM {accounts.TOKEN_LOOKUP_FROM}
LEFT JOIN projects p ON p.id = :p
WHERE {accounts.TOKEN_LOOKUP_WHERE}
"""


def _first(rows: list) -> Any:
    return rows[0] if rows else None


def worker_call(project_id: str, worker_id: str | None) -> WorkerCall:
    """Authenticate a worker call, load its project and the worker's standing
    in one round trip.

    Raises:
        InvalidToken, PermissionDenied (not an active user with role worker,
        pending node, revoked token worker, node using another worker id),
        NotFound.
    """
    token = bearer()
    if token.startswith(fleet.NODE_SECRET_PREFIX):
        row = _first(fetch_rows(_NODE_CALL, {"p": project_id, "h": tokens.digest(token)}, named=True))
        if row is None or not tokens.matches(token, row.secret_hash) \
                or row.standing in ("rejected", "revoked"):
            raise InvalidToken("invalid node secret")
        who = Principal(user_id=None, roles=frozenset({"worker"}), node_id=row.node_id,
                        node_status=row.standing)
        if row.standing == "pending":
            raise AwaitingApproval()
        if worker_id is not None and worker_id != row.node_id:
            raise PermissionDenied("a node's worker_id is its node id")
        status, lane = row.standing, Lane(row.tier, row.local)
        project = _project(project_id, row)
        worker = Worker(worker_id=row.node_id, owner=None)
        mapped = None
    else:
        row = _first(fetch_rows(TOKEN_CALL, {"p": project_id, "w": worker_id,
                                              **accounts.lookup_params(token)}, named=True))
        if row is None:
            raise InvalidToken("invalid machine token")
        who = accounts.authenticate(token, row=(row.user_id, row.user_roles, row.user_status,
                                                row.token_hash))
        status, lane = row.standing or "active", Lane(row.tier or "auto")
        # As SavewebHQ: an unknown project is 404 whoever asks; then the user
        # must be an active worker.
        project = _project(project_id, row)
        if not _active_user_with(who, ("worker",)):
            raise PermissionDenied("active worker role required")
        if status == "revoked":
            raise PermissionDenied("this worker id was revoked")
        worker = Worker(worker_id=worker_id, owner=who.user_id)
        mapped = row.mapped_user
    g.principal = who
    _acting(who)
    age = row.heartbeat_age_s
    return WorkerCall(who, project, worker, status, None if age is None else float(age), lane, mapped)


def admin_call(project_id: str) -> "projects.ProjectView | None":
    """``require("admin")`` and the project's view in one round trip (a
    1,000-job enqueue spent about a tenth of its web CPU on the two
    look-ups apart). The project is None when there is none: the route says
    404 after its body's checks, in the order it always answered.

    Raises:
        InvalidToken, PermissionDenied: as ``require("admin")``.
    """
    token = bearer()
    if token.startswith(fleet.NODE_SECRET_PREFIX):
        require("admin")   # refuses: a node is never an admin
    row = _first(fetch_rows(_ADMIN_CALL, {"p": project_id, **accounts.lookup_params(token)}, named=True))
    if row is None:
        raise InvalidToken("invalid machine token")
    g.principal = accounts.authenticate(token, row=(row.user_id, row.user_roles, row.user_status,
                                                    row.token_hash))
    _acting(g.principal)
    require("admin")
    return projects.view_from_named(row)


def _project(project_id: str, row) -> "projects.ProjectView":
    project = projects.view_from_named(row)
    if project is None:
        raise projects.not_found(project_id)
    return project


def _active_user_with(who: Principal, roles) -> bool:
    return who.user_status == "active" and who.has(*roles)


def require(*roles: str) -> Principal:
    """A caller with one of ``roles``: for a user, an active one (a pending
    or suspended user's token still authenticates, as in SavewebHQ, but is
    refused here with 403)."""
    who = principal()
    allowed = who.has(*roles) if who.node_id is not None else _active_user_with(who, roles)
    if not allowed:
        raise PermissionDenied(f"active {' or '.join(roles)} role required")
    return who


def require_worker() -> Principal:
    """Any worker identity: an active/draining node or a user with role worker."""
    who = principal()
    if who.node_id is not None:
        if who.node_status == "pending":
            raise AwaitingApproval()
        return who
    if not _active_user_with(who, ("worker",)):
        raise PermissionDenied("active worker role required")
    return who


def client_version() -> str | None:
    return (request.headers.get(CLIENT_VERSION_HEADER)
            or request.headers.get(CLIENT_VERSION_HEADER_ALIAS))


def check_client_version(project) -> None:
    version = client_version()
    if version is None or version not in project.client_versions:
        raise UpgradeRequired(
            "client version missing or not allowed for this project",
            details={"client_versions": list(project.client_versions),
                     # SavewebHQ names a missing header as "", not null.
                     "client_version": version or ""})


_BODY_LIMITS = {"worker": "WORKER_BODY_LIMIT", "api": "API_BODY_LIMIT", "enqueue": "ENQUEUE_BODY_LIMIT"}


def body_limit(kind: str) -> int:
    return current_app.config[_BODY_LIMITS[kind]]
