"""SavewebHQ's ``scripts/test-e2e.sh``, played step by step against FleetHQ.

The script's setup commands become FleetHQ's, run as the real programs:

    tracker migrate                  -> flask --app wsgi db upgrade
    tracker bootstrap-user … --machine-token-file F
                                     -> flask --app wsgi fleet bootstrap-user … --machine-token-file F
                                        (F holds the operator's token, as the script writes it)
    tracker serve                    -> gunicorn -c python:app.gunicorn_conf wsgi:app
    source pack --identity-mode --input --output
                                     -> fleethq-source pack with the same flags

and every ``curl`` is the same request over HTTP. The script makes 46
explicit checks (28 Python assertions, 17 ``test`` comparisons and one
``kill -0``); each is a ``C<n>`` below, tagged with its line in the script,
with the same status codes and fields. ``curl --fail`` steps without their
own check are tagged ``fail-…`` and check SavewebHQ's exact status.

One flow, like the script: a failed check is recorded and the flow goes on
where it can, so one run lists every broken step; a step whose answer later
steps need stops the flow.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from tests.conftest import free_port
from tests.helpers import sql
from tests.savewebhq_wire import Wire, hq, hq_server  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
ADMIN_TOKEN = "e2e-admin-token-0123456789abcdef"
WORKER_TOKEN = "e2e-worker-token-0123456789abcdef"
VERSION = "e2e-v1"


class FlowStopped(Exception):
    pass


class Flow:
    """The script's checks: ``check`` records a failure and goes on, ``need``
    stops the flow (later steps depend on it)."""

    def __init__(self):
        self.failures: list[str] = []
        self.passed: list[str] = []
        self.server: Server | None = None  # stopped by the test, however the flow ends

    def check(self, label: str, ok: bool, detail="") -> bool:
        (self.passed if ok else self.failures).append(label if ok else f"{label}: {detail}")
        return ok

    def need(self, label: str, ok: bool, detail=""):
        if not self.check(label, ok, detail):
            raise FlowStopped(label)

    def verdict(self, stopped: str | None):
        lines = list(self.failures)
        if stopped:
            lines.append(f"(the flow stopped at {stopped}; later checks did not run)")
        assert not lines, f"{len(self.failures)} of the script's checks failed:\n" + "\n".join(lines)


def json_of(response: requests.Response):
    try:
        return response.json()
    except ValueError:
        return None


def run(argv: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def write_secret(path, value: str) -> None:
    """``umask 077; printf '%s\\n' TOKEN > FILE``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")


class Server:
    """``tracker serve``: the web process, as the Procfile runs it."""

    def __init__(self, env: dict, log_path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "gunicorn"), "-c", "python:app.gunicorn_conf", "wsgi:app"], cwd=ROOT,
            env={**env, "FLEETHQ_BIND": f"127.0.0.1:{self.port}", "FLEETHQ_WEB_WORKERS": "1"},
            stdout=self._log, stderr=subprocess.STDOUT)

    def wait_health(self, seconds: float = 30) -> requests.Response | None:
        """``for _ in $(seq 1 200); do curl --fail …/healthz && break; sleep 0.1; done``"""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                response = requests.get(self.base + "/healthz", timeout=2)
                if response.ok:
                    return response
            except requests.RequestException:
                pass
            time.sleep(0.1)
        return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


