"""Speaking SavewebHQ's v1 wire to a live FleetHQ master, for the drop-in tests.

``Wire`` sends what a SavewebHQ client sends (bearer token, the
``X-SavewebHQ-Client-Version`` header, strict JSON) over a real socket;
``expect`` and ``expect_error`` check the status and validate every JSON
answer against the contract's schema (tests/savewebhq_schemas.py), with a
failure message naming the route, what was expected and what came back.

The ``hq`` fixture serves the app on a real port and provides an admin token
and a worker token as SavewebHQ deployments have them (two users, one role
each).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import pytest
import requests

from tests import savewebhq_schemas as S

CLIENT_VERSION = "contract-v1"
VERSION_HEADER = "X-SavewebHQ-Client-Version"
MIB = 1024 * 1024
SUCCESS = {"kind": "success", "code": 200, "uri": None, "meta": {}}
NO_BODY = object()


def strict_loads(data: bytes):
    """JSON as SavewebHQ's clients read it: NaN and Infinity are not JSON."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(data, parse_constant=refuse)


@dataclass
class Answer:
    method: str
    path: str
    status: int
    headers: requests.structures.CaseInsensitiveDict
    content: bytes

    def json(self):
        return strict_loads(self.content)

    def excerpt(self, limit: int = 600) -> str:
        text = self.content[:limit].decode("utf-8", "replace")
        return text + ("…" if len(self.content) > limit else "")

    def __str__(self) -> str:
        return f"{self.method} {self.path} -> {self.status} {self.excerpt()}"


class Wire:
    """One caller: a token (or none) and a client version (or none)."""

    def __init__(self, base_url: str, token: str | None = None, version: str | None = None):
        self.base_url = base_url
        self.token = token
        self.version = version
        self.session = requests.Session()

    def headers(self) -> dict:
        headers = {}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.version is not None:
            headers[VERSION_HEADER] = self.version
        return headers

    def call(self, method: str, path: str, body=NO_BODY, *, raw: bytes | None = None,
             content_type: str | None = "application/json", headers: dict | None = None,
             schema: dict | None = None) -> Answer:
        """Send ``body`` as compact JSON (or ``raw`` bytes as they are).

        ``schema``: the contract's request schema; the body is checked against
        it first, so a test that passes it knows it sent a contract-shaped request.
        """
        all_headers = self.headers()
        data = None
        if body is not NO_BODY:
            if schema is not None:
                S.conforms(body, schema, f"the test's own {method} {path} body")
            data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        elif raw is not None:
            data = raw
        if data is not None and content_type is not None:
            all_headers["Content-Type"] = content_type
        all_headers.update(headers or {})
        try:
            response = self.session.request(method, self.base_url + path, data=data,
                                            headers=all_headers, timeout=60, allow_redirects=False)
        except requests.ConnectionError as exc:
            pytest.fail(f"{method} {path}: the connection broke before an answer ({exc})")
        return Answer(method, path, response.status_code, response.headers, response.content)

    def get(self, path, **kw):
        return self.call("GET", path, **kw)

    def post(self, path, body=NO_BODY, **kw):
        return self.call("POST", path, body, **kw)

    def put(self, path, body=NO_BODY, **kw):
        return self.call("PUT", path, body, **kw)

    def delete(self, path, **kw):
        return self.call("DELETE", path, **kw)


def expect(answer: Answer, status: int, schema: dict | None = None):
    """The answer has ``status`` and (for JSON answers) fits ``schema``; returns its JSON."""
    assert answer.status == status, f"expected {status}: {answer}"
    if status == 204:
        assert answer.content == b"", f"a 204 has no body: {answer}"
        return None
    media_type = answer.headers.get("Content-Type", "").split(";")[0].strip()
    assert media_type == "application/json", f"expected a JSON answer, got {media_type!r}: {answer}"
    data = answer.json()
    if schema is not None:
        S.conforms(data, schema, f"{answer.method} {answer.path} ({answer.status}) answer")
    return data


