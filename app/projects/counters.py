"""Read and fold the delta tables that the triggers maintain.

Reads sum a handful of rows per project; the fold (run by a periodic actor)
replaces many delta rows by one per (project, state) so reads stay small.
Concurrent writers insert new rows meanwhile; the fold never touches rows it
did not see.
"""
from __future__ import annotations

from sqlalchemy import text

from app.extensions import db
from app.projects.models import ATTEMPT_STATES, JOB_STATES


def job_counts(project_ids: list[str]) -> dict[str, dict[str, int]]:
    result = {pid: dict.fromkeys(JOB_STATES, 0) for pid in project_ids}
    rows = db.session.execute(text(
        "SELECT project_id, state, sum(delta) FROM job_counts "
        "WHERE project_id = ANY(:ids) GROUP BY project_id, state"), {"ids": list(project_ids)})
    for project_id, state, total in rows:
        result[project_id][state] = int(total)
    return result


# One index probe per project (ix_jobs_todo_fifo: its first entry), however
# deep the queue.
_OLDEST_QUEUED = """
SELECT p.id, extract(epoch FROM now() - o.created_at)
FROM unnest(CAST(:ids AS text[])) AS p(id)
LEFT JOIN LATERAL (SELECT created_at FROM jobs
                   WHERE project_id = p.id AND state = 'todo'
                   ORDER BY created_at, id LIMIT 1) o ON true
"""


def oldest_queued_s(project_ids: list[str]) -> dict[str, float | None]:
    """How long each project's oldest queued job has waited since it was
    enqueued, in seconds (None: nothing queued)."""
    rows = db.session.execute(text(_OLDEST_QUEUED), {"ids": list(project_ids)})
    return {pid: None if age is None else max(0.0, float(age)) for pid, age in rows}


def attempt_totals() -> dict[str, dict[str, int]]:
    result: dict[str, dict[str, int]] = {}
    rows = db.session.execute(text(
        "SELECT project_id, state, sum(delta) FROM attempt_totals GROUP BY project_id, state"))
    for project_id, state, total in rows:
        result.setdefault(project_id, dict.fromkeys(ATTEMPT_STATES, 0))[state] = int(total)
    return result


_FOLD = """
WITH gone AS (DELETE FROM {table} RETURNING project_id, state, delta)
INSERT INTO {table} (project_id, state, delta)
SELECT project_id, state, sum(delta) FROM gone GROUP BY project_id, state
HAVING sum(delta) <> 0
"""


def fold() -> None:
    """Collapse the delta rows of both tables; commits."""
    for table in ("job_counts", "attempt_totals"):
        db.session.execute(text(_FOLD.format(table=table)))
    db.session.commit()


def forget_project(project_id: str) -> None:
    for table in ("job_counts", "attempt_totals"):
        db.session.execute(text(f"DELETE FROM {table} WHERE project_id = :p"), {"p": project_id})
