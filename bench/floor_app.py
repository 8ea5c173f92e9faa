"""The floor: what Flask on gunicorn costs per request before FleetHQ does
anything, for bench/vs_savewebhq.py.

The worker routes of SavewebHQ's v1 protocol, answered from memory: the
bearer header and the client version read, the JSON body parsed, an answer
of the contract's shape built and sent with ``Cache-Control: no-store`` — no
database, no validation, no leases. SavewebHQ's Go SDK worker runs against it
unchanged, so its requests are the very ones FleetHQ serves in the same run,
and FleetHQ's server CPU per request over this one's is what FleetHQ adds.
Served as FleetHQ is: ``gunicorn -c python:app.gunicorn_conf bench.floor_app:app``.

With ``FLOOR_ROUND_TRIP_DSN`` set (a PostgreSQL URL) it is the round-trip
floor: the same app, plus one ``SELECT 1`` on a connection of its own thread
before each POST. A server whose every write request reaches the database
cannot cost less than that; FleetHQ's routes do reach it (a claim leases, a
completion records its outcome, durably, before the answer).
"""
from __future__ import annotations

import itertools
import os
import threading
import time

import psycopg
from flask import Flask, jsonify, request

app = Flask(__name__)
# Job ids unique across gunicorn's worker processes.
_job_ids = itertools.count(os.getpid() * 10_000_000 + 1)


def _caller() -> str:
    return request.headers.get("Authorization", "").removeprefix("Bearer ") and "bench"


_ROUND_TRIP_DSN = os.environ.get("FLOOR_ROUND_TRIP_DSN")
_threads = threading.local()


@app.before_request
def _round_trip():
    if _ROUND_TRIP_DSN and request.method == "POST":
        conn = getattr(_threads, "conn", None)
        if conn is None:
            conn = _threads.conn = psycopg.connect(_ROUND_TRIP_DSN, autocommit=True)
        conn.execute("SELECT 1").fetchall()


@app.after_request
def _no_store(response):
    response.headers["Cache-Control"] = "no-store, no-cache, max-age=0"
    return response


@app.get("/healthz")
def health():
    return jsonify(status="ok")


@app.get("/api/v1/whoami")
def whoami():
    return jsonify(user_id=_caller())


@app.get("/api/v1/projects/<project_id>")
def policy(project_id):
    request.headers.get("X-SavewebHQ-Client-Version")
    return jsonify(project_id=project_id, dispatch_qps=None, worker_claim_qps=None, max_jobs_per_claim=256,
                   recommended_lease_seconds=300, policy_version=1, refresh_after_ms=30_000)


@app.post("/api/v1/projects/<project_id>/jobs/claim")
def claim(project_id):
    body = request.get_json()
    lease = int(time.time()) + int(body["lease_seconds"])
    jobs = []
    for _ in range(int(body["max_jobs"])):
        job_id = next(_job_ids)
        jobs.append({"value": f"https://example.test/{job_id}", "type": "seed", "job_id": job_id,
                     "attempt_id": f"a{job_id}", "lease_expires_at": lease})
    return jsonify(project_id=project_id, jobs=jobs, retry_after_ms=0, policy_version=1)


def _results(status: str | None):
    body = request.get_json()
    return jsonify(results=[{"job_id": item["job_id"], "attempt_id": item["attempt_id"], "status": "applied",
                             "job_status": status, "lease_expires_at": None, "error": None}
                            for item in body["items"]])


@app.post("/api/v1/projects/<project_id>/jobs/complete")
def complete(project_id):
    return _results("done")


@app.post("/api/v1/projects/<project_id>/jobs/fail")
def fail(project_id):
    return _results("failed")


@app.post("/api/v1/projects/<project_id>/jobs/extend-lease")
def extend(project_id):
    return _results("wip")