def expect_error(answer: Answer, status: int, code: str) -> dict:
    """An error envelope with ``status`` and ``code``; ``retry_after_ms`` is an
    integer, 0 unless the error asks the client to retry."""
    error = expect(answer, status, S.ERROR_ENVELOPE)["error"]
    assert error["code"] == code, f"expected error code {code!r}: {answer}"
    if not error["retryable"]:
        assert error["retry_after_ms"] == 0, f"retry_after_ms must be 0 when not retrying: {answer}"
    return error


def job_id_of(job: dict) -> int:
    """A claimed job's id as a SavewebHQ client holds it: an int64.

    A master that still answers a decimal string is let through here so that
    the operation under test (not the claim before it) decides the outcome;
    the claim tests check the type itself.
    """
    value = job["job_id"]
    return value if isinstance(value, int) else int(value)


def ref(job: dict) -> dict:
    return {"job_id": job_id_of(job), "attempt_id": job["attempt_id"]}


def receipt(n: int = 0, **overrides) -> dict:
    """An artifact receipt as an external Artifact Receiver issues it."""
    return {"id": f"receipt-{n}", "issuer": "https://artifacts.example",
            "object_id": f"artifact-{n}", "checksum": "sha256:" + "ab" * 32,
            "size_bytes": 123, "accepted_at": int(time.time()), **overrides}


def specs(n: int, prefix: str = "job", job_type: str = "seed") -> list[dict]:
    return [{"id": f"{prefix}-{i}", "value": f"https://example.test/{prefix}/{i}", "type": job_type}
            for i in range(n)]


def project_body(**overrides) -> dict:
    """The PUT body SavewebHQ's e2e script sends, with overrides."""
    return {"status": "active", "identity_mode": "external_id", "dispatch_qps": None,
            "worker_claim_qps": None, "max_jobs_per_claim": 256, "max_resets": 3,
            "client_versions": [CLIENT_VERSION], **overrides}


def claim_body(worker_id: str = "worker-1", max_jobs: int = 10, lease_seconds: int = 300,
               accept_types=(), policy_version: int = 1, **extra) -> dict:
    return {"worker_id": worker_id, "max_jobs": max_jobs, "lease_seconds": lease_seconds,
            "accept_types": list(accept_types), "policy_version": policy_version, **extra}


def complete_body(jobs, worker_id: str = "worker-1", outcome=None, receipts=None) -> dict:
    return {"worker_id": worker_id, "items": [
        {**ref(job), "outcome": outcome or SUCCESS,
         "artifact_receipts": [] if receipts is None else receipts} for job in jobs]}


def fail_body(jobs, retryable: bool, worker_id: str = "worker-1", code: str = "temporary") -> dict:
    return {"worker_id": worker_id, "items": [
        {**ref(job), "retryable": retryable,
         "error": {"code": code, "message": "it broke", "details": {}}} for job in jobs]}


def extend_body(jobs, extend_seconds: int = 120, worker_id: str = "worker-1") -> dict:
    return {"worker_id": worker_id, "extend_seconds": extend_seconds,
            "items": [ref(job) for job in jobs]}


def admin_path(project_id: str, tail: str = "") -> str:
    return f"/api/v1/admin/projects/{project_id}{tail}"


def worker_path(project_id: str, tail: str = "") -> str:
    return f"/api/v1/projects/{project_id}{tail}"


def make_account(app, user_id: str, roles: list[str], status: str = "active") -> str:
    """A user with a machine token, made on the master (as ``bootstrap-user`` does)."""
    from app.accounts import service as accounts
    from app.extensions import db
    with app.app_context():
        accounts.put_user(user_id, roles, "active")
        token = accounts.rotate_token(user_id)
        if status != "active":
            accounts.put_user(user_id, roles, status)
        db.session.remove()
    return token


