"""Lanes on one queue: worker tiers, the local fetcher and the remote switch.

Every worker (enrolled node or token worker) has a tier: ``auto`` (every new
worker's) follows the project's ``lane_order`` — under ``local_first`` (pdf)
the local fetcher is first and every remote worker fallback, under
``remote_first`` (documents, generic) the other way round — and an admin may
pin a worker ``first`` or ``fallback`` for every project. A ``first`` worker
is offered every job; a ``fallback`` worker only a job that has waited the
project's ``fallback_after_seconds``, or any job while no first-choice worker
could take it (none that serves the project — by its heartbeat's
``projects`` — with a fresh heartbeat and a free slot). The master's own
fetcher (``flask fleet local-worker``) is a node marked ``local``; the
master-wide remote switch (``master_settings`` row ``remote``) stops every
other worker's new claims at once and leaves the local lane running.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import text

from app import audit
from app.errors import InvalidRequest, NotFound
from app.extensions import app_cache, db
from app.fleet.models import TIERS
from app.projects.states import holds_slot

REMOTE = "remote"


@dataclass(frozen=True)
class Lane:
    """Where a claiming worker stands: its tier and whether it is the local fetcher."""
    tier: str = "auto"
    local: bool = False

    def tier_in(self, lane_order: str) -> str:
        """Its tier in a project of this lane order (see effective_tier)."""
        return effective_tier(self.tier, self.local, lane_order)


def effective_tier(tier: str, local: bool, lane_order: str) -> str:
    """A tier an admin set wins; ``auto`` is first for the lane the project's
    lane_order puts first (the local fetcher under local_first, every other
    worker under remote_first) and fallback for the other."""
    if tier != "auto":
        return tier
    return "first" if local == (lane_order == "local_first") else "fallback"


def lane_orders() -> list[dict]:
    """Each live project's lane order, for the workers page."""
    return [dict(r._mapping) for r in db.session.execute(text(
        "SELECT id, kind, lane_order, fallback_after_seconds FROM projects "
        "WHERE status <> 'archived' ORDER BY id LIMIT 200")).all()]


# --------------------------------------------------------------- the switch

def remote_enabled() -> bool:
    """The switch as stored; no row means on."""
    row = db.session.execute(text("SELECT enabled FROM master_settings WHERE name = :n"),
                             {"n": REMOTE}).first()
    return True if row is None else bool(row[0])


def set_remote(enabled: bool, actor: str) -> dict:
    """Turn remote delegation on or off for every web process. Commits.

    Turning it on wakes every waiting claimer: remote long polls held back by
    the switch take work at once instead of at their next poll.
    """
    db.session.execute(text(
        "INSERT INTO master_settings (name, enabled, updated_by) VALUES (:n, :e, :a) "
        "ON CONFLICT (name) DO UPDATE SET enabled = :e, updated_by = :a, updated_at = now()"),
        {"n": REMOTE, "e": enabled, "a": actor})
    if enabled:
        from app.projects import wakeups
        for (project_id,) in db.session.execute(text(
                "SELECT id FROM projects WHERE status = 'active'")).all():
            wakeups.notify(project_id)
    audit.record("fleet.remote", "setting", REMOTE, {"enabled": enabled})
    db.session.commit()
    return {"remote": "on" if enabled else "off", "updated_by": actor}


# The claim's own check (one primary-key probe, evaluated once per statement),
# so a claim racing the switch never hands out work after it was turned off.
REMOTE_ON_SQL = ("AND NOT EXISTS (SELECT 1 FROM master_settings "
                 "WHERE name = 'remote' AND NOT enabled)")


# ------------------------------------------------------------------- tiers

def set_tier(worker_id: str, tier: str, user_id: str | None = None) -> dict:
    """Set a node's tier (or a token worker's, with ``user_id``). Commits.

    Raises:
        InvalidRequest: unknown tier. NotFound: no such worker.
    """
    if tier not in TIERS:
        raise InvalidRequest(f"tier must be one of {', '.join(TIERS)}", details={"field": "tier"})
    if user_id is None:
        row = db.session.execute(text(
            "UPDATE fleet_nodes SET tier = :t, updated_at = now() WHERE id = :w "
            "RETURNING id, name, status, tier, local"), {"t": tier, "w": worker_id}).first()
        if row is None:
            raise NotFound(f"node {worker_id!r} not found", details={"worker_id": worker_id})
        result = {"worker_id": row[0], "name": row[1], "status": row[2], "tier": row[3],
                  "local": row[4]}
    else:
        row = db.session.execute(text(
            "UPDATE token_workers SET tier = :t, updated_at = now() "
            "WHERE user_id = :u AND worker_id = :w RETURNING worker_id, user_id, status, tier"),
            {"t": tier, "u": user_id, "w": worker_id}).first()
        if row is None:
            raise NotFound(f"token worker {user_id}/{worker_id} not found",
                           details={"worker_id": worker_id, "user_id": user_id})
        result = {"worker_id": row[0], "user_id": row[1], "status": row[2], "tier": row[3]}
    kind = "node" if user_id is None else "token_worker"
    audit.record(f"{kind}.tier", kind, worker_id if user_id is None else f"{user_id}/{worker_id}",
                 {"tier": tier})
    db.session.commit()
    app_cache("first_choice_free").clear()  # a promoted or demoted worker counts at once
    return result


