"""Upload PDFs to pdf attempts through gunicorn until every job is archived
(``done``), with a real Dramatiq worker on Redis. ``--spool local`` (the
default): the local spool and object store, one data directory shared by web
and tasks. ``--spool s3``: S3 staging and the S3 store on moto's HTTP server
(its own process), web and tasks each with a data directory of its own.

Default: 4 concurrent clients, 200 synthetic valid PDFs of 20 MiB. The
ceiling, measured in the same run on the same disk: hashing and writing the
same bytes with fsync in one stream (the parallel figure is printed too),
before and after the ingest, counted as the mean of the two.
A second phase uploads 4 × 100 MiB at once
and samples the RSS of every master process (web arbiter and workers, task
processes).

The ceiling is that of the medium the spool writes to: for ``--spool s3``,
hashing and putting the same files into the store in one stream (moto, a
Python process keeping objects in memory, is far slower than the disk),
measured in the same way.

Last line: ``upload_ingest spool=S mb_per_s=N ceiling_mb_per_s=M ratio=R … peak_rss_mb=X``
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import redis
import requests

from _common import ROOT, VERSION, admin_token, free_port, fresh_database, stop, wait_ready

sys.path.insert(0, ROOT)
from tests.fleet_helpers import new_identity  # noqa: E402
from tests.pdfs import make_pdf  # noqa: E402

MB = 1024 * 1024
REDIS_URL = os.environ.get("FLEETHQ_BENCH_REDIS", "redis://127.0.0.1:6379/14")


def flask(url, *args, env_extra=None):
    env = {**os.environ, "DATABASE_URL": url, **(env_extra or {})}
    out = subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "fleet", *args], cwd=ROOT,
                         env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


class Moto:
    """moto's S3 server as a process of its own, with one bucket."""

    BUCKET = "fleethq-bench"

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"),
                                      "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(self.url + "/moto-api/", self.proc)
        import boto3
        boto3.client("s3", endpoint_url=self.url, region_name="us-east-1", aws_access_key_id="bench",
                     aws_secret_access_key="bench").create_bucket(Bucket=self.BUCKET)

    def env(self) -> dict:
        return {"S3_BUCKET": self.BUCKET, "S3_ENDPOINT_URL": self.url, "S3_REGION": "us-east-1",
                "S3_ACCESS_KEY_ID": "bench", "S3_SECRET_ACCESS_KEY": "bench",
                "S3_READ_TIMEOUT": "60", "FLEETHQ_SPOOL_BACKEND": "s3"}

    def stop(self):
        stop(self.proc)


