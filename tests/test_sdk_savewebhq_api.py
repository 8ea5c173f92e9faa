"""SavewebHQ's Python SDK API (``saveweb_hq``) served by ``workers.sdk.savewebhq``.

A worker written for ``saveweb_hq`` runs, as a real process against a live
master, with only its import line changed; the other tests pin the parts of
that API a script relies on: what ``claim`` sends and returns, batch reports,
``whoami``, ``default_job_id`` and SavewebHQ's errors.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.helpers import sql
from tests.savewebhq_wire import CLIENT_VERSION, hq, hq_server, receipt, specs  # noqa: F401
from workers import sdk as fleet_sdk
from workers.sdk import savewebhq
from workers.sdk.savewebhq import (APIError, Config, SavewebHQError, TransportError,
                                   default_job_id, open_project_queue, whoami)

ROOT = Path(__file__).resolve().parent.parent
P = "proj"

# saveweb_hq/__init__.py's __all__, copied by hand.
SAVEWEB_HQ_ALL = ["APIError", "Config", "ProjectQueue", "SavewebHQError", "TransportError",
                  "default_job_id", "open_project_queue", "whoami"]

# The usage example of SavewebHQ's sdk/python/README.md, grown into a whole
# worker: claim, extend, upload (a receipt stands in), complete and fail by batch.
SAVEWEB_HQ_WORKER = '''\
import json, os, time
from saveweb_hq import APIError, Config, open_project_queue, whoami

config = Config(
    tracker_url=os.environ["HQ_URL"],
    machine_token=os.environ["HQ_TOKEN"],
    client_version=os.environ["HQ_CLIENT_VERSION"],
    allow_http_tracker=True,
)
report = {"user": whoami(config), "claims": 0, "results": []}
with open_project_queue(config, os.environ["HQ_PROJECT"]) as queue:
    report["worker_id"] = queue.worker_id
    while True:
        response = queue.claim(max_jobs=64)
        report["claims"] += 1
        if not response["jobs"]:
            break
        refs = [{"job_id": job["job_id"], "attempt_id": job["attempt_id"]}
                for job in response["jobs"]]
        report["extended"] = [r["status"] for r in queue.extend_lease(600, refs)["results"]]
        done, failed = [], []
        for job, ref in zip(response["jobs"], refs):
            if job["value"].endswith("/gone"):
                failed.append({**ref, "retryable": False,
                               "error": {"code": "gone", "message": "410", "details": {}}})
            else:
                # Upload artifacts to the external Artifact Receiver, then
                # include its receipts in complete().
                done.append({**ref, "outcome": {"kind": "success", "code": 200,
                                                "uri": None, "meta": {}},
                             "artifact_receipts": [{
                                 "id": "receipt-" + job["id"],
                                 "issuer": "https://artifacts.example",
                                 "object_id": job["id"], "checksum": "sha256:" + "ab" * 32,
                                 "size_bytes": 123, "accepted_at": int(time.time())}]})
        for batch, report_batch in ((done, queue.complete), (failed, queue.fail)):
            if batch:
                report["results"] += report_batch(batch)["results"]
    try:
        queue.claim(max_jobs=0)
    except ValueError as error:
        report["bad_claim"] = str(error)
print(json.dumps(report))
'''


def run_script(source: str, env: dict) -> dict:
    """Run a worker script in a process of its own; its JSON report."""
    done = subprocess.run([sys.executable, "-c", source], cwd=ROOT, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def config(hq, **overrides) -> Config:
    fields = {"tracker_url": hq.url, "machine_token": hq.worker.token,
              "client_version": CLIENT_VERSION, "allow_http_tracker": True, **overrides}
    return Config(**fields)


def refs(jobs: list[dict]) -> list[dict]:
    return [{"job_id": job["job_id"], "attempt_id": job["attempt_id"]} for job in jobs]


def success(job: dict, n: int) -> dict:
    return {**refs([job])[0], "outcome": {"kind": "success", "code": 200, "uri": None, "meta": {}},
            "artifact_receipts": [receipt(n)]}


# ============================================================ the whole script

def test_a_saveweb_hq_worker_runs_with_only_its_import_changed(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(3, "ok") + [{"id": "bad-0", "value": "https://example.test/gone",
                                     "type": "seed"}])
    source = SAVEWEB_HQ_WORKER.replace("from saveweb_hq import",
                                       "from workers.sdk.savewebhq import")
    assert source.count("\n") == SAVEWEB_HQ_WORKER.count("\n") and source != SAVEWEB_HQ_WORKER

    report = run_script(source, {"HQ_URL": hq.url, "HQ_TOKEN": hq.worker.token,
                                 "HQ_CLIENT_VERSION": CLIENT_VERSION, "HQ_PROJECT": P})

    assert report["user"] == "hq-worker"
    assert report["claims"] == 2 and report["extended"] == ["applied"] * 4
    assert sorted((r["status"], r["job_status"]) for r in report["results"]) == [
        ("applied", "done")] * 3 + [("applied", "failed")]
    assert report["bad_claim"] == "max_jobs must be positive"
    done = [hq.job(P, r["job_id"]) for r in report["results"] if r["job_status"] == "done"]
    assert sorted(job["artifact_receipts"][0]["id"] for job in done) == [
        "receipt-ok-0", "receipt-ok-1", "receipt-ok-2"]
    workers = sql(hq.app, "SELECT DISTINCT worker_id FROM attempts WHERE project_id = :p", p=P)
    assert workers == [(report["worker_id"],)]


# ==================================================================== surface

def test_public_names_are_saveweb_hqs():
    assert savewebhq.__all__ == SAVEWEB_HQ_ALL
    assert sorted(name for name in vars(savewebhq) if not name.startswith("_")) == SAVEWEB_HQ_ALL


def test_errors_fit_both_trees():
    assert SavewebHQError is fleet_sdk.FleetHQError
    assert TransportError is fleet_sdk.TransportError
    assert issubclass(APIError, fleet_sdk.APIError) and issubclass(APIError, SavewebHQError)
    error = APIError(429, {"code": "project_dispatch_rate_limited", "message": "slow down",
                           "retryable": True, "retry_after_ms": 25})
    assert (error.status, error.code, error.retryable, error.retry_after_ms) == (
        429, "project_dispatch_rate_limited", True, 25)
    assert str(error) == "HTTP 429: project_dispatch_rate_limited: slow down"
    bare = APIError(500, {})
    assert (bare.code, bare.retryable, bare.retry_after_ms, bare.error) == (
        "internal_error", False, 0, {})


@pytest.mark.parametrize("value, job_type, expected", [
    ("https://example.org/", "seed",
     "j1_92f50438a02ab171b6735678275a2f9db233d4c88e301a0243886c2679ce7070"),
    ("https://example.org/a.png", "asset",
     "j1_3415498e0d810218fb682c5192529b4ec15d74dfbaedf293c3b13d5d5c652998"),
    ("https://例子.测试/路径", "seed",
     "j1_6f244c2352df6cd3f399df55501a1b77c57f98b85a94a2193849f5532e766528"),
])
def test_default_job_id_takes_the_type_first(value, job_type, expected):
    """SavewebHQ's job-id-v1 vectors, in SavewebHQ's argument order."""
    assert default_job_id(job_type, value) == expected
    assert default_job_id("", value) == default_job_id("seed", value)


@pytest.mark.parametrize("fields, message", [
    ({"tracker_url": ""}, "required"),
    ({"machine_token": ""}, "required"),
    ({"client_version": ""}, "required"),
    ({"request_timeout": 0.5}, "between 1 and 600"),
    ({"request_timeout": 600.5}, "between 1 and 600"),
])
def test_config_validation_refuses_before_anything_is_sent(fields, message):
    bad = Config(**{"tracker_url": "https://hq.test", "machine_token": "t",
                    "client_version": "v1", **fields})
    for call in (bad.validate, lambda: open_project_queue(bad, P), lambda: whoami(bad)):
        with pytest.raises(ValueError, match=message):
            call()


def test_config_accepts_its_bounds_and_is_frozen():
    for timeout in (1.0, 600.0):
        Config("https://hq.test", "t", "v1", request_timeout=timeout).validate()
    with pytest.raises(AttributeError):
        Config("https://hq.test", "t", "v1").tracker_url = "https://elsewhere"


def test_plain_http_is_refused_without_the_allow_flag(hq):
    plain = config(hq, allow_http_tracker=False)
    for call in (lambda: open_project_queue(plain, P), lambda: whoami(plain)):
        with pytest.raises(TransportError, match="allow_http_tracker"):
            call()


def test_opening_sends_nothing_and_each_queue_has_its_own_worker_id():
    # Nothing listens on port 9: an open that called the master would fail.
    nowhere = Config("http://127.0.0.1:9", "t", "v1", allow_http_tracker=True)
    with open_project_queue(nowhere, P) as first, open_project_queue(nowhere, P) as second:
        ids = [first.worker_id, second.worker_id]
    assert ids[0] != ids[1]
    assert all(len(i) == 7 and set(i) <= set("abcdefghijklmnopqrstuvwxyz0123456789") for i in ids)
    with pytest.raises(ValueError, match="project_id is required"):
        open_project_queue(nowhere, "")


# ====================================================================== claims

def test_claim_returns_the_raw_answer_with_policy_defaults(hq):
    hq.put_project(P, max_jobs_per_claim=3, recommended_lease_seconds=120)
    hq.enqueue(P, specs(2, "s", "seed") + specs(2, "a", "asset"))
    with open_project_queue(config(hq), P) as queue:
        started = time.time()
        response = queue.claim()
        assert sorted(response) == ["jobs", "policy_version", "project_id", "retry_after_ms"]
        assert response["project_id"] == P and len(response["jobs"]) == 3
        assert all(type(job["job_id"]) is int for job in response["jobs"])
        assert all(started + 115 <= job["lease_expires_at"] <= time.time() + 121
                   for job in response["jobs"])
        rest = queue.claim(lease_seconds=30, accept_types=["asset", "seed"])["jobs"]
        assert len(rest) == 1 and rest[0]["lease_expires_at"] <= time.time() + 31


def test_accept_types_filters_and_an_empty_list_means_every_type(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(2, "s", "seed") + specs(2, "a", "asset"))
    with open_project_queue(config(hq), P) as queue:
        assert [j["type"] for j in queue.claim(accept_types=["asset"])["jobs"]] == ["asset"] * 2
        assert [j["type"] for j in queue.claim(accept_types=[])["jobs"]] == ["seed"] * 2


def test_an_explicit_429_is_waited_out(hq):
    hq.put_project(P, dispatch_qps=1)
    hq.enqueue(P, specs(2))
    with open_project_queue(config(hq), P) as queue:
        assert len(queue.claim()["jobs"]) == 1
        started = time.monotonic()
        assert len(queue.claim()["jobs"]) == 1
        # One token a second: the second claim cannot have been served sooner.
        assert time.monotonic() - started >= 0.5


def test_worker_claim_qps_paces_claims(hq):
    hq.put_project(P, worker_claim_qps=4)
    with open_project_queue(config(hq), P) as queue:
        queue.claim()
        started = time.monotonic()
        for _ in range(2):
            queue.claim()
        assert time.monotonic() - started >= 2 * 0.25


# ===================================================================== reports

def test_256_completions_with_receipts_in_one_batch(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(256))
    with open_project_queue(config(hq), P) as queue:
        jobs = queue.claim(max_jobs=256)["jobs"]
        assert len(jobs) == 256
        results = queue.complete([success(job, n) for n, job in enumerate(jobs)])["results"]
    assert [(r["job_id"], r["status"], r["job_status"]) for r in results] == [
        (job["job_id"], "applied", "done") for job in jobs]


def test_fail_and_extend_batches_return_raw_results(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(2))
    with open_project_queue(config(hq), P) as queue:
        first, second = queue.claim()["jobs"]
        extended = queue.extend_lease(600, refs([first, second]))["results"]
        assert [r["status"] for r in extended] == ["applied"] * 2
        assert all(r["lease_expires_at"] >= time.time() + 590 for r in extended)
        items = [{**refs([job])[0], "retryable": retryable,
                  "error": {"code": "fetch_failed", "message": "boom", "details": {}}}
                 for job, retryable in ((first, True), (second, False))]
        results = queue.fail(items)["results"]
        assert [(r["status"], r["job_status"]) for r in results] == [
            ("applied", "todo"), ("applied", "failed")]
        # A report for an attempt that already ended is answered per item, not raised.
        again = queue.complete([success(first, 0)])["results"]
        assert [(r["job_id"], r["status"]) for r in again] == [(first["job_id"], "rejected")]


def test_a_batch_over_256_is_an_api_error(hq):
    hq.put_project(P)
    with open_project_queue(config(hq), P) as queue:
        with pytest.raises(APIError) as raised:
            queue.complete([{"job_id": n + 1, "attempt_id": "1"} for n in range(257)])
    assert (raised.value.status, raised.value.code) == (400, "invalid_request")
    assert "1..256" in raised.value.error["message"]


# ====================================================================== errors

def test_a_wrong_token_is_an_api_error_with_status_and_code(hq):
    wrong = config(hq, machine_token="hq_wrong")
    with pytest.raises(APIError) as raised:
        whoami(wrong)
    assert (raised.value.status, raised.value.code, raised.value.retryable) == (
        401, "invalid_machine_token", False)
    assert raised.value.error["code"] == "invalid_machine_token" and raised.value.error["message"]
    assert isinstance(raised.value, fleet_sdk.FleetHQError)
    with open_project_queue(wrong, P) as queue, pytest.raises(APIError) as raised:
        queue.claim()
    assert (raised.value.status, raised.value.code) == (401, "invalid_machine_token")


def test_a_client_version_off_the_allow_list_is_a_426(hq):
    hq.put_project(P, client_versions=["other-v1"])
    with open_project_queue(config(hq), P) as queue, pytest.raises(APIError) as raised:
        queue.claim()
    assert (raised.value.status, raised.value.code) == (426, "client_upgrade_required")


def test_a_missing_project_is_a_404(hq):
    with open_project_queue(config(hq), "missing") as queue, pytest.raises(APIError) as raised:
        queue.claim()
    assert (raised.value.status, raised.value.code) == (404, "not_found")


# ============================================ answers only a stand-in can give

NO_STORE = {"Cache-Control": "no-store", "Content-Type": "application/json"}
WHOAMI = (200, b'{"user_id": "u1"}', NO_STORE)


class StandIn:
    """A tiny HTTP server giving canned answers (status, body, headers) in
    turn, the last one for ever, and keeping each request's headers."""

    def __init__(self, answers: list[tuple[int, bytes, dict]]):
        self.requests: list[dict] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                stand_in.requests.append(dict(self.headers))
                status, body, headers = answers[min(len(stand_in.requests), len(answers)) - 1]
                self.send_response(status)
                for name, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.config = Config(f"http://127.0.0.1:{self.server.server_address[1]}", "tok",
                             "sinavideo/2.4.0", allow_http_tracker=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in():
    servers = []

    def start(*answers) -> StandIn:
        servers.append(StandIn(list(answers)))
        return servers[-1]
    yield start
    for server in servers:
        server.close()


def test_sends_savewebhqs_client_version_header(stand_in):
    server = stand_in(WHOAMI)
    assert whoami(server.config) == "u1"
    (headers,) = server.requests
    assert headers["X-SavewebHQ-Client-Version"] == "sinavideo/2.4.0"
    assert headers["Authorization"] == "Bearer tok"


@pytest.mark.parametrize("status, body, headers, message", [
    (400, b"bad request", {"Cache-Control": "no-store"}, "no error envelope"),
    (200, b'{"user_id": "u1"}', {"Cache-Control": "no-store, max-age=60"}, "cacheable"),
    (200, b"not json", {"Cache-Control": "no-store"}, "not JSON"),
    (302, b"", {"Location": "https://elsewhere.example/"}, "not following it"),
])
def test_untrustworthy_answers_are_transport_errors(stand_in, status, body, headers, message):
    server = stand_in((status, body, headers))
    with pytest.raises(TransportError, match=message):
        whoami(server.config)
    assert len(server.requests) == 1  # refused, not retried


def test_a_malformed_policy_is_a_transport_error(stand_in):
    server = stand_in((200, json.dumps({"project_id": P}).encode(), NO_STORE))
    with open_project_queue(server.config, P) as queue, pytest.raises(TransportError,
                                                                       match="policy"):
        queue.claim()
    assert len(server.requests) == 1


def test_5xx_is_retried_by_fleethqs_retry_policy(stand_in):
    """The one retry policy of the worker side, not SavewebHQ's 429-only one."""
    server = stand_in((503, b"busy", {}), WHOAMI)
    assert whoami(server.config) == "u1"
    assert len(server.requests) == 2


def test_a_429_asking_for_too_long_a_pause_is_raised_with_its_hint(stand_in):
    envelope = {"error": {"code": "project_dispatch_rate_limited", "message": "slow down",
                          "retryable": True, "retry_after_ms": 200_000}}
    server = stand_in((429, json.dumps(envelope).encode(), NO_STORE))
    with pytest.raises(APIError) as raised:
        whoami(server.config)
    assert (raised.value.status, raised.value.retryable, raised.value.retry_after_ms) == (
        429, True, 200_000)
    assert len(server.requests) == 1
