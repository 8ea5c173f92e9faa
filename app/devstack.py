"""``make dev``: the whole master on one machine, with no configuration (DESIGN §2).

Starts embedded PostgreSQL (``./var/pg``) and Redis (``./var/redis.sock``)
unless ``DATABASE_URL`` / ``REDIS_URL`` are set, migrates, creates the
development admin, runs web + tasks + clock as children with prefixed output,
waits for ``/readyz``, and fills a demo project. Ctrl-C or SIGTERM stops the
children, then Redis and PostgreSQL.

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
