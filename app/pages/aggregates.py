"""PostgreSQL aggregates behind the dashboard: throughput, workers, backlog, errors.

Every query is bounded — by a time range, a LIMIT or a cap on the count — and
backed by an index, so the dashboard costs the same with five thousand jobs or
five million:

- claims per minute: ``date_trunc`` over ``attempts.created_at`` of the last
  day, an index-only range scan of ``ix_attempts_project_created``;
- completions per minute: ``finished_at`` of done attempts, from the partial
  index ``ix_attempts_project_done``;
- failures per minute, recent errors and errors by code: the small partial
  index ``ix_attempts_failed_finished`` (errors by code read at most the
  newest ``ERROR_SCAN_CAP`` of the day, and again only when a failure came
  since or a minute passed);
- the leaderboard: a day of done attempts (``ix_attempts_project_done``)
  joined to their uploads' sizes, read at most once a minute per process;
- staged and outbox backlog: counts capped at ``BACKLOG_CAP`` rows, so an
  outage backlog never turns the dashboard into a long count.

Minutes that can no longer change are cached per process (see ``_Throughput``):
after the first view, a refresh reads only the last few minutes of attempts.
"""
from __future__ import annotations

import copy
import threading
import time
from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy import text

from app.extensions import db
from app.fleet.listing import stale_sql

DAY_MINUTES = 24 * 60
BACKLOG_CAP = 100_000
# ``now()`` is the start of the claiming transaction, so a claim that commits
# just after a minute turned is still dated in the previous minute. Minutes
# older than this margin are final and may be cached.
SETTLE = timedelta(minutes=2)

_SERIES_SQL = {
    "claims": "SELECT project_id, date_trunc('minute', created_at), count(*) FROM attempts "
              "WHERE project_id = ANY(:ids) AND created_at >= :since GROUP BY 1, 2",
    "completions": "SELECT project_id, date_trunc('minute', finished_at), count(*) FROM attempts "
                   "WHERE project_id = ANY(:ids) AND state = 'done' AND finished_at >= :since "
                   "GROUP BY 1, 2",
    # Failed and expired attempts (ix_attempts_failed_finished): the series
    # an operator looks for first when completions fall.
    "failures": "SELECT project_id, date_trunc('minute', finished_at), count(*) FROM attempts "
                "WHERE state IN ('failed', 'expired') AND finished_at >= :since "
                "AND project_id = ANY(:ids) GROUP BY 1, 2",
}
KINDS = tuple(_SERIES_SQL)


