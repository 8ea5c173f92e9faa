"""Process supervision for ``make dev`` (:mod:`app.devstack`): the embedded
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
from typing import Callable

from app import embedded


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

