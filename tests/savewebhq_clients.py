"""Stand-ins for SavewebHQ's own clients, written for the drop-in tests.

They send what SavewebHQ's clients send and refuse what those clients refuse,
so a test passing against them means the unmodified client would work:

* ``PythonSdk*``: the ``saveweb_hq`` Python SDK (sdk/python): one persistent
  ``http.client`` connection, compact JSON, ``Accept`` and ``Cache-Control:
  no-store`` on requests; it refuses answers without ``no-store``, answers
  over 8 MiB, non-JSON or non-object answers, and errors without the envelope.
  Its default ``claim()`` sends ``accept_types: []``.
* ``GoClient`` and ``GoQueue``: SavewebHQ's Go tracker client and worker SDK
  (internal/trackerclient, sdk/worker): it refuses answers that are cacheable
  or not ``application/json``, decodes them with ``DisallowUnknownFields`` into
  Go types (``job_id`` is an ``int64``: a string or ``1.0`` fails), and sends
  Go's zero values — ``null`` for an unset ``AcceptTypes``, ``meta``,
  ``details`` or receipts list.

The Go types are declared below from ``pkg/protocol/api.go``; ``decode``
applies encoding/json's rules to a parsed answer.
"""
from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import random
import secrets
import string
import time
from urllib.parse import quote, urlsplit

MAX_ANSWER = 8 << 20


def _loads(data: bytes):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(data, parse_constant=refuse)


# ================================================================ Python SDK

class PythonSdkTransportError(Exception):
    pass


class PythonSdkAPIError(Exception):
    def __init__(self, status: int, error: dict):
        super().__init__(f"HTTP {status}: {error.get('code')}: {error.get('message', '')}")
        self.status = status
        self.error = error
        self.code = str(error.get("code", "internal_error"))
        self.retryable = bool(error.get("retryable", False))
        value = error.get("retry_after_ms", 0)
        self.retry_after_ms = value if isinstance(value, int) else 0


