"""Schemathesis against a live master's served ``/api/v1/openapi.json``:
shared by the bounded run in ``make test`` (tests/test_api_fuzz.py) and the
longer one (bench/fuzz.py).

Schemathesis runs as its own process (its CLI), over real HTTP, authenticated
with an admin+worker machine token, so what it sees is exactly what a client
sees. Checks: no 5xx, every status code documented, response bodies match
their schema, content types match.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKS = ("not_a_server_error", "status_code_conformance", "response_schema_conformance",
          "content_type_conformance")
VERSION = "fuzz-1"
PROJECTS = {  # project id -> (PUT body, jobs to enqueue)
    "fz-none": ({"identity_mode": "none"}, [{"value": f"https://example.org/n/{i}"} for i in range(300)]),
    "fz-ext": ({"identity_mode": "external_id", "claim_order": "random"},
               [{"id": f"e{i}", "value": f"https://example.org/e/{i}", "attr": {"i": i}}
                for i in range(100)]),
    "fz-pdf": ({"kind": "pdf", "identity_mode": "unique_value"},
               [{"value": f"https://example.org/p/{i}.pdf"} for i in range(20)]),
}


@dataclass
class FuzzResult:
    operations: int
    examples: int
    failures: int
    errors: int
    exit_code: int
    seconds: float
    report: dict = field(repr=False)
    output: str = field(repr=False)

    def summary(self) -> str:
        return (f"fuzz operations={self.operations} examples={self.examples} "
                f"failures={self.failures} seconds={self.seconds:.0f}")

    def failure_text(self) -> str:
        """The FAILURES and ERRORS sections of schemathesis' output (with reproductions)."""
        start = min((i for i in (self.output.find("=== FAILURES"), self.output.find("=== ERRORS"))
                     if i >= 0), default=0)
        end = self.output.find("=== WARNINGS")
        return self.output[start:end if end > start else None]


def seed_master(base: str, token: str) -> None:
    """A few projects with jobs, a hook consumer and a worker user, so the
    fuzzer reaches real rows (it learns their ids from list answers)."""
    session = requests.Session()
    session.headers.update({"Authorization": f"Bearer {token}", "X-Client-Version": VERSION})
    for project_id, (policy, jobs) in PROJECTS.items():
        body = {**policy, "client_versions": [VERSION]}
        session.put(f"{base}/api/v1/fleethq/projects/{project_id}", json=body,
                    timeout=30).raise_for_status()
        session.post(f"{base}/api/v1/admin/projects/{project_id}/jobs", json={"jobs": jobs},
                     timeout=60).raise_for_status()
    session.post(f"{base}/api/v1/admin/projects/fz-none/hooks",
                 json={"name": "sink", "url": "http://127.0.0.1:9/hook", "enabled": False},
                 timeout=30).raise_for_status()
    session.put(f"{base}/api/v1/admin/users/fz-worker",
                json={"status": "active", "roles": ["worker"]}, timeout=30).raise_for_status()
    # One claimed batch, so outcomes and lease renewals have live attempts to find.
    session.post(f"{base}/api/v1/projects/fz-none/jobs/claim", timeout=30, json={
        "worker_id": "fz-w1", "max_jobs": 20, "lease_seconds": 3600}).raise_for_status()


def run(base: str, token: str, *, admin_id: str, max_examples: int, seed: int = 1,
        workers: int = 1, phases: str = "examples,coverage,fuzzing",
        timeout_s: float = 900) -> FuzzResult:
    """Run schemathesis' CLI against ``base``; ``admin_id`` is the token's user
    (the hooks keep the fuzzer from locking itself out)."""
    with tempfile.TemporaryDirectory(prefix="fleethq-fuzz-") as scratch:
        report_path = os.path.join(scratch, "report.json")
        command = [
            sys.executable, "-m", "schemathesis.cli", "run", f"{base}/api/v1/openapi.json",
            "-H", f"Authorization: Bearer {token}", "-H", f"X-Client-Version: {VERSION}",
            "--checks", ",".join(CHECKS), "--phases", phases,
            "--max-examples", str(max_examples), "--seed", str(seed), "--workers", str(workers),
            "--request-timeout", "30", "--generation-database", "none", "--no-color",
            "--report", "json", "--report-json-path", report_path,
        ]
        env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.api_fuzz_hooks",
               "FLEETHQ_FUZZ_ADMIN": admin_id,
               "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
        started = time.monotonic()
        # Run in a scratch directory: schemathesis keeps replay files in its cwd.
        done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
        seconds = time.monotonic() - started
        output = done.stdout + done.stderr
        try:
            with open(report_path) as fh:
                report = json.load(fh)
        except FileNotFoundError:
            raise RuntimeError(f"schemathesis wrote no report (exit {done.returncode}):\n"
                               f"{output[-4000:]}") from None
    cases = report["test_cases"]
    return FuzzResult(operations=report["operations"]["tested"], examples=cases["generated"],
                      failures=cases["unique_failures"], errors=len(report["errors"]),
                      exit_code=done.returncode, seconds=seconds, report=report, output=output)
