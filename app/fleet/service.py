"""Enrollment, node decisions and heartbeats (DESIGN §7).

Fleet actions (enroll, approve, reject, drain, enable, revoke) are called only
from the master's CLI and from signed-in admin pages — never from the machine
API, where they answer 403.
"""
from __future__ import annotations

import re
import time
from datetime import timedelta

from sqlalchemy import select, text

from app import audit
from app.accounts import tokens
from app.errors import Conflict, EnrollmentRefused, InvalidRequest, InvalidToken, NotFound, PermissionDenied
from app.extensions import app_cache, db
from app.fleet.models import EnrollmentCredential, FleetNode, TokenWorker

ENROLLMENT_PREFIX = "fhqe_"
NODE_SECRET_PREFIX = "fhqn_"
NODE_ID_RE = re.compile(r"\A[A-Za-z0-9_-]{16,128}\Z")
NODE_SECRET_RE = re.compile(r"\Afhqn_[A-Za-z0-9_-]{43}\Z")

# (action, from-statuses, to-status): the whole node state machine.
TRANSITIONS = {
    "approve": ({"pending"}, "active"),
    "reject": ({"pending"}, "rejected"),
    "drain": ({"active"}, "draining"),
    "enable": ({"draining"}, "active"),
    "revoke": ({"pending", "active", "draining"}, "revoked"),
}
TOKEN_WORKER_TRANSITIONS = {
    "drain": ({"active"}, "draining"),
    "enable": ({"draining"}, "active"),
    "revoke": ({"active", "draining"}, "revoked"),
}