class PythonSdkTransport:
    """One HQ origin over one keep-alive connection, as ``saveweb_hq`` talks to it."""

    def __init__(self, base_url: str, machine_token: str, client_version: str, timeout: float = 45.0):
        parsed = urlsplit(base_url)
        self.connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)
        self.headers = {"Authorization": f"Bearer {machine_token}",
                        "X-SavewebHQ-Client-Version": client_version}
        self.sent: list[tuple[str, str, dict | None]] = []

    def close(self):
        self.connection.close()

    def request(self, method: str, path: str, payload: dict | None = None) -> dict:
        body = None if payload is None else json.dumps(
            payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
        headers = {**self.headers, "Accept": "application/json", "Cache-Control": "no-store"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        self.sent.append((method, path, payload))
        try:
            self.connection.request(method, path, body=body, headers=headers)
            response = self.connection.getresponse()
            raw = response.read(MAX_ANSWER + 1)
        except (OSError, http.client.HTTPException) as exc:
            self.connection.close()
            raise PythonSdkTransportError(f"HTTP request failed: {exc}") from exc
        where = f"{method} {path} -> {response.status}"
        if len(raw) > MAX_ANSWER:
            raise PythonSdkTransportError(f"{where}: answer exceeds 8 MiB")
        if "no-store" not in response.headers.get("Cache-Control", "").lower():
            raise PythonSdkTransportError(f"{where}: HQ response is cacheable")
        try:
            decoded = _loads(raw)
        except ValueError as exc:
            raise PythonSdkTransportError(f"{where}: invalid JSON response: {exc}") from exc
        if not isinstance(decoded, dict):
            raise PythonSdkTransportError(f"{where}: JSON response must be an object")
        if not 200 <= response.status < 300:
            error = decoded.get("error")
            if not isinstance(error, dict):
                raise PythonSdkTransportError(f"{where}: has no error envelope")
            raise PythonSdkAPIError(response.status, error)
        return decoded


def python_sdk_valid_policy(policy: dict, project_id: str) -> bool:
    """The SDK's own check of a policy answer (it raises ValueError otherwise)."""
    def qps_ok(value):
        return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                 and value > 0 and value != float("inf"))

    def int_in(name, low, high):
        value = policy.get(name)
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high

    return (policy.get("project_id") == project_id and int_in("max_jobs_per_claim", 1, 256)
            and int_in("recommended_lease_seconds", 1, 3600) and int_in("policy_version", 1, 2**63)
            and int_in("refresh_after_ms", 1, 2**63) and qps_ok(policy.get("dispatch_qps"))
            and qps_ok(policy.get("worker_claim_qps")))


class PythonSdkQueue:
    """``saveweb_hq.ProjectQueue``: a fresh 7-character worker id, policy-driven
    claims that wait out retryable 429s, raw batch mutations."""

    def __init__(self, transport: PythonSdkTransport, project_id: str, sleep=time.sleep):
        self.transport = transport
        self.project_id = project_id
        self.worker_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(7))
        self.sleep = sleep
        self.rate_limited = 0

    def whoami(self) -> str:
        user_id = self.transport.request("GET", "/api/v1/whoami").get("user_id")
        if not isinstance(user_id, str) or not user_id:
            raise ValueError("tracker returned an invalid user ID")
        return user_id

    def policy(self) -> dict:
        policy = self.transport.request("GET", f"/api/v1/projects/{quote(self.project_id, safe='')}")
        if not python_sdk_valid_policy(policy, self.project_id):
            raise ValueError(f"tracker returned an invalid project policy: {policy}")
        return policy

    def claim(self, max_jobs: int = 64, lease_seconds: int | None = None,
              accept_types: list[str] | None = None) -> dict:
        while True:
            policy = self.policy()
            body = {"worker_id": self.worker_id, "max_jobs": min(max_jobs, policy["max_jobs_per_claim"]),
                    "lease_seconds": policy["recommended_lease_seconds"] if lease_seconds is None
                    else lease_seconds,
                    "accept_types": [] if accept_types is None else list(accept_types),
                    "policy_version": policy["policy_version"]}
            try:
                response = self._jobs("claim", body)
            except PythonSdkAPIError as error:
                if error.status == 429 and error.retryable and error.retry_after_ms > 0:
                    self.rate_limited += 1
                    delay = error.retry_after_ms / 1000
                    self.sleep(delay + random.random() * delay / 10)
                    continue
                raise
            if response.get("project_id") != self.project_id or not isinstance(response.get("jobs"), list):
                raise ValueError(f"tracker returned a mismatched claim response: {response}")
            return response

    def complete(self, items: list[dict]) -> dict:
        return self._jobs("complete", {"worker_id": self.worker_id, "items": items})

    def fail(self, items: list[dict]) -> dict:
        return self._jobs("fail", {"worker_id": self.worker_id, "items": items})

    def extend_lease(self, extend_seconds: int, items: list[dict]) -> dict:
        return self._jobs("extend-lease", {"worker_id": self.worker_id,
                                           "extend_seconds": extend_seconds, "items": items})

    def _jobs(self, operation: str, payload: dict) -> dict:
        return self.transport.request(
            "POST", f"/api/v1/projects/{quote(self.project_id, safe='')}/jobs/{operation}", payload)


# ============================================================ Go's decoding

class GoDecodeError(Exception):
    """What encoding/json (with DisallowUnknownFields) would return."""


def _json_kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return f"number {value}"
    return {str: "string", list: "array", dict: "object"}[type(value)]


class GoType:
    name = "?"

    def decode(self, value, path: str):
        if value is None:  # JSON null leaves a Go value at its zero value
            return None
        if not self.accepts(value):
            raise GoDecodeError(f"json: cannot unmarshal {_json_kind(value)} into Go value of type "
                                f"{self.name} (at {path or '<root>'})")
        return self.inner(value, path)

    def accepts(self, value) -> bool:
        raise NotImplementedError

    def inner(self, value, path):
        return value


class _String(GoType):
    name = "string"

    def accepts(self, value):
        return isinstance(value, str)


class _Bool(GoType):
    name = "bool"

    def accepts(self, value):
        return isinstance(value, bool)


class _Int(GoType):
    def __init__(self, bits: int):
        self.name = f"int{bits}" if bits != 64 else "int64"
        self.low, self.high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def accepts(self, value):
        return isinstance(value, int) and not isinstance(value, bool) and self.low <= value <= self.high


class _Float(GoType):
    name = "float64"

    def accepts(self, value):
        return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Any(GoType):
    name = "interface {}"

    def accepts(self, value):
        return True


class Ptr(GoType):
    def __init__(self, target: GoType):
        self.target, self.name = target, f"*{target.name}"

    def accepts(self, value):
        return self.target.accepts(value)

    def inner(self, value, path):
        return self.target.inner(value, path)


