"""The whole system under faults: nothing accepted is lost, nothing is done twice.

Starts FleetHQ the way production runs it: its own PostgreSQL (embedded, so
that it can be restarted), its own Redis, moto's S3 server as the object
store with uploads staged in it (``FLEETHQ_SPOOL_BACKEND=s3``; web, tasks and
clock each get their own data directory, so they share no disk), gunicorn
web (3 workers), the Dramatiq tasks process, the clock, the test publisher
and a hook consumer. Then the fleet: three enrolled ``fleethq-worker``
processes and the local fetcher (``flask fleet local-worker``) as the
fallback lane on two pdf projects, papers and scans; an enrolled OCR node
and the local OCR lane (its fallback) on the OCR project that the scans'
derive hook fills; and, on a generic project, SDK workers (``workers.sdk``)
and workers that speak SavewebHQ's wire with plain HTTP.

While they work it injects, at random moments (seeded): kill -9 of a
worker of any kind (restarted), kill -9 of web, tasks or clock (restarted),
Redis restarted with its data lost, PostgreSQL restarted, the object store
unreachable, the spool filled to its quota (the archive stopped while
workers upload), and the hook consumer answering 500. Every kind happens at
least once. Then the queues settle and the invariants are checked straight
in PostgreSQL, the object store and the disks:

- every job is done or failed, and each failure is the one its URL must give
  (the publisher serves some missing, gone and fake papers);
- every done pdf job has exactly one asset, one ``done`` upload receipt and
  its object in the store; no job has two finished attempts; every archived
  scan has one OCR job and, once that is done, one derived (OCRed) asset;
- no spool file, staged object or worker-local file is left;
- every asset's hook delivery is ``delivered`` and reached the consumer;
- the kept counters equal a full count (jobs per state, reserved spool bytes).

Last line: ``chaos jobs=N done=D failed=F duplicates=0 lost=0 spool_left=0
counter_drift=0 faults=K`` (with ``unexplained`` and ``undelivered``
beside); the exit status is 1 when an invariant is broken. ``--quick`` is the
short variant ``make test`` runs (tests/test_chaos.py).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import requests

from _common import ROOT, free_port

VERSION = "chaos-1"
PDF_PROJECT, GENERIC_PROJECT = "papers", "crawl"
# Scanned papers: fetched like the others; the derive hook turns each archived
# one into an OCR job, served by an OCR node (first) and the local OCR lane.
SCAN_PROJECT, OCR_PROJECT = "scans", "scans-ocr"
PDF_PROJECTS = (PDF_PROJECT, SCAN_PROJECT, OCR_PROJECT)
# The scans are upright: no orientation pass (a second Tesseract run a page).
OCR_ENV = {"FLEETHQ_OCR_ROTATE_PAGES": "false"}
PAPER_KIB = 48
# Publisher routes whose papers must fail, and the error each must end in.
FAILING = {"/missing/{n}": "not_found", "/fakepdf/{n}": "invalid_pdf", "/gone/{n}": "not_found"}
GOOD = ("/papers/{n}.pdf", "/landing/{n}", "/links/{n}", "/attachment/{n}", "/chain/3/{n}")
FAULTS = ("kill_worker", "kill_web", "kill_tasks", "kill_clock", "restart_redis", "restart_postgres",
          "store_down", "spool_full", "hook_500")


def log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


# --- processes ------------------------------------------------------------------

class Proc:
    """A child in a process group of its own, so kill -9 takes all it started."""

    def __init__(self, name: str, argv: list[str], env: dict, log_dir: str):
        self.name, self.argv, self.env = name, argv, env
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Proc":
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        return self

    def signal(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait()
        _wait_group_gone(self.proc.pid)

    def stop(self, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log(f"{self.name} did not stop in {timeout:.0f} s: killing it")
        self.signal(signal.SIGKILL)
        self.proc.wait()
        _wait_group_gone(self.proc.pid)
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _wait_group_gone(pgid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.2, quiet: bool = False):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except Exception:      # a service coming back: ask again
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    if quiet:
        return None
    raise SystemExit(f"chaos: {what} did not happen within {timeout:.0f} s")


# --- the hook consumer ----------------------------------------------------------

class HookConsumer:
    """Answers 200 (and records the asset) or, while ``failing``, 500."""

    def __init__(self):
        self.failing = False
        self.seen: set[str] = set()
        self.refused = 0
        consumer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if consumer.failing:
                    consumer.refused += 1
                    self.send_response(500)
                else:
                    consumer.seen.add(body.get("canonical_key", ""))
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


# --- the run ----------------------------------------------------------------------

class Chaos:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.tmp = tempfile.mkdtemp(prefix="fleethq-chaos-")
        self.logs = os.path.join(self.tmp, "logs")
        os.makedirs(self.logs)
        self.procs: dict[str, Proc] = {}
        self.stop_faults = threading.Event()
        self.fault_thread: threading.Thread | None = None
        self.fleet: list[str] = []          # names of worker processes
        self.volumes: dict[str, str] = {}   # worker name -> its volume
        self.faults: list[str] = []
        # Below what the fleet holds at once (11 download slots), so that a
        # stalled archive fills it.
        self.spool_quota = 6 * PAPER_KIB * 1024
        self.spool_peak = 0
        self.py = sys.executable
        self.bin = os.path.dirname(sys.executable)

    # --- services ---------------------------------------------------------------

    def start_services(self) -> None:
        from app.dev import embedded
        from tests.publisher import Publisher
        from tests.support.archive import MotoServer
        import logging
        logging.getLogger("werkzeug").setLevel(logging.ERROR)   # moto's request log
        self.pg_dir = os.path.join(self.tmp, "pg")
        self.db_url, _ = embedded.start_postgres(self.pg_dir, database="fleethq")
        self.redis_port = free_port()
        self.procs["redis"] = Proc("redis", ["redis-server", "--bind", "127.0.0.1", "--port",
                                             str(self.redis_port), "--save", "", "--appendonly", "no"],
                                   dict(os.environ), self.logs).start()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.wait_redis()
        self.store = MotoServer()
        self.store.start()
        import boto3
        # One client for the run: the settle loop lists the bucket every second.
        self.s3 = boto3.client("s3", endpoint_url=self.store.url, region_name="us-east-1",
                               aws_access_key_id="chaos", aws_secret_access_key="chaos")
        self.s3.create_bucket(Bucket="fleethq")
        self.pub = Publisher(paper_bytes=PAPER_KIB * 1024).start()
        self.hooks = HookConsumer()
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        # Where the fleet reaches the master (bench/netfaults.py puts its
        # faulty network there).
        self.fleet_url = self.base

    def wait_redis(self) -> None:
        import redis
        wait_until(lambda: redis.Redis(port=self.redis_port, socket_timeout=1).ping(), 30, "Redis")

    def master_env(self, role: str) -> dict:
        data = os.path.join(self.tmp, role)
        os.makedirs(data, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETHQ_", "S3_"))}
        env.update({
            "DATABASE_URL": self.db_url, "REDIS_URL": self.redis_url, "FLEETHQ_DATA_DIR": data,
            "FLEETHQ_SECRET_KEY": "chaos-secret", "FLEETHQ_LOG_JSON": "false", "PYTHONUNBUFFERED": "1",
            "FLEETHQ_PUBLIC_URL": self.base, "FLEETHQ_BIND": f"127.0.0.1:{self.port}",
            # The run's hook consumer listens on loopback.
            "FLEETHQ_OUTBOUND_ALLOW": "127.0.0.0/8",
            "FLEETHQ_WEB_WORKERS": "3", "FLEETHQ_WEB_THREADS": "8",
            "FLEETHQ_SPOOL_BACKEND": "s3", "FLEETHQ_SPOOL_MAX_BYTES": str(self.spool_quota),
            "S3_ENDPOINT_URL": self.store.url, "S3_BUCKET": "fleethq", "S3_REGION": "us-east-1",
            "S3_ACCESS_KEY_ID": "chaos", "S3_SECRET_ACCESS_KEY": "chaos",
            "S3_CONNECT_TIMEOUT": "1", "S3_READ_TIMEOUT": "5",
            # Faster recovery than production's defaults, so the run is short;
            # the paths taken are the same.
            "FLEETHQ_RECONCILE_EVERY_S": "5", "FLEETHQ_REAP_EVERY_S": "2",
            "FLEETHQ_SWEEP_SPOOL_EVERY_S": "20"})
        return env

    def flask(self, *args: str) -> str:
        done = subprocess.run([self.py, "-m", "flask", "--app", "wsgi", *args], cwd=ROOT,
                              env=self.master_env("cli"), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise SystemExit(f"chaos: flask {' '.join(args)} failed: {done.stderr[-800:]}")
        return done.stdout.strip()

    def start_master(self) -> None:
        self.flask("db", "upgrade")
        self.master_proc("web").start()
        self.master_proc("tasks").start()
        self.master_proc("clock").start()
        self.wait_web()

    def master_proc(self, role: str) -> Proc:
        argv = {"web": [os.path.join(self.bin, "gunicorn"), "-c", "python:app.gunicorn_conf", "wsgi:app"],
                "tasks": [os.path.join(self.bin, "dramatiq"), "tasks:setup_broker", "--processes", "1",
                          "--threads", "4"],
                "clock": [self.py, "-m", "tasks.clock"]}[role]
        self.procs[role] = Proc(role, argv, self.master_env(role), self.logs)
        return self.procs[role]

    def wait_web(self) -> None:
        wait_until(lambda: requests.get(self.base + "/readyz", timeout=5).status_code == 200, 120,
                   "web /readyz")

    # --- projects and jobs ----------------------------------------------------------

    def admin(self) -> requests.Session:
        session = requests.Session()
        session.headers.update({"Authorization": f"Bearer {self.token}", "X-Client-Version": VERSION})
        return session

    def call(self, method: str, path: str, **kw) -> dict:
        answer = self.admin().request(method, self.base + path, timeout=300, **kw)
        if answer.status_code >= 300:
            raise SystemExit(f"chaos: {method} {path} answered {answer.status_code}: {answer.text[:500]}")
        return answer.json() if answer.content else {}

    def set_up_work(self) -> None:
        self.flask("fleet", "put-user", "chaos", "--roles", "admin,worker")
        self.token = self.flask("fleet", "rotate-token", "chaos").splitlines()[-1]
        common = {"client_versions": [VERSION, "fleethq-worker/1"], "max_resets": 100,
                  "task_timeout_seconds": 86400}
        self.call("PUT", f"/api/v1/fleethq/projects/{PDF_PROJECT}", json={
            "kind": "pdf", "identity_mode": "unique_value", "recommended_lease_seconds": 20,
            "fallback_after_seconds": 5, **common})
        self.call("PUT", f"/api/v1/admin/projects/{GENERIC_PROJECT}", json={
            "status": "active", "identity_mode": "external_id", "dispatch_qps": None,
            "worker_claim_qps": None, "max_jobs_per_claim": 256, "max_resets": 100,
            "client_versions": [VERSION]})
        self.call("PATCH", f"/api/v1/fleethq/projects/{GENERIC_PROJECT}", json={"task_timeout_seconds": 86400})
        self.flask("fleet", "add-hook", PDF_PROJECT, "--name", "chaos", "--url", self.hooks.url)
        for name, lease in ((SCAN_PROJECT, 20), (OCR_PROJECT, 30)):
            self.call("PUT", f"/api/v1/fleethq/projects/{name}", json={
                "kind": "pdf", "identity_mode": "unique_value", "recommended_lease_seconds": lease,
                "fallback_after_seconds": 10, **common})
        self.call("POST", f"/api/v1/admin/projects/{SCAN_PROJECT}/hooks", json={
            "name": "ocr", "kind": "derive", "target_project": OCR_PROJECT,
            "profile": {"name": "ocr", "languages": "eng"}})

        n_pdf, n_generic = self.args.pdf_jobs, self.args.generic_jobs
        self.expected_failure: dict[str, str] = {}
        pdf = []
        for i in range(1, n_pdf + 1):
            if i % 50 == 0:           # 2 %: papers that must fail, each with its own reason
                route = list(FAILING)[(i // 50) % len(FAILING)]
                self.expected_failure[self.pub.url + route.format(n=i)] = FAILING[route]
                pdf.append(self.pub.url + route.format(n=i))
            else:
                pdf.append(self.pub.url + GOOD[i % len(GOOD)].format(n=i))
        for start in range(0, len(pdf), 5000):
            self.call("POST", f"/api/v1/admin/projects/{PDF_PROJECT}/jobs",
                      json={"jobs": [{"value": v} for v in pdf[start:start + 5000]]})
        self.call("POST", f"/api/v1/admin/projects/{SCAN_PROJECT}/jobs", json={"jobs": [
            {"value": f"{self.pub.url}/scans/{n}.pdf"} for n in range(1, self.args.ocr_jobs + 1)]})
        for start in range(0, n_generic, 5000):
            self.call("POST", f"/api/v1/admin/projects/{GENERIC_PROJECT}/jobs", json={"jobs": [
                {"id": f"page-{i}", "value": f"https://example.test/page/{i}"}
                for i in range(start, min(n_generic, start + 5000))]})
        log(f"enqueued {n_pdf} pdf jobs ({len(self.expected_failure)} must fail), {self.args.ocr_jobs} "
            f"scans to OCR and {n_generic} generic jobs")

    # --- the fleet --------------------------------------------------------------------

    def worker_env(self) -> dict:
        return {k: v for k, v in os.environ.items()
                if not k.startswith(("FLEETHQ_", "S3_")) and k not in ("DATABASE_URL", "REDIS_URL")}

    def worker_args(self) -> list[str]:
        # A 30 s lease (the worker's default is 120): a claim whose answer a
        # killed web process never sent comes back within lease + 5 s, and
        # that bounds how long the run takes to settle.
        return ["--allow-http", "--client-version", VERSION, "--min-free-bytes", "0",
                "--allow-networks", f"{self.pub.host}/32", "--log-level", "INFO",
                "--lease-seconds", "30"]

    def start_fleet(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from datetime import timedelta

        from app import create_app
        from app.fleet import service as fleet_service
        # The enrollment and approval `flask fleet enroll` and `flask fleet
        # worker approve` do, in this process: each CLI start costs seconds.
        admin_app = create_app({"DATABASE_URL": self.db_url, "LOG_JSON": False, "SECRET_KEY": "chaos-secret"},
                               check_schema=False)
        lock = threading.Lock()

        def as_admin(action):
            with lock, admin_app.app_context():
                return action()

        def enrolled_worker(i: int) -> str:
            ocr = i == 3
            name = "ocr-0" if ocr else f"worker-{i}"
            volume = self.volumes[name] = os.path.join(self.tmp, name)
            credential = as_admin(lambda: fleet_service.create_enrollment("chaos", timedelta(minutes=15)))
            env = {**self.worker_env(), "FLEETHQ_ENROLL": credential, **OCR_ENV}
            work = (["--task", "ocr", "--project", OCR_PROJECT, "--concurrency", "2"] if ocr else
                    ["--project", PDF_PROJECT, "--project", SCAN_PROJECT, "--concurrency", "3"])
            self.procs[name] = Proc(name, [
                self.py, "-m", "workers.runner.cli", "run", "--master", self.fleet_url, "--volume", volume,
                *work, "--name", name, *self.worker_args()], env, self.logs).start()
            identity = os.path.join(volume, "identity.json")
            wait_until(lambda: os.path.exists(identity) and json.load(open(identity)).get("registered"),
                       120, f"{name} registering")
            node_id = json.load(open(identity))["worker_id"]
            as_admin(lambda: fleet_service.decide(node_id, "approve", actor="chaos"))
            return name

        with ThreadPoolExecutor(4) as pool:
            self.fleet += list(pool.map(enrolled_worker, range(4)))
        # The local lanes, as the Procfile's fetcher runs them: the fallback
        # here, for downloads and for OCR.
        for name, work in (("fetcher", ["--project", PDF_PROJECT, "--project", SCAN_PROJECT]),
                           ("ocr-local", ["--project", OCR_PROJECT, "--task", "ocr"])):
            volume = self.volumes[name] = os.path.join(self.tmp, f"{name}-volume")
            self.procs[name] = Proc(name, [
                self.py, "-m", "flask", "--app", "wsgi", "fleet", "local-worker", "--tier", "fallback",
                "--volume", volume, "--master-url", self.fleet_url, "--name", name,
                "--concurrency", "2" if name == "fetcher" else "1", "--",
                *work, *[a for a in self.worker_args() if a != "--allow-http"]],
                {**self.master_env(name), **OCR_ENV}, self.logs).start()
            self.fleet.append(name)
        for i in range(self.args.generic_workers):
            for role in ("sdk", "raw"):
                name = f"{role}-{i}"
                self.procs[name] = Proc(name, [
                    self.py, os.path.abspath(__file__), "--role", role, "--master", self.fleet_url,
                    "--token", self.token, "--worker-id", f"{role[0]}{i}chaos"[:7],
                    *(["--complete-each"] if getattr(self.args, "complete_each", False) else [])],
                    self.worker_env(), self.logs).start()
                self.fleet.append(name)
        log(f"fleet: {', '.join(self.fleet)}")

    # --- faults -------------------------------------------------------------------------

    def inject(self, kind: str) -> str:
        short = self.args.quick
        if kind == "kill_worker":
            name = self.rng.choice(self.fleet)
            self.procs[name].kill9()
            time.sleep(self.rng.uniform(0.5, 3))
            self.procs[name].start()
            return f"kill -9 {name}, restarted"
        if kind in ("kill_web", "kill_tasks", "kill_clock"):
            role = kind[len("kill_"):]
            self.procs[role].kill9()
            time.sleep(self.rng.uniform(0.2, 2))
            self.master_proc(role).start()
            if role == "web":
                self.wait_web()
            return f"kill -9 {role}, restarted"
        if kind == "restart_redis":
            self.procs["redis"].kill9()
            self.procs["redis"].start()
            self.wait_redis()
            return "Redis killed and restarted empty"
        if kind == "restart_postgres":
            from app.dev import embedded
            embedded.stop_postgres(self.pg_dir)
            time.sleep(self.rng.uniform(0.5, 3))
            embedded.start_postgres(self.pg_dir, database="fleethq")
            return "PostgreSQL restarted"
        if kind == "store_down":
            seconds = 8 if short else 60
            self.store.stop()
            time.sleep(seconds)
            self.store.start()
            return f"object store unreachable for {seconds} s"
        if kind == "spool_full":
            # The archive stops (tasks frozen) while workers keep uploading:
            # staged uploads pile up to the quota, further ones are refused.
            self.spool_peak = 0
            self.procs["tasks"].signal(signal.SIGSTOP)
            try:
                deadline = time.monotonic() + (15 if short else 45)
                while time.monotonic() < deadline and self.spool_peak < self.spool_quota - PAPER_KIB * 1024:
                    time.sleep(0.5)
                    self.sample_spool()
            finally:
                self.procs["tasks"].signal(signal.SIGCONT)
            return f"spool filled: peak {self.spool_peak} of {self.spool_quota} bytes"
        if kind == "hook_500":
            seconds = 10 if short else 60
            self.hooks.failing = True
            time.sleep(seconds)
            self.hooks.failing = False
            return f"hook consumer answered 500 for {seconds} s ({self.hooks.refused} refused so far)"
        raise ValueError(kind)

    def sample_spool(self) -> None:
        try:
            with psycopg.connect(self.db_url, connect_timeout=3) as conn:
                used = conn.execute("SELECT reserved_bytes FROM spool_usage WHERE id = 1").fetchone()
            self.spool_peak = max(self.spool_peak, used[0] if used else 0)
        except psycopg.Error:
            pass

    def run_faults(self, stop: threading.Event) -> None:
        kinds = list(FAULTS)
        self.rng.shuffle(kinds)
        low, high = (1.5, 3) if self.args.quick else (8, 20)
        while not stop.is_set():
            if stop.wait(self.rng.uniform(low, high)):
                return
            kind = kinds.pop() if kinds else self.rng.choice(
                ("kill_worker", "kill_worker", "kill_web", "kill_tasks", "kill_clock",
                 "restart_redis", "restart_postgres"))
            began = time.monotonic()
            what = self.inject(kind)
            self.faults.append(kind)
            log(f"fault {len(self.faults)}: {what} ({time.monotonic() - began:.1f} s)")
            if not kinds and len(self.faults) >= self.args.faults:
                return
            if self.args.quick and not kinds:
                return

    # --- settling and the invariants ------------------------------------------------------

    def query(self, sql: str, *params):
        with psycopg.connect(self.db_url, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    def progress(self) -> dict:
        try:
            rows = self.query("SELECT project_id, state, count(*) FROM jobs GROUP BY 1, 2")
        except psycopg.Error:            # PostgreSQL is being restarted
            return {}
        return {f"{p}:{s}": n for p, s, n in rows}

    def work_done(self) -> bool:
        try:
            return self.query("SELECT count(*) FROM jobs WHERE state NOT IN "
                              "('done', 'failed', 'reset_exhausted')")[0][0] == 0
        except psycopg.Error:
            return False

    def settled(self) -> bool:
        open_jobs = self.query(
            "SELECT count(*) FROM jobs WHERE state NOT IN ('done', 'failed', 'reset_exhausted')")[0][0]
        uploads = self.query("SELECT count(*) FROM uploads WHERE state IN ('uploading', 'staged')")[0][0]
        hooks = self.query("SELECT count(*) FROM hook_deliveries WHERE state <> 'delivered'")[0][0]
        outbox = self.query("SELECT count(*) FROM outbox WHERE done_at IS NULL")[0][0]
        missing_hooks = self.query(
            "SELECT count(*) FROM assets a WHERE a.project_id IN (%s, %s) AND NOT EXISTS "
            "(SELECT 1 FROM hook_deliveries d WHERE d.attempt_id = a.attempt_id)",
            PDF_PROJECT, SCAN_PROJECT)[0][0]
        # What a process killed mid-way left in the spool goes with the
        # sweeper's next round (every 20 s here): part of settling.
        return (open_jobs == 0 and uploads == 0 and hooks == 0 and outbox == 0 and missing_hooks == 0
                and not self.master_files_left())

    def check(self) -> dict:
        q = self.query
        jobs = q("SELECT count(*) FROM jobs")[0][0]
        done = q("SELECT count(*) FROM jobs WHERE state = 'done'")[0][0]
        failed_rows = q("SELECT value, state, last_error->>'code' FROM jobs "
                        "WHERE state IN ('failed', 'reset_exhausted')")
        not_finished = q("SELECT count(*) FROM jobs WHERE state NOT IN ('done', 'failed', 'reset_exhausted')")[0][0]
        unexplained = [r for r in failed_rows if self.expected_failure.get(r[0]) != r[2]]
        never_failed = set(self.expected_failure) - {r[0] for r in failed_rows}
        twice = q("SELECT count(*) FROM (SELECT job_id FROM attempts WHERE state = 'done' "
                  "GROUP BY job_id HAVING count(*) > 1) t")[0][0]
        receipts_twice = q("SELECT count(*) FROM (SELECT job_id FROM uploads WHERE state = 'done' "
                           "GROUP BY job_id HAVING count(*) > 1) t")[0][0]
        assets_twice = q("SELECT count(*) FROM (SELECT job_id FROM assets GROUP BY job_id "
                         "HAVING count(*) > 1) t")[0][0]
        pdf = list(PDF_PROJECTS)
        no_asset = q("SELECT count(*) FROM jobs j WHERE j.project_id = ANY(%s) AND j.state = 'done' "
                     "AND NOT EXISTS (SELECT 1 FROM assets a WHERE a.job_id = j.id)", pdf)[0][0]
        no_receipt = q("SELECT count(*) FROM jobs j WHERE j.project_id = ANY(%s) AND j.state = 'done' AND NOT "
                       "EXISTS (SELECT 1 FROM uploads u WHERE u.job_id = j.id AND u.state = 'done')", pdf)[0][0]
        # Every archived scan became one OCR job, and every OCR job one derived asset.
        not_derived = q("SELECT count(*) FROM assets a WHERE a.project_id = %s AND NOT EXISTS "
                        "(SELECT 1 FROM assets d WHERE d.derived_from = a.canonical_key)", SCAN_PROJECT)[0][0]
        ocr_jobs = q("SELECT count(*) FROM jobs WHERE project_id = %s", OCR_PROJECT)[0][0]
        scans_done = q("SELECT count(*) FROM jobs WHERE project_id = %s AND state = 'done'", SCAN_PROJECT)[0][0]
        keys = {k for k, _ in self.store_keys("")}
        object_missing = sum(1 for (key,) in q("SELECT object_key FROM assets") if key not in keys)
        undelivered = q("SELECT count(*) FROM assets a WHERE a.project_id IN (%s, %s) AND NOT EXISTS "
                        "(SELECT 1 FROM hook_deliveries d WHERE d.attempt_id = a.attempt_id "
                        "AND d.state = 'delivered')", PDF_PROJECT, SCAN_PROJECT)[0][0]
        unseen = sum(1 for (key,) in q("SELECT canonical_key FROM assets WHERE project_id = %s", PDF_PROJECT)
                     if key not in self.hooks.seen)
        kept = {(p, s): int(n) for p, s, n in q(
            "SELECT project_id, state, sum(delta) FROM job_counts GROUP BY 1, 2 HAVING sum(delta) <> 0")}
        full = {(p, s): n for p, s, n in q("SELECT project_id, state, count(*) FROM jobs GROUP BY 1, 2")}
        drift = sum(abs(kept.get(k, 0) - full.get(k, 0)) for k in set(kept) | set(full))
        reserved = q("SELECT reserved_bytes FROM spool_usage WHERE id = 1")
        owed = q("SELECT coalesce(sum(reserved_bytes), 0) FROM uploads WHERE state IN ('uploading', 'staged', 'held')")
        drift += abs((reserved[0][0] if reserved else 0) - int(owed[0][0]))
        left = self.files_left()
        return {
            "jobs": jobs, "done": done, "failed": len(failed_rows),
            "duplicates": twice + receipts_twice + assets_twice,
            "lost": (not_finished + no_asset + no_receipt + object_missing + len(never_failed)
                     + not_derived + abs(ocr_jobs - scans_done)),
            "ocr_done": q("SELECT count(*) FROM jobs WHERE project_id = %s AND state = 'done'", OCR_PROJECT)[0][0],
            "spool_left": len(left), "counter_drift": drift, "unexplained": len(unexplained),
            "undelivered": undelivered + unseen, "faults": len(self.faults),
            "_detail": {"unexplained": unexplained[:10], "never_failed": sorted(never_failed)[:10],
                        "left": left[:20], "no_asset": no_asset, "no_receipt": no_receipt,
                        "object_missing": object_missing, "unseen": unseen, "not_derived": not_derived,
                        "ocr_jobs": ocr_jobs, "scans_done": scans_done,
                        "kept": {f"{p}:{st}": n for (p, st), n in kept.items()},
                        "full": {f"{p}:{st}": n for (p, st), n in full.items()}}}

    def store_keys(self, prefix: str) -> list:
        out = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket="fleethq", Prefix=prefix):
            out += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
        return out

    def master_files_left(self) -> list[str]:
        """Staged objects and files in the master processes' spool directories."""
        left = [f"s3:{k}" for k, _ in self.store_keys("staging/")]
        for role in ("web", "tasks", "clock", "cli", "fetcher", "ocr-local"):
            spool = os.path.join(self.tmp, role, "spool")
            if os.path.isdir(spool):
                left += [os.path.join(role, "spool", n) for n in os.listdir(spool)]
        return left

    def files_left(self) -> list[str]:
        left = self.master_files_left()
        for name, volume in self.volumes.items():
            for sub in ("tmp", "ready"):
                path = os.path.join(volume, sub)
                if os.path.isdir(path):
                    left += [os.path.join(name, sub, n) for n in os.listdir(path)]
        return left

    def run(self) -> dict:
        self.start_services()
        self.start_master()
        self.set_up_work()
        began = time.monotonic()
        self.start_fleet()
        stop = self.stop_faults
        faults = self.fault_thread = threading.Thread(target=self.run_faults, args=(stop,), daemon=True)
        faults.start()
        # Faults for at most --minutes, then the queues settle within --settle.
        budget = self.args.minutes * 60
        last = 0.0
        while faults.is_alive() and time.monotonic() - began < budget:
            time.sleep(1)
            self.sample_spool()
            if time.monotonic() - last > (10 if self.args.quick else 30):
                last = time.monotonic()
                log("progress: " + ", ".join(f"{k} {v}" for k, v in sorted(self.progress().items())))
                # The work is done and every kind of fault has happened:
                # further faults would hit an idle system.
                if set(self.faults) >= set(FAULTS) and self.work_done():
                    break
        stop.set()
        faults.join()
        log(f"faults done ({len(self.faults)}); settling")
        settle_by = time.monotonic() + self.args.settle * 60
        while not wait_until(self.settled, 10, "", interval=1, quiet=True):
            if time.monotonic() > settle_by:     # the check below says what is wrong
                log(f"not settled within {self.args.settle} min")
                break
            log("progress: " + ", ".join(f"{k} {v}" for k, v in sorted(self.progress().items())))
        # A clean stop, all at once: what they hold is uploaded or given back.
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(len(self.fleet)) as pool:
            codes = dict(zip(self.fleet, pool.map(lambda n: self.procs[n].stop(60), self.fleet)))
        for name, code in codes.items():
            if code not in (0, -signal.SIGTERM):
                log(f"{name} exited {code} at the stop (see {self.procs[name].log_path})")
        self.workers_s = time.monotonic() - began
        return self.check()

    def close(self, keep: bool) -> None:
        # First the faults (after an error they may still be restarting things).
        self.stop_faults.set()
        if self.fault_thread is not None:
            self.fault_thread.join()
        for proc in reversed(list(self.procs.values())):
            if proc.alive():
                proc.stop(30)
        for stopper in ("pub", "hooks", "store"):
            if hasattr(self, stopper):
                getattr(self, stopper).stop()
        if hasattr(self, "pg_dir"):
            from app.dev import embedded
            embedded.stop_postgres(self.pg_dir)
        if keep:
            log(f"logs kept in {self.logs}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


# --- the generic-project workers (run as child processes) ---------------------------

def sdk_worker(args) -> int:
    """A worker written with the Python SDK: claim, complete, again."""
    from workers.sdk import FleetHQError, LeaseLost, open_project_queue
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    while not stop.is_set():
        try:
            with open_project_queue(args.master, args.token, GENERIC_PROJECT, client_version=VERSION,
                                    worker_id=args.worker_id, allow_http=True, lease_seconds=15,
                                    long_poll_ms=2000) as queue:
                while not stop.is_set():
                    for job in queue.claim(max_jobs=64):
                        try:
                            job.complete("success", code=200)
                        except LeaseLost:
                            pass
        except FleetHQError as exc:
            print(f"sdk worker: {type(exc).__name__}: {exc}", flush=True)
            stop.wait(1)
    return 0


def raw_worker(args) -> int:
    """A worker that speaks SavewebHQ's wire itself, as its own clients do."""
    session = requests.Session()
    session.headers.update({"Authorization": f"Bearer {args.token}",
                            "X-SavewebHQ-Client-Version": VERSION})
    base = f"{args.master}/api/v1/projects/{GENERIC_PROJECT}/jobs"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    held: list[dict] = []
    while not stop.is_set():
        try:
            if not held:
                answer = session.post(f"{base}/claim", timeout=30, json={
                    "worker_id": args.worker_id, "max_jobs": 100, "lease_seconds": 15,
                    "accept_types": [], "wait_ms": 2000})
                if answer.status_code != 200:
                    print(f"raw worker: claim {answer.status_code} {answer.text[:200]}", flush=True)
                    stop.wait(1)
                    continue
                held = answer.json()["jobs"]
                continue
            # The same report again after any failure: replays are idempotent.
            # --complete-each: one request per job, as SavewebHQ's Go SDK does.
            batch = held[:1] if args.complete_each else held
            answer = session.post(f"{base}/complete", timeout=30, json={
                "worker_id": args.worker_id, "items": [
                    {"job_id": j["job_id"], "attempt_id": j["attempt_id"],
                     "outcome": {"kind": "success", "code": 200, "uri": None, "meta": {}},
                     "artifact_receipts": []} for j in batch]})
            if answer.status_code == 200:
                held = held[len(batch):]
            else:
                print(f"raw worker: complete {answer.status_code} {answer.text[:200]}", flush=True)
                stop.wait(1)
        except requests.RequestException as exc:
            print(f"raw worker: {type(exc).__name__}", flush=True)
            stop.wait(1)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the short run make test does")
    parser.add_argument("--pdf-jobs", type=int, default=None)
    parser.add_argument("--generic-jobs", type=int, default=None)
    # 60 by default: on two shared cores a scan's OCR takes 7-11 s beside
    # the rest of the run, so 200 need about 25 minutes (--ocr-jobs 200
    # --minutes 25 --settle 8).
    parser.add_argument("--ocr-jobs", type=int, default=None, help="scans that go through OCR")
    parser.add_argument("--generic-workers", type=int, default=None, help="SDK and raw workers, each")
    parser.add_argument("--faults", type=int, default=None, help="at least this many faults")
    parser.add_argument("--minutes", type=float, default=None, help="at most this long with faults")
    parser.add_argument("--settle", type=float, default=None, help="then at most this long to settle")
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--keep", action="store_true", help="keep the logs even when all is well")
    parser.add_argument("--role", choices=("sdk", "raw"), help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--worker-id", help=argparse.SUPPRESS)
    parser.add_argument("--complete-each", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        return (sdk_worker if args.role == "sdk" else raw_worker)(args)
    defaults = ({"pdf_jobs": 150, "generic_jobs": 2000, "ocr_jobs": 6, "generic_workers": 1, "faults": 10,
                 "minutes": 1.6,
                 # An archive commit cut by the PostgreSQL restart is sent
                 # again by the reconciler once its outbox lease
                 # (RESEND_LEASE_S, 120 s) runs out: settling may take that long.
                 "settle": 2.5}
                if args.quick else
                {"pdf_jobs": 2000, "generic_jobs": 20000, "ocr_jobs": 60, "generic_workers": 2, "faults": 30,
                 "minutes": 9, "settle": 4})
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    chaos = Chaos(args)
    result, ok = None, False
    try:
        result = chaos.run()
        ok = all(result[k] == 0 for k in ("duplicates", "lost", "spool_left", "counter_drift",
                                           "unexplained", "undelivered"))
    finally:
        chaos.close(keep=args.keep or not ok)
    detail = result.pop("_detail")
    if not ok:
        print(json.dumps(detail, default=str, indent=1)[:4000], flush=True)
    log(f"faults: {', '.join(chaos.faults)}; fleet work took {chaos.workers_s:.0f} s")
    print("chaos " + " ".join(f"{k}={v}" for k, v in result.items()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
