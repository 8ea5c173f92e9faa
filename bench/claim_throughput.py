"""Claim 64 + complete 64 per cycle, 4 client threads, over HTTP through
gunicorn; baseline: the same SQL cycle run directly through psycopg. The two
sides run in four phases (baseline, HTTP, HTTP, baseline) and each side's
rate is its jobs over its time.

Last line: ``claim_throughput jobs_per_s=N baseline_jobs_per_s=M ratio=R``
"""
from __future__ import annotations

import argparse
import json
import threading
import time

import psycopg

from _common import VERSION, admin_token, api, fresh_database, gunicorn, json_poster

from app.extensions import driver_sql
from app.projects import leasing, outcomes


def fill(session, base, project, jobs):
    session.put(f"{base}/api/v1/fleethq/projects/{project}", json={
        "kind": "generic", "identity_mode": "none", "client_versions": [VERSION]}).raise_for_status()
    for start in range(0, jobs, 10_000):
        batch = [{"value": f"https://example.org/{i}"} for i in range(start, min(jobs, start + 10_000))]
        session.post(f"{base}/api/v1/admin/projects/{project}/jobs",
                     json={"jobs": batch}).raise_for_status()


def http_worker(base, token, project, worker_id, done_counter, lock):
    # The load generator is a bare keep-alive HTTP/1.1 connection, not
    # ``requests``: on two shared cores every millisecond the client spends is
    # taken from the master under test, and ``requests`` costs about 0.85 ms of
    # CPU a call against 0.15 ms here (the baseline's client is psycopg's C code).
    post = json_poster(base, token)

    claim_path = f"/api/v1/projects/{project}/jobs/claim"
    complete_path = f"/api/v1/projects/{project}/jobs/complete"
    while True:
        jobs = post(claim_path, {"worker_id": worker_id, "max_jobs": 64, "lease_seconds": 300})["jobs"]
        if not jobs:
            return
        items = [{"job_id": j["job_id"], "attempt_id": j["attempt_id"], "outcome": {"kind": "success"}}
                 for j in jobs]
        results = post(complete_path, {"worker_id": worker_id, "items": items})
        applied = sum(r["status"] == "applied" for r in results["results"])
        with lock:
            done_counter[0] += applied


CLAIM = driver_sql(leasing._claim_sql("fifo", ("seed", "asset")))
COMPLETE = driver_sql(outcomes._COMPLETE_SQL)


def sql_worker(url, project, worker_id, done_counter, lock):
    with psycopg.connect(url) as conn:
        while True:
            rows = conn.execute(CLAIM, {"p": project, "w": worker_id, "o": "bench", "n": 64,
                                        "lease": 300.0, "attempt_timeout": None, "task_timeout": None,
                                        "types": ["seed", "asset"]}).fetchall()
            conn.commit()
            if not rows:
                return
            payload = {"outcome": {"kind": "success"}, "artifact_receipts": []}
            done = conn.execute(COMPLETE, {"p": project, "w": worker_id, "o": "bench",
                                           "job_ids": [r[0] for r in rows],
                                           "attempt_ids": [r[7] for r in rows],
                                           "payloads": json.dumps([payload] * len(rows))}).fetchall()
            conn.commit()
            with lock:
                done_counter[0] += len(done)


def run_threads(target, args_for, threads):
    counter, lock = [0], threading.Lock()
    pool = [threading.Thread(target=target, args=(*args_for(i), counter, lock)) for i in range(threads)]
    started = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return counter[0], time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--gunicorn-workers", type=int, default=2)
    args = parser.parse_args()

    # Four phases in the order baseline, HTTP, HTTP, baseline: a machine whose
    # speed drifts during the run (shared cores do) shifts both sides alike.
    half = args.jobs // 2
    phases = [("sql", 0), ("http", 0), ("http", 1), ("sql", 1)]
    url = fresh_database("fleethq_bench_claim")
    token = admin_token(url)
    totals = {"http": [0, 0.0], "sql": [0, 0.0]}
    with gunicorn(url, workers=args.gunicorn_workers) as (base, _):
        session = api(base, token)
        for side, n in phases:
            fill(session, base, f"{side}{n}", half)
        # Both sides plan against the same statistics and run without autovacuum
        # beside them: otherwise its first analyze of the freshly filled table
        # lands in one phase (moving the claim from a sort of every waiting row
        # to an index walk), and its vacuums take a core from another.
        with psycopg.connect(url, autocommit=True) as conn:
            for table in ("jobs", "attempts"):
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
                conn.execute(f"ANALYZE {table}")
        for side, n in phases:
            project = f"{side}{n}"
            if side == "http":
                done, elapsed = run_threads(http_worker, lambda i, project=project: (base, token, project, f"w{i}"),
                                            args.threads)
            else:
                done, elapsed = run_threads(sql_worker, lambda i, project=project: (url, project, f"w{i}"),
                                            args.threads)
            assert done == half, (project, done)
            totals[side][0] += done
            totals[side][1] += elapsed
            print(f"{side}: {done} jobs in {elapsed:.2f}s = {done / elapsed:.0f} jobs/s", flush=True)
    http_rate = totals["http"][0] / totals["http"][1]
    sql_rate = totals["sql"][0] / totals["sql"][1]
    print(f"claim_throughput jobs_per_s={http_rate:.0f} baseline_jobs_per_s={sql_rate:.0f} "
          f"ratio={http_rate / sql_rate:.2f}")


if __name__ == "__main__":
    main()