class Master:
    """gunicorn + one Dramatiq task process; with ``tasks_data_dir`` (S3
    staging) the tasks process has a data directory of its own."""

    def __init__(self, url, data_dir, extra_env=None, tasks_data_dir=None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, **(extra_env or {}), "DATABASE_URL": url, "REDIS_URL": REDIS_URL,
               "FLEETHQ_DATA_DIR": data_dir,
               "FLEETHQ_LOG_JSON": os.environ.get("FLEETHQ_LOG_JSON", "false"), "FLEETHQ_SECRET_KEY": "bench",
               "FLEETHQ_BIND": f"127.0.0.1:{self.port}",
               "FLEETHQ_WEB_WORKERS": os.environ.get("FLEETHQ_WEB_WORKERS", "2"),
               "FLEETHQ_WEB_THREADS": "8"}
        bin_dir = os.path.dirname(sys.executable)
        self.web = subprocess.Popen([os.path.join(bin_dir, "gunicorn"), "-c", "python:app.gunicorn_conf",
                                     "--log-level", "warning", "wsgi:app"], cwd=ROOT, env=env)
        tasks_env = {**env, "FLEETHQ_DATA_DIR": tasks_data_dir or data_dir}
        self.tasks = subprocess.Popen([os.path.join(bin_dir, "dramatiq"), "tasks:setup_broker", "--processes", "1",
                                       "--threads", "4"], cwd=ROOT, env=tasks_env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(self.base + "/readyz", self.web)

    def pids(self) -> list[int]:
        """The web and task processes and their children (workers, parse zygotes)."""
        pids, todo = [], [self.web.pid, self.tasks.pid]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            todo += children(pid)
        return pids

    def stop(self):
        stop(self.web, self.tasks)


def children(pid: int) -> list[int]:
    # Read from /proc rather than by running pgrep: a sampler that forks twice
    # every 50 ms takes CPU from the master it is measuring.
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for tid in tids:
        try:  # a thread may end between the listing and the read
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                found += [int(p) for p in fh.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def process_kind(pid: int) -> str:
    """gunicorn or dramatiq, arbiter or worker (for the peak-RSS breakdown)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):  # ended before or while read
        return "gone"
    name = next((os.path.basename(a.decode()) for a in argv if b"gunicorn" in a or b"dramatiq" in a),
                "other")
    return name


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


class PeakRss(threading.Thread):
    """Largest RSS of any single master process while running."""

    def __init__(self, master):
        super().__init__(daemon=True)
        self.master, self.peak, self.halt = master, 0.0, threading.Event()

    def run(self):
        self.by_kind: dict[str, float] = {}
        while not self.halt.is_set():
            for pid in self.master.pids():
                mb = rss_mb(pid)
                if mb > self.peak:
                    self.peak = mb
                kind = process_kind(pid)
                self.by_kind[kind] = max(self.by_kind.get(kind, 0.0), mb)
            time.sleep(0.05)


def ceiling(paths, threads, out_dir) -> float:
    """Hash + write + fsync the same files, ``threads`` at a time: MB/s."""
    work: queue.Queue = queue.Queue()
    for p in paths:
        work.put(p)
    total = sum(os.path.getsize(p) for p in paths)

    def run():
        while True:
            try:
                src = work.get_nowait()
            except queue.Empty:
                return
            digest = hashlib.sha256()
            dst = os.path.join(out_dir, os.path.basename(src) + ".copy")
            with open(src, "rb") as fin, open(dst, "wb") as fout:
                while chunk := fin.read(MB):
                    digest.update(chunk)
                    fout.write(chunk)
                fout.flush()
                os.fsync(fout.fileno())
            os.unlink(dst)

    started = time.perf_counter()
    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return total / MB / (time.perf_counter() - started)


def store_ceiling(paths, moto) -> float:
    """Hash + put the same files into the S3 store in one stream: MB/s, the
    ceiling of what S3 staging writes to (moto here)."""
    import base64

    import boto3
    client = boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1",
                          aws_access_key_id="bench", aws_secret_access_key="bench")
    total = sum(os.path.getsize(p) for p in paths)
    started = time.perf_counter()
    for n, path in enumerate(paths):
        with open(path, "rb") as fh:
            data = fh.read()
        digest = hashlib.sha256(data).digest()
        client.put_object(Bucket=moto.BUCKET, Key=f"ceiling/{n}", Body=data, ChecksumAlgorithm="SHA256",
                          ChecksumSHA256=base64.b64encode(digest).decode())
        client.delete_object(Bucket=moto.BUCKET, Key=f"ceiling/{n}")
    return total / MB / (time.perf_counter() - started)


class FileBody:
    """A file body that hands http.client 1 MiB per read (its default block
    is 8-16 KiB, which makes the client, not the master, the bottleneck)."""

    def __init__(self, path):
        self._fh = open(path, "rb")
        self._size = os.path.getsize(path)

    def __len__(self):
        return self._size

    def read(self, n=-1):
        return self._fh.read(max(n, MB) if n and n > 0 else -1)

    def close(self):
        self._fh.close()


class Uploader:
    def __init__(self, base, node_id, secret, project):
        self.base, self.node_id, self.project = base, node_id, project
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {secret}", "X-Client-Version": VERSION})

    def heartbeat(self):
        self.session.post(f"{self.base}/api/v1/fleet/heartbeat", json={
            "capacity": 8, "browser_ok": False, "disk_free_bytes": 10**12, "spool_bytes": 0,
            "running_attempt_ids": []}).raise_for_status()

    def claim_one(self):
        response = self.session.post(f"{self.base}/api/v1/projects/{self.project}/jobs/claim", json={
            "worker_id": self.node_id, "max_jobs": 1, "lease_seconds": 600})
        response.raise_for_status()
        jobs = response.json()["jobs"]
        return jobs[0] if jobs else None

    def upload(self, attempt_id, path, sha):
        size = os.path.getsize(path)
        body = FileBody(path)
        try:
            response = self.session.put(f"{self.base}/api/v1/fleet/uploads/{attempt_id}", data=body,
                                        headers={"X-PDF-SHA256": sha, "X-PDF-Size": str(size),
                                                 "Content-Type": "application/pdf"}, timeout=600)
        finally:
            body.close()
        if response.status_code in (200, 202):
            return size
        error = response.json().get("error", {}) if response.headers.get(
            "Content-Type", "").startswith("application/json") else {}
        if error.get("retryable"):
            # As a worker does (spool full while the archive catches up, the
            # store away): wait as told, capped so the run measures throughput.
            time.sleep(min(error.get("retry_after_ms", 1000), 1000) / 1000)
            return self.upload(attempt_id, path, sha)
        raise RuntimeError(f"upload {attempt_id}: {response.status_code} {response.text[:300]}")


def run_phase(master, uploader_args, files, clients) -> tuple[int, float]:
    """Claim + upload every file with ``clients`` threads; wait until all are done."""
    work: queue.Queue = queue.Queue()
    for item in files:
        work.put(item)
    uploaded = [0]
    lock = threading.Lock()
    errors = []

    def client():
        up = Uploader(master.base, *uploader_args)
        up.heartbeat()
        while True:
            try:
                path, sha = work.get_nowait()
            except queue.Empty:
                return
            try:
                job = None
                while job is None:
                    up.heartbeat()
                    job = up.claim_one()
                    if job is None:
                        time.sleep(0.05)
                size = up.upload(job["attempt_id"], path, sha)
                with lock:
                    uploaded[0] += size
            except Exception as exc:  # report, do not hang the run
                errors.append(exc)
                return

    started = time.perf_counter()
    pool = [threading.Thread(target=client) for _ in range(clients)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return uploaded[0], started


def wait_done(base, token, project, expected, timeout_s=1800):
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        counts = session.get(f"{base}/api/v1/admin/projects/{project}").json()["job_counts"]
        if counts["done"] >= expected:
            return
        if counts["failed"] or counts["reset_exhausted"]:
            raise RuntimeError(f"jobs failed: {counts}")
        time.sleep(0.1)
    raise RuntimeError("timed out waiting for archive")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--mib", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--big-mib", type=int, default=100)
    parser.add_argument("--spool", choices=("local", "s3"), default="local")
    args = parser.parse_args()

    redis.Redis.from_url(REDIS_URL).flushdb()
    url = fresh_database("fleethq_bench_upload")
    token = admin_token(url)
    work_dir = tempfile.mkdtemp(prefix="fleethq-bench-")
    data_dir = os.path.join(work_dir, "data")
    src_dir = os.path.join(work_dir, "src")
    os.makedirs(src_dir)
    try:
        print(f"generating {args.files} PDFs of {args.mib} MiB ...", flush=True)
        files = []
        for i in range(args.files):
            path = os.path.join(src_dir, f"p{i}.pdf")
            files.append((path, make_pdf(path, pages=4, target_bytes=args.mib * MB, seed=i)))
        # The ceiling is one stream hashing and writing the bytes with fsync (the
        # measure of the machine notes' anchor figure); the same work spread
        # over the clients' thread count is printed beside it for context.
        os.sync()  # the generated files' writeback must not run during either measurement
        ceiling_mb_s = ceiling([p for p, _ in files], 1, work_dir)
        parallel_mb_s = ceiling([p for p, _ in files], args.clients, work_dir)
        print(f"ceiling (sha256 + write + fsync): {ceiling_mb_s:.0f} MB/s in one stream, "
              f"{parallel_mb_s:.0f} MB/s in {args.clients} threads", flush=True)

        env = {"FLEETHQ_DATA_DIR": data_dir}
        flask(url, "put-project", "papers", "--kind", "pdf", "--identity-mode", "unique_value",
              "--client-versions", VERSION, "--max-in-flight", "null", "--max-worker-in-flight", "null",
              env_extra=env)
        specs = [json.dumps({"value": f"10.5555/bench.{i}"}) for i in range(args.files + args.clients)]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as fh:
            fh.write("\n".join(specs) + "\n")
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "fleethq-source"), "pack",
                        "--jsonl", "--project-mode", "unique_value", "-o", fh.name + ".zst", fh.name],
                       check=True, capture_output=True)
        flask(url, "enqueue-source", "papers", fh.name + ".zst", env_extra=env)
        credential = flask(url, "enroll", env_extra=env).splitlines()[-1]
        node_id, secret = new_identity()

        os.sync()
        moto = Moto() if args.spool == "s3" else None
        store_mb_s = store_ceiling([p for p, _ in files], moto) if moto else None
        if moto:
            print(f"store ceiling (sha256 + put into moto, one stream): {store_mb_s:.0f} MB/s", flush=True)
        master = Master(url, data_dir, moto.env() if moto else None,
                        os.path.join(work_dir, "tasks-data") if moto else None)
        sampler = PeakRss(master)
        sampler.start()
        try:
            requests.post(f"{master.base}/api/v1/fleet/register", json={
                "id": node_id, "name": "bench", "enrollment_token": credential,
                "secret": secret}).raise_for_status()
            flask(url, "worker", "approve", node_id, env_extra=env)
            total, started = run_phase(master, (node_id, secret, "papers"), files, args.clients)
            wait_done(master.base, token, "papers", args.files)
            elapsed = time.perf_counter() - started
            mb_s = total / MB / elapsed
            print(f"ingest: {total / MB:.0f} MB in {elapsed:.1f}s = {mb_s:.0f} MB/s "
                  f"(upload, verify, stage, archive, done)", flush=True)
            # The machine's speed drifts by 10-20 % within one run: each
            # ceiling is the mean of a measure before the ingest and one after
            # (the master idle).
            os.sync()
            after_mb_s = ceiling([p for p, _ in files], 1, work_dir)
            print(f"ceiling after the ingest: {after_mb_s:.0f} MB/s", flush=True)
            ceiling_mb_s = (ceiling_mb_s + after_mb_s) / 2
            if moto:
                after_mb_s = store_ceiling([p for p, _ in files], moto)
                print(f"store ceiling after the ingest: {after_mb_s:.0f} MB/s", flush=True)
                store_mb_s = (store_mb_s + after_mb_s) / 2
            steady_peak = sampler.peak
            for path, _ in files:
                os.unlink(path)
            big = []
            for i in range(args.clients):
                path = os.path.join(src_dir, f"big{i}.pdf")
                big.append((path, make_pdf(path, pages=8, target_bytes=args.big_mib * MB, seed=10_000 + i)))
            run_phase(master, (node_id, secret, "papers"), big, args.clients)
            wait_done(master.base, token, "papers", args.files + args.clients)
            print(f"peak RSS of any master process: {steady_peak:.0f} MB with {args.mib} MiB uploads, "
                  f"{sampler.peak:.0f} MB with {args.clients} x {args.big_mib} MiB in flight "
                  f"(by program: {json.dumps({k: round(v) for k, v in sampler.by_kind.items()})})",
                  flush=True)
        finally:
            sampler.halt.set()
            master.stop()
            if moto:
                moto.stop()
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    # The ceiling is that of the medium the spool writes to: the disk for the
    # local spool, the object store for S3 staging (moto here, far slower
    # than the disk: the disk's ratio is printed beside it).
    if store_mb_s:
        print(f"upload_ingest spool=s3 mb_per_s={mb_s:.0f} ceiling_mb_per_s={store_mb_s:.0f} "
              f"ratio={mb_s / store_mb_s:.2f} disk_ceiling_mb_per_s={ceiling_mb_s:.0f} "
              f"disk_ratio={mb_s / ceiling_mb_s:.2f} peak_rss_mb={sampler.peak:.0f}")
    else:
        print(f"upload_ingest spool=local mb_per_s={mb_s:.0f} ceiling_mb_per_s={ceiling_mb_s:.0f} "
              f"ratio={mb_s / ceiling_mb_s:.2f} peak_rss_mb={sampler.peak:.0f}")


if __name__ == "__main__":
    main()