# A first-choice worker is free when the jobs holding its slots in the project
# (as the in-flight caps count them: running, or staged) are fewer than its
# slots: the capacity its last heartbeat reported (its download concurrency),
# bounded by the project's max_worker_in_flight.
_FIRST_FREE_SQL = f"""
WITH switch AS (
    SELECT NOT EXISTS (SELECT 1 FROM master_settings WHERE name = '{REMOTE}' AND NOT enabled)
           AS remote_on)
SELECT EXISTS (
    SELECT 1 FROM fleet_nodes n, switch
    WHERE (n.tier = 'first' OR (n.tier = 'auto' AND n.local = :local_first))
      AND n.status = 'active' AND (n.local OR switch.remote_on)
      AND n.last_heartbeat_at > now() - make_interval(secs => :stale_s)
      AND (n.projects IS NULL OR :p = ANY(n.projects))
      AND (SELECT count(*) FROM jobs j WHERE j.project_id = :p AND {holds_slot('j')}
           AND j.worker_id = n.id AND j.worker_owner IS NULL)
          < LEAST(n.capacity, CAST(:cap AS int))
    UNION ALL
    SELECT 1 FROM token_workers t, switch
    WHERE (t.tier = 'first' OR (t.tier = 'auto' AND NOT :local_first))
      AND t.status = 'active' AND switch.remote_on
      AND t.last_heartbeat_at > now() - make_interval(secs => :stale_s)
      AND (t.projects IS NULL OR :p = ANY(t.projects))
      AND (SELECT count(*) FROM jobs j WHERE j.project_id = :p AND {holds_slot('j')}
           AND j.worker_id = t.worker_id AND j.worker_owner = t.user_id)
          < LEAST(t.capacity, CAST(:cap AS int))
)
"""

# Fallback workers ask often (every long-poll round); the answer may be this
# old. Short against any sensible fallback_after_seconds.
FIRST_FREE_CACHE_S = 1.0


def first_choice_free(project_id: str, max_worker_in_flight: int | None, stale_s: float,
                      lane_order: str) -> bool:
    """Could a first-choice worker (in this project's lane order) take a job
    of this project now?"""
    now = time.monotonic()
    _first_free: dict[str, tuple[float, bool]] = app_cache("first_choice_free")
    cached = _first_free.get(project_id)
    if cached is not None and now - cached[0] < FIRST_FREE_CACHE_S:
        return cached[1]
    if len(_first_free) > 10_000:
        _first_free.clear()
    free = bool(db.session.execute(text(_FIRST_FREE_SQL), {
        "p": project_id, "stale_s": float(stale_s), "local_first": lane_order == "local_first",
        "cap": max_worker_in_flight if max_worker_in_flight is not None else 2**31 - 1}).scalar())
    _first_free[project_id] = (now, free)
    return free


# -------------------------------------------------------------- local lane

def ensure_local_node(node_id: str, name: str, secret: str, tier: str | None) -> dict:
    """Create (or find again) the master's own fetcher node, approved and
    marked local, for the identity its volume holds. Commits.

    Idempotent: a restart with the same volume finds the node and changes
    only the tier, when one is given. A node an admin revoked or rejected
    stays so (the worker then exits with its "revoked" code); a new volume
    needs a new node.

    Raises:
        InvalidRequest: unknown tier. Conflict: the id belongs to another secret.
    """
    from app.accounts import tokens
    from app.errors import Conflict
    if tier is not None and tier not in TIERS:
        raise InvalidRequest(f"tier must be one of {', '.join(TIERS)}", details={"field": "tier"})
    row = db.session.execute(text(
        "INSERT INTO fleet_nodes (id, name, status, secret_hash, tier, local, decided_at, decided_by) "
        "VALUES (:id, :name, 'active', :h, :tier, true, now(), 'local-worker') "
        "ON CONFLICT (id) DO UPDATE SET local = true, tier = COALESCE(:given, fleet_nodes.tier), "
        "updated_at = now() WHERE fleet_nodes.secret_hash = :h "
        "RETURNING id, name, status, tier, local, (xmax = 0) AS created"),
        {"id": node_id, "name": name, "h": tokens.digest(secret), "tier": tier or "auto",
         "given": tier}).first()
    if row is None:
        db.session.rollback()
        raise Conflict(f"node {node_id!r} exists with another secret: give the fetcher a new volume",
                       code="invalid_transition", details={"worker_id": node_id})
    db.session.commit()
    app_cache("first_choice_free").clear()
    return {"worker_id": row[0], "name": row[1], "status": row[2], "tier": row[3],
            "local": row[4], "created": row[5]}
