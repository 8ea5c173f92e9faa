"""Page latency with millions of jobs: ``/admin``, ``/admin/projects/<p>`` and ``/progress``.

Builds a scratch database (migrated with ``flask db upgrade``) holding
``--jobs`` jobs across 5 projects, with attempts in every state spread over
the last week, generated in SQL (``INSERT … SELECT generate_series``) so the
counter triggers run exactly as in production; the trigger-maintained counts
are then checked against a full count. A gunicorn master serves the pages in
development mode on loopback, signed in with the development login; each page
is requested ``--requests`` times after one warm-up request per page (the
first view of a process reads the last day of attempts; later views read only
the minutes since — the cold time is printed too). The dashboard and the
project page carry the errors grouped by code and the oldest queued job's
age; ``/progress`` the per-project bars and rates and the leaderboard (a day
of done attempts, read at most once a minute per process).

Job search (``/admin/projects/<p>/jobs/search``) is measured over a round of
searches a day's work asks for: a job id, an external id, a value prefix, an
attribute (1 job in 1,000 has it), an error text (on ~8 % of the jobs) and
a state with an error code.

Last line: ``dashboard_latency jobs=N admin_p95_ms=A project_p95_ms=B progress_p95_ms=P search_p95_ms=C``
"""
from __future__ import annotations

import argparse
import os
import re
import secrets
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

import psycopg
import requests

from _common import BENCH_PG, ROOT, free_port, fresh_database, stop

PROJECTS = [("bench-1", "generic", "external_id"), ("bench-2", "generic", "external_id"),
            ("bench-3", "generic", "none"), ("bench-4", "pdf", "unique_value"),
            ("bench-5", "pdf", "unique_value")]

# Per mille of a project's jobs in each state (wip and staged stay small, as
# a real fleet's leases and spool bound them).
_STATE = """CASE WHEN g % 1000 < 380 THEN 'todo'
     WHEN g % 10000 BETWEEN 3800 AND 3803 THEN 'wip'
     WHEN g % 10000 BETWEEN 3804 AND 3809 AND :kind = 'pdf' THEN 'staged'
     WHEN g % 1000 < 920 THEN 'done'
     WHEN g % 1000 < 975 THEN 'failed'
     ELSE 'reset_exhausted' END"""

_JOBS = f"""
INSERT INTO jobs (project_id, ext_id, value_sha256, value, type, random_key, state, created_at,
                  updated_at, not_before, worker_id, resets, attempts_count, last_error, attr)
SELECT :p,
       CASE WHEN :mode = 'external_id' THEN 'j' || g END,
       CASE WHEN :mode = 'unique_value' THEN sha256(convert_to(v, 'UTF8')) END,
       v, 'seed', (hashint4(g) % 2147483647), st, ts, ts, ts,
       CASE WHEN st IN ('wip', 'staged') THEN 'w' || (g % 50) END,
       CASE WHEN st = 'reset_exhausted' THEN 3 ELSE 0 END,
       CASE WHEN st = 'todo' THEN 0 WHEN st IN ('failed', 'reset_exhausted') THEN 2 ELSE 1 END,
       CASE WHEN st IN ('failed', 'reset_exhausted')
            THEN jsonb_build_object('code', 'http_404', 'message',
                                    'not found at mirror ' || (g % 97) || ' after ' || (g % 5) || ' redirects') END,
       jsonb_build_object('batch', g % 1000, 'source', 'crawl-' || (g % 7))
FROM (SELECT g, {_STATE} AS st,
             CASE WHEN :kind = 'pdf' THEN '10.1234/' || :p || '.' || g
                  ELSE 'https://example.org/' || :p || '/' || g END AS v,
             now() - interval '8 days' + g * (interval '7 days' / :n) AS ts
      FROM generate_series(1, :n) g) s
"""