def create_enrollment(created_by: str | None, valid_for: timedelta = timedelta(minutes=15)) -> str:
    """A one-use enrollment credential, returned in clear once. Commits."""
    secret = tokens.new_secret(ENROLLMENT_PREFIX)
    db.session.add(EnrollmentCredential(
        token_hash=tokens.digest(secret), created_by=created_by,
        expires_at=db.func.now() + valid_for))
    audit.record("node.enrollment", "enrollment", None,
                 {"valid_minutes": int(valid_for.total_seconds() // 60)})
    db.session.commit()
    return secret


def register(node_id: str, name: str, enrollment_token: str, secret: str) -> FleetNode:
    """Register a node identity with a credential. Commits.

    A lost response is retried with the same identity and succeeds again; a
    consumed credential cannot register a different identity.
    """
    if not NODE_ID_RE.match(node_id or ""):
        raise InvalidRequest("id must be 16..128 url-safe characters", details={"field": "id"})
    if not NODE_SECRET_RE.match(secret or ""):
        raise InvalidRequest("secret must be fhqn_ + 32 random bytes in unpadded base64url",
                             details={"field": "secret"})
    if not isinstance(name, str) or not 1 <= len(name) <= 128 or not name.isprintable():
        raise InvalidRequest("name must be 1..128 printable characters", details={"field": "name"})
    if not enrollment_token.startswith(ENROLLMENT_PREFIX):
        raise EnrollmentRefused("invalid enrollment credential")
    credential = db.session.scalars(
        select(EnrollmentCredential).where(
            EnrollmentCredential.token_hash == tokens.digest(enrollment_token)).with_for_update()
    ).first()
    if credential is None:
        raise EnrollmentRefused("invalid enrollment credential")
    secret_hash = tokens.digest(secret)
    if credential.used_at is not None:
        node = db.session.get(FleetNode, credential.node_id)
        if node is not None and node.id == node_id and tokens.matches(secret, node.secret_hash):
            db.session.commit()
            return node  # the same identity retrying after a lost response
        raise EnrollmentRefused("enrollment credential already used")
    expired = db.session.execute(text("SELECT :t <= now()"), {"t": credential.expires_at}).scalar()
    if expired:
        raise EnrollmentRefused("enrollment credential expired")
    if db.session.get(FleetNode, node_id) is not None:
        raise Conflict("node id already registered; generate a fresh identity",
                       code="invalid_transition")
    node = FleetNode(id=node_id, name=name, status="pending", secret_hash=secret_hash,
                     enrollment_id=credential.id)
    db.session.add(node)
    credential.used_at = db.func.now()
    credential.node_id = node_id
    db.session.commit()
    return node


def authenticate_node(secret: str) -> FleetNode:
    if not NODE_SECRET_RE.match(secret):
        raise InvalidToken("invalid node secret")
    node = db.session.scalars(select(FleetNode).where(
        FleetNode.secret_hash == tokens.digest(secret))).first()
    if node is None or not tokens.matches(secret, node.secret_hash) \
            or node.status in ("rejected", "revoked"):
        raise InvalidToken("invalid node secret")
    return node


def get_node(node_id: str) -> FleetNode:
    node = db.session.get(FleetNode, node_id, populate_existing=True)
    if node is None:
        raise NotFound(f"node {node_id!r} not found", details={"worker_id": node_id})
    return node


def _transition(label: str, action: str, rules: dict, update_sql: str, params: dict, load,
                worker: tuple[str, str | None], reason: str | None, also=None):
    """One guarded status UPDATE; the row count decides. A revoke also cancels
    the worker's running attempts in the same transaction, and runs ``also``
    there (its answer joins the details). Commits; returns (the row, details).

    Raises:
        InvalidRequest (unknown action), NotFound, Conflict ``invalid_transition``.
    """
    if action not in rules:
        raise InvalidRequest(f"unknown action {action!r} for a {label}")
    allowed, target = rules[action]
    moved = db.session.execute(text(update_sql),
                               {**params, "to": target, "allowed": sorted(allowed)}).first()
    if moved is None:
        current = load()
        db.session.rollback()
        raise Conflict(f"cannot {action} a {current.status} {label}", code="invalid_transition",
                       details={"status": current.status, "action": action})
    details = {}
    if action == "revoke":
        from app.projects import leasing
        from app.uploads import transitions
        cancelled = leasing.cancel_worker_attempts(*worker)
        details = {"cancelled_attempts": len(cancelled), "held_uploads": transitions.hold_uploads(cancelled),
                   **(also() if also is not None else {})}
    kind = "node" if worker[1] is None else "token_worker"
    audit.record(f"{kind}.{action}", kind, worker[0] if worker[1] is None else f"{worker[1]}/{worker[0]}",
                 details, reason=reason)
    db.session.commit()
    return load(), details


def decide(node_id: str, action: str, *, actor: str, reason: str | None = None) -> FleetNode:
    """Apply a fleet action (approve, reject, drain, enable, revoke) to a node;
    ``reason``: what the admin typed (revoke, reject), kept in the audit log."""
    return _transition(
        "node", action, TRANSITIONS,
        "UPDATE fleet_nodes SET status = :to, updated_at = now(), decided_at = now(), "
        "decided_by = :actor WHERE id = :id AND status = ANY(:allowed) RETURNING id",
        {"actor": actor, "id": node_id}, lambda: get_node(node_id), (node_id, None), reason)[0]


def get_token_worker(user_id: str, worker_id: str) -> TokenWorker:
    worker = db.session.get(TokenWorker, (user_id, worker_id), populate_existing=True)
    if worker is None:
        raise NotFound(f"token worker {user_id}/{worker_id} not found")
    return worker


def decide_token_worker(user_id: str, worker_id: str, action: str, reason: str | None = None, *,
                        end_token: bool = True) -> tuple[TokenWorker, dict]:
    """Drain, enable or revoke a token worker (a user's machine token + worker
    id). Returns the worker and what the action did (a revoke: the attempts it
    cancelled, the uploads it held, ``token_ended``).

    ``end_token``: a revoke also ends the user's machine token, in the same
    transaction. Without it, the same token may claim again at once under a
    new worker id (SDKs pick a fresh one at every start) and take back the
    jobs the revoke just cancelled.
    """
    from app.accounts import service as accounts   # it imports this module
    return _transition(
        "token worker", action, TOKEN_WORKER_TRANSITIONS,
        "UPDATE token_workers SET status = :to, updated_at = now() "
        "WHERE user_id = :u AND worker_id = :w AND status = ANY(:allowed) RETURNING worker_id",
        {"u": user_id, "w": worker_id}, lambda: get_token_worker(user_id, worker_id),
        (worker_id, user_id), reason,
        also=lambda: {"token_ended": end_token and accounts.end_token(user_id)})


# Recording a token worker on every claim would add a write to the hot path;
# once per interval per process keeps the worker list fresh enough.
_NOTE_EVERY_S = 30.0


def note_token_worker(user_id: str, worker_id: str) -> None:
    now = time.monotonic()
    noted: dict[tuple[str, str], float] = app_cache("token_workers_noted")
    if now - noted.get((user_id, worker_id), -_NOTE_EVERY_S) < _NOTE_EVERY_S:
        return
    if len(noted) > 100_000:  # SDKs pick a new worker id at every start
        noted.clear()
    noted[(user_id, worker_id)] = now
    db.session.execute(text(
        "INSERT INTO token_workers (user_id, worker_id) VALUES (:u, :w) "
        "ON CONFLICT (user_id, worker_id) DO UPDATE SET last_seen_at = now()"),
        {"u": user_id, "w": worker_id})
    db.session.commit()


def map_worker(user_id: str, worker_id: str) -> None:
    """SavewebHQ's worker map: the worker id now names this user, in the
    caller's transaction (no commit). Worker calls read the current mapping
    with their credentials and call this whenever it differs (missing or
    another user), so the map is right after every call, whichever web
    process served it; an unchanged mapping costs nothing."""
    db.session.execute(text(
        "INSERT INTO worker_users (worker_id, user_id) VALUES (:w, :u) "
        "ON CONFLICT (worker_id) DO UPDATE SET user_id = EXCLUDED.user_id, updated_at = now() "
        "WHERE worker_users.user_id <> EXCLUDED.user_id"),
        {"u": user_id, "w": worker_id})


def heartbeat(worker, body: dict, lease_seconds: int) -> dict:
    """Record a heartbeat and renew the leases of the attempts it lists. Commits."""
    from app.projects import leasing
    params = {"cap": body["capacity"], "b": body["browser_ok"], "d": body["disk_free_bytes"],
              "s": body["spool_bytes"], "e": body.get("last_error"), "w": worker.worker_id,
              "u": worker.owner, "pr": body.get("projects")}
    if worker.owner is None:
        status = db.session.execute(text(
            "UPDATE fleet_nodes SET last_heartbeat_at = now(), capacity = :cap, browser_ok = :b, "
            "disk_free_bytes = :d, spool_bytes = :s, last_error = :e, projects = :pr "
            "WHERE id = :w RETURNING status"),
            params).scalar()
    else:
        status = db.session.execute(text(
            "INSERT INTO token_workers (user_id, worker_id, last_heartbeat_at, capacity, browser_ok, "
            "disk_free_bytes, spool_bytes, last_error, projects) "
            "VALUES (:u, :w, now(), :cap, :b, :d, :s, :e, :pr) "
            "ON CONFLICT (user_id, worker_id) DO UPDATE SET last_heartbeat_at = now(), "
            "last_seen_at = now(), capacity = :cap, browser_ok = :b, disk_free_bytes = :d, "
            "spool_bytes = :s, last_error = :e, projects = :pr RETURNING status"), params).scalar()
    db.session.commit()
    ids = [int(a) for a in body["running_attempt_ids"] if a.isascii() and a.isdigit() and len(a) <= 18]
    leases = leasing.renew_for_heartbeat(worker, ids, lease_seconds) if status != "revoked" else {}
    answer = {"status": status, "lease_expires": leases}
    if body.get("projects"):
        answer["shares"] = dict(db.session.execute(text(
            "SELECT id, share_weight FROM projects WHERE id = ANY(:pr)"), params).all())
    return answer


def refuse_machine_fleet_action() -> None:
    raise PermissionDenied("fleet actions need a signed-in admin or the master's CLI")
