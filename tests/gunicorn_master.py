"""A real gunicorn master (the Procfile's ``web`` line) for tests: several
worker processes, gthread, on a free port (no tests here)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from tests.conftest import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Gunicorn:
    def __init__(self, env: dict, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        full_env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        full_env.update({"FLEETHQ_BIND": f"127.0.0.1:{self.port}", "FLEETHQ_WEB_WORKERS": "3",
                         "FLEETHQ_LOG_JSON": "false",
                         # One connection per worker at a time, so that concurrent
                         # requests are necessarily served by different workers.
                         "GUNICORN_CMD_ARGS": "--worker-connections 1"}, **env)
        gunicorn = os.path.join(os.path.dirname(sys.executable), "gunicorn")
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([gunicorn, "-c", "python:app.gunicorn_conf", "wsgi:app"],
                                     cwd=ROOT, env=full_env, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_ready(self, deadline_s: float = 60):
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"gunicorn exited:\n{self.log()}"
            try:
                if requests.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        pytest.fail(f"gunicorn did not become ready:\n{self.log()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
