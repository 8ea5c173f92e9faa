"""``make dev``: the whole master on one machine, with no configuration (DESIGN §2).

Starts embedded PostgreSQL (``./var/pg``) and Redis (``./var/redis.sock``)
unless ``DATABASE_URL`` / ``REDIS_URL`` are set, migrates, creates the
development admin, runs web + tasks + clock as children with prefixed output,
waits for ``/readyz``, and fills a demo project. Then the pdf demo: the local
test publisher, a ``demo-papers`` project of 50 papers, and a local
``fleethq-worker`` (volume ``./var/worker``) that fetches and archives them
while a progress bar runs. Ctrl-C or SIGTERM stops the children, then the
publisher, Redis and PostgreSQL.

    python -m app.devstack [--no-demo] [--stop]
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from app import embedded

DEMO_PROJECT = "demo"
DEMO_JOBS = 300
PDF_PROJECT = "demo-papers"
WORKER_VERSION = "fleethq-worker/dev"


class StepFailed(Exception):
    """A start-up step failed; the message is shown to the user."""


class Stop(BaseException):
    """SIGTERM, handled like Ctrl-C."""


_print_lock = threading.Lock()


def say(name: str, text: str) -> None:
    with _print_lock:
        sys.stdout.write(f"{name:>8} | {text}\n")
        sys.stdout.flush()


class Stack:
    def __init__(self, var: Path):
        self.var = var
        self.children: dict[str, subprocess.Popen] = {}
        self.stoppers: list[tuple[str, Callable[[], None]]] = []  # stopped in reverse order

    # --- steps -------------------------------------------------------------------

    def services(self) -> dict[str, str]:
        env = {}
        if os.environ.get("DATABASE_URL"):
            say("devstack", "DATABASE_URL is set: using that PostgreSQL")
            env["DATABASE_URL"] = os.environ["DATABASE_URL"]
        else:
            url, stop = embedded.start_postgres(self.var / "pg")
            self.stoppers.append(("postgres", stop))
            say("postgres", f"embedded PostgreSQL at {url} (data in {self.var / 'pg'})")
            env["DATABASE_URL"] = url
        if os.environ.get("REDIS_URL"):
            say("devstack", "REDIS_URL is set: using that Redis")
            env["REDIS_URL"] = os.environ["REDIS_URL"]
        else:
            url, stop = embedded.start_redis(self.var)
            self.stoppers.append(("redis", stop))
            say("redis", f"embedded Redis at {url}")
            env["REDIS_URL"] = url
        return env

    def run_step(self, name: str, args: list[str], env: dict) -> None:
        proc = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
        for line in proc.stdout.decode(errors="replace").splitlines():
            say(name, line)
        if proc.returncode != 0:
            raise StepFailed(f"{name} failed (exit {proc.returncode}): {' '.join(args[1:])}")

    def spawn(self, name: str, args: list[str], env: dict) -> None:
        # Own session: Ctrl-C reaches only devstack, which stops children in order.
        # PDEATHSIG: a killed devstack does not leave children behind.
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=embedded.die_with_parent)
        self.children[name] = proc
        threading.Thread(target=self._pump, args=(name, proc), daemon=True).start()

    @staticmethod
    def _pump(name: str, proc: subprocess.Popen) -> None:
        for raw in proc.stdout:
            say(name, raw.decode(errors="replace").rstrip("\n"))

    def check_children(self) -> None:
        for name, proc in self.children.items():
            if proc.poll() is not None:
                raise StepFailed(f"{name} exited unexpectedly (exit {proc.returncode})")

    # --- shutdown ----------------------------------------------------------------

    def shutdown(self) -> None:
        for proc in self.children.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 20
        for name, proc in self.children.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say("devstack", f"{name} did not stop in time: killing it")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for name, stop in reversed(self.stoppers):
            try:
                stop()
                say(name, "stopped")
            except Exception as exc:  # keep stopping the others
                say(name, f"could not stop: {exc}")


def wait_ready(stack: Stack, base: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        stack.check_children()
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=5) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:200].decode(errors='replace')}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.3)
    raise StepFailed(f"{base}/readyz did not answer 200 within {timeout:.0f} s ({last})")


def api(base: str, token: str, method: str, path: str, body=None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{base}{path}", data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raise StepFailed(f"{method} {path} answered {exc.code}: "
                         f"{exc.read()[:500].decode(errors='replace')}") from exc


def demo(base: str, token: str) -> None:
    api(base, token, "PUT", f"/api/v1/admin/projects/{DEMO_PROJECT}",
        {"kind": "generic", "identity_mode": "external_id"})
    jobs = [{"id": f"demo-{i:04d}", "value": f"https://example.org/items/{i}"} for i in range(DEMO_JOBS)]
    # Same ids and values on every run: re-enqueueing is idempotent (DESIGN §4.3).
    result = api(base, token, "POST", f"/api/v1/admin/projects/{DEMO_PROJECT}/jobs", {"jobs": jobs})
    summary = api(base, token, "GET", f"/api/v1/admin/projects/{DEMO_PROJECT}")
    say("demo", f"project {DEMO_PROJECT!r}: submitted {result.get('submitted')}, "
                f"inserted {result.get('inserted')}; job_counts {summary.get('job_counts')}")


# --- the pdf demo: local publisher → local fleethq-worker → archive ----------------

def demo_papers() -> list[str]:
    """50 papers as DOIs, resolved by the publisher's /doi/ route: the values do
    not depend on the publisher's port, so a second `make dev` re-enqueues the
    same jobs (a no-op) instead of adding 50 more. Most are fetched over HTTP,
    three only by the browser, three fail (not found, paywall, HTML as PDF)."""
    http = ["papers/{n}.pdf", "landing/{n}", "links/{n}", "attachment/{n}", "chain/3/{n}"]
    routes = [http[n % len(http)].format(n=n) for n in range(1, 45)]
    routes += ["jslink/45", "jsredirect/46", "jslink/47", "missing/48", "paywall403/49", "fakepdf/50"]
    return ["10.5555/" + route for route in routes]


def start_publisher(stack: Stack):
    # The test suite's publisher doubles as the demo's internet (repo checkout only).
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.publisher import Publisher
    publisher = Publisher(paper_bytes=1024 * 1024).start()
    stack.stoppers.append(("publisher", publisher.stop))
    say("demo", f"local publisher at {publisher.url} (DOI resolver {publisher.url}/doi/)")
    return publisher


def node_status(base: str, secret: str) -> str | None:
    """The node's status, or None when the master does not know this secret."""
    req = urllib.request.Request(f"{base}/api/v1/fleet/status",
                                 headers={"Authorization": f"Bearer {secret}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())["status"]
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            return None
        raise StepFailed(f"GET /api/v1/fleet/status answered {exc.code}") from exc


def start_worker(stack: Stack, base: str, env: dict, publisher) -> None:
    """Enroll (first run only), start ``fleethq-worker run`` and approve it."""
    py, volume = sys.executable, stack.var / "worker"
    identity_file = volume / "identity.json"
    worker_env = {k: v for k, v in env.items() if not k.startswith("FLEETHQ_")}
    if identity_file.exists():
        identity = json.loads(identity_file.read_text())
        if identity.get("registered") and node_status(base, identity["secret"]) is None:
            # A fresh database does not know the old identity: enroll a new one.
            aside = volume.with_name(f"worker.old-{int(time.time())}")
            volume.rename(aside)
            say("demo", f"the master does not know the worker in {volume}; moved it to {aside}")
    if not identity_file.exists():
        out = subprocess.run([py, "-m", "flask", "--app", "wsgi", "fleet", "enroll",
                              "--created-by", "devstack"], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise StepFailed(f"flask fleet enroll failed: {out.stderr.strip()[-500:]}")
        worker_env["FLEETHQ_ENROLL"] = out.stdout.strip().splitlines()[-1]
    worker_env.update({
        "FLEETHQ_MASTER": base, "FLEETHQ_VOLUME": str(volume), "FLEETHQ_PROJECTS": PDF_PROJECT,
        "FLEETHQ_ALLOW_HTTP": "true", "FLEETHQ_CONCURRENCY": "4",
        "FLEETHQ_CLIENT_VERSION": WORKER_VERSION, "FLEETHQ_WORKER_NAME": "devstack-local",
        "FLEETHQ_DOI_RESOLVER": f"{publisher.url}/doi/",
        "FLEETHQ_FETCH_ALLOW_NETWORKS": f"{publisher.host}/32",   # the publisher, nothing else local
        "FLEETHQ_LOG_LEVEL": os.environ.get("FLEETHQ_LOG_LEVEL", "WARNING"), "PYTHONUNBUFFERED": "1"})
    stack.spawn("worker", [py, "-m", "workers.runner.cli", "run"], worker_env)
    deadline = time.monotonic() + 60
    while not (identity_file.exists() and json.loads(identity_file.read_text()).get("registered")):
        stack.check_children()
        if time.monotonic() > deadline:
            raise StepFailed("the worker did not register within 60 s")
        time.sleep(0.2)
    identity = json.loads(identity_file.read_text())
    if node_status(base, identity["secret"]) == "pending":
        stack.run_step("approve", [py, "-m", "flask", "--app", "wsgi", "fleet", "worker", "approve",
                                   identity["worker_id"]], env)


def pdf_demo(stack: Stack, base: str, token: str, env: dict) -> None:
    publisher = start_publisher(stack)
    api(base, token, "PUT", f"/api/v1/admin/projects/{PDF_PROJECT}", {
        "kind": "pdf", "identity_mode": "unique_value", "client_versions": [WORKER_VERSION],
        "max_in_flight": 16, "max_worker_in_flight": 8, "retry_backoff_seconds": 2, "max_resets": 1})
    values = demo_papers()
    result = api(base, token, "POST", f"/api/v1/admin/projects/{PDF_PROJECT}/jobs",
                 {"jobs": [{"value": v} for v in values]})
    say("demo", f"project {PDF_PROJECT!r}: {result.get('submitted')} papers submitted, "
                f"{result.get('inserted')} new")
    start_worker(stack, base, env, publisher)
    counts = watch_progress(stack, base, token)
    say("demo", summary(base, token, env["DATABASE_URL"], counts))


def watch_progress(stack: Stack, base: str, token: str) -> dict:
    """A progress bar until nothing is waiting, in flight or staged."""
    tty, last, shown = sys.stdout.isatty(), None, 0.0
    while True:
        stack.check_children()
        counts = api(base, token, "GET", f"/api/v1/admin/projects/{PDF_PROJECT}")["job_counts"]
        total = sum(counts.values())
        failed = counts["failed"] + counts["reset_exhausted"]
        settled = counts["done"] + failed
        width = 30
        bar = "#" * (width * settled // max(total, 1))
        line = (f"{PDF_PROJECT} [{bar:.<{width}}] {settled}/{total} settled: {counts['done']} archived,"
                f" {failed} failed, {counts['wip']} fetching, {counts['staged']} staged")
        if tty:
            with _print_lock:
                sys.stdout.write("\r" + line)
                sys.stdout.flush()
        elif line != last and (time.monotonic() - shown > 2 or settled == total):
            say("demo", line)
            shown = time.monotonic()
        last = line
        if settled == total:
            if tty:
                with _print_lock:
                    sys.stdout.write("\n")
            return counts
        time.sleep(0.5)


def summary(base: str, token: str, database_url: str, counts: dict) -> str:
    import psycopg
    from app.config import libpq_url, sqlalchemy_url
    by_code: dict[str, int] = {}
    for status in ("failed", "reset_exhausted"):
        page = api(base, token, "GET", f"/api/v1/admin/projects/{PDF_PROJECT}/jobs?status={status}&limit=200")
        for job in page["jobs"]:
            code = (job.get("last_error") or {}).get("code", "unknown")
            by_code[code] = by_code.get(code, 0) + 1
    with psycopg.connect(libpq_url(sqlalchemy_url(database_url))) as conn:
        size = conn.execute("SELECT coalesce(sum(size), 0)::bigint FROM uploads "
                            "WHERE project_id = %s AND state = 'done'", (PDF_PROJECT,)).fetchone()[0]
    failed = ", ".join(f"{code} {n}" for code, n in sorted(by_code.items())) or "none"
    return (f"{PDF_PROJECT}: {counts['done']} archived ({size / 1024 / 1024:.1f} MiB), "
            f"failed by code: {failed}; see {base}/admin/projects/{PDF_PROJECT}")


def banner(base: str, token: str, token_file: Path) -> str:
    return f"""
FleetHQ (development mode) is ready at {base}/
  dev admin machine token: {token}   (also in {token_file})

Try this in another shell:
  export FLEETHQ_MASTER={base} FLEETHQ_TOKEN=$(cat {token_file})
  .venv/bin/hqctl whoami
  .venv/bin/hqctl project get {DEMO_PROJECT}
  seq 1 1000 | sed 's|^|https://example.org/n/|' | .venv/bin/hqctl enqueue {DEMO_PROJECT}
  .venv/bin/hqctl jobs list {DEMO_PROJECT} --status todo --limit 5
  curl -s $FLEETHQ_MASTER/metrics | grep fleethq_queue_depth

Ctrl-C stops everything; data stays in var/ for the next `make dev`.
"""


def secret_key(var: Path) -> str:
    """A stable key, so that sessions survive restarts and every gunicorn worker agrees."""
    path = var / "secret_key"
    if not path.exists():
        path.write_text("dev-" + secrets.token_hex(32) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def run(args) -> int:
    root = Path.cwd()
    var = root / "var"
    var.mkdir(exist_ok=True)
    port = int(os.environ.get("FLEETHQ_PORT") or 8400)
    if not embedded.port_is_free(port):
        raise StepFailed(f"127.0.0.1:{port} is in use; stop that process or set FLEETHQ_PORT")
    py = sys.executable
    token_file = var / "dev-admin.token"
    stack = Stack(var)
    try:
        env = {**os.environ, **stack.services(),
               "FLEETHQ_DEV_MODE": "true", "FLEETHQ_DATA_DIR": str(var),
               "FLEETHQ_BIND": f"127.0.0.1:{port}", "PYTHONUNBUFFERED": "1"}
        env.setdefault("FLEETHQ_SECRET_KEY", secret_key(var))
        env.setdefault("FLEETHQ_LOG_JSON", "false")  # readable lines in a terminal

        stack.run_step("migrate", [py, "-m", "flask", "--app", "wsgi", "db", "upgrade"], env)
        stack.run_step("admin", [py, "-m", "flask", "--app", "wsgi", "fleet", "bootstrap-user",
                                 "--user-id", "dev-admin", "--roles", "admin,worker",
                                 "--machine-token-file", str(token_file)], env)
        if not token_file.exists():
            raise StepFailed(f"bootstrap-user wrote no token to {token_file}")
        token = token_file.read_text().strip()

        stack.spawn("web", [py, "-m", "gunicorn", "-c", "python:app.gunicorn_conf", "wsgi:app"], env)
        stack.spawn("tasks", [py, "-m", "dramatiq", "tasks", "--processes", "1", "--threads", "4"], env)
        stack.spawn("clock", [py, "-m", "tasks.clock"], env)

        base = f"http://127.0.0.1:{port}"
        wait_ready(stack, base)
        if not args.no_demo:
            demo(base, token)
            pdf_demo(stack, base, token, env)
        with _print_lock:
            print(banner(base, token, token_file.relative_to(root)), flush=True)
        while True:
            stack.check_children()
            time.sleep(0.5)
    finally:
        # A second Ctrl-C must not cut the shutdown short and leave servers running.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        say("devstack", "stopping")
        stack.shutdown()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.devstack", description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-demo", action="store_true", help="do not create the demo project")
    parser.add_argument("--stop", action="store_true",
                        help="stop an embedded PostgreSQL left running in ./var/pg, then exit")
    args = parser.parse_args(argv)

    def on_term(signum, frame):
        raise Stop()
    signal.signal(signal.SIGTERM, on_term)

    try:
        if args.stop:
            stopped = embedded.stop_postgres(Path.cwd() / "var" / "pg")
            say("postgres", "stopped" if stopped else "not running")
            return 0
        return run(args)
    except (KeyboardInterrupt, Stop):
        return 0
    except (StepFailed, embedded.EmbeddedError) as exc:
        say("devstack", f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
