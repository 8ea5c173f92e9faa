"""Small read-only lookups the admin pages need and no domain service offers.

Each is bounded and index-backed; none of them counts or scans ``jobs`` or
``attempts`` as a whole.
"""
from __future__ import annotations

from sqlalchemy import text

from app.accounts import service as accounts
from app.errors import NotFound
from app.extensions import db
from app.hooks import deliveries


def project_of_job(job_id: int) -> str:
    project_id = db.session.execute(text("SELECT project_id FROM jobs WHERE id = :id"),
                                    {"id": job_id}).scalar()
    if project_id is None:
        raise NotFound(f"job {job_id} not found", details={"job_id": str(job_id)})
    return project_id


def node_names(worker_ids) -> dict[str, str]:
    """The names of the enrolled nodes among these worker ids (a page's
    worth), so tables show "lab-3" rather than a 32-character id."""
    ids = sorted({w for w in worker_ids if w})
    if not ids:
        return {}
    return dict(db.session.execute(text("SELECT id, name FROM fleet_nodes WHERE id = ANY(:ids)"),
                                   {"ids": ids}).all())


def user_logins(user_ids) -> dict[str, str]:
    """GitHub logins of these users, where they have one."""
    ids = sorted(set(user_ids))
    if not ids:
        return {}
    return dict(db.session.execute(text(
        "SELECT id, github_login FROM users WHERE id = ANY(:ids) AND github_login IS NOT NULL"),
        {"ids": ids}).all())


def deliveries_for_attempts(project_id: str, attempt_ids: list[int]) -> list[dict]:
    """Hook deliveries of these attempts, through the (consumer, attempt) index."""
    if not attempt_ids:
        return []
    ids = db.session.execute(text(
        "SELECT d.id FROM hook_deliveries d WHERE d.consumer_id IN "
        "(SELECT id FROM hook_consumers WHERE project_id = :p) AND d.attempt_id = ANY(:a) "
        "ORDER BY d.id LIMIT 200"), {"p": project_id, "a": attempt_ids}).scalars().all()
    return [deliveries.get(i) for i in ids]


WORKER_SEARCH_LIMIT = 200


def worker_owners(worker_id: str) -> list[dict]:
    """SavewebHQ's worker search: the user a worker id is mapped to (exact
    match; a worker id names one user), with its standing as a token worker."""
    rows = db.session.execute(text("""
        SELECT m.worker_id, m.user_id, extract(epoch FROM m.updated_at), u.status, tw.status
        FROM worker_users m JOIN users u ON u.id = m.user_id
        LEFT JOIN token_workers tw ON tw.user_id = m.user_id AND tw.worker_id = m.worker_id
        WHERE m.worker_id = :w LIMIT :n"""), {"w": worker_id, "n": WORKER_SEARCH_LIMIT}).all()
    return [{"worker_id": r[0], "user_id": r[1], "seen_at": r[2], "user_status": r[3],
             "worker_status": r[4]} for r in rows]


def live_jobs_of_worker(worker_id: str, owner: str | None, limit: int = 50) -> list[dict]:
    """Jobs a worker holds now (wip or staged), via the live-worker partial index."""
    rows = db.session.execute(text(
        "SELECT j.id, j.project_id, j.value, j.state, j.current_attempt_id, "
        "extract(epoch FROM j.lease_expires_at - now()) AS lease_left_s "
        "FROM jobs j WHERE j.project_id IN (SELECT id FROM projects) AND j.worker_id = :w "
        "AND j.worker_owner IS NOT DISTINCT FROM CAST(:o AS text) AND j.state IN ('wip', 'staged') "
        "ORDER BY j.id LIMIT :n"), {"w": worker_id, "o": owner, "n": limit}).mappings().all()
    return [{"job_id": str(r["id"]), "project_id": r["project_id"], "value": r["value"],
             "state": r["state"],
             "attempt_id": str(r["current_attempt_id"]) if r["current_attempt_id"] else None,
             "lease_left_s": None if r["lease_left_s"] is None else float(r["lease_left_s"])}
            for r in rows]


def users_overview(limit: int = 500) -> list[dict]:
    """Every user with token metadata and open sessions, in one query (not 3 per user)."""
    rows = db.session.execute(text(
        "SELECT u.id, u.status, u.roles, u.github_login, u.created_at, "
        "t.created_at AS token_created_at, t.last_used_at AS token_last_used_at, "
        "t.token_hash, t.sealed, "
        "(SELECT count(*) FROM page_sessions s WHERE s.user_id = u.id AND s.expires_at > now()) "
        "AS sessions "
        "FROM users u LEFT JOIN machine_tokens t ON t.user_id = u.id ORDER BY u.id LIMIT :n"),
        {"n": limit}).mappings().all()

    def ts(value):
        return int(value.timestamp()) if value is not None else None

    return [{"user_id": r["id"], "status": r["status"], "roles": list(r["roles"]),
             "github_login": r["github_login"], "created_at": ts(r["created_at"]),
             "token": {"exists": r["token_created_at"] is not None,
                       "viewable": accounts.viewable(r["id"], r["token_hash"], r["sealed"]),
                       "created_at": ts(r["token_created_at"]),
                       "last_used_at": ts(r["token_last_used_at"])},
             "sessions": int(r["sessions"])} for r in rows]
