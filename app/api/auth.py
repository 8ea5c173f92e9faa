"""Bearer-token authentication and the client-version gate for API views."""
from __future__ import annotations

from flask import current_app, g, request

from app.accounts import service as accounts
from app.accounts.service import Principal
from app.errors import InvalidToken, PermissionDenied, UpgradeRequired
from workers.protocol import CLIENT_VERSION_HEADER, CLIENT_VERSION_HEADER_ALIAS


def principal() -> Principal:
    """The caller, from ``Authorization: Bearer``; a browser cookie is never enough."""
    cached = getattr(g, "principal", None)
    if cached is not None:
        return cached
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise InvalidToken("missing bearer token")
    g.principal = accounts.authenticate(token.strip())
    return g.principal


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
