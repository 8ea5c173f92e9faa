"""Find jobs in a project of millions: a filter (state, type, error code,
worker, site, value prefix, time range) and a search term, the same filter the
bulk actions act on (app/projects/bulk.py).

The search term ``q`` is read as:

- digits: that job id, or that external id;
- ``attr:key=value``: jobs whose ``attr`` has that key with that value (a
  JSON scalar: ``attr:pages=3`` is the number 3, ``attr:lang="3"`` the
  string);
- ``error:text``: jobs whose last error's message contains the text (at
  least 3 characters);
- anything else: that external id, or values starting with it.

Each form has an index (migration 0016); the filter's other fields narrow
the rows those indexes find. Results are newest first, a page at a time.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, UTC
from typing import Any

from sqlalchemy import text

from app.errors import InvalidRequest
from app.extensions import db
from app.projects.models import JOB_STATES
from workers.wire.protocol import JOB_TYPES

PAGE_SIZE = 50
Q_MAX_CHARS = 256
PREFIX_CHARS = 256      # the indexed length of a value (ix_jobs_value_prefix)
MIN_ERROR_CHARS = 3     # trigrams: shorter text cannot use the index
# A job's last error is its current one only while it is failed, exhausted
# or queued for a retry (a tried job back in the queue): a retried job that
# runs again or finished keeps the old error in last_error, which error
# searches must not match (a bulk delete of "error:timeout" would otherwise
# take done jobs with it). State → the condition within it.
ERROR_STATES = {"failed": "true", "reset_exhausted": "true", "todo": "j.attempts_count > 0"}


def _like(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _epoch(name: str, raw) -> int | None:
    if raw in (None, ""):
        return None
    raw = str(raw).strip()
    if raw.isascii() and raw.isdigit() and len(raw) <= 12:
        return int(raw)
    try:  # a date or a date and time from the page's inputs, read as UTC
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be UNIX seconds or a date (YYYY-MM-DD[THH:MM])",
                             details={"field": name}) from None
    return int((parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp())


@dataclass(frozen=True)
class JobFilter:
    state: str | None = None
    type: str | None = None
    error_code: str | None = None
    worker_id: str | None = None
    site: str | None = None              # a site key (app.sites.keys), as stored
    value_prefix: str | None = None
    created_after: int | None = None     # UNIX seconds
    created_before: int | None = None
    q: str | None = None

    FIELDS = ("state", "type", "error_code", "worker_id", "site", "value_prefix", "created_after",
              "created_before", "q")

    @classmethod
    def from_args(cls, args) -> "JobFilter":
        """From a query string or form; raises InvalidRequest naming the field."""
        values: dict[str, Any] = {name: (args.get(name) or "").strip() or None for name in cls.FIELDS}
        for name in ("error_code", "worker_id", "site", "value_prefix", "q"):
            if values[name] is not None and len(values[name]) > Q_MAX_CHARS:
                raise InvalidRequest(f"{name} is limited to {Q_MAX_CHARS} characters",
                                     details={"field": name})
        if values["state"] is not None and values["state"] not in JOB_STATES:
            raise InvalidRequest(f"unknown job state {values['state']!r}", details={"field": "state"})
        if values["type"] is not None and values["type"] not in JOB_TYPES:
            raise InvalidRequest(f"type must be one of {', '.join(JOB_TYPES)}", details={"field": "type"})
        for name in ("created_after", "created_before"):
            values[name] = _epoch(name, values[name])
        if values["site"] is not None:
            values["site"] = values["site"].lower()  # keys are stored lowercase
        found = cls(**values)
        found.where()  # a bad search term is refused now
        return found

    @classmethod
    def from_dict(cls, stored: dict) -> "JobFilter":
        return cls(**{k: stored.get(k) for k in cls.FIELDS})

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def is_empty(self) -> bool:
        return not self.as_dict()

    def where(self) -> tuple[str, dict]:
        """SQL conditions on ``jobs j`` (after the project's) and their parameters."""
        parts: list[str] = []
        params: dict[str, Any] = {}
        if self.state:
            parts.append("j.state = :f_state")
            params["f_state"] = self.state
        if self.type:
            parts.append("j.type = :f_type")
            params["f_type"] = self.type
        if self.error_code:
            parts.append(f"j.last_error ->> 'code' = :f_code AND {_current_error(self.state)}")
            params["f_code"] = self.error_code
        if self.worker_id:
            parts.append("j.worker_id = :f_worker")
            params["f_worker"] = self.worker_id
        if self.site:
            parts.append("j.site_key = :f_site")
            params["f_site"] = self.site
        if self.value_prefix:
            parts.append(_prefix_sql("f_prefix", params, self.value_prefix))
        if self.created_after is not None:
            parts.append("j.created_at >= to_timestamp(:f_after)")
            params["f_after"] = self.created_after
        if self.created_before is not None:
            parts.append("j.created_at < to_timestamp(:f_before)")
            params["f_before"] = self.created_before
        if self.q:
            parts.append(_search_sql(self.q, params, self.state))
        return " AND ".join(parts) or "true", params


def _current_error(state: str | None) -> str:
    """Whether a job's last error is current, folded into the filter's state
    when it names one: an OR the planner cannot see through would cost the
    (project, state, id) scan."""
    if state is not None:
        return ERROR_STATES.get(state, "false")
    return "(" + " OR ".join(f"(j.state = '{s}' AND {c})" for s, c in ERROR_STATES.items()) + ")"


def _refuse_constant(name: str):
    raise ValueError(name)  # NaN and Infinity are JSON to Python, not to jsonb: a string then


def _prefix_sql(name: str, params: dict, prefix: str) -> str:
    # The indexed expression first (a range scan), then the whole value for
    # prefixes longer than the indexed part.
    params[name] = _like(prefix[:PREFIX_CHARS]) + "%"
    params[name + "_full"] = _like(prefix) + "%"
    return f"(left(j.value, {PREFIX_CHARS}) LIKE :{name} AND j.value LIKE :{name}_full)"


def _search_sql(q: str, params: dict, state: str | None = None) -> str:
    if q.startswith("attr:"):
        key, found, raw = q[len("attr:"):].partition("=")
        if not found or not key:
            raise InvalidRequest("an attribute search reads attr:key=value", details={"field": "q"})
        try:
            value = json.loads(raw, parse_constant=_refuse_constant)
        except ValueError:
            value = raw
        if isinstance(value, float) and not math.isfinite(value):  # 1e999: jsonb has no infinity
            value = raw
        if isinstance(value, (dict, list)):
            raise InvalidRequest("an attribute value must be a string, number, true, false or null",
                                 details={"field": "q"})
        params["q_attr"] = json.dumps({key: value})
        return "(j.attr IS NOT NULL AND j.attr @> CAST(:q_attr AS jsonb))"
    if q.startswith("error:"):
        needle = q[len("error:"):].strip()
        if len(needle) < MIN_ERROR_CHARS:
            raise InvalidRequest(f"an error search needs at least {MIN_ERROR_CHARS} characters",
                                 details={"field": "q"})
        params["q_error"] = "%" + _like(needle) + "%"
        return (f"(j.last_error IS NOT NULL AND (j.last_error ->> 'message') ILIKE :q_error "
                f"AND {_current_error(state)})")
    params["q_ext"] = q
    by_id = ""
    if q.isascii() and q.isdigit() and len(q) <= 18:
        params["q_id"] = int(q)
        by_id = "j.id = :q_id OR "
    return f"({by_id}j.ext_id = :q_ext OR {_prefix_sql('q_prefix', params, q)})"


_LIST = """
SELECT j.id, j.ext_id, j.value, j.type, j.state, j.worker_id, j.worker_owner, j.last_error,
       j.site_key, j.created_at, j.updated_at
FROM jobs j WHERE j.project_id = :project AND {where} {cursor}
ORDER BY j.id DESC LIMIT :n
"""


# An error text common to many jobs ("timeout") matches more rows than the
# trigram index can hand over quickly. So the newest ERROR_PROBE_ROWS jobs
# of each state that holds errors are read first, through the (project,
# state, id) index; the matches newer than every full window's oldest id are
# exactly the newest matches. Only when they fill less than a page is the
# trigram index asked.
ERROR_PROBE_ROWS = 2000
_WINDOW_LOW = """
SELECT j.id FROM jobs j WHERE j.project_id = :project AND j.state = :state AND {only} {cursor}
ORDER BY j.id DESC OFFSET :probe LIMIT 1
"""
# MATERIALIZED: the window is read through the (project, state, id) btree;
# left to itself the planner would answer the ILIKE from the trigram index,
# which is the slow path this probe exists to avoid.
_IN_WINDOW = """
WITH w AS MATERIALIZED (
    SELECT j.id, j.ext_id, j.value, j.type, j.state, j.worker_id, j.worker_owner, j.last_error,
           j.site_key, j.created_at, j.updated_at, j.attempts_count
    FROM jobs j WHERE j.project_id = :project AND j.state = :state AND {only} AND j.id > :low {cursor}
    ORDER BY j.id DESC LIMIT :probe
)
SELECT * FROM w j WHERE {where} ORDER BY j.id DESC LIMIT :n
"""


def _newest_errors(found: JobFilter, where: str, cursor: str, values: dict) -> list | None:
    # The windows are read where current errors are (ERROR_STATES); queued
    # jobs through the small ix_jobs_todo_tried, not the untried backlog.
    states = {found.state: _current_error(found.state)} if found.state else ERROR_STATES
    lows = {state: db.session.execute(text(_WINDOW_LOW.format(cursor=cursor, only=only)), {
        **values, "state": state, "probe": ERROR_PROBE_ROWS - 1}).scalar() or 0
        for state, only in states.items()}
    cut = max(lows.values())  # below it some state's window ended: order unknown
    rows: list = []
    for state, only in states.items():
        rows += db.session.execute(text(_IN_WINDOW.format(where=where, cursor=cursor, only=only)), {
            **values, "state": state, "low": cut - 1 if cut else 0,
            "probe": ERROR_PROBE_ROWS}).mappings().all()
    rows.sort(key=lambda r: r["id"], reverse=True)
    return rows if len(rows) >= values["n"] else None  # a full page and one more


def search(project_id: str, found: JobFilter, *, before_id: int | None = None,
           limit: int = PAGE_SIZE) -> dict:
    """One page of matching jobs, newest first: ``{"jobs", "next_before_id"}``."""
    where, params = found.where()
    cursor = "AND j.id < :before" if before_id is not None else ""
    values = {**params, "project": project_id, "before": before_id, "n": limit + 1}
    rows: Sequence | None = None
    if found.q and found.q.startswith("error:"):
        rows = _newest_errors(found, where, cursor, values)
    if rows is None:
        rows = db.session.execute(text(_LIST.format(where=where, cursor=cursor)), values).mappings().all()
    rows = rows[:limit + 1]
    more = len(rows) > limit
    jobs = [{"job_id": str(r["id"]), "id": r["ext_id"], "value": r["value"], "type": r["type"],
             "state": r["state"], "worker_id": r["worker_id"], "worker_owner": r["worker_owner"],
             "last_error": r["last_error"], "site": r["site_key"],
             "created_at": r["created_at"].timestamp(),
             "updated_at": r["updated_at"].timestamp()} for r in rows[:limit]]
    return {"jobs": jobs, "next_before_id": int(jobs[-1]["job_id"]) if more else None}


COUNT_CAP = 100_000


def count(project_id: str, found: JobFilter, cap: int = COUNT_CAP) -> tuple[int, bool]:
    """How many jobs match, counted up to ``cap``: (count, whether it is exact)."""
    where, params = found.where()
    n = db.session.execute(text(
        f"SELECT count(*) FROM (SELECT 1 FROM jobs j WHERE j.project_id = :project AND {where} "
        f"LIMIT :cap) t"), {**params, "project": project_id, "cap": cap + 1}).scalar_one()
    return min(n, cap), n <= cap
