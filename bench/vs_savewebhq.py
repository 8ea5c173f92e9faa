"""FleetHQ beside SavewebHQ's own tracker, each as it is deployed, on fresh
databases of the same PostgreSQL, taking turns.

SavewebHQ's programs come from the shared folder beside the checkout
(``savewebhq/bin``, ``savewebhq/python``; ``FLEETHQ_SAVEWEBHQ_DIR`` names
another). FleetHQ is its ``web`` process (``gunicorn -c
python:app.gunicorn_conf``, the default shape); SavewebHQ is ``tracker
serve``. Each round runs, on each server in turn:

- ``sdk``: SavewebHQ's Go SDK worker (``swpworker``) over N jobs: one claim
  per 64 jobs and one ``complete`` (or ``fail``) request per job, as its real
  workers run;
- ``batch``: its Python SDK, claim 64 and complete the 64 in one request;
- ``enqueue``: its ``hqctl enqueue``, plain jobs in 1,000-job requests.

Measured per server: throughput, the server's CPU (its process tree, from
/proc) per request of the sdk run, and PostgreSQL's CPU (the postmaster's
tree, exited backends included) per job; for the enqueue, both per 1,000
jobs (on standard error: they say which side an enqueue gap is on). The floor: the same Go worker
against ``bench/floor_app.py`` (Flask on the same gunicorn settings, answers
from memory), its CPU per request; and the round-trip floor: the same app
plus one ``SELECT 1`` round trip per POST (what any server whose writes
reach the database pays at least). Idle memory: the PSS of FleetHQ's web
process tree at rest after the runs, and the tracker's RSS.

Last line: ``vs_savewebhq sdk_ratio=… batch_ratio=… enqueue_ratio=…
server_cpu_per_req_ratio=… floor_ratio=… pg_cpu_per_job_ratio=…
idle_pss_mb=… savewebhq_idle_rss_mb=… round_trip_floor_ratio=…`` — ratios are FleetHQ over
SavewebHQ (throughput: higher is better; CPU: lower is better), the best of
the rounds for each; ``floor_ratio`` is FleetHQ's server CPU per request over
the floor's, ``round_trip_floor_ratio`` over the round-trip floor's.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import requests

from _common import BENCH_PG, ROOT, cpu_seconds, fresh_database, free_port, pss_mb, stop, wait_ready

HOME = Path(os.environ.get("FLEETHQ_SAVEWEBHQ_DIR") or Path(ROOT).parent / "shared" / "savewebhq")
CLIENT_VERSION = "bench-1"
PROJECT = "bench"
BIN = os.path.dirname(sys.executable)


def program(name: str) -> str:
    path = HOME / "bin" / name
    if not os.access(path, os.X_OK):
        sys.exit(f"SavewebHQ's {name} is not at {path} (set FLEETHQ_SAVEWEBHQ_DIR)")
    return str(path)


# ------------------------------------------------------------ /proc readings

def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def postmaster_pid() -> int:
    with psycopg.connect(f"{BENCH_PG}/postgres") as conn:
        data = conn.execute("SHOW data_directory").fetchone()[0]
    return int(Path(data, "postmaster.pid").read_text().split()[0])


# ----------------------------------------------------------------- servers

def token_file(directory: Path, name: str) -> Path:
    path = directory / f"{name}.token"
    path.write_text("hq_" + secrets.token_urlsafe(32) + "\n")
    path.chmod(0o600)
    return path


class Server:
    name: str
    url: str
    proc: subprocess.Popen

    def stop(self) -> None:
        stop(self.proc)


class SavewebHQ(Server):
    name = "savewebhq"

    def __init__(self, directory: Path, admin: Path, worker: Path):
        db = "bench_vs_savewebhq_ref"
        with psycopg.connect(f"{BENCH_PG}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{db}"')
        url = f"{BENCH_PG}/{db}?sslmode=disable".replace("postgresql://", "postgres://")
        tracker = program("tracker")
        subprocess.run([tracker, "migrate", "--database-url", url], check=True, capture_output=True)
        for user, roles, path in (("admin", "admin", admin), ("worker", "worker", worker)):
            subprocess.run([tracker, "bootstrap-user", "--database-url", url, "--user-id", user,
                            "--roles", roles, "--machine-token-file", str(path)], check=True, capture_output=True)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([tracker, "serve", "--listen", f"127.0.0.1:{port}", "--database-url", url],
                                     stdout=subprocess.DEVNULL, stderr=open(directory / "tracker.log", "wb"))
        wait_ready(self.url + "/healthz", self.proc)


class FleetHQ(Server):
    name = "fleethq"

    def __init__(self, directory: Path, admin: Path, worker: Path):
        url = fresh_database("bench_vs_savewebhq_fleethq")
        env = {**os.environ, "DATABASE_URL": url, "FLEETHQ_DATA_DIR": str(directory / "fleethq"),
               "FLEETHQ_SECRET_KEY": "bench", "FLEETHQ_LOG_LEVEL": "warning"}
        for user, roles, path in (("admin", "admin", admin), ("worker", "worker", worker)):
            subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "fleet", "bootstrap-user",
                            "--user-id", user, "--roles", roles, "--machine-token-file", str(path)],
                           cwd=ROOT, env=env, check=True, capture_output=True)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([os.path.join(BIN, "gunicorn"), "-c", "python:app.gunicorn_conf",
                                      "wsgi:app"], cwd=ROOT, env={**env, "FLEETHQ_BIND": f"127.0.0.1:{port}"},
                                     stdout=subprocess.DEVNULL, stderr=open(directory / "fleethq.log", "wb"))
        wait_ready(self.url + "/readyz", self.proc)


class Floor(Server):
    name = "floor"

    def __init__(self, directory: Path, round_trip_dsn: str | None = None):
        if round_trip_dsn is not None:
            self.name = "round_trip_floor"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "FLEETHQ_BIND": f"127.0.0.1:{port}", "FLEETHQ_DATA_DIR": str(directory / self.name)}
        if round_trip_dsn is not None:
            env["FLOOR_ROUND_TRIP_DSN"] = round_trip_dsn
        self.proc = subprocess.Popen([os.path.join(BIN, "gunicorn"), "-c", "python:app.gunicorn_conf",
                                      "--chdir", os.path.join(ROOT, "bench"), "floor_app:app"], cwd=ROOT,
                                     env=env, stdout=subprocess.DEVNULL,
                                     stderr=open(directory / f"{self.name}.log", "wb"))
        wait_ready(self.url + "/healthz", self.proc)


# --------------------------------------------------------------- workloads

def put_project(server: Server, admin: Path) -> None:
    token = admin.read_text().strip()
    body = {"status": "active", "identity_mode": "none", "dispatch_qps": None, "worker_claim_qps": None,
            "max_jobs_per_claim": 256, "max_resets": 3, "client_versions": [CLIENT_VERSION]}
    answer = requests.put(f"{server.url}/api/v1/admin/projects/{PROJECT}", json=body,
                          headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert answer.status_code in (200, 201), answer.text


def enqueue(server: Server, admin: Path, jobs: int, directory: Path, tag: str) -> float:
    values = directory / f"values-{tag}.txt"
    values.write_text("".join(f"https://example.test/{tag}/{i}\n" for i in range(jobs)))
    started = time.monotonic()
    subprocess.run([program("hqctl"), "enqueue", "-url", server.url, "-allow-http", "-machine-token-file",
                    str(admin), "-project-id", PROJECT, "-type", "seed", "-input", str(values),
                    "-batch-size", "1000", "-progress-every", "0"], check=True, capture_output=True)
    return jobs / (time.monotonic() - started)


def go_worker(server: Server, worker: Path, jobs: int) -> dict:
    done = subprocess.run([program("swpworker"), "-url", server.url, "-token-file", str(worker),
                           "-project", PROJECT, "-client-version", CLIENT_VERSION, "-n", str(jobs),
                           "-concurrency", "16"], check=True, capture_output=True, text=True, timeout=900)
    report = json.loads(done.stdout[done.stdout.index("{"):])
    assert report["other_errors"] == 0, report
    report["requests"] = (report["claims"] + report["completed"] + report["failed_retryable"]
                          + report["failed_permanent"])
    report["finished"] = report["completed"] + report["failed_permanent"] + report["failed_retryable"]
    return report


def measured(server: Server, pg: int, work):
    cpu0, pg0, t0 = cpu_seconds(server.proc.pid), cpu_seconds(pg), time.monotonic()
    result = work()
    return result, cpu_seconds(server.proc.pid) - cpu0, cpu_seconds(pg) - pg0, time.monotonic() - t0


def python_batches(server: Server, worker: Path, jobs: int) -> float:
    """SavewebHQ's Python SDK, four queues: claim 64, complete the 64 in one request."""
    sys.path.insert(0, str(HOME / "python"))
    import saveweb_hq
    config = saveweb_hq.Config(server.url, worker.read_text().strip(), CLIENT_VERSION, allow_http_tracker=True)
    finished = [0]
    lock = threading.Lock()

    def run():
        with saveweb_hq.open_project_queue(config, PROJECT) as queue:
            while True:
                with lock:
                    if finished[0] >= jobs:
                        return
                claimed = queue.claim(max_jobs=64)["jobs"]
                if not claimed:
                    return
                queue.complete([{"job_id": j["job_id"], "attempt_id": j["attempt_id"],
                                 "outcome": {"kind": "success", "code": 200, "uri": None, "meta": {}},
                                 "artifact_receipts": []} for j in claimed])
                with lock:
                    finished[0] += len(claimed)

    started = time.monotonic()
    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return finished[0] / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4000, help="jobs per sdk and batch run")
    parser.add_argument("--enqueue-jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default=os.path.join(ROOT, "var", "bench-vs-savewebhq"))
    args = parser.parse_args()
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    admin, worker = token_file(directory, "admin"), token_file(directory, "worker")
    pg = postmaster_pid()
    servers: list[Server] = []
    try:
        servers = [FleetHQ(directory, admin, worker), SavewebHQ(directory, admin, worker)]
        floor = Floor(directory)
        round_trip_floor = Floor(directory, f"{BENCH_PG}/postgres")
        servers += [floor, round_trip_floor]
        for server in servers[:2]:
            put_project(server, admin)
        figures: dict[str, dict[str, list[float]]] = {s.name: {} for s in servers}

        def note(name: str, key: str, value: float) -> None:
            figures[name].setdefault(key, []).append(value)
            print(f"{name:9} {key:18} {value:10.4f}", file=sys.stderr, flush=True)

        for round_ in range(args.rounds):
            for server in servers[:2]:
                tag = f"{server.name}-{round_}"
                rate, cpu, pg_cpu, _ = measured(server, pg, lambda s=server, t=tag: enqueue(
                    s, admin, args.enqueue_jobs, directory, t))
                note(server.name, "enqueue_jobs_s", rate)
                thousands = args.enqueue_jobs / 1000
                note(server.name, "enqueue_cpu_ms_per_1k", 1000 * cpu / thousands)
                note(server.name, "enqueue_pg_ms_per_1k", 1000 * pg_cpu / thousands)
                enqueue(server, admin, args.jobs * 2, directory, tag + "-work")
                report, cpu, pg_cpu, seconds = measured(server, pg, lambda s=server: go_worker(s, worker, args.jobs))
                note(server.name, "sdk_jobs_s", report["finished"] / seconds)
                note(server.name, "cpu_ms_per_req", 1000 * cpu / report["requests"])
                note(server.name, "pg_cpu_ms_per_job", 1000 * pg_cpu / report["finished"])
                note(server.name, "batch_jobs_s", python_batches(server, worker, args.jobs))
            for bare in (floor, round_trip_floor):
                report, cpu, _, _ = measured(bare, pg, lambda b=bare: go_worker(b, worker, args.jobs))
                note(bare.name, "cpu_ms_per_req", 1000 * cpu / report["requests"])
        time.sleep(10)  # at rest
        idle_pss = pss_mb(servers[0].proc.pid)
        tracker_rss = rss_mb(servers[1].proc.pid)
    finally:
        for server in servers:
            server.stop()
    best_high = {name: {k: max(v) for k, v in f.items()} for name, f in figures.items()}
    best_low = {name: {k: min(v) for k, v in f.items()} for name, f in figures.items()}
    ours, theirs = best_high["fleethq"], best_high["savewebhq"]
    cpu_ours = best_low["fleethq"]["cpu_ms_per_req"]
    pg_ratio = best_low["fleethq"]["pg_cpu_ms_per_job"] / best_low["savewebhq"]["pg_cpu_ms_per_job"]
    print(json.dumps({n: {k: [round(x, 4) for x in v] for k, v in f.items()} for n, f in figures.items()}),
          file=sys.stderr)
    print(f"median cpu_ms_per_req: fleethq={statistics.median(figures['fleethq']['cpu_ms_per_req']):.3f} "
          f"savewebhq={statistics.median(figures['savewebhq']['cpu_ms_per_req']):.3f} "
          f"floor={statistics.median(figures['floor']['cpu_ms_per_req']):.3f} "
          f"round_trip_floor={statistics.median(figures['round_trip_floor']['cpu_ms_per_req']):.3f}",
          file=sys.stderr)
    print(f"vs_savewebhq sdk_ratio={ours['sdk_jobs_s'] / theirs['sdk_jobs_s']:.2f} "
          f"batch_ratio={ours['batch_jobs_s'] / theirs['batch_jobs_s']:.2f} "
          f"enqueue_ratio={ours['enqueue_jobs_s'] / theirs['enqueue_jobs_s']:.2f} "
          f"server_cpu_per_req_ratio={cpu_ours / best_low['savewebhq']['cpu_ms_per_req']:.2f} "
          f"floor_ratio={cpu_ours / best_low['floor']['cpu_ms_per_req']:.2f} "
          f"pg_cpu_per_job_ratio={pg_ratio:.2f} "
          f"idle_pss_mb={idle_pss:.0f} savewebhq_idle_rss_mb={tracker_rss:.0f} "
          f"round_trip_floor_ratio={cpu_ours / best_low['round_trip_floor']['cpu_ms_per_req']:.2f}")


if __name__ == "__main__":
    main()
