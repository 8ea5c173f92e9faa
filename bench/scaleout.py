"""One web instance against two behind a round-robin proxy, in one run.

The topology is production's past one master: one PostgreSQL, one Redis,
uploads staged in S3 (moto's HTTP server, a process of its own), a Dramatiq
tasks process, and web instances that share no data directory. Both sides go
through the same proxy (tests/roundrobin_proxy.py, its own process): with one
backend, then with two, so the proxy's cost is on both sides.

- claim: claim 64 + complete 64 per cycle from 4 keep-alive client threads
  (bench/claim_throughput.py's load generator), in four phases one, two, two,
  one; each side's rate is its jobs over its time;
- ingest: claim + upload of 20 MiB PDFs by 4 clients until every job is
  archived (bench/upload_ingest.py's uploader), one side after the other.

On two cores a second instance cannot add CPU, so the goal is that two lose
nothing (claim_ratio >= 0.9). Last line:
``scaleout claim_one=N claim_two=M claim_ratio=R ingest_one_mb_s=A ingest_two_mb_s=B``
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psycopg
import redis
import requests

from _common import ROOT, VERSION, admin_token, api, free_port, fresh_database, stop, wait_ready
from claim_throughput import fill, http_worker, run_threads
from upload_ingest import MB, REDIS_URL, Moto, flask, run_phase, wait_done

sys.path.insert(0, ROOT)
from tests.fleet_helpers import new_identity  # noqa: E402
from tests.pdfs import make_pdf  # noqa: E402
from tests.roundrobin_proxy import ProxyProcess  # noqa: E402

BIN = os.path.dirname(sys.executable)


class Cluster:
    def __init__(self, url: str, work_dir: str, moto: Moto, web_workers: int):
        self.env = {**os.environ, **moto.env(), "DATABASE_URL": url, "REDIS_URL": REDIS_URL,
                    "FLEETHQ_LOG_JSON": "false", "FLEETHQ_SECRET_KEY": "bench",
                    "FLEETHQ_WEB_WORKERS": str(web_workers), "FLEETHQ_WEB_THREADS": "8"}
        self.env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.webs, self.procs = [], []
        for name in ("web1", "web2"):
            port = free_port()
            env = {**self.env, "FLEETHQ_BIND": f"127.0.0.1:{port}",
                   "FLEETHQ_DATA_DIR": os.path.join(work_dir, name)}
            proc = subprocess.Popen([os.path.join(BIN, "gunicorn"), "-c", "python:app.gunicorn_conf",
                                     "--log-level", "warning", "wsgi:app"], cwd=ROOT, env=env)
            self.procs.append(proc)
            self.webs.append(f"http://127.0.0.1:{port}")
        for base, proc in zip(self.webs, self.procs):
            wait_ready(base + "/readyz", proc)
        tasks_env = {**self.env, "FLEETHQ_DATA_DIR": os.path.join(work_dir, "tasks")}
        self.procs.append(subprocess.Popen(
            [os.path.join(BIN, "dramatiq"), "tasks:setup_broker", "--processes", "1", "--threads", "4"],
            cwd=ROOT, env=tasks_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self.one = ProxyProcess(free_port(), self.webs[:1], ROOT)
        self.two = ProxyProcess(free_port(), self.webs, ROOT)

    def stop(self) -> None:
        self.one.stop()
        self.two.stop()
        stop(*self.procs)


def claim_phases(cluster: Cluster, url: str, token: str, jobs: int, threads: int) -> dict:
    session = api(cluster.webs[0], token)
    half = jobs // 2
    phases = [("one", 0), ("two", 0), ("two", 1), ("one", 1)]
    for side, n in phases:
        fill(session, cluster.webs[0], f"claim-{side}{n}", half)
    with psycopg.connect(url, autocommit=True) as conn:  # as claim_throughput: same plans, no vacuum beside
        for table in ("jobs", "attempts"):
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            conn.execute(f"ANALYZE {table}")
    totals = {"one": [0, 0.0], "two": [0, 0.0]}
    for side, n in phases:
        base = (cluster.one if side == "one" else cluster.two).url
        project = f"claim-{side}{n}"
        done, elapsed = run_threads(http_worker, lambda i, base=base, project=project: (base, token, project, f"w{i}"),
                                    threads)
        assert done == half, (side, n, done)
        totals[side][0] += done
        totals[side][1] += elapsed
        print(f"claim {side}: {done} jobs in {elapsed:.2f}s = {done / elapsed:.0f} jobs/s", flush=True)
    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("jobs", "attempts"):
            conn.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
    return {side: done / elapsed for side, (done, elapsed) in totals.items()}


def ingest(cluster: Cluster, url: str, token: str, src_dir: str, files: int, mib: int,
           clients: int) -> dict:
    credential = flask(url, "enroll").splitlines()[-1]
    node_id, secret = new_identity()
    requests.post(f"{cluster.webs[0]}/api/v1/fleet/register", json={
        "id": node_id, "name": "bench", "enrollment_token": credential,
        "secret": secret}).raise_for_status()
    flask(url, "worker", "approve", node_id)
    rates = {}
    for side, proxy in (("one", cluster.one), ("two", cluster.two)):
        project = f"papers-{side}"
        flask(url, "put-project", project, "--kind", "pdf", "--identity-mode", "unique_value",
              "--client-versions", VERSION, "--max-in-flight", "null",
              "--max-worker-in-flight", "null")
        session = api(cluster.webs[0], token)
        session.post(f"{cluster.webs[0]}/api/v1/admin/projects/{project}/jobs", json={"jobs": [
            {"value": f"10.5555/{side}.{i}"} for i in range(files + clients)]}).raise_for_status()
        batch = []
        for i in range(files):
            path = os.path.join(src_dir, f"{side}{i}.pdf")
            batch.append((path, make_pdf(path, pages=4, target_bytes=mib * MB,
                                         seed=i + (0 if side == "one" else 100_000))))
        os.sync()
        target = type("Target", (), {"base": proxy.url})()
        total, started = run_phase(target, (node_id, secret, project), batch, clients)
        wait_done(cluster.webs[0], token, project, files)
        elapsed = time.perf_counter() - started
        rates[side] = total / MB / elapsed
        print(f"ingest {side}: {total / MB:.0f} MB in {elapsed:.1f}s = {rates[side]:.0f} MB/s", flush=True)
        for path, _ in batch:
            os.unlink(path)
    served = cluster.two.served()
    print(f"connections served through the two-instance proxy: {json.dumps(served)}", flush=True)
    return rates


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000, help="claim jobs per side")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--files", type=int, default=40, help="uploads per side")
    parser.add_argument("--mib", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn workers per instance")
    args = parser.parse_args()

    redis.Redis.from_url(REDIS_URL).flushdb()
    url = fresh_database("fleethq_bench_scaleout")
    token = admin_token(url)
    work_dir = tempfile.mkdtemp(prefix="fleethq-scaleout-")
    src_dir = os.path.join(work_dir, "src")
    os.makedirs(src_dir)
    moto = Moto()
    cluster = None
    try:
        cluster = Cluster(url, work_dir, moto, args.web_workers)
        claims = claim_phases(cluster, url, token, args.jobs, args.threads)
        rates = ingest(cluster, url, token, src_dir, args.files, args.mib, args.clients)
    finally:
        if cluster is not None:
            cluster.stop()
        moto.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    print(f"scaleout claim_one={claims['one']:.0f} claim_two={claims['two']:.0f} "
          f"claim_ratio={claims['two'] / claims['one']:.2f} ingest_one_mb_s={rates['one']:.0f} "
          f"ingest_two_mb_s={rates['two']:.0f}")


if __name__ == "__main__":
    main()