@pytest.fixture
def master_env(app, database_url, redis_url, tmp_path):
    """The environment of FleetHQ's master commands on the test database."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update({"DATABASE_URL": database_url, "REDIS_URL": redis_url, "FLEETHQ_LOG_JSON": "false",
                "FLEETHQ_DATA_DIR": str(tmp_path / "var"),
                # A deployed master has its key (docs/operations.md): machine
                # tokens are sealed with it, which is what lets GET …/machine-token
                # show a token again (check C15).
                "FLEETHQ_SECRET_KEY": "e2e-secret-key-0123456789abcdef0123456789abcdef"})
    return env


def test_savewebhq_e2e_script_passes_against_fleethq(app, master_env, tmp_path):
    flow = Flow()
    stopped = None
    try:
        _play(flow, app, master_env, tmp_path)
    except FlowStopped as exc:
        stopped = str(exc)
    finally:
        if flow.server is not None:
            flow.server.stop()
    flow.verdict(stopped)


def _play(flow: Flow, app, env: dict, run_dir):  # noqa: C901 (the script is one long flow)
    # --- setup: tokens, migrate, bootstrap-user x2 (script lines 39-49)
    write_secret(run_dir / "admin.token", ADMIN_TOKEN)
    write_secret(run_dir / "worker.token", WORKER_TOKEN)
    done = run([os.path.join(BIN, "flask"), "--app", "wsgi", "db", "upgrade"], env)
    flow.need("setup migrate (l.45)", done.returncode == 0, done.stderr[-800:])
    for user_id, roles, token_file, token in (("admin-e2e", "admin", "admin.token", ADMIN_TOKEN),
                                              ("worker-e2e", "worker", "worker.token", WORKER_TOKEN)):
        done = run([os.path.join(BIN, "flask"), "--app", "wsgi", "fleet", "bootstrap-user",
                    "--user-id", user_id, "--roles", roles,
                    "--machine-token-file", str(run_dir / token_file)], env)
        flow.need(f"setup bootstrap-user {user_id} (l.46-49)", done.returncode == 0, done.stderr[-800:])
        flow.check(f"setup bootstrap-user {user_id} installs the file's token and leaves the file",
                   (run_dir / token_file).read_text().strip() == token,
                   f"the file now holds {(run_dir / token_file).read_text().strip()[:12]}…")

    # --- serve and wait for /healthz (l.51-60)
    server = flow.server = Server(env, run_dir / "tracker.log")
    health = server.wait_health()
    flow.need("setup serve: /healthz answers (l.55-58)", health is not None, server.log())
    base = server.base
    flow.check("C01 l.59 kill -0: the server is running", server.proc.poll() is None, server.log())
    flow.check("C02 l.60 /healthz == {status: ok}", json_of(health) == {"status": "ok"}, health.text)

    admin = Wire(base, ADMIN_TOKEN)
    worker = Wire(base, WORKER_TOKEN, VERSION)
    project_body = {"status": "active", "identity_mode": "external_id", "dispatch_qps": None,
                    "worker_claim_qps": None, "max_jobs_per_claim": 256, "max_resets": 3,
                    "client_versions": [VERSION]}

    # --- A worker credential must not cross the management boundary (l.66-70)
    answer = worker.get("/api/v1/admin/projects")
    flow.check("C03 l.69 worker GET /admin/projects is 403", answer.status == 403, str(answer))
    flow.check("C04 l.70 its code is permission_denied",
               (json_of_answer(answer) or {}).get("error", {}).get("code") == "permission_denied", str(answer))

    # --- Create a project through the admin API (l.72-76)
    answer = admin.put("/api/v1/admin/projects/project-e2e", project_body)
    p = json_of_answer(answer) or {}
    flow.check("fail-put-project-e2e l.73 PUT project-e2e is 200", answer.status == 200, str(answer))
    flow.need("(flow) project-e2e exists", answer.status in (200, 201), str(answer))
    flow.check("C05 l.76 the project summary has id, status, identity mode, max_resets 3, lease 300, "
               "versions and no jobs",
               p.get("id") == "project-e2e" and p.get("status") == "active"
               and p.get("identity_mode") == "external_id" and p.get("max_resets") == 3
               and p.get("recommended_lease_seconds") == 300 and p.get("client_versions") == [VERSION]
               and sum((p.get("job_counts") or {"x": 1}).values()) == 0, str(answer))

    # --- Every worker route requires an explicitly allowed client version (l.78-87)
    answer = Wire(base, WORKER_TOKEN, "obsolete-v1").get("/api/v1/projects/project-e2e")
    error = (json_of_answer(answer) or {}).get("error") or {}
    flow.check("C06 l.82 an obsolete client version is 426", answer.status == 426, str(answer))
    flow.check("C07 l.83 client_upgrade_required with details.client_versions == [e2e-v1]",
               error.get("code") == "client_upgrade_required"
               and (error.get("details") or {}).get("client_versions") == [VERSION], str(answer))
    answer = worker.get("/api/v1/projects/project-e2e")
    policy = json_of_answer(answer) or {}
    flow.check("C08 l.87 policy: recommended_lease_seconds 300, policy_version 1",
               answer.status == 200 and policy.get("recommended_lease_seconds") == 300
               and policy.get("policy_version") == 1, str(answer))

    # --- Upload the packed source format through a separate project (l.89-102)
    answer = admin.put("/api/v1/admin/projects/source-e2e", project_body)
    flow.check("fail-put-source-e2e l.90 PUT source-e2e is 200", answer.status == 200, str(answer))
    (run_dir / "source-values.txt").write_text("https://example.test/source\n")
    packed = run([os.path.join(BIN, "fleethq-source"), "pack", "--identity-mode", "external_id",
                  "--input", str(run_dir / "source-values.txt"),
                  "--output", str(run_dir / "source.jobs.jsonl.zst")], env)
    if flow.check("fail-source-pack l.94 source pack --identity-mode --input --output exits 0",
                  packed.returncode == 0, packed.stderr[-600:]):
        answer = admin.post("/api/v1/admin/projects/source-e2e/source",
                            raw=(run_dir / "source.jobs.jsonl.zst").read_bytes(),
                            content_type="application/zstd")
        r = json_of_answer(answer) or {}
        flow.check("C09 l.99 source import: jobs 1, inserted 1, uncompressed_bytes > 0",
                   answer.status == 200 and r.get("jobs") == 1 and r.get("inserted") == 1
                   and (r.get("uncompressed_bytes") or 0) > 0, str(answer))
    else:
        flow.check("C09 l.99 source import: jobs 1, inserted 1, uncompressed_bytes > 0", False,
                   "not run: source pack failed")
    answer = admin.delete("/api/v1/admin/projects/source-e2e")
    flow.check("C10 l.102 DELETE source-e2e is 204", answer.status == 204, str(answer))

    # --- Enqueue count is constrained by the body limit, not the worker batch limit (l.104-115)
    answer = admin.put("/api/v1/admin/projects/large-enqueue-e2e", project_body)
    flow.check("fail-put-large-enqueue-e2e l.105 PUT is 200", answer.status == 200, str(answer))
    answer = admin.post("/api/v1/admin/projects/large-enqueue-e2e/jobs",
                        {"jobs": [{"id": f"large-{i}", "value": str(i)} for i in range(300)]})
    r = json_of_answer(answer) or {}
    flow.check("C11 l.112 300 jobs: submitted 300, inserted 300",
               answer.status == 200 and r.get("submitted") == 300 and r.get("inserted") == 300, str(answer))
    answer = admin.delete("/api/v1/admin/projects/large-enqueue-e2e")
    flow.check("C12 l.115 DELETE large-enqueue-e2e is 204", answer.status == 204, str(answer))

    # --- Users and machine tokens through the admin API (l.117-141)
    answer = admin.put("/api/v1/admin/users/api-worker", {"status": "active", "roles": ["worker"]})
    flow.check("C13 l.119 PUT user api-worker is 204", answer.status == 204, str(answer))
    answer = admin.post("/api/v1/admin/users/api-worker/machine-token")
    issued = json_of_answer(answer) or {}
    # SavewebHQ's tokens start with hq_; FleetHQ issues fhq_ tokens, so the
    # check is on the fields and on the token working (C17), not its prefix.
    flow.check("C14 l.122 POST machine-token is 201 with user_id api-worker and a token",
               answer.status == 201 and set(issued) == {"user_id", "token"}
               and issued.get("user_id") == "api-worker" and bool(issued.get("token")), str(answer))
    answer = admin.get("/api/v1/admin/users/api-worker/machine-token")
    flow.check("C15 l.125 GET machine-token answers the same token again",
               answer.status == 200 and json_of_answer(answer) == issued, str(answer))
    answer = Wire(base).get("/api/v1/whoami")
    flow.check("C16 l.128 whoami without a token is 401", answer.status == 401, str(answer))
    answer = Wire(base, issued.get("token") or "missing").get("/api/v1/whoami")
    flow.check("C17 l.131 whoami with the new token == {user_id: api-worker}",
               answer.status == 200 and json_of_answer(answer) == {"user_id": "api-worker"}, str(answer))
    answer = admin.get("/api/v1/admin/users")
    users = (json_of_answer(answer) or {}).get("users") or []
    flow.check("C18 l.133 the user list shows api-worker with an active, viewable token",
               any(u.get("id") == "api-worker" and u.get("machine_token_active")
                   and u.get("machine_token_viewable") for u in users), str(answer))
    answer = admin.delete("/api/v1/admin/users/api-worker/machine-token")
    flow.check("C19 l.136 DELETE machine-token is 204", answer.status == 204, str(answer))
    answer = admin.delete("/api/v1/admin/users/api-worker")
    flow.check("C20 l.139 DELETE user api-worker is 204", answer.status == 204, str(answer))
    answer = admin.get("/api/v1/admin/users")
    users = (json_of_answer(answer) or {}).get("users")
    flow.check("C21 l.141 api-worker is gone from the user list",
               answer.status == 200 and isinstance(users, list)
               and all(u.get("id") != "api-worker" for u in users), str(answer))

    # --- Enqueue a mixed workload (l.143-160)
    jobs = {"jobs": [
        {"id": "seed-1", "value": "https://example.test/seed/1", "type": "seed", "via": None,
         "attr": {"group": "seed"}},
        {"id": "seed-2", "value": "https://example.test/seed/2", "type": "seed", "via": None,
         "attr": {"group": "seed"}},
        {"id": "asset-1", "value": "https://example.test/asset/1", "type": "asset",
         "via": "https://example.test/seed/1", "attr": {"group": "asset"}},
        {"id": "asset-2", "value": "https://example.test/asset/2", "type": "asset",
         "via": "https://example.test/seed/1", "attr": {"group": "asset"}}]}
    answer = admin.post("/api/v1/admin/projects/project-e2e/jobs", jobs)
    r = json_of_answer(answer) or {}
    flow.need("C22 l.151 enqueue: submitted 4, inserted 4",
              answer.status == 200 and r.get("submitted") == 4 and r.get("inserted") == 4, str(answer))
    # The same immutable batch is idempotent.
    answer = admin.post("/api/v1/admin/projects/project-e2e/jobs", jobs)
    r = json_of_answer(answer) or {}
    flow.check("C23 l.156 the same batch again: submitted 4, inserted 0",
               answer.status == 200 and r.get("submitted") == 4 and r.get("inserted") == 0, str(answer))
    answer = admin.get("/api/v1/admin/projects")
    projects = (json_of_answer(answer) or {}).get("projects") or []
    flow.check("C24 l.160 the project list has project-e2e alone, with 4 todo",
               len(projects) == 1 and (projects[0].get("job_counts") or {}).get("todo") == 4, str(answer))

    # --- Claim only seeds, extend one lease, complete one, and retry the other (l.162-188)
    answer = worker.post("/api/v1/projects/project-e2e/jobs/claim",
                         {"worker_id": "worker-e2e", "max_jobs": 2, "lease_seconds": 300,
                          "accept_types": ["seed"], "policy_version": 1})
    seeds = (json_of_answer(answer) or {}).get("jobs") or []
    flow.need("C25 l.166 the seed claim has 2 jobs, all seeds",
              len(seeds) == 2 and all(j.get("type") == "seed" for j in seeds), str(answer))
    # printf '"job_id":%s' writes the claimed id as a JSON number.
    seed1, seed2 = ({"job_id": int(j["job_id"]), "attempt_id": j["attempt_id"]} for j in seeds)

    answer = worker.post("/api/v1/projects/project-e2e/jobs/extend-lease",
                         {"worker_id": "worker-e2e", "extend_seconds": 120, "items": [seed1]})
    r = first_result(answer)
    flow.check("C26 l.173 extend: applied, wip, lease_expires_at > 0",
               r.get("status") == "applied" and r.get("job_status") == "wip"
               and isinstance(r.get("lease_expires_at"), int) and r["lease_expires_at"] > 0, str(answer))

    receipt = {"id": "receipt-seed-1", "issuer": "https://artifacts.example", "object_id": "artifact-seed-1",
               "checksum": "blake3:" + "a" * 64, "size_bytes": 123, "accepted_at": int(time.time())}
    success = {"kind": "success", "code": 200, "uri": None, "meta": {}}
    answer = worker.post("/api/v1/projects/project-e2e/jobs/complete",
                         {"worker_id": "worker-e2e",
                          "items": [{**seed1, "outcome": success, "artifact_receipts": [receipt]}]})
    flow.check("C27 l.181 completing seed 1 with a receipt is applied",
               first_result(answer).get("status") == "applied", str(answer))

    answer = worker.post("/api/v1/projects/project-e2e/jobs/fail",
                         {"worker_id": "worker-e2e", "items": [
                             {**seed2, "retryable": True,
                              "error": {"code": "temporary", "message": "retry once", "details": {}}}]})
    r = first_result(answer)
    flow.check("C28 l.188 a retryable failure of seed 2: applied, todo",
               r.get("status") == "applied" and r.get("job_status") == "todo", str(answer))

    # --- A late completion from the old attempt must be rejected (l.190-196)
    answer = worker.post("/api/v1/projects/project-e2e/jobs/complete",
                         {"worker_id": "worker-e2e",
                          "items": [{**seed2, "outcome": success, "artifact_receipts": []}]})
    r = first_result(answer)
    flow.check("C29 l.196 the late completion is rejected as stale_attempt",
               r.get("status") == "rejected" and (r.get("error") or {}).get("code") == "stale_attempt",
               str(answer))

    # --- Claim assets separately; one succeeds and one is permanently failed (l.198-212)
    answer = worker.post("/api/v1/projects/project-e2e/jobs/claim",
                         {"worker_id": "worker-e2e", "max_jobs": 2, "lease_seconds": 300,
                          "accept_types": ["asset"], "policy_version": 1})
    assets = (json_of_answer(answer) or {}).get("jobs") or []
    flow.need("C30 l.202 the asset claim has 2 jobs, all assets",
              len(assets) == 2 and all(j.get("type") == "asset" for j in assets), str(answer))
    asset1, asset2 = ({"job_id": int(j["job_id"]), "attempt_id": j["attempt_id"]} for j in assets)
    answer = worker.post("/api/v1/projects/project-e2e/jobs/fail",
                         {"worker_id": "worker-e2e", "items": [
                             {**asset1, "retryable": False,
                              "error": {"code": "not_found", "message": "permanent", "details": {}}}]})
    r = first_result(answer)
    flow.check("C31 l.207 a permanent failure of asset 1: applied, failed",
               r.get("status") == "applied" and r.get("job_status") == "failed", str(answer))
    answer = worker.post("/api/v1/projects/project-e2e/jobs/complete",
                         {"worker_id": "worker-e2e",
                          "items": [{**asset2, "outcome": success, "artifact_receipts": []}]})
    flow.check("fail-complete-asset l.211 completing asset 2 is 200", answer.status == 200, str(answer))

    # --- Reclaim and finish the retryable seed (l.214-223)
    answer = worker.post("/api/v1/projects/project-e2e/jobs/claim",
                         {"worker_id": "worker-e2e", "max_jobs": 10, "lease_seconds": 300,
                          "accept_types": [], "policy_version": 1})
    again = (json_of_answer(answer) or {}).get("jobs") or []
    flow.check("C32 l.218 the reclaim has exactly 1 job", len(again) == 1, str(answer))
    if again:
        retry = {"job_id": int(again[0]["job_id"]), "attempt_id": again[0]["attempt_id"]}
        flow.check("C33 l.219 the reclaimed job is seed 2", retry["job_id"] == seed2["job_id"], str(answer))
        answer = worker.post("/api/v1/projects/project-e2e/jobs/complete",
                             {"worker_id": "worker-e2e",
                              "items": [{**retry, "outcome": success, "artifact_receipts": []}]})
        flow.check("fail-complete-retry l.222 completing the retry is 200", answer.status == 200, str(answer))
    else:
        flow.check("C33 l.219 the reclaimed job is seed 2", False, "nothing was reclaimed")

    # --- Draining stops scheduling, and archived projects reject new jobs (l.225-240)
    lifecycle = {k: v for k, v in project_body.items() if k != "identity_mode"}
    answer = admin.put("/api/v1/admin/projects/project-e2e", {**lifecycle, "status": "draining"})
    flow.check("fail-put-draining l.226 PUT draining is 200", answer.status == 200, str(answer))
    answer = worker.post("/api/v1/projects/project-e2e/jobs/claim",
                         {"worker_id": "worker-e2e", "max_jobs": 1, "lease_seconds": 30,
                          "accept_types": [], "policy_version": 1})
    flow.check("C34 l.231 a claim on the draining project is 409", answer.status == 409, str(answer))
    flow.check("C35 l.232 its code is project_not_active",
               (json_of_answer(answer) or {}).get("error", {}).get("code") == "project_not_active", str(answer))
    answer = admin.put("/api/v1/admin/projects/project-e2e", {**lifecycle, "status": "archived"})
    flow.check("fail-put-archived l.234 PUT archived is 200", answer.status == 200, str(answer))
    answer = admin.post("/api/v1/admin/projects/project-e2e/jobs",
                        {"jobs": [{"id": "late-job", "value": "https://example.test/late", "type": "seed",
                                   "via": None, "attr": {}}]})
    flow.check("C36 l.239 enqueue into the archived project is 409", answer.status == 409, str(answer))
    flow.check("C37 l.240 its code is project_not_active",
               (json_of_answer(answer) or {}).get("error", {}).get("code") == "project_not_active", str(answer))

    answer = admin.get("/api/v1/admin/projects/project-e2e")
    p = json_of_answer(answer) or {}
    flow.check("C38 l.244 the final project is archived with counts 0/0/3/1/0",
               p.get("status") == "archived" and p.get("job_counts") == {
                   "todo": 0, "wip": 0, "done": 3, "failed": 1, "reset_exhausted": 0}, str(answer))

    # --- The database check (l.246-248), in FleetHQ's tables: done, failed, jobs
    # whose completion kept one artifact receipt, jobs still holding a lease.
    row = sql(app, """
        SELECT count(*) FILTER (WHERE j.state = 'done'),
               count(*) FILTER (WHERE j.state = 'failed'),
               count(*) FILTER (WHERE EXISTS (
                   SELECT 1 FROM attempts a WHERE a.job_id = j.id AND a.state = 'done'
                   AND jsonb_typeof(a.outcome -> 'artifact_receipts') = 'array'
                   AND jsonb_array_length(a.outcome -> 'artifact_receipts') = 1)),
               count(*) FILTER (WHERE j.lease_expires_at IS NOT NULL)
        FROM jobs j WHERE j.project_id = 'project-e2e'""")[0]
    flow.check("C39 l.248 the database holds 3 done, 1 failed, 1 job with one receipt, no lease",
               "|".join(str(n) for n in row) == "3|1|1|0", f"got {'|'.join(str(n) for n in row)}")

    # --- Inspect, requeue and delete through the admin API (l.250-270)
    answer = admin.get("/api/v1/admin/projects/project-e2e/jobs?status=failed&limit=10")
    listed = (json_of_answer(answer) or {}).get("jobs") or []
    flow.check("C40 l.252 the failed filter lists 1 job with status failed",
               len(listed) == 1 and listed[0].get("status") == "failed", str(answer))
    answer = admin.get(f"/api/v1/admin/projects/project-e2e/jobs/{asset1['job_id']}")
    job_id = (json_of_answer(answer) or {}).get("job_id")
    flow.check("C41 l.255 the failed job's job_id is a number > 0",
               isinstance(job_id, int) and not isinstance(job_id, bool) and job_id > 0, str(answer))
    answer = admin.post(f"/api/v1/admin/projects/project-e2e/jobs/{asset1['job_id']}/requeue")
    flow.check("C42 l.258 requeue is 204", answer.status == 204, str(answer))
    answer = admin.delete(f"/api/v1/admin/projects/project-e2e/jobs/{asset1['job_id']}")
    flow.check("C43 l.261 deleting the job is 204", answer.status == 204, str(answer))
    answer = admin.delete("/api/v1/admin/projects/project-e2e")
    flow.check("C44 l.264 deleting project-e2e is 204", answer.status == 204, str(answer))
    answer = admin.delete("/api/v1/admin/users/admin-e2e")
    flow.check("C45 l.267 the admin deletes its own user: 204", answer.status == 204, str(answer))
    answer = admin.get("/api/v1/admin/users")
    flow.check("C46 l.270 the deleted admin's token is 401", answer.status == 401, str(answer))


def json_of_answer(answer):
    try:
        return answer.json()
    except ValueError:
        return None


def first_result(answer) -> dict:
    results = (json_of_answer(answer) or {}).get("results") or [{}]
    return results[0] if isinstance(results[0], dict) else {}


# ===================================================================
# The operator commands SavewebHQ's documentation uses, with its flags:
# tracker put-project --project-id … and hqctl enqueue / enqueue-source.

def test_operator_setup_with_savewebhq_flags(hq, master_env, tmp_path):
    token_file = tmp_path / "admin.token"
    write_secret(token_file, "ops-admin-token-0123456789abcdef")
    flask = [os.path.join(BIN, "flask"), "--app", "wsgi", "fleet"]
    done = run(flask + ["bootstrap-user", "--user-id", "ops-admin", "--roles", "admin",
                        "--machine-token-file", str(token_file)], master_env)
    assert done.returncode == 0, done.stderr[-800:]
    # SavewebHQ installs the operator's token and never writes the file.
    assert token_file.read_text().strip() == "ops-admin-token-0123456789abcdef", token_file.read_text()
    done = run(flask + ["put-project", "--project-id", "cli-e2e", "--status", "active",
                        "--identity-mode", "external_id", "--max-jobs-per-claim", "256",
                        "--max-resets", "3", "--recommended-lease-seconds", "300",
                        "--client-versions", "e2e-v1"], master_env)
    assert done.returncode == 0, done.stderr[-800:]

    values = tmp_path / "values.txt"
    values.write_text("https://example.test/a\nhttps://example.test/b\nhttps://example.test/c\n")
    hqctl = [os.path.join(BIN, "hqctl")]
    common = ["--url", hq.url, "--project-id", "cli-e2e", "--machine-token-file", str(token_file),
              "--allow-http"]
    done = run(hqctl + ["enqueue"] + common + ["--input", str(values), "--format", "values",
                                               "--batch-size", "2"], master_env)
    assert done.returncode == 0, done.stderr[-800:]
    assert json.loads(done.stdout) == {"project_id": "cli-e2e", "identity_mode": "external_id",
                                       "submitted": 3, "inserted": 3, "batches": 2}

    from tests.savewebhq_wire import source_file, specs
    source = tmp_path / "more.jobs.jsonl.zst"
    source.write_bytes(source_file(specs(2, "src")))
    done = run(hqctl + ["enqueue-source"] + common + ["--input", str(source)], master_env)
    assert done.returncode == 0, done.stderr[-800:]
    result = json.loads(done.stdout)
    assert (result["project_id"], result["jobs"], result["inserted"]) == ("cli-e2e", 2, 2)

    # What the operator set up is what a SavewebHQ worker sees.
    policy = hq.worker.get("/api/v1/projects/cli-e2e", headers={"X-SavewebHQ-Client-Version": "e2e-v1"})
    assert policy.status == 200 and policy.json()["recommended_lease_seconds"] == 300, str(policy)
    assert len(hq.job_ids("cli-e2e")) == 5
