"""Read-only views of the fleet: the worker list and remote job progress."""
from __future__ import annotations

from sqlalchemy import text

from app.extensions import db

MAX_ROWS = 500


def stale_sql(t: str, *, token: bool) -> str:
    """The one rule of a stale worker (``:stale`` seconds), for the list and
    the dashboard's count alike: silent longer than that since it was last
    heard. Never stale: a token worker that never sent a heartbeat (an SDK
    worker that only claims, by design), nor a worker whose last heartbeat
    offered no slot (it signed off: SIGTERM, a host going to sleep)."""
    window = "now() - make_interval(secs => :stale)"
    if token:
        return (f"({t}.last_heartbeat_at IS NOT NULL AND {t}.capacity IS DISTINCT FROM 0 "
                f"AND GREATEST({t}.last_heartbeat_at, {t}.last_seen_at) < {window})")
    return (f"({t}.last_heartbeat_at IS NULL OR ({t}.capacity IS DISTINCT FROM 0 "
            f"AND {t}.last_heartbeat_at < {window}))")


_WORKERS = f"""
WITH live AS (
    -- An expired lease is not running any more: the reaper will requeue it.
    SELECT worker_id, worker_owner, count(*) AS running FROM jobs
    WHERE state = 'staged' OR (state = 'wip' AND lease_expires_at > now())
    GROUP BY worker_id, worker_owner
), held AS (
    SELECT worker_id, worker_owner, count(*) AS files, sum(size) AS bytes FROM uploads
    WHERE state = 'held' GROUP BY worker_id, worker_owner
)
SELECT * FROM (
    SELECT 'node' AS kind, n.id AS worker_id, NULL AS user_id, n.name, n.status, n.capacity,
           n.browser_ok, n.disk_free_bytes, n.spool_bytes, n.last_error, n.created_at,
           n.last_heartbeat_at, extract(epoch FROM now() - n.last_heartbeat_at) AS heartbeat_age_s,
           COALESCE(l.running, 0) AS running, COALESCE(h.files, 0) AS held_files,
           COALESCE(h.bytes, 0) AS held_bytes, n.tier, n.local, {stale_sql('n', token=False)} AS stale
    FROM fleet_nodes n LEFT JOIN live l ON l.worker_id = n.id AND l.worker_owner IS NULL
    LEFT JOIN held h ON h.worker_id = n.id AND h.worker_owner IS NULL
    UNION ALL
    SELECT 'token', t.worker_id, t.user_id, t.worker_id, t.status, t.capacity, t.browser_ok,
           t.disk_free_bytes, t.spool_bytes, t.last_error, t.first_seen_at, t.last_heartbeat_at,
           extract(epoch FROM now() - GREATEST(t.last_heartbeat_at, t.last_seen_at)),
           COALESCE(l.running, 0), COALESCE(h.files, 0), COALESCE(h.bytes, 0), t.tier, false,
           {stale_sql('t', token=True)}
    FROM token_workers t LEFT JOIN live l ON l.worker_id = t.worker_id AND l.worker_owner = t.user_id
    LEFT JOIN held h ON h.worker_id = t.worker_id AND h.worker_owner = t.user_id
) w
ORDER BY (status IN ('pending')) DESC, kind, worker_id
LIMIT :n
"""


def workers(stale_after_s: float, limit: int = MAX_ROWS) -> list[dict]:
    rows = db.session.execute(text(_WORKERS), {"n": min(limit, MAX_ROWS),
                                                "stale": float(stale_after_s)}).mappings().all()
    out = []
    for r in rows:
        age = None if r["heartbeat_age_s"] is None else round(float(r["heartbeat_age_s"]), 1)
        heartbeats = r["kind"] == "node" or r["last_heartbeat_at"] is not None
        signed_off = r["last_heartbeat_at"] is not None and r["capacity"] == 0   # see stale_sql
        out.append({
            "kind": r["kind"], "worker_id": r["worker_id"], "user_id": r["user_id"], "name": r["name"],
            "status": r["status"], "capacity": r["capacity"], "running": int(r["running"]),
            "browser_ok": r["browser_ok"], "disk_free_bytes": r["disk_free_bytes"],
            "spool_bytes": r["spool_bytes"], "last_error": r["last_error"],
            "created_at": int(r["created_at"].timestamp()),
            "last_heartbeat_at": int(r["last_heartbeat_at"].timestamp()) if r["last_heartbeat_at"] else None,
            # A token worker that never sent a heartbeat is an SDK worker
            # (claims only): its age is when it was last seen.
            "heartbeats": heartbeats, "signed_off": signed_off,
            "heartbeat_age_s": age, "stale": bool(r["stale"]),
            "held_files": int(r["held_files"]), "held_bytes": int(r["held_bytes"]),
            "tier": r["tier"], "local": bool(r["local"]),
        })
    return out


_REMOTE = """
SELECT j.id, j.project_id, j.ext_id, j.value, j.state, a.state AS attempt_state, j.worker_id,
       j.last_error, j.updated_at
FROM jobs j LEFT JOIN attempts a ON a.id = j.current_attempt_id
WHERE (CAST(:p AS text) IS NULL OR j.project_id = :p) {state_filter}
ORDER BY j.id DESC
LIMIT :n
"""

_PUBLIC_STATE = {"todo": "queued", "staged": "staged", "done": "done", "failed": "failed",
                 "reset_exhausted": "failed"}
# A reader's state → the condition on jobs (j) and their current attempt (a).
PUBLIC_STATES = {
    "queued": "j.state = 'todo'",
    "running": "j.state = 'wip' AND a.state IS DISTINCT FROM 'uploading'",
    "uploading": "j.state = 'wip' AND a.state = 'uploading'",
    "staged": "j.state = 'staged'",
    "done": "j.state = 'done'",
    "failed": "j.state IN ('failed', 'reset_exhausted')",
}


def remote_jobs(project_id: str | None, limit: int, state: str | None = None) -> list[dict]:
    """Progress for readers: state, worker id, error, updated time — no
    topology. ``state``: one of :data:`PUBLIC_STATES` (KeyError otherwise)."""
    state_filter = f"AND {PUBLIC_STATES[state]}" if state else ""
    rows = db.session.execute(text(_REMOTE.format(state_filter=state_filter)),
                              {"p": project_id, "n": limit}).mappings().all()
    out = []
    for r in rows:
        state = _PUBLIC_STATE.get(r["state"]) or (
            "uploading" if r["attempt_state"] == "uploading" else "running")
        error = r["last_error"] if r["state"] in ("failed", "reset_exhausted", "todo") else None
        out.append({"job_id": r["id"], "project_id": r["project_id"], "id": r["ext_id"],
                    "value": r["value"], "state": state,
                    "worker_id": r["worker_id"] if state in ("running", "uploading", "staged", "done")
                    else None,
                    "error": error, "updated_at": int(r["updated_at"].timestamp())})
    return out
