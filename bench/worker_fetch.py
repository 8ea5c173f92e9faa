"""fleethq-worker end to end: claim → fetch from the local publisher → upload →
archive receipt → delete, with one worker process at concurrency 4.

The master is the production shape on this machine: gunicorn (2 workers × 8
threads) and one Dramatiq task process on Redis, a scratch PostgreSQL
database, the local object store. The publisher (tests/publisher) serves
synthetic 1 MiB papers from this process.

Two lanes, measured separately, each in its own pdf project:
- HTTP lane: 200 papers cycling through direct PDF, citation_pdf_url landing
  page, "Download PDF" link, Content-Disposition attachment, redirect chain;
- browser lane: papers only a browser gets (a link inserted by JavaScript,
  a JavaScript navigation to an inline PDF that Chromium's viewer would show).

Rate = archived papers / (first claim → last ``done`` receipt), from the
master's own timestamps, so worker start-up is not counted. Memory: the
worker's process tree (the Python process, Playwright's driver and every
Chromium process under it) sampled every 0.2 s from /proc/PID/smaps_rollup.
``peak_rss_mb`` is the peak of the tree's summed PSS: resident pages with
each shared page split between the processes sharing it, i.e. the memory
the tree really holds. Summing plain RSS would count Chromium's shared
libraries and shared-memory segments once per Chromium process (5-8 times);
that sum is printed on the detail line for comparison.

Last line: ``worker_fetch http_pdfs_per_min=N browser_pdfs_per_min=M peak_rss_mb=X``
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import psycopg
import redis

from _common import ROOT, VERSION, Master, admin_token, api, flask_cli, fresh_database

from tests.publisher import Publisher  # noqa: E402  (_common put ROOT on sys.path)

REDIS_URL = os.environ.get("FLEETHQ_BENCH_REDIS", "redis://127.0.0.1:6379/13")
MB = 1024 * 1024


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (Chromium's zygotes and renderers are grandchildren)."""
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, []))
    return out


TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """CPU used by these processes and by their reaped children (the PDF
    parser children of the ladder, Chromium's closed renderers)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15])   # utime stime cutime cstime
        except (OSError, ValueError, IndexError):
            pass
    return total / TICKS


def memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in KiB; zeros if it is gone."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return rss, pss


class Sampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak_rss, self.peak_pss, self.peak_procs = pid, 0, 0, 0
        self.cpu = 0.0
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            pids = tree(self.pid)
            sums = [memory_kb(p) for p in pids]
            self.peak_rss = max(self.peak_rss, sum(s[0] for s in sums))
            self.peak_pss = max(self.peak_pss, sum(s[1] for s in sums))
            self.peak_procs = max(self.peak_procs, len(pids))
            self.cpu = max(self.cpu, cpu_seconds(pids))
            time.sleep(0.2)


class Bench:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="fleethq-bench-worker-")
        self.db_url = fresh_database("fleethq_bench_worker")
        self.token = admin_token(self.db_url)
        redis.Redis.from_url(REDIS_URL).flushdb()
        self.master = Master(self.db_url, os.path.join(self.tmp, "master"), REDIS_URL)
        self.admin = api(self.master.base, self.token)
        self.pub = Publisher(paper_bytes=args.paper_mib * MB).start()
        self.volume = os.path.join(self.tmp, "volume")
        self.enrolled = False

    def close(self):
        self.pub.stop()
        self.master.stop()
        if self.args.log_dir:
            os.makedirs(self.args.log_dir, exist_ok=True)
            for name in os.listdir(self.tmp):
                if name.endswith(".log"):
                    shutil.copy(os.path.join(self.tmp, name), self.args.log_dir)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def project(self, name: str, values: list[str]) -> None:
        self.admin.put(f"{self.master.base}/api/v1/fleethq/projects/{name}", json={
            "kind": "pdf", "identity_mode": "unique_value", "client_versions": [VERSION],
            "max_in_flight": 64, "max_worker_in_flight": 64}).raise_for_status()
        for i in range(0, len(values), 500):
            self.admin.post(f"{self.master.base}/api/v1/admin/projects/{name}/jobs", json={
                "jobs": [{"value": v} for v in values[i:i + 500]]}).raise_for_status()

    def counts(self, name: str) -> dict:
        response = self.admin.get(f"{self.master.base}/api/v1/fleethq/projects/{name}")
        response.raise_for_status()
        return response.json()["job_counts"]

    def start_worker(self, project: str) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETHQ_")}
        if not self.enrolled:
            env["FLEETHQ_ENROLL"] = flask_cli(self.db_url, "enroll").splitlines()[-1]
        cmd = [sys.executable, "-m", "workers.runner.cli", "run", "--master", self.master.base,
               "--volume", self.volume, "--project", project, "--concurrency", str(self.args.concurrency),
               "--allow-http", "--client-version", VERSION, "--min-free-bytes", "0",
               "--allow-networks", f"{self.pub.host}/32", "--log-level", self.args.log_level]
        log = open(os.path.join(self.tmp, f"worker-{project}.log"), "ab") if self.args.log_dir else None
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=log)
        if not self.enrolled:
            identity = os.path.join(self.volume, "identity.json")
            for _ in range(300):
                if os.path.exists(identity) and json.load(open(identity)).get("registered"):
                    break
                time.sleep(0.1)
            flask_cli(self.db_url, "worker", "approve", json.load(open(identity))["worker_id"])
            self.enrolled = True
        return proc

    def lane(self, name: str, values: list[str]) -> tuple[float, int]:
        if not values:
            return 0.0, 0
        self.project(name, values)
        proc = self.start_worker(name)
        sampler = Sampler(proc.pid)
        sampler.start()
        deadline = time.monotonic() + self.args.timeout
        while True:
            c = self.counts(name)
            if c["done"] + c["failed"] + c["reset_exhausted"] >= len(values):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name}: worker exited or timed out; counts {c}")
            time.sleep(0.25)
        sampler.halt.set()
        sampler.join()
        cpu = max(sampler.cpu, cpu_seconds(tree(proc.pid)))
        proc.terminate()
        proc.wait(30)
        with psycopg.connect(self.db_url) as conn:
            first, last, done, size = conn.execute(
                "SELECT (SELECT min(created_at) FROM attempts WHERE project_id = %s), "
                "max(done_at), count(*), coalesce(sum(size), 0)::bigint FROM uploads "
                "WHERE project_id = %s AND state = 'done'", (name, name)).fetchone()
        seconds = (last - first).total_seconds()
        rate = done / seconds * 60
        print(f"{name}: {done}/{len(values)} archived ({c['failed'] + c['reset_exhausted']} failed), "
              f"{size / MB:.0f} MiB in {seconds:.1f} s: {rate:.0f} PDFs/min, {size / MB / seconds:.1f} MiB/s; "
              f"worker tree peak PSS {sampler.peak_pss / 1024:.0f} MB (summed RSS {sampler.peak_rss / 1024:.0f} MB, "
              f"{sampler.peak_procs} processes); worker CPU {cpu / max(done, 1) * 1000:.0f} ms per PDF; "
              f"machine load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
        return rate, sampler.peak_pss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http-jobs", type=int, default=200)
    parser.add_argument("--browser-jobs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--paper-mib", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--log-level", default="WARNING", help="the worker's log level")
    parser.add_argument("--log-dir", default=None, help="keep the worker logs here")
    args = parser.parse_args()
    bench = Bench(args)
    try:
        http_values = [p.value for p in bench.pub.papers(args.http_jobs)]
        browser_values = [p.value for p in bench.pub.papers(args.browser_jobs, kinds=("jslink", "jsredirect"),
                                                            start=args.http_jobs + 1)]
        print(f"worker concurrency {args.concurrency}, papers of {args.paper_mib} MiB; master "
              f"{bench.master.base}, publisher {bench.pub.url}", flush=True)
        http_rate, http_mem = bench.lane("bench-http", http_values)
        browser_rate, browser_mem = bench.lane("bench-browser", browser_values)
    finally:
        bench.close()
    peak = max(http_mem, browser_mem) / 1024   # PSS sums (see the docstring)
    print(f"worker_fetch http_pdfs_per_min={http_rate:.0f} browser_pdfs_per_min={browser_rate:.0f} "
          f"peak_rss_mb={peak:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