@dataclass
class Hq:
    """A live master and the callers of a SavewebHQ deployment."""
    url: str
    app: object
    admin: Wire
    worker: Wire
    anonymous: Wire
    wires: list = field(default_factory=list)

    def __post_init__(self):
        self.wires += [self.admin, self.worker, self.anonymous]

    def wire(self, token: str | None, version: str | None = CLIENT_VERSION) -> Wire:
        wire = Wire(self.url, token, version)
        self.wires.append(wire)
        return wire

    def put_project(self, project_id: str = "proj", **fields) -> str:
        """Create or update a project through the SavewebHQ route (any 2xx:
        the PUT tests check the exact status)."""
        answer = self.admin.put(admin_path(project_id), project_body(**fields))
        assert answer.status in (200, 201), f"setup: could not put project: {answer}"
        return project_id

    def enqueue(self, project_id: str, jobs: list[dict]) -> dict:
        answer = self.admin.post(admin_path(project_id, "/jobs"), {"jobs": jobs})
        assert answer.status == 200, f"setup: could not enqueue: {answer}"
        return answer.json()

    def claim(self, project_id: str, **kw) -> Answer:
        # Every type named explicitly: the accept_types tests check [] and null.
        kw.setdefault("accept_types", ["seed", "asset"])
        return self.worker.post(worker_path(project_id, "/jobs/claim"), claim_body(**kw))

    def claimed(self, project_id: str, n: int | None = None, **kw) -> list[dict]:
        """Claim and return the jobs (exactly ``n`` of them when given)."""
        answer = self.claim(project_id, **kw)
        assert answer.status == 200, f"setup: could not claim: {answer}"
        jobs = answer.json()["jobs"]
        if n is not None:
            assert len(jobs) == n, f"setup: expected {n} claimed jobs: {answer}"
        return jobs

    def job(self, project_id: str, job_id: int) -> dict:
        """The admin view of one job, for tests about other operations: only
        SavewebHQ's field names are checked here (the AdminJob tests check the rest)."""
        answer = self.admin.get(admin_path(project_id, f"/jobs/{job_id}"))
        assert answer.status == 200, f"setup: could not read the job: {answer}"
        job = answer.json()
        missing = [name for name in S.ADMIN_JOB["required"] if name not in job]
        assert not missing, f"setup: the admin job view lacks SavewebHQ's {missing}: {answer}"
        return job

    def job_ids(self, project_id: str) -> list[int]:
        """The project's job ids, read from the database (setup that does not
        depend on the job list under test)."""
        from tests.helpers import sql
        return [row[0] for row in sql(self.app, "SELECT id FROM jobs WHERE project_id = :p ORDER BY id",
                                      p=project_id)]

    def completes(self, project_id: str, jobs: list[dict]) -> None:
        """Control step: a valid completion of ``jobs`` is applied (so a refusal
        just before was about the part the test changed)."""
        answer = self.worker.post(worker_path(project_id, "/jobs/complete"), complete_body(jobs))
        assert answer.status == 200, f"control: a valid completion was refused: {answer}"
        statuses = [result.get("status") for result in answer.json()["results"]]
        assert statuses == ["applied"] * len(jobs), f"control: a valid completion was not applied: {answer}"


@pytest.fixture(scope="module")
def hq_server(app):
    """One real HTTP server for a whole module: stopping one takes half a second."""
    from tests.conftest import LiveServer
    server = LiveServer(app).start()
    yield server
    server.stop()


@pytest.fixture
def hq(app, hq_server) -> Hq:
    admin_token = make_account(app, "hq-admin", ["admin"])
    worker_token = make_account(app, "hq-worker", ["worker"])
    deployment = Hq(url=hq_server.url, app=app,
                    admin=Wire(hq_server.url, admin_token),
                    worker=Wire(hq_server.url, worker_token, CLIENT_VERSION),
                    anonymous=Wire(hq_server.url))
    yield deployment
    for wire in deployment.wires:
        wire.session.close()


def source_file(jobs: list[dict]) -> bytes:
    """A ``jobs-jsonl-zstd-v1`` body: one JobSpec JSON object a line, zstd-compressed."""
    import zstandard
    lines = b"".join(json.dumps(job, separators=(",", ":")).encode() + b"\n" for job in jobs)
    return zstandard.ZstdCompressor().compress(lines)


def each_case(cases: dict, check) -> None:
    """Run ``check(case)`` for every case and fail once, naming each case that
    failed (one test per rule, every broken case in its report)."""
    assert cases, "no cases to check"
    failures = []
    for name, case in cases.items():
        try:
            check(case)
        except (AssertionError, pytest.fail.Exception) as exc:
            failures.append(f"[{name}] {exc}")
    assert not failures, "\n".join(failures)
