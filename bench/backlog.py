"""A paper backlog far larger than the fleet: it waits, it does not expire.

Enqueues ``--jobs`` (100,000) pdf jobs against the local publisher into one
project whose task timeout is shortened to 120 s, far less than the fleet
needs to work them all off. Four ``fleethq-worker`` processes serve it, the
last of them a fallback node (``flask fleet set-tier … fallback``); the
master runs as in production (gunicorn, one Dramatiq task process, the
clock). After ``--minutes`` the project is drained (running attempts finish,
no new claims), the workers are stopped, and the jobs are counted straight
in PostgreSQL:

- ``failed_deadline``: jobs failed because their task deadline passed. The
  deadline starts at a job's first claim, so waiting in the queue never
  counts: this must be 0.
- ``queued``: jobs not done and still claimable (``todo``, no deadline or
  one not yet passed); ``done + queued + failed_* == jobs`` is checked, and
  one more claim proves the queue still hands out work.
- ``claims_per_s``: attempts the fleet was granted per second during the run.
- ``fallback_share``: the fallback node's share of the archived papers.

Before the fleet starts, the claim path alone is measured on two more pdf
projects, one holding 100,000 queued jobs and one 1,000 (raw HTTP claims of
one job by four token workers, alternating rounds, medians): the claim rate
must not depend on the size of the backlog (goal: within 20 %).

Last line: ``backlog jobs=N done=D queued=Q failed_deadline=0 failed_other=F
claims_per_s=… fallback_share=… claim_rate_100k=… claim_rate_1k=… rate_ratio=…``
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psycopg
import redis

from _common import ROOT, VERSION, Master, admin_token, api, flask_cli, fresh_database, stop

from tests.publisher import Publisher  # noqa: E402  (_common put ROOT on sys.path)
from tests.publisher.server import HTTP_KINDS, KIND_PATHS  # noqa: E402

REDIS_URL = os.environ.get("FLEETHQ_BENCH_REDIS", "redis://127.0.0.1:6379/12")
PROJECT = "backlog"
TASK_TIMEOUT_S = 120


def paper_urls(pub: Publisher, count: int, start: int = 1) -> list[str]:
    """Publisher URLs without generating the papers (the publisher makes each
    on its first request, so only the papers fetched cost disk)."""
    return [pub.url + KIND_PATHS[HTTP_KINDS[i % len(HTTP_KINDS)]].format(n=start + i) for i in range(count)]


class Run:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="fleethq-bench-backlog-")
        self.db_url = fresh_database("fleethq_bench_backlog")
        self.token = admin_token(self.db_url)
        redis.Redis.from_url(REDIS_URL).flushdb()
        self.master = Master(self.db_url, os.path.join(self.tmp, "master"), REDIS_URL, clock=True)
        self.admin = api(self.master.base, self.token)
        self.pub = Publisher(paper_bytes=args.paper_kib * 1024).start()
        self.workers: list[subprocess.Popen] = []

    def close(self) -> None:
        stop(*self.workers)
        self.pub.stop()
        self.master.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- set-up -------------------------------------------------------------

    def project(self, name: str, policy: dict) -> None:
        self.admin.put(f"{self.master.base}/api/v1/fleethq/projects/{name}", json={
            "kind": "pdf", "identity_mode": "unique_value", "client_versions": [VERSION],
            **policy}).raise_for_status()

    def patch(self, name: str, **fields) -> None:
        self.admin.patch(f"{self.master.base}/api/v1/fleethq/projects/{name}",
                         json=fields).raise_for_status()

    def enqueue(self, name: str, urls: list[str]) -> None:
        for i in range(0, len(urls), 10_000):
            self.admin.post(f"{self.master.base}/api/v1/admin/projects/{name}/jobs", json={
                "jobs": [{"value": u} for u in urls[i:i + 10_000]]}, timeout=300).raise_for_status()

    def start_worker(self, index: int, tier: str = "first") -> str:
        """Enroll, start and approve one worker program (its tier set before
        it may claim); returns its worker id."""
        volume = os.path.join(self.tmp, f"volume-{index}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHQ_")}
        env["FLEETHQ_ENROLL"] = flask_cli(self.db_url, "enroll").splitlines()[-1]
        cmd = [sys.executable, "-m", "workers.runner.cli", "run", "--master", self.master.base,
               "--volume", volume, "--project", PROJECT, "--concurrency", str(self.args.concurrency),
               "--name", f"bench-{index}", "--allow-http", "--client-version", VERSION,
               "--min-free-bytes", "0", "--allow-networks", f"{self.pub.host}/32",
               "--log-level", self.args.log_level]
        log = None
        if self.args.log_dir:
            os.makedirs(self.args.log_dir, exist_ok=True)
            log = open(os.path.join(self.args.log_dir, f"worker-{index}.log"), "ab")
        self.workers.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=log))
        identity = os.path.join(volume, "identity.json")
        deadline = time.monotonic() + 120
        while not (os.path.exists(identity) and json.load(open(identity)).get("registered")):
            if time.monotonic() > deadline or self.workers[-1].poll() is not None:
                raise SystemExit(f"worker {index} did not register")
            time.sleep(0.1)
        worker_id = json.load(open(identity))["worker_id"]
        if tier != "first":
            flask_cli(self.db_url, "set-tier", worker_id, tier)
        flask_cli(self.db_url, "worker", "approve", worker_id)
        return worker_id

    # --- the claim path alone -----------------------------------------------

    def claim_rate(self, name: str, claims: int, threads: int = 4) -> float:
        """Claims of one job per second by ``threads`` token workers."""
        url = f"{self.master.base}/api/v1/projects/{name}/jobs/claim"
        errors: list[str] = []

        def claimer(i: int):
            session = api(self.master.base, self.token)
            worker_id = f"rate{i:03d}"
            session.post(f"{self.master.base}/api/v1/fleet/heartbeat", json={
                "worker_id": worker_id, "capacity": 256, "browser_ok": False, "disk_free_bytes": 1 << 40,
                "spool_bytes": 0, "running_attempt_ids": []}, timeout=60).raise_for_status()
            for _ in range(claims // threads):
                r = session.post(url, json={"worker_id": worker_id, "max_jobs": 1, "lease_seconds": 3600},
                                 timeout=60)
                if r.status_code != 200 or len(r.json()["jobs"]) != 1:
                    errors.append(f"{r.status_code} {r.text[:200]}")
                    return

        pool = [threading.Thread(target=claimer, args=(i,)) for i in range(threads)]
        began = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        if errors:
            raise SystemExit(f"claims on {name} failed: {errors[0]}")
        return claims // threads * threads / (time.perf_counter() - began)

    def measure_claim_path(self) -> tuple[float, float]:
        rounds, per_round = self.args.rate_rounds, self.args.rate_claims
        unlimited = {"max_in_flight": None, "max_worker_in_flight": None}
        self.project("rate-big", unlimited)
        self.project("rate-small", unlimited)
        started = time.perf_counter()
        self.enqueue("rate-big", paper_urls(self.pub, self.args.jobs, start=10_000_001))
        # The small queue ends the measurement at 1,000 queued.
        self.enqueue("rate-small", paper_urls(self.pub, 1_000 + rounds * per_round, start=20_000_001))
        print(f"claim path: enqueued {self.args.jobs} + {1_000 + rounds * per_round} jobs in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        self.claim_rate("rate-small", 40)  # warm-up: connections, plans, caches
        big, small = [], []
        for _ in range(rounds):
            small.append(self.claim_rate("rate-small", per_round))
            big.append(self.claim_rate("rate-big", per_round))
        print("claim path, claims/s per round: 100k queued " + " ".join(f"{r:.0f}" for r in big)
              + "; 1k queued " + " ".join(f"{r:.0f}" for r in small), flush=True)
        for name in ("rate-big", "rate-small"):
            self.patch(name, status="archived")
        return statistics.median(big), statistics.median(small)

    # --- the backlog ---------------------------------------------------------

    def counts(self) -> dict:
        with psycopg.connect(self.db_url) as conn:
            rows = conn.execute(
                "SELECT state, count(*) FILTER (WHERE last_error->>'code' = 'timeout'), count(*) "
                "FROM jobs WHERE project_id = %s GROUP BY state", (PROJECT,)).fetchall()
        return {state: (timeouts, n) for state, timeouts, n in rows}

    def in_flight(self) -> int:
        with psycopg.connect(self.db_url) as conn:
            return conn.execute("SELECT count(*) FROM attempts WHERE project_id = %s "
                                "AND state IN ('running', 'uploading', 'staged')",
                                (PROJECT,)).fetchone()[0]

    def backlog(self) -> dict:
        self.project(PROJECT, {"task_timeout_seconds": TASK_TIMEOUT_S, "max_in_flight": 4 * self.args.concurrency,
                               "max_worker_in_flight": self.args.concurrency,
                               "fallback_after_seconds": self.args.fallback_after})
        started = time.perf_counter()
        self.enqueue(PROJECT, paper_urls(self.pub, self.args.jobs))
        print(f"backlog: enqueued {self.args.jobs} pdf jobs in {time.perf_counter() - started:.1f} s "
              f"(task timeout {TASK_TIMEOUT_S} s)", flush=True)
        ids = [self.start_worker(i) for i in range(3)] + [self.start_worker(3, tier="fallback")]
        fallback = ids[-1]
        run_began = time.time()
        end = time.monotonic() + self.args.minutes * 60
        while time.monotonic() < end:
            time.sleep(min(30, max(0.0, end - time.monotonic())))
            c = self.counts()
            print(f"  {time.time() - run_began:5.0f} s: " + ", ".join(f"{k} {v[1]}" for k, v in sorted(c.items())),
                  flush=True)
            dead = [p.args[p.args.index("--name") + 1] for p in self.workers if p.poll() is not None]
            if dead:
                raise SystemExit(f"worker(s) exited: {dead}")
        # Drain: what runs may finish, nothing new is handed out.
        self.patch(PROJECT, status="draining")
        drain_end = time.monotonic() + 300
        while self.in_flight() and time.monotonic() < drain_end:
            time.sleep(1)
        run_s = time.time() - run_began
        stop(*self.workers, timeout=60)
        self.workers = []
        self.patch(PROJECT, status="active")
        with psycopg.connect(self.db_url) as conn:
            claims = conn.execute("SELECT count(*) FROM attempts WHERE project_id = %s",
                                  (PROJECT,)).fetchone()[0]
            done_by = dict(conn.execute(
                "SELECT a.worker_id, count(*) FROM jobs j JOIN attempts a ON a.id = j.current_attempt_id "
                "WHERE j.project_id = %s AND j.state = 'done' GROUP BY a.worker_id", (PROJECT,)).fetchall())
            claimable = conn.execute(
                "SELECT count(*) FROM jobs WHERE project_id = %s AND state = 'todo' "
                "AND (deadline_at IS NULL OR deadline_at > now())", (PROJECT,)).fetchone()[0]
        c = self.counts()
        done = c.get("done", (0, 0))[1]
        failed_deadline, failed = c.get("failed", (0, 0))
        other = {k: v[1] for k, v in c.items() if k not in ("done", "todo", "failed")}
        if other:
            raise SystemExit(f"jobs left in flight after the drain: {other}")
        # The queue still hands out work after the run.
        r = self.admin.post(f"{self.master.base}/api/v1/fleet/heartbeat", json={
            "worker_id": "probe01", "capacity": 1, "browser_ok": False, "disk_free_bytes": 1 << 40,
            "spool_bytes": 0, "running_attempt_ids": []}, timeout=60)
        r.raise_for_status()
        r = self.admin.post(f"{self.master.base}/api/v1/projects/{PROJECT}/jobs/claim", json={
            "worker_id": "probe01", "max_jobs": 1, "lease_seconds": 60}, timeout=60)
        r.raise_for_status()
        if done < self.args.jobs and len(r.json()["jobs"]) != 1:
            raise SystemExit(f"the backlog hands out no job after the run: {r.text[:300]}")
        return {"jobs": self.args.jobs, "done": done, "queued": claimable, "failed_deadline": failed_deadline,
                "failed_other": failed - failed_deadline, "claims_per_s": claims / run_s,
                "fallback_share": done_by.get(fallback, 0) / max(done, 1), "run_s": run_s,
                "done_by": done_by, "unaccounted": self.args.jobs - done - claimable - failed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--concurrency", type=int, default=2, help="downloads per worker")
    parser.add_argument("--paper-kib", type=int, default=64)
    parser.add_argument("--fallback-after", type=int, default=60,
                        help="the project's fallback_after_seconds")
    parser.add_argument("--log-level", default="WARNING", help="the workers' log level")
    parser.add_argument("--log-dir", default=None, help="write the workers' logs here")
    parser.add_argument("--rate-rounds", type=int, default=3)
    parser.add_argument("--rate-claims", type=int, default=160, help="claims per measuring round")
    args = parser.parse_args()
    run = Run(args)
    try:
        print(f"master {run.master.base}, publisher {run.pub.url}; machine load {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} CPUs", flush=True)
        rate_big, rate_small = run.measure_claim_path()
        result = run.backlog()
    finally:
        run.close()
    print(f"run {result['run_s']:.0f} s; done per worker {result['done_by']}; "
          f"unaccounted {result['unaccounted']}", flush=True)
    ratio = rate_big / rate_small
    print(f"backlog jobs={result['jobs']} done={result['done']} queued={result['queued']} "
          f"failed_deadline={result['failed_deadline']} failed_other={result['failed_other']} "
          f"claims_per_s={result['claims_per_s']:.1f} fallback_share={result['fallback_share']:.2f} "
          f"claim_rate_100k={rate_big:.0f} claim_rate_1k={rate_small:.0f} rate_ratio={ratio:.2f}")
    return 0 if result["unaccounted"] == 0 and result["failed_deadline"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