class _Throughput:
    """Per-minute counts of settled minutes, per (kind, project), per process.

    A settled minute never changes (attempts are inserted and finished with
    ``now()``; deleting a job takes its attempts along, which the chart may
    keep counting for up to a day — harmless), so each view re-reads only the
    minutes since the last view's settle point, and the cache holds at most
    the last day.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self, database: str | None = None) -> None:
        self.database = database
        self.settled_until: dict[tuple[str, str], datetime] = {}
        self.minutes: dict[tuple[str, str], dict[datetime, int]] = defaultdict(dict)

    def series(self, project_ids: list[str]) -> tuple[datetime, dict[str, dict[str, list[int]]]]:
        now = db.session.execute(text("SELECT date_trunc('minute', now())")).scalar()
        start = now - timedelta(minutes=DAY_MINUTES - 1)
        settle = now - SETTLE
        database = str(db.engine.url)
        out: dict[str, dict[str, list[int]]] = {}
        with self.lock:  # one cold scan per process, not one per concurrent view
            if database != self.database:
                self.reset(database)
            for kind in KINDS:
                fresh = self._read(kind, project_ids, start, settle)
                out[kind] = {}
                for pid in project_ids:
                    out[kind][pid] = self._day(self.minutes[(kind, pid)], fresh.get(pid, {}), start)
        return now, out

    @staticmethod
    def _day(known: dict, recent: dict, start: datetime) -> list[int]:
        """1440 counts from the sparse minutes (cost per minute with data, not
        per minute of the day: hundreds of idle projects stay cheap)."""
        values = [0] * DAY_MINUTES
        for source in (known, recent):
            for minute, count in list(source.items()):
                index = int((minute - start).total_seconds() // 60)
                if index < 0:
                    del source[minute]  # slid out of the day
                elif index < DAY_MINUTES:
                    values[index] = count
        return values

    def _read(self, kind, project_ids, start, settle) -> dict[str, dict[datetime, int]]:
        """Query what the cache lacks; file settled minutes, return the rest."""
        groups: dict[datetime, list[str]] = defaultdict(list)
        for pid in project_ids:
            groups[max(self.settled_until.get((kind, pid), start), start)].append(pid)
        fresh: dict[str, dict[datetime, int]] = defaultdict(dict)
        for since, pids in groups.items():
            rows = db.session.execute(text(_SERIES_SQL[kind]), {"ids": pids, "since": since})
            for pid, minute, count in rows:
                if minute < settle:
                    self.minutes[(kind, pid)][minute] = int(count)
                else:
                    fresh[pid][minute] = int(count)
            for pid in pids:
                self.settled_until[(kind, pid)] = max(settle, since)
        return fresh


_throughput = _Throughput()


def throughput(project_ids: list[str]) -> tuple[datetime, dict[str, dict[str, list[int]]]]:
    """Claims and completions per minute of the last day, oldest minute first.

    Returns:
        The current minute and ``{kind: {project_id: [1440 counts]}}``.
    """
    return _throughput.series(sorted(project_ids))


def reset_cache() -> None:
    """Forget cached minutes and the leaderboard (tests that rewrite history)."""
    with _throughput.lock:
        _throughput.reset()
    _leaderboard.clear()
    _errors.clear()


def total(series_by_project: dict[str, list[int]]) -> list[int]:
    columns = list(series_by_project.values())
    return [sum(values) for values in zip(*columns)] if columns else [0] * DAY_MINUTES


def per_minute_average(values: list[int], width: int) -> list[float]:
    """Buckets of ``width`` minutes, each as its average per minute."""
    return [sum(values[i:i + width]) / width for i in range(0, len(values), width)]


_WORKERS = f"""
SELECT 'node' AS kind, status, count(*) AS n,
       count(*) FILTER (WHERE status IN ('active', 'draining') AND {stale_sql('n', token=False)}) AS stale
FROM fleet_nodes n GROUP BY status
UNION ALL
SELECT 'token', status, count(*),
       count(*) FILTER (WHERE status IN ('active', 'draining') AND {stale_sql('t', token=True)})
FROM token_workers t GROUP BY status
"""


def workers_summary(stale_after_s: float) -> dict:
    """Counts by status for nodes and token workers, and how many are stale."""
    out = {"node": {}, "token": {}, "stale": 0, "total": 0}
    for kind, status, n, stale in db.session.execute(text(_WORKERS), {"stale": stale_after_s}):
        out[kind][status] = int(n)
        out["stale"] += int(stale)
        out["total"] += int(n)
    return out


_BACKLOG = """
SELECT
  (SELECT count(*) FROM (SELECT 1 FROM uploads WHERE state = 'staged' LIMIT :cap) s) AS staged,
  (SELECT extract(epoch FROM now() - min(updated_at)) FROM uploads WHERE state = 'staged')
      AS oldest_staged_s,
  (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE done_at IS NULL LIMIT :cap) o) AS outbox,
  (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE done_at IS NULL AND tries > 0 LIMIT :cap) r)
      AS outbox_retrying,
  (SELECT extract(epoch FROM now() - min(due_at)) FROM outbox WHERE done_at IS NULL)
      AS oldest_due_s