class Slice(GoType):
    def __init__(self, item: GoType):
        self.item, self.name = item, f"[]{item.name}"

    def accepts(self, value):
        return isinstance(value, list)

    def inner(self, value, path):
        return [self.item.decode(v, f"{path}[{i}]") for i, v in enumerate(value)]


class Map(GoType):
    def __init__(self, item: GoType):
        self.item, self.name = item, f"map[string]{item.name}"

    def accepts(self, value):
        return isinstance(value, dict)

    def inner(self, value, path):
        return {k: self.item.decode(v, f"{path}.{k}") for k, v in value.items()}


class Struct(GoType):
    """A Go struct: JSON keys match field tags exactly, else case-insensitively;
    any other key is an unknown field."""

    def __init__(self, name: str, **fields: GoType):
        self.name, self.fields = f"protocol.{name}", fields
        self._folded = {key.lower(): key for key in fields}

    def accepts(self, value):
        return isinstance(value, dict)

    def inner(self, value, path):
        out = {}
        for key, item in value.items():
            field = key if key in self.fields else self._folded.get(key.lower())
            if field is None:
                raise GoDecodeError(f'json: unknown field "{key}" (in {self.name} at {path or "<root>"})')
            out[field] = self.fields[field].decode(item, f"{path}.{field}" if path else field)
        return out


STRING, BOOL, INT, INT32, INT64, FLOAT64, ANY = _String(), _Bool(), _Int(64), _Int(32), _Int(64), _Float(), _Any()
ATTRS = Map(ANY)

# From pkg/protocol/api.go (JobSpecV1 is embedded, so its fields sit beside the others).
JOB_SPEC = dict(id=STRING, value=STRING, type=STRING, via=Ptr(STRING), hops=INT, attr=ATTRS)
API_ERROR = Struct("APIError", code=STRING, message=STRING, retryable=BOOL, retry_after_ms=INT64,
                   details=ATTRS)
ERROR_ENVELOPE = Struct("ErrorEnvelope", error=API_ERROR)
WHO_AM_I = Struct("WhoAmIResponse", user_id=STRING)
CLAIMED_JOB = Struct("ClaimedJob", **JOB_SPEC, job_id=INT64, attempt_id=STRING, lease_expires_at=INT64)
CLAIM_RESPONSE = Struct("ProjectClaimResponse", project_id=STRING, jobs=Slice(CLAIMED_JOB),
                        retry_after_ms=INT64, policy_version=INT64)
POLICY = Struct("ProjectPolicy", project_id=STRING, dispatch_qps=Ptr(FLOAT64),
                worker_claim_qps=Ptr(FLOAT64), max_jobs_per_claim=INT,
                recommended_lease_seconds=INT64, policy_version=INT64, refresh_after_ms=INT64)
ITEM_RESULT = Struct("ItemResult", job_id=INT64, attempt_id=STRING, status=STRING,
                     job_status=Ptr(STRING), lease_expires_at=Ptr(INT64), error=Ptr(API_ERROR))
BATCH_RESULT = Struct("BatchResultResponse", results=Slice(ITEM_RESULT))
PROJECT_SUMMARY = Struct(
    "AdminProjectSummary", id=STRING, status=STRING, identity_mode=STRING, claim_order=STRING,
    dispatch_qps=Ptr(FLOAT64), worker_claim_qps=Ptr(FLOAT64), max_jobs_per_claim=INT, max_resets=INT,
    recommended_lease_seconds=INT64, client_versions=Slice(STRING), policy_version=INT64,
    job_counts=Map(INT64), created_at=INT64, updated_at=INT64)
ENQUEUE_RESPONSE = Struct("AdminEnqueueJobsResponse", project_id=STRING, submitted=INT, inserted=INT64)
SOURCE_RESPONSE = Struct("AdminEnqueueSourceResponse", project_id=STRING, jobs=INT64, inserted=INT64,
                         uncompressed_bytes=INT64)