# One attempt per job that was ever claimed, at a random time of the last
# week; failed and exhausted jobs also get an earlier expired attempt.
_ATTEMPTS = """
INSERT INTO attempts (job_id, project_id, worker_id, state, created_at, lease_expires_at,
                      finished_at, error)
SELECT id, project_id, 'w' || (id % 50),
       CASE state WHEN 'wip' THEN 'running' WHEN 'staged' THEN 'staged' WHEN 'done' THEN 'done'
                  ELSE 'failed' END,
       c, c + interval '5 minutes',
       CASE WHEN state IN ('done', 'failed', 'reset_exhausted') THEN c + d END,
       CASE WHEN state IN ('failed', 'reset_exhausted')
            THEN '{"retryable": false, "error": {"code": "http_404", "message": "not found"}}'::jsonb END
FROM (SELECT j.id, j.project_id, j.state,
             CASE WHEN j.state IN ('wip', 'staged') THEN now() - random() * interval '4 minutes'
                  ELSE now() - random() * interval '7 days' END AS c,
             random() * interval '2 minutes' AS d
      FROM jobs j WHERE j.project_id = :p AND j.state <> 'todo') s
"""

_EXPIRED = """
INSERT INTO attempts (job_id, project_id, worker_id, state, created_at, lease_expires_at, finished_at)
SELECT id, project_id, 'w' || ((id + 7) % 50), 'expired', c, c + interval '5 minutes',
       c + interval '5 minutes'
FROM (SELECT j.id, j.project_id, now() - interval '7 days' - random() * interval '12 hours' AS c
      FROM jobs j WHERE j.project_id = :p AND j.state IN ('failed', 'reset_exhausted')) s
"""


def build(url: str, total_jobs: int) -> None:
    per_project = total_jobs // len(PROJECTS)
    with psycopg.connect(url) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET maintenance_work_mem = '512MB'")
        for project_id, kind, mode in PROJECTS:
            started = time.perf_counter()
            conn.execute(
                "INSERT INTO projects (id, kind, status, identity_mode, claim_order, "
                "max_jobs_per_claim, max_resets, recommended_lease_seconds, retry_backoff_seconds, "
                "client_versions, prefer_new_worker, upload_timeout_seconds) VALUES "
                "(%s, %s, 'active', %s, 'fifo', 256, 3, 300, 0, '{bench-1}', false, 120)",
                (project_id, kind, mode))
            conn.execute("INSERT INTO project_dispatch (project_id) VALUES (%s)", (project_id,))
            params = {"p": project_id, "kind": kind, "mode": mode, "n": per_project}
            conn.execute(_sql(_JOBS), params)
            conn.execute(_sql(_ATTEMPTS), params)
            conn.execute(_sql(_EXPIRED), params)
            conn.commit()
            print(f"{project_id}: {per_project} jobs with attempts in "
                  f"{time.perf_counter() - started:.0f}s", flush=True)
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        # Index-only scans need the visibility map; autovacuum does this in production.
        conn.execute("VACUUM (ANALYZE) jobs")
        conn.execute("VACUUM (ANALYZE) attempts")
        print(f"vacuum analyze: {time.perf_counter() - started:.0f}s", flush=True)


def _sql(statement: str) -> str:
    """``:name`` placeholders (readable above) as psycopg's ``%(name)s``."""
    return re.sub(r"(?<!:):([a-z]+)", r"%(\1)s", statement.replace("%", "%%"))


def verify_counts(url: str, total_jobs: int) -> dict:
    """The trigger-maintained counters must equal a full count of the table."""
    with psycopg.connect(url) as conn:
        counted = {(p, s): n for p, s, n in conn.execute(
            "SELECT project_id, state, count(*) FROM jobs GROUP BY 1, 2")}
        counters = {(p, s): int(n) for p, s, n in conn.execute(
            "SELECT project_id, state, sum(delta) FROM job_counts GROUP BY 1, 2") if n}
        attempts = conn.execute("SELECT count(*) FROM attempts").fetchone()[0]
    if counted != counters:
        raise SystemExit(f"counter mismatch: {sorted(set(counted.items()) ^ set(counters.items()))[:10]}")
    if sum(counted.values()) != total_jobs:
        raise SystemExit(f"expected {total_jobs} jobs, found {sum(counted.values())}")
    by_state: dict[str, int] = {}
    for (_, state), n in counted.items():
        by_state[state] = by_state.get(state, 0) + n
    print(f"counters match a full count: {by_state}; attempts={attempts}", flush=True)
    return by_state


def sign_in(base: str) -> requests.Session:
    session = requests.Session()
    login = session.get(f"{base}/login")
    token = re.search(r'name="csrf_token" value="([^"]+)"', login.text).group(1)
    response = session.post(f"{base}/login/dev", data={"csrf_token": token}, allow_redirects=False)
    if response.status_code != 303:
        raise SystemExit(f"dev login failed: {response.status_code} {response.text[:200]}")
    return session


