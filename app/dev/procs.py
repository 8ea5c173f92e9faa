"""Process supervision for ``make dev`` (:mod:`app.dev`): the embedded
services, one-shot steps and long-running children with prefixed output, in
start order, stopped in reverse.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from collections.abc import Callable

from app.dev import embedded


class StepFailed(Exception):
    """A start-up step failed; the message is shown to the user."""


class Stop(BaseException):
    """SIGTERM, handled like Ctrl-C."""


print_lock = threading.Lock()


def say(name: str, text: str) -> None:
    with print_lock:
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
        self.children[name] = _Child(name, args, env)
        self.children[name].start()

    def check_children(self) -> None:
        """Restart a child that died, as foreman-style supervisors do, but keep the stack up."""
        for child in self.children.values():
            child.supervise()

    # --- shutdown ----------------------------------------------------------------

    def shutdown(self) -> None:
        # Every child's whole process group, dead or alive: a child killed
        # with -9 leaves its own children (dramatiq's worker processes,
        # gunicorn's workers, Chromium) in the group, still holding
        # database connections.
        children = list(self.children.values())
        names = [child.name for child in children]
        after_web = names.index("web") + 1 if "web" in names else 0
        # What started after web (the fetcher, the OCR lanes, tasks) stops
        # first: a worker that stops sends a last heartbeat offering no slot
        # (the workers page then says "signed off", not "stale"), and that
        # needs web still answering.
        for wave in (children[after_web:], children[:after_web]):
            for child in wave:
                child.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + 20
            for child in wave:
                if not child.wait_group(max(0.1, deadline - time.monotonic())):
                    say("devstack", f"{child.name} did not stop in time: killing it")
                    child.signal_group(signal.SIGKILL)
                    child.wait_group(5)
        for name, stop in reversed(self.stoppers):
            try:
                stop()
                say(name, "stopped")
            except Exception as exc:  # keep stopping the others
                say(name, f"could not stop: {exc}")


class _Child:
    """One long-running child in a process group of its own, restarted with backoff."""

    BACKOFF_S = (1, 2, 5, 10, 30)
    STEADY_S = 60           # up this long: the next crash starts the backoff over

    def __init__(self, name: str, args: list[str], env: dict):
        self.name, self.args, self.env = name, args, env
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.crashes = 0
        self.restart_at: float | None = None

    def start(self) -> None:
        # Own session: Ctrl-C reaches only devstack, which stops children in
        # order. PDEATHSIG: a killed devstack does not leave children behind.
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=embedded.die_with_parent)
        self.started_at = time.monotonic()
        say("devstack", f"{self.name} started (pid {self.proc.pid})")
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen) -> None:
        for raw in proc.stdout:
            say(self.name, raw.decode(errors="replace").rstrip("\n"))

    def supervise(self) -> None:
        now = time.monotonic()
        if self.restart_at is not None:
            if now >= self.restart_at:
                self.restart_at = None
                self.start()
                say("devstack", f"{self.name} restarted (pid {self.proc.pid})")
            return
        code = self.proc.poll()
        if code is None:
            return
        # What the dead child started must not outlive it, nor meet its successor.
        self.signal_group(signal.SIGKILL)
        self.wait_group(5)
        if now - self.started_at >= self.STEADY_S:
            self.crashes = 0
        delay = self.BACKOFF_S[min(self.crashes, len(self.BACKOFF_S) - 1)]
        self.crashes += 1
        self.restart_at = now + delay
        say("devstack", f"{self.name} exited unexpectedly (exit {code}); restarting in {delay} s")

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass          # the group is empty already

    def wait_group(self, timeout: float) -> bool:
        """Wait until every process of the group has gone; reap the leader."""
        deadline = time.monotonic() + timeout
        while True:
            self.proc.poll()
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


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

