"""Who did what: one row per admin or fleet action, in the action's transaction
(a run of enqueue or import batches is one action: :func:`tally`).

The services that own each change (projects, enqueue, accounts, fleet, hooks,
held uploads, job requeue/delete) call :func:`record` before they commit, so
an action and its audit row land together or not at all, whichever entry
point (page, API, CLI) asked for it.

Who acted is set by the entry point, not passed through every service:
the pages and the machine API call :func:`acting_as` once they know the
caller (``user:<id>``; a machine credential of a node is ``node:<id>``); the
task and clock processes are ``system``; anything else in an app context
without a request is a command on the master host, ``cli@<host>``.
"""
from __future__ import annotations

import json
import socket
from datetime import datetime

from flask import g, has_request_context
from sqlalchemy import text

from app.extensions import db

REASON_MAX = 1000
DETAILS_MAX_BYTES = 8192


def acting_as(actor: str) -> None:
    """Name who acts for the rest of this request or app context."""
    g.audit_actor = actor


def current_actor() -> str:
    actor = g.get("audit_actor")
    if actor:
        return actor
    return "anonymous" if has_request_context() else f"cli@{socket.gethostname()}"


def record(action: str, object_kind: str, object_id, details: dict | None = None, *,
           reason: str | None = None) -> None:
    """Add one audit row in the caller's transaction (no commit).

    ``action``: dotted verb, e.g. ``project.create``, ``node.revoke``;
    ``details``: what changed (sizes, fields), never a secret; ``reason``:
    the text the admin typed, where the page asks for one."""
    payload = json.dumps(details or {}, default=str, separators=(",", ":"))
    if len(payload) > DETAILS_MAX_BYTES:  # a bulk action's id list, say: keep its size, not its bulk
        payload = json.dumps({"truncated": True, "bytes": len(payload)})
    reason = (reason or "").strip()[:REASON_MAX] or None
    db.session.execute(text(
        "INSERT INTO audit_log (actor, action, object_kind, object_id, details, reason) "
        "VALUES (:actor, :action, :kind, :oid, CAST(:details AS jsonb), :reason)"),
        {"actor": current_actor(), "action": action, "kind": object_kind,
         "oid": None if object_id is None else str(object_id), "details": payload, "reason": reason})


# A run of enqueues (hqctl enqueue sends 1,000 jobs a request; a source
# import commits in batches) is one row: the batches of one actor for one
# project add into the row of its run while they keep coming.
RUN_GAP_S = 60.0

_TALLY = """
UPDATE audit_log SET details = details || jsonb_build_object({sums}, 'batches',
        COALESCE((details->>'batches')::bigint, 1) + 1, 'last_at', now())
WHERE id = (SELECT id FROM audit_log
            WHERE action = :action AND actor = :actor AND object_kind = :kind AND object_id = :oid
              AND at > now() - interval '1 day'
              AND COALESCE((details->>'last_at')::timestamptz, at) > now() - make_interval(secs => :gap)
            ORDER BY id DESC LIMIT 1 FOR UPDATE)
RETURNING id
"""


def tally(action: str, object_kind: str, object_id, counts: dict[str, int]) -> None:
    """Add counts to the audit row of this actor's run of ``action`` on the
    object (the newest such row whose last batch is under ``RUN_GAP_S`` old),
    or start a run. In the caller's transaction (no commit). Details:
    the counts summed, ``batches`` and ``last_at``."""
    names = sorted(counts)
    if any(not name.isidentifier() for name in names):
        raise ValueError("tally counts are named by identifiers")
    sums = ", ".join(f"'{n}', COALESCE((details->>'{n}')::bigint, 0) + :c_{n}" for n in names)
    params = {"action": action, "actor": current_actor(), "kind": object_kind,
              "oid": None if object_id is None else str(object_id), "gap": RUN_GAP_S,
              **{f"c_{n}": int(counts[n]) for n in names}}
    if db.session.execute(text(_TALLY.format(sums=sums)), params).first() is None:
        record(action, object_kind, object_id, {**counts, "batches": 1})


PAGE_MAX = 500
FILTER_MAX_CHARS = 256


def listing(*, actor: str | None = None, action: str | None = None, object_kind: str | None = None,
            object_id: str | None = None, before_id: int | None = None, limit: int = 100,
            since: datetime | None = None, until: datetime | None = None) -> dict:
    """Audit rows newest first, filtered; ``action`` ending in ``.`` is a prefix
    (``node.`` is every node action); ``since``/``until`` bound the time
    (``since <= at < until``). Returns ``{"entries", "next_before_id"}``."""
    limit = max(1, min(int(limit), PAGE_MAX))
    where, params = [], {"n": limit + 1}
    for column, value in (("actor", actor), ("object_kind", object_kind), ("object_id", object_id)):
        if value:
            where.append(f"{column} = :{column}")
            params[column] = value[:FILTER_MAX_CHARS]
    if action:
        if action.endswith("."):
            where.append("action LIKE :action_prefix")
            params["action_prefix"] = action[:FILTER_MAX_CHARS].replace("%", r"\%").replace("_", r"\_") + "%"
        else:
            where.append("action = :action")
            params["action"] = action[:FILTER_MAX_CHARS]
    if since is not None:
        where.append("at >= :since")
        params["since"] = since
    if until is not None:
        where.append("at < :until")
        params["until"] = until
    if before_id is not None:
        where.append("id < :before")
        params["before"] = before_id
    rows = db.session.execute(text(
        "SELECT id, at, actor, action, object_kind, object_id, details, reason FROM audit_log "
        f"{'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY id DESC LIMIT :n"),
        params).mappings().all()
    more = len(rows) > limit
    entries = [dict(row) for row in rows[:limit]]
    return {"entries": entries, "next_before_id": entries[-1]["id"] if more else None}
