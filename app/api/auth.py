"""Bearer-token authentication and the client-version gate for API views."""
from __future__ import annotations

from flask import current_app, g, request
from sqlalchemy import text

from app.accounts import service as accounts
from app.accounts.service import Principal
from app.errors import InvalidToken, PermissionDenied, UpgradeRequired
from app.extensions import db
from app.projects import service as projects
from workers.protocol import CLIENT_VERSION_HEADER, CLIENT_VERSION_HEADER_ALIAS


def _bearer() -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise InvalidToken("missing bearer token")
    return token.strip()


def principal() -> Principal:
    """The caller, from ``Authorization: Bearer``; a browser cookie is never enough."""
    cached = getattr(g, "principal", None)
    if cached is not None:
        return cached
    g.principal = accounts.authenticate(_bearer())
    return g.principal


def worker_and_project(project_id: str) -> tuple[Principal, "projects.ProjectView"]:
    """Authenticate a worker call and load its project in one round trip.

    Raises:
        InvalidToken, PermissionDenied, NotFound.
    """
    bearer = _bearer()
    if not accounts.well_formed(bearer):
        raise InvalidToken("invalid machine token")
    row = db.session.execute(text(
        f"SELECT {accounts.TOKEN_LOOKUP_COLUMNS}, {projects.VIEW_COLUMNS} "
        f"FROM {accounts.TOKEN_LOOKUP_FROM} LEFT JOIN projects p ON p.id = :p "
        "WHERE t.token_hash = :h"),
        {"p": project_id, "h": accounts.tokens.digest(bearer)}).first()
    who = accounts.authenticate(bearer, row=row)
    g.principal = who
    if not who.has("worker"):
        raise PermissionDenied("requires role worker")
    project = projects.view_from_row(row[4:])
    if project is None:
        raise projects.not_found(project_id)
    return who, project


def require(*roles: str) -> Principal:
    who = principal()
    if not who.has(*roles):
        raise PermissionDenied(f"requires role {' or '.join(roles)}")
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
                     "client_version": version})


def body_limit(kind: str) -> int:
    return current_app.config["WORKER_BODY_LIMIT" if kind == "worker" else "ENQUEUE_BODY_LIMIT"]