"""


def backlog() -> dict:
    """Staged uploads waiting for their archive commit and outbox rows not done.

    A growing staged backlog is the usual reason pdf claims stop (staged
    attempts count against the in-flight caps), so the dashboard shows it.
    """
    row = db.session.execute(text(_BACKLOG), {"cap": BACKLOG_CAP}).mappings().one()
    out = {k: (None if v is None else int(v)) for k, v in row.items()}
    out["cap"] = BACKLOG_CAP
    return out


_FAILURES = """
SELECT a.id, a.job_id, a.project_id, a.worker_id, a.worker_owner, a.state, a.finished_at, a.error
FROM attempts a
WHERE a.state IN ('failed', 'expired') AND a.finished_at >= now() - make_interval(secs => :window)
  {worker_filter}
ORDER BY a.finished_at DESC
LIMIT :n
"""


# The leaderboard is a day of done attempts grouped by worker: worth reading
# once a minute per process, not on every view of a page readers keep open.
LEADERBOARD_TTL_S = 60

_LEADERBOARD = """
SELECT a.worker_owner, CASE WHEN a.worker_owner IS NULL THEN a.worker_id END AS node_id,
       count(DISTINCT a.worker_id) AS workers,
       count(*) FILTER (WHERE a.finished_at >= now() - interval '1 hour') AS items_hour,
       coalesce(sum(u.size) FILTER (WHERE a.finished_at >= now() - interval '1 hour'), 0) AS bytes_hour,
       count(*) AS items_day, coalesce(sum(u.size), 0) AS bytes_day
FROM attempts a LEFT JOIN uploads u ON u.attempt_id = a.id
WHERE a.state = 'done' AND a.finished_at >= now() - interval '1 day' AND a.project_id = ANY(:ids)
GROUP BY 1, 2
"""


class _Recent:
    """Answers worth reading at most once per ``ttl_s`` per process, by key
    (the database and the question): a page many people keep open costs one
    query per period, not one per view. Copies go out, so a caller's edits
    never reach the cache."""

    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self.lock = threading.Lock()
        self.answers: dict[tuple, tuple[float, object]] = {}

    def get(self, key: tuple, read):
        key = (str(db.engine.url), *key)
        with self.lock:
            kept = self.answers.get(key)
            if kept is None or time.monotonic() - kept[0] > self.ttl_s:
                if len(self.answers) > 1000:  # a bound, for many distinct questions
                    self.answers.clear()
                kept = self.answers[key] = (time.monotonic(), read())
            return copy.deepcopy(kept[1])

    def clear(self) -> None:
        with self.lock:
            self.answers.clear()


_leaderboard = _Recent(LEADERBOARD_TTL_S)


def _leaderboard_rows(project_ids: list[str]) -> list[dict]:
    result = db.session.execute(text(_LEADERBOARD), {"ids": project_ids}).mappings()
    return [{k: (int(v) if k not in ("worker_owner", "node_id") else v) for k, v in r.items()} for r in result]


def leaderboard(project_ids: list[str], *, limit: int = 10) -> dict:
    """The workers with the most done jobs over the last hour and the last
    day, with the bytes they uploaded; each board largest first.

    Returns:
        ``{"hour": [...], "day": [...]}``, rows ``{worker_owner, node_id,
        workers, items_hour, bytes_hour, items_day, bytes_day}``.
    """
    ids = sorted(project_ids)
    rows = _leaderboard.get(("leaderboard", *ids), lambda: _leaderboard_rows(ids))
    by = {"hour": ("items_hour", "bytes_hour"), "day": ("items_day", "bytes_day")}
    return {board: sorted((r for r in rows if r[keys[0]]), key=lambda r: (-r[keys[0]], -r[keys[1]]))[:limit]
            for board, keys in by.items()}


# Errors by code read at most this many of the newest failed attempts of the
# day: a mass failure (a publisher down for a day) costs a bounded scan, and
# the page says its counts are of the newest ERROR_SCAN_CAP.
ERROR_SCAN_CAP = 10_000
# ... and are read again when a failure came since, or at the latest after
# this long (failures leaving the day's window change them slowly).
ERRORS_TTL_S = 60
_NEWEST_FAILURE = "SELECT max(finished_at) FROM attempts WHERE state IN ('failed', 'expired')"

_ERROR_GROUPS = """
SELECT project_id, code, count(*) AS attempts, count(DISTINCT job_id) AS jobs,
       max(finished_at) AS last_at, (array_agg(job_id ORDER BY finished_at DESC))[1] AS last_job,
       (array_agg(message ORDER BY finished_at DESC))[1] AS message,
       sum(count(*)) OVER () AS scanned