def measure(session: requests.Session, url: str, count: int, expect: str) -> tuple[float, list[float]]:
    started = time.perf_counter()
    first = session.get(url, allow_redirects=False)
    cold_ms = (time.perf_counter() - started) * 1000
    if first.status_code != 200 or expect not in first.text:
        raise SystemExit(f"{url}: {first.status_code}, {expect!r} missing")
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        response = session.get(url, allow_redirects=False)
        samples.append((time.perf_counter() - started) * 1000)
        response.raise_for_status()
    return cold_ms, samples


def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


@contextmanager
def serve(url: str, *, workers: int = 2, threads: int = 4, boot_timeout_s: float = 60.0):
    """gunicorn on a free port, waiting for /healthz with a patient timeout.

    ``_common.gunicorn`` gives a request one second; on a loaded machine a
    worker can take longer than that to import the app, which is not what
    this benchmark measures.
    """
    port = free_port()
    env = {**os.environ, "DATABASE_URL": url, "FLEETHQ_LOG_JSON": "false"}
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "gunicorn"), "-w", str(workers),
         "-k", "gthread", "--threads", str(threads), "-b", f"127.0.0.1:{port}",
         "--log-level", "warning", "--graceful-timeout", "3", "wsgi:app"], cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + boot_timeout_s
        while True:
            try:
                if requests.get(base + "/healthz", timeout=10).status_code == 200:
                    break
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield base
    finally:
        stop(proc)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5_000_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--reuse", action="store_true", help="keep the database of an earlier run")
    args = parser.parse_args()
    total = args.jobs // len(PROJECTS) * len(PROJECTS)

    name = "fleethq_bench_dashboard"
    if args.reuse:
        url = f"{BENCH_PG}/{name}"
    else:
        url = fresh_database(name)
        started = time.perf_counter()
        build(url, total)
        print(f"built {total} jobs in {time.perf_counter() - started:.0f}s", flush=True)
    verify_counts(url, total)

    # Dev login (loopback only); one secret for every gunicorn worker so the
    # session cookie signed by one is valid in the other.
    os.environ["FLEETHQ_DEV_MODE"] = "true"
    os.environ["FLEETHQ_SECRET_KEY"] = secrets.token_hex(32)
    with serve(url) as base:
        session = sign_in(base)
        per_project = f"{total // len(PROJECTS):,}"
        results = {}
        for label, path, expect in (("admin", "/admin", per_project),
                                    ("project", f"/admin/projects/{PROJECTS[2][0]}", "Next page"),
                                    ("progress", "/progress", "leaderboard-day")):
            cold, samples = measure(session, base + path, args.requests, expect)
            results[label] = p95(samples)
            print(f"{path}: cold {cold:.0f} ms, median {statistics.median(samples):.1f} ms, "
                  f"p95 {p95(samples):.1f} ms over {len(samples)} requests", flush=True)
        searched = []
        for query in searches(url, total):
            path = f"/admin/projects/{PROJECTS[0][0]}/jobs/search?{query}"
            cold, samples = measure(session, base + path, max(5, args.requests // 5), "job-search-results")
            searched += samples
            print(f"search {query}: cold {cold:.0f} ms, median {statistics.median(samples):.1f} ms, "
                  f"p95 {p95(samples):.1f} ms", flush=True)
        results["search"] = p95(searched)
    print(f"dashboard_latency jobs={total} admin_p95_ms={results['admin']:.0f} "
          f"project_p95_ms={results['project']:.0f} progress_p95_ms={results['progress']:.0f} "
          f"search_p95_ms={results['search']:.0f}")


def searches(url: str, total: int) -> list[str]:
    """The round of searches, on the first project, with ids that exist."""
    per_project = total // len(PROJECTS)
    middle = per_project // 2
    with psycopg.connect(url) as conn:
        job_id = conn.execute("SELECT min(id) + %s FROM jobs WHERE project_id = %s",
                              (middle, PROJECTS[0][0])).fetchone()[0]
    project = PROJECTS[0][0]
    return [f"q={job_id}", f"q=j{middle}", f"q=https://example.org/{project}/{middle // 10}",
            "q=attr:batch=7", "q=error:mirror+42+after", "state=failed&error_code=http_404",
            "q=error:not+found"]


if __name__ == "__main__":
    main()
