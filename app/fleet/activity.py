"""What each worker did: its recent finished attempts and its counts of the
last hour and day (done, failed, bytes) — the worker page's "Recent tasks"
and the workers list's leaderboard columns.

Both read ``ix_attempts_worker_finished`` (migration 0015), one range scan
per worker; bytes are the archived upload's size (pdf projects; generic
attempts carry no file).
"""
from __future__ import annotations

from sqlalchemy import text

from app.extensions import db

RECENT_TASKS = 100
FAILED_STATES = ("failed", "expired", "cancelled")
_FAILED_SQL = f"a.state IN ({', '.join(repr(s) for s in FAILED_STATES)})"

_RECENT = text("""
SELECT a.id, a.job_id, a.project_id, j.value, a.state, a.created_at, a.finished_at,
       extract(epoch FROM a.finished_at - a.created_at) AS seconds,
       -- the worker's report is {"retryable", "error": {code, message}}
       COALESCE(a.error -> 'error' ->> 'code', a.error ->> 'code',
                CASE WHEN a.state = 'expired' THEN 'lease_expired' END) AS error_code,
       a.outcome, u.size AS bytes
FROM attempts a
LEFT JOIN jobs j ON j.id = a.job_id
LEFT JOIN uploads u ON u.attempt_id = a.id AND u.state = 'done'
WHERE a.worker_id = :w AND COALESCE(a.worker_owner, '') = COALESCE(CAST(:o AS text), '')
  AND a.finished_at IS NOT NULL
ORDER BY a.finished_at DESC
LIMIT :n
""")


def recent_tasks(worker_id: str, owner: str | None, limit: int = RECENT_TASKS) -> list[dict]:
    """The worker's last ``limit`` finished attempts, newest first."""
    rows = db.session.execute(_RECENT, {"w": worker_id, "o": owner, "n": limit}).mappings().all()
    out = []
    for r in rows:
        skipped = (r["outcome"] or {}).get("skipped") if isinstance(r["outcome"], dict) else None
        out.append({
            "attempt_id": str(r["id"]), "job_id": str(r["job_id"]), "project_id": r["project_id"],
            "value": r["value"], "state": r["state"], "error_code": r["error_code"],
            "skipped": skipped, "finished_at": r["finished_at"].timestamp(),
            "seconds": None if r["seconds"] is None else max(0.0, float(r["seconds"])),
            "bytes": r["bytes"]})
    return out


_COUNTS = text(f"""
SELECT w.worker_id, w.owner, c.*
FROM unnest(CAST(:ids AS text[]), CAST(:owners AS text[])) AS w(worker_id, owner)
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE a.state = 'done' AND a.finished_at > now() - interval '1 hour') AS done_hour,
           count(*) FILTER (WHERE {_FAILED_SQL}
                            AND a.finished_at > now() - interval '1 hour') AS failed_hour,
           COALESCE(sum(u.size) FILTER (WHERE a.finished_at > now() - interval '1 hour'), 0) AS bytes_hour,
           count(*) FILTER (WHERE a.state = 'done') AS done_day,
           count(*) FILTER (WHERE {_FAILED_SQL}) AS failed_day,
           COALESCE(sum(u.size), 0) AS bytes_day
    FROM attempts a LEFT JOIN uploads u ON u.attempt_id = a.id AND u.state = 'done'
    WHERE a.worker_id = w.worker_id AND COALESCE(a.worker_owner, '') = w.owner
      AND a.finished_at > now() - interval '1 day'
) c
""")

ZERO = {"done_hour": 0, "failed_hour": 0, "bytes_hour": 0, "done_day": 0, "failed_day": 0,
        "bytes_day": 0}


def counts(workers: list[tuple[str, str | None]]) -> dict[tuple[str, str | None], dict]:
    """(worker_id, owner) → done, failed and bytes of the last hour and day."""
    if not workers:
        return {}
    rows = db.session.execute(_COUNTS, {"ids": [w for w, _ in workers],
                                        "owners": [o or "" for _, o in workers]}).mappings().all()
    return {(r["worker_id"], r["owner"] or None): {k: int(r[k]) for k in ZERO} for r in rows}