def go_marshal(value) -> bytes:
    """encoding/json.Marshal: compact, with <, > and & escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text.encode()


def go_default_job_id(job_type: str, value: str) -> str:
    """protocol.DefaultJobID: ``j1_`` + SHA-256 of type, NUL, value (type defaults to seed)."""
    return "j1_" + hashlib.sha256((job_type or "seed").encode() + b"\0" + value.encode()).hexdigest()


# ============================================================== Go client

class GoClientError(Exception):
    pass


class GoAPIError(Exception):
    def __init__(self, status: int, api: dict):
        super().__init__(f"tracker HTTP {status}: {api.get('code')}: {api.get('message')}")
        self.status, self.api = status, api


class GoClient:
    """internal/trackerclient.Client: one request per call, strict answers."""

    def __init__(self, base_url: str, machine_token: str, client_version: str = ""):
        parsed = urlsplit(base_url)
        self.host, self.port = parsed.hostname, parsed.port
        self.token, self.client_version = machine_token, client_version
        self.sent: list[tuple[str, str, bytes | None]] = []

    def do(self, method: str, path: str, out: GoType, body: bytes | None = None,
           content_type: str = ""):
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json",
                   "Cache-Control": "no-store, no-cache, max-age=0",
                   "User-Agent": "Go-http-client/1.1", "Accept-Encoding": "gzip"}
        if self.client_version:
            headers["X-SavewebHQ-Client-Version"] = self.client_version
        if content_type:
            headers["Content-Type"] = content_type
        self.sent.append((method, path, body))
        connection = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            raw = response.read(MAX_ANSWER + 1)
        finally:
            connection.close()
        where = f"{method} {path} -> {response.status}"
        if response.headers.get("Content-Encoding", "").lower() == "gzip":
            raw = gzip.decompress(raw)  # Go's transport undoes the gzip it asked for
        if "no-store" not in response.headers.get("Cache-Control", "").lower():
            raise GoClientError(f"{where}: tracker client: response is cacheable")
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            raise GoClientError(f"{where}: tracker client: response is not JSON ({media_type!r})")
        decoder = json.JSONDecoder()
        text = raw[:MAX_ANSWER].decode("utf-8", "replace")
        try:
            value, end = decoder.raw_decode(text, len(text) - len(text.lstrip()))
        except ValueError as exc:
            raise GoClientError(f"{where}: {exc}") from exc
        if not 200 <= response.status < 300:
            try:
                envelope = ERROR_ENVELOPE.decode(value, "")
            except GoDecodeError as exc:
                raise GoClientError(f"{where}: {exc}: {text[:300]}") from exc
            raise GoAPIError(response.status, (envelope or {}).get("error") or {})
        try:
            decoded = out.decode(value, "")
        except GoDecodeError as exc:
            raise GoClientError(f"{where}: {exc}: {text[:300]}") from exc
        if text[end:].strip():
            raise GoClientError(f"{where}: tracker client: trailing JSON")
        return decoded

    def json_call(self, path: str, request: dict, out: GoType):
        return self.do("POST", path, out, go_marshal(request), "application/json")


class GoQueue:
    """sdk/worker.ProjectQueue: claims with the policy's lease, checks each
    claimed job, finishes one job per request and renews leases in batches."""

    def __init__(self, client: GoClient, project_id: str):
        self.client, self.project_id = client, project_id
        alphabet = string.ascii_lowercase + string.digits
        self.worker_id = "".join(secrets.choice(alphabet) for _ in range(7))

    def _path(self, tail: str = "") -> str:
        return f"/api/v1/projects/{quote(self.project_id, safe='')}{tail}"

    def policy(self) -> dict:
        policy = self.client.do("GET", self._path(), POLICY)
        qps_ok = all(policy.get(k) is None or policy[k] > 0 for k in ("dispatch_qps", "worker_claim_qps"))
        if (policy.get("project_id") != self.project_id or not 1 <= (policy.get("max_jobs_per_claim") or 0) <= 256
                or not 1 <= (policy.get("recommended_lease_seconds") or 0) <= 3600
                or (policy.get("policy_version") or 0) < 1 or (policy.get("refresh_after_ms") or 0) < 1
                or not qps_ok):
            raise GoClientError(f"worker: tracker returned an invalid project policy: {policy}")
        return policy

    def claim(self, max_jobs: int, accept_types: list[str] | None = None) -> list[dict]:
        policy = self.policy()
        request = {"worker_id": self.worker_id, "max_jobs": min(max_jobs, policy["max_jobs_per_claim"]),
                   "lease_seconds": policy["recommended_lease_seconds"],
                   # append([]string(nil), options.AcceptTypes...) is nil when unset or empty
                   "accept_types": list(accept_types) if accept_types else None,
                   "policy_version": policy["policy_version"]}
        result = self.client.json_call(self._path("/jobs/claim"), request, CLAIM_RESPONSE)
        if result.get("project_id") != self.project_id:
            raise GoClientError("worker: tracker returned a mismatched project")
        jobs = result.get("jobs") or []
        for job in jobs:
            if (job.get("job_id") or 0) < 1 or not job.get("attempt_id"):
                raise GoClientError(f"worker: tracker returned an invalid claimed job: {job}")
        return jobs

    def _finish(self, job: dict, operation: str, item: dict) -> None:
        request = {"worker_id": self.worker_id,
                   "items": [{"job_id": job["job_id"], "attempt_id": job["attempt_id"], **item}]}
        result = self.client.json_call(self._path(f"/jobs/{operation}"), request, BATCH_RESULT)
        results = result.get("results") or []
        if (len(results) != 1 or results[0].get("job_id") != job["job_id"]
                or results[0].get("attempt_id") != job["attempt_id"]):
            raise GoClientError(f"worker: tracker returned a mismatched job result: {result}")
        if results[0].get("status") != "applied":
            raise GoClientError(f"worker: job lease lost: {results[0]}")

    def complete(self, job: dict, outcome: dict, receipts: list[dict] | None = None) -> None:
        # protocol.Outcome{Kind: …} leaves Code, URI and Meta nil: they go as null.
        full = {"kind": outcome["kind"], "code": outcome.get("code"), "uri": outcome.get("uri"),
                "meta": outcome.get("meta")}
        self._finish(job, "complete", {"outcome": full, "artifact_receipts": receipts or None})

    def fail(self, job: dict, retryable: bool, code: str, message: str, details: dict | None = None):
        self._finish(job, "fail", {"retryable": retryable,
                                   "error": {"code": code, "message": message, "details": details}})

    def renew(self, jobs: list[dict], lease_seconds: int) -> dict:
        """One renewJobBatch: returns the results by attempt id (only the ones
        whose job id matches, as the SDK does)."""
        request = {"worker_id": self.worker_id, "extend_seconds": lease_seconds,
                   "items": [{"job_id": j["job_id"], "attempt_id": j["attempt_id"]} for j in jobs]}
        result = self.client.json_call(self._path("/jobs/extend-lease"), request, BATCH_RESULT)
        held = {j["attempt_id"]: j["job_id"] for j in jobs}
        return {r["attempt_id"]: r for r in result.get("results") or []
                if held.get(r.get("attempt_id")) == r.get("job_id")}


class GoHqctl:
    """cmd/hqctl over the Go client: ``enqueue`` reads the project first, fills
    ``j1_`` ids for external_id projects, posts batches and checks each answer;
    ``enqueue-source`` posts the file and checks the answer."""

    def __init__(self, client: GoClient):
        self.client = client

    @staticmethod
    def _path(project_id: str, tail: str = "") -> str:
        return f"/api/v1/admin/projects/{quote(project_id, safe='')}{tail}"

    def enqueue_values(self, project_id: str, values: list[str], job_type: str = "",
                       batch_size: int = 1000) -> dict:
        project = self.client.do("GET", self._path(project_id), PROJECT_SUMMARY)
        result = {"project_id": project.get("id"), "identity_mode": project.get("identity_mode"),
                  "submitted": 0, "inserted": 0, "batches": 0}
        for start in range(0, len(values), batch_size):
            batch = []
            for value in values[start:start + batch_size]:
                job = {"value": value}  # AdminEnqueueJob: empty fields are omitted
                if job_type:
                    job["type"] = job_type
                if project.get("identity_mode") == "external_id":
                    job = {"id": go_default_job_id(job_type, value), **job}
                batch.append(job)
            answer = self.client.do("POST", self._path(project_id, "/jobs"), ENQUEUE_RESPONSE,
                                    go_marshal({"jobs": batch}), "application/json")
            if (answer.get("project_id") != project.get("id") or answer.get("submitted") != len(batch)
                    or not 0 <= (answer.get("inserted") or 0) <= len(batch)):
                raise GoClientError(f"enqueue: batch {result['batches'] + 1} returned an invalid response: "
                                    f"{answer}")
            result["submitted"] += answer["submitted"]
            result["inserted"] += answer.get("inserted") or 0
            result["batches"] += 1
        return result

    def enqueue_source(self, project_id: str, source: bytes) -> dict:
        answer = self.client.do("POST", self._path(project_id, "/source"), SOURCE_RESPONSE, source,
                                "application/zstd")
        jobs, inserted = answer.get("jobs") or 0, answer.get("inserted") or 0
        if (answer.get("project_id") != project_id or jobs < 0 or not 0 <= inserted <= jobs
                or (answer.get("uncompressed_bytes") or 0) < 0):
            raise GoClientError(f"enqueue-source: server returned an invalid response: {answer}")
        return answer
