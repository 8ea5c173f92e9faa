"""Shared set-up for the benchmarks: a scratch database, a migrated schema,
an admin token, and a gunicorn master on a free port."""
from __future__ import annotations

import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import psycopg
import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BENCH_PG = os.environ.get("FLEETHQ_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
VERSION = "bench-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fresh_database(name: str) -> str:
    """Drop and create ``name`` on the benchmark server, migrate it, return its URL."""
    with psycopg.connect(f"{BENCH_PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{BENCH_PG}/{name}"
    env = {**os.environ, "DATABASE_URL": url}
    subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "db", "upgrade"], cwd=ROOT,
                   env=env, check=True, capture_output=True)
    return url


def admin_token(url: str) -> str:
    env = {**os.environ, "DATABASE_URL": url}
    out = subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "fleet", "put-user", "bench",
                          "--roles", "admin,worker"], cwd=ROOT, env=env, check=True,
                         capture_output=True)
    out = subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "fleet", "rotate-token",
                          "bench"], cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def wait_ready(url: str, proc: subprocess.Popen, within_s: float = 120) -> None:
    """Poll ``url`` until it answers 200. Generous on a loaded machine: a slow
    answer is not a failure, only a dead process or the deadline is."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if requests.get(url, timeout=10).status_code == 200:
                return
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up")
        time.sleep(0.05)


@contextmanager
def gunicorn(url: str, *, workers: int = 2, threads: int = 4):
    port = free_port()
    env = {**os.environ, "DATABASE_URL": url, "FLEETHQ_LOG_JSON": "false"}
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "gunicorn"), "-w", str(workers),
         "-k", "gthread", "--threads", str(threads), "-b", f"127.0.0.1:{port}",
         "--log-level", "warning", "--graceful-timeout", "3", "wsgi:app"],
        cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base + "/healthz", proc)
        yield base, proc
    finally:
        stop(proc)


def stop(*procs: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM every process, then wait for each; kill what outlives ``timeout``."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tree_rss_mb(pid: int) -> float:
    """Current RSS of a process and its children, in MB (from /proc)."""
    total = 0
    pids = [pid]
    try:
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        pids += [int(p) for p in children.split()]
    except FileNotFoundError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total / 1024


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (field 3 on)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out.setdefault(int(proc_stat(int(entry))[1]), []).append(int(entry))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
    return out


def tree(pid: int) -> list[int]:
    """A process and all its descendants."""
    kids, found = _children(), [pid]
    for p in found:
        found.extend(kids.get(p, []))
    return found


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(root: int) -> float:
    """CPU of a process tree so far, children that exited and were waited for included."""
    total = 0.0
    for pid in tree(root):
        try:
            fields = proc_stat(pid)
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])
        if pid == root:
            total += int(fields[13]) + int(fields[14])
    return total / _TICK


def pss_mb(root: int) -> float:
    """The PSS of a process tree in MB: shared pages counted in part by each sharer."""
    total = 0
    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                total += next(int(line.split()[1]) for line in fh if line.startswith("Pss:"))
        except (FileNotFoundError, StopIteration):
            pass
    return total / 1024


def self_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def api(base: str, token: str):
    session = requests.Session()
    session.headers.update({"Authorization": f"Bearer {token}", "X-Client-Version": VERSION})
    return session


def json_poster(base: str, token: str):
    """POST JSON on one kept-alive connection, as a worker does; returns the
    answer's JSON (anything but 200 raises)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {"Authorization": f"Bearer {token}", "X-Client-Version": VERSION,
               "Content-Type": "application/json"}

    def post(path: str, body: dict) -> dict:
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{path}: {response.status} {data[:300]!r}")
        return json.loads(data)
    return post


def flask_cli(db_url: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "fleet", *args], cwd=ROOT,
                         env={**os.environ, "DATABASE_URL": db_url}, check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


class Master:
    """gunicorn (2 workers × 8 threads), one Dramatiq task process and, when
    asked, the clock: the production shape on this machine."""

    def __init__(self, db_url: str, data_dir: str, redis_url: str, env: dict | None = None,
                 clock: bool = False):
        self.base = f"http://127.0.0.1:{free_port()}"
        env = {**os.environ, "DATABASE_URL": db_url, "REDIS_URL": redis_url, "FLEETHQ_DATA_DIR": data_dir,
               "FLEETHQ_LOG_JSON": "false", "FLEETHQ_SECRET_KEY": "bench",
               "FLEETHQ_BIND": self.base[len("http://"):], "FLEETHQ_WEB_WORKERS": "2",
               "FLEETHQ_WEB_THREADS": "8", **(env or {})}
        bin_dir = os.path.dirname(sys.executable)
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.procs = [
            subprocess.Popen([os.path.join(bin_dir, "gunicorn"), "-c", "python:app.gunicorn_conf",
                              "--log-level", "warning", "wsgi:app"], cwd=ROOT, env=env, **quiet),
            subprocess.Popen([os.path.join(bin_dir, "dramatiq"), "tasks:setup_broker", "--processes", "1",
                              "--threads", "4"], cwd=ROOT, env=env, **quiet)]
        if clock:
            self.procs.append(subprocess.Popen([sys.executable, "-m", "tasks.clock"], cwd=ROOT, env=env,
                                               **quiet))
        for _ in range(300):
            try:
                if requests.get(self.base + "/readyz", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("master did not start")

    def stop(self) -> None:
        stop(*self.procs)