FROM (SELECT a.project_id, a.job_id, a.finished_at,
             COALESCE(a.error -> 'error' ->> 'code', a.error ->> 'code',
                      CASE WHEN a.state = 'expired' THEN 'lease_expired' END, 'unknown') AS code,
             COALESCE(a.error -> 'error' ->> 'message', a.error ->> 'message') AS message
      FROM attempts a
      WHERE a.state IN ('failed', 'expired') AND a.finished_at >= now() - make_interval(secs => :window)
        {project_filter}
      ORDER BY a.finished_at DESC
      LIMIT :cap) s
GROUP BY project_id, code
ORDER BY attempts DESC, last_at DESC
LIMIT :n
"""


_errors = _Recent(ERRORS_TTL_S)


def error_groups(project_id: str | None = None, *, limit: int = 20, window_s: int = 86400) -> dict:
    """Failed and expired attempts of the last ``window_s`` seconds grouped by
    project and error code, the largest group first: how many attempts, how
    many jobs, the newest one's job and message.

    Returns:
        ``{"groups": [...], "capped": bool}``; capped when the newest
        ``ERROR_SCAN_CAP`` attempts were all the scan read.
    """
    # The newest failure anywhere (one step down ix_attempts_failed_finished)
    # is part of the key: a new failure is on the page at the next view.
    newest = db.session.execute(text(_NEWEST_FAILURE)).scalar()
    return _errors.get(("errors", project_id, limit, window_s, newest),
                       lambda: _read_error_groups(project_id, limit, window_s))


def _read_error_groups(project_id: str | None, limit: int, window_s: int) -> dict:
    params: dict = {"window": window_s, "cap": ERROR_SCAN_CAP, "n": limit}
    project_filter = ""
    if project_id is not None:
        project_filter, params["p"] = "AND a.project_id = :p", project_id
    rows = db.session.execute(text(_ERROR_GROUPS.format(project_filter=project_filter)), params).mappings().all()
    groups = [{"project_id": r["project_id"], "code": r["code"], "attempts": int(r["attempts"]),
               "jobs": int(r["jobs"]), "last_at": r["last_at"].timestamp(), "last_job": str(r["last_job"]),
               "message": r["message"]} for r in rows]
    return {"groups": groups, "capped": bool(rows) and int(rows[0]["scanned"]) >= ERROR_SCAN_CAP,
            "cap": ERROR_SCAN_CAP}


def recent_failures(limit: int = 10, *, window_s: int = 86400, worker_id: str | None = None,
                    worker_owner: str | None = None) -> list[dict]:
    """The newest failed or expired attempts of the last ``window_s`` seconds."""
    params = {"n": limit, "window": window_s}
    worker_filter = ""
    if worker_id is not None:
        worker_filter = "AND a.worker_id = :w AND a.worker_owner IS NOT DISTINCT FROM CAST(:o AS text)"
        params.update(w=worker_id, o=worker_owner)
    rows = db.session.execute(text(_FAILURES.format(worker_filter=worker_filter)), params).mappings()
    out = []
    for r in rows:
        error = r["error"] if isinstance(r["error"], dict) else {}
        # Attempts store the worker's report: {"retryable": …, "error": {code, message}}.
        error = error.get("error") if isinstance(error.get("error"), dict) else error
        if r["state"] == "expired" and not error:
            error = {"code": "lease_expired", "message": "the lease ran out"}
        out.append({"attempt_id": str(r["id"]), "job_id": str(r["job_id"]),
                    "project_id": r["project_id"], "worker_id": r["worker_id"],
                    "worker_owner": r["worker_owner"], "state": r["state"],
                    "finished_at": int(r["finished_at"].timestamp()),
                    "code": error.get("code"), "message": error.get("message")})
    return out
