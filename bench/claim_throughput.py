"""Claim 64 + complete 64 per cycle, 4 client threads, over HTTP through
gunicorn; baseline: the same SQL cycle run directly through psycopg.

Last line: ``claim_throughput jobs_per_s=N baseline_jobs_per_s=M ratio=R``
"""
from __future__ import annotations

import argparse
import json
import re
import threading
import time

import psycopg

from _common import VERSION, admin_token, api, fresh_database, gunicorn

from app.projects import leasing, outcomes


def fill(session, base, project, jobs):
    session.put(f"{base}/api/v1/fleethq/projects/{project}", json={
        "kind": "generic", "identity_mode": "none", "client_versions": [VERSION]}).raise_for_status()
    for start in range(0, jobs, 10_000):
        batch = [{"value": f"https://example.org/{i}"} for i in range(start, min(jobs, start + 10_000))]
        session.post(f"{base}/api/v1/admin/projects/{project}/jobs",
                     json={"jobs": batch}).raise_for_status()


def http_worker(base, token, project, worker_id, done_counter, lock):
    session = api(base, token)
    claim_url = f"{base}/api/v1/projects/{project}/jobs/claim"
    complete_url = f"{base}/api/v1/projects/{project}/jobs/complete"
    while True:
        jobs = session.post(claim_url, json={"worker_id": worker_id, "max_jobs": 64,
                                             "lease_seconds": 300}).json()["jobs"]
        if not jobs:
            return
        items = [{"job_id": j["job_id"], "attempt_id": j["attempt_id"], "outcome": {"kind": "success"}}
                 for j in jobs]
        results = session.post(complete_url, json={"worker_id": worker_id, "items": items}).json()
        applied = sum(r["status"] == "applied" for r in results["results"])
        with lock:
            done_counter[0] += applied


def _psycopg_sql(sql: str) -> str:
    """Turn SQLAlchemy ``:name`` parameters into psycopg ``%(name)s``."""
    return re.sub(r"(?<!:):([a-z_]+)", r"%(\1)s", sql)


CLAIM = _psycopg_sql(leasing._claim_sql("fifo", ("seed", "asset")))
COMPLETE = _psycopg_sql(outcomes._COMPLETE_SQL)


def sql_worker(url, project, worker_id, done_counter, lock):
    with psycopg.connect(url) as conn:
        while True:
            rows = conn.execute(CLAIM, {"p": project, "w": worker_id, "o": "bench", "n": 64,
                                        "lease": 300.0, "attempt_timeout": None, "task_timeout": None,
                                        "types": ["seed", "asset"]}).fetchall()
            conn.commit()
            if not rows:
                return
            payload = json.dumps({"outcome": {"kind": "success"}, "artifact_receipts": []})
            done = conn.execute(COMPLETE, {"p": project, "w": worker_id, "o": "bench",
                                           "job_ids": [r[0] for r in rows],
                                           "attempt_ids": [r[7] for r in rows],
                                           "payloads": [payload] * len(rows)}).fetchall()
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

    url = fresh_database("fleethq_bench_claim")
    token = admin_token(url)
    with gunicorn(url, workers=args.gunicorn_workers) as (base, _):
        session = api(base, token)
        fill(session, base, "http", args.jobs)
        fill(session, base, "sql", args.jobs)
        done, elapsed = run_threads(http_worker, lambda i: (base, token, "http", f"w{i}"), args.threads)
        http_rate = done / elapsed
        print(f"http: {done} jobs in {elapsed:.2f}s = {http_rate:.0f} jobs/s", flush=True)
        done_sql, elapsed_sql = run_threads(sql_worker, lambda i: (url, "sql", f"w{i}"), args.threads)
        sql_rate = done_sql / elapsed_sql
        print(f"raw sql: {done_sql} jobs in {elapsed_sql:.2f}s = {sql_rate:.0f} jobs/s", flush=True)
        assert done == args.jobs and done_sql == args.jobs, (done, done_sql)
    print(f"claim_throughput jobs_per_s={http_rate:.0f} baseline_jobs_per_s={sql_rate:.0f} "
          f"ratio={http_rate / sql_rate:.2f}")


if __name__ == "__main__":
    main()
