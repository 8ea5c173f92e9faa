"""The Python SDK (``workers.sdk``) against the real master over HTTP, plus
a few transport rules checked with a mock requests adapter.

The master runs in ``live_server`` (real PostgreSQL); faults the master does
not produce on demand (503s, dropped connections, redirects) come from tiny
local HTTP servers in front of it.
"""
from __future__ import annotations

import dataclasses
import http.server
import json
import re
import threading
import time
import types
import uuid

import pytest
import requests

import workers.sdk as sdk
from tests.helpers import Api, sql, values
from workers.sdk import (
    AuthError,
    LeaseLost,
    ProtocolError,
    RetryPolicy,
    ServerError,
    TransportError,
    UpgradeRequired,
    open_project_queue,
)

VERSION = "sdk-test/1"
FAST_RETRY = RetryPolicy(attempts=6, backoff_base_s=0.01, backoff_cap_s=0.05)


class RecordingSession(requests.Session):
    """A requests session that remembers what it sent and what came back."""

    def __init__(self, fail_paths: tuple[str, ...] = ()):
        super().__init__()
        self.sent: list[tuple[str, str, dict | None]] = []
        self.statuses: list[int] = []
        self.fail_paths = fail_paths  # simulate a network cut for these routes

    def request(self, method, url, **kw):
        self.sent.append((method, url, kw.get("json")))
        if any(url.endswith(p) for p in self.fail_paths):
            raise requests.ConnectionError("simulated network cut")
        response = super().request(method, url, **kw)
        self.statuses.append(response.status_code)
        return response

    def bodies(self, route: str) -> list[dict]:
        return [body for _, url, body in self.sent if url.endswith(route)]


@pytest.fixture
def admin(live_server, admin_token):
    return Api(requests.Session(), admin_token, version=VERSION, base=live_server.url)


@pytest.fixture
def worker_token(make_user):
    return make_user("sdk-worker", ["worker"])


def new_project(admin, **fields) -> str:
    project_id = f"sdk-{uuid.uuid4().hex[:8]}"
    fields.setdefault("client_versions", [VERSION])
    admin.put_project(project_id, **fields)
    return project_id


def enqueue(admin, project_id: str, n: int) -> None:
    response = admin.enqueue(project_id, values(n))
    assert response.status_code == 200, response.text


def open_queue(url, token, project_id, **kw):
    kw.setdefault("allow_http", True)  # loopback test server
    kw.setdefault("worker_id", "w1")
    return open_project_queue(url, token, project_id, client_version=VERSION, **kw)


# ------------------------------------------------------------- round trip

def test_claim_complete_fail_round_trip(live_server, admin, worker_token):
    project = new_project(admin)
    admin.enqueue(project, [{"id": "a", "value": "https://example.org/a", "attr": {"k": 1}},
                            {"id": "b", "value": "https://example.org/b", "type": "asset"},
                            {"id": "c", "value": "https://example.org/c", "hops": 2}])
    with open_queue(live_server.url, worker_token, project) as queue:
        assert queue.policy.project_id == project
        jobs = queue.claim()
        assert [j.info.id for j in jobs] == ["a", "b", "c"]
        a, b, c = jobs
        assert (a.info.value, a.info.type, a.info.attr) == ("https://example.org/a", "seed", {"k": 1})
        assert (b.info.type, c.info.hops, c.info.via) == ("asset", 2, None)
        with pytest.raises(dataclasses.FrozenInstanceError):
            a.info.value = "x"
        assert a.lease_expires_at == a.info.lease_expires_at > time.time()

        done = a.complete(code=200, uri="https://example.org/a.pdf", meta={"bytes": 3})
        assert (done.status, done.job_status) == ("applied", "done")
        # A lost response makes the worker send again: the replay is applied.
        assert a.complete(code=200, uri="https://example.org/a.pdf", meta={"bytes": 3}).status == "applied"
        assert b.fail("not_found", "gone", retryable=False).job_status == "failed"
        assert c.fail("network", "x" * 5000).job_status == "todo"  # message cut to 2048 bytes
        assert not any(j.cancelled.is_set() for j in jobs)
    assert admin.counts(project) == {"todo": 1, "wip": 0, "staged": 0, "done": 1,
                                     "failed": 1, "reset_exhausted": 0}


def test_long_poll_claim_returns_when_a_job_arrives(live_server, admin, worker_token):
    project = new_project(admin)
    with open_queue(live_server.url, worker_token, project, long_poll_ms=10_000) as queue:
        threading.Timer(0.5, enqueue, (admin, project, 1)).start()
        started = time.monotonic()
        jobs = queue.claim()
        assert len(jobs) == 1 and time.monotonic() - started < 8
        jobs[0].complete()


def test_each_queue_gets_a_fresh_seven_character_worker_id(live_server, admin, worker_token, app):
    """As SavewebHQ's SDKs: a random a-z0-9 id per queue instance, mapped
    to the token's user by the master on its first claim."""
    project = new_project(admin)
    enqueue(admin, project, 1)
    ids = []
    for _ in range(2):
        with open_queue(live_server.url, worker_token, project, worker_id=None) as queue:
            assert re.fullmatch(r"[a-z0-9]{7}", queue.worker_id)
            ids.append(queue.worker_id)
            for job in queue.claim():
                job.complete()
    assert ids[0] != ids[1]
    mapped = dict(sql(app, "SELECT worker_id, user_id FROM worker_users"))
    assert ids[0] in mapped


# ----------------------------------------------------------------- policy

def test_claims_are_clamped_to_max_jobs_per_claim(live_server, admin, worker_token):
    project = new_project(admin, max_jobs_per_claim=5)
    enqueue(admin, project, 20)
    session = RecordingSession()
    with open_queue(live_server.url, worker_token, project, session=session) as queue:
        assert len(queue.claim()) == 5
        assert len(queue.claim(max_jobs=100)) == 5
        assert len(queue.claim(max_jobs=3)) == 3
    assert [b["max_jobs"] for b in session.bodies("/jobs/claim")] == [5, 5, 3]


def test_policy_change_is_picked_up_after_the_claim_that_reveals_it(live_server, admin, worker_token):
    project = new_project(admin, max_jobs_per_claim=2)
    enqueue(admin, project, 30)
    session = RecordingSession()
    with open_queue(live_server.url, worker_token, project, session=session) as queue:
        version = queue.policy.policy_version
        assert len(queue.claim(max_jobs=50)) == 2
        patched = admin.call("PATCH", f"/api/v1/fleethq/projects/{project}", {"max_jobs_per_claim": 7})
        assert patched.status_code == 200, patched.text
        # This claim still asks with the old policy; its answer carries the
        # new policy_version, so the SDK reads the policy again.
        assert len(queue.claim(max_jobs=50)) == 2
        assert queue.policy.policy_version > version
        assert queue.policy.max_jobs_per_claim == 7
        assert len(queue.claim(max_jobs=50)) == 7
    assert [b["max_jobs"] for b in session.bodies("/jobs/claim")] == [2, 2, 7]
    assert [b["policy_version"] for b in session.bodies("/jobs/claim")][-1] > version


def test_worker_claim_qps_paces_claims(live_server, admin, worker_token):
    project = new_project(admin, worker_claim_qps=5)
    with open_queue(live_server.url, worker_token, project) as queue:
        started = time.monotonic()
        for _ in range(6):
            assert queue.claim() == []
        # Five intervals of at least 1/5 s each, plus a random initial phase.
        assert time.monotonic() - started >= 0.95


# ---------------------------------------------------------------- leases

def test_renewal_keeps_a_job_past_its_original_lease(live_server, admin, worker_token):
    project = new_project(admin)
    enqueue(admin, project, 1)
    with open_queue(live_server.url, worker_token, project, lease_seconds=2) as queue:
        (job,) = queue.claim()
        time.sleep(5)
        assert not job.cancelled.is_set(), job.cancel_reason
        assert job.lease_expires_at > job.info.lease_expires_at
        assert job.complete().status == "applied"


def test_renewals_are_batched_by_at_most_256(live_server, admin, worker_token):
    project = new_project(admin)
    enqueue(admin, project, 300)
    session = RecordingSession()
    with open_queue(live_server.url, worker_token, project, lease_seconds=4,
                    session=session) as queue:
        jobs = queue.claim() + queue.claim()
        assert len(jobs) == 300
        time.sleep(2.5)
        renewals = session.bodies("/jobs/extend-lease")
        assert renewals and all(1 <= len(b["items"]) <= 256 for b in renewals)
        assert max(len(b["items"]) for b in renewals) == 256
        renewed = {item["attempt_id"] for b in renewals for item in b["items"]}
        assert renewed == {j.info.attempt_id for j in jobs}
        assert [t.name for t in threading.enumerate()].count(queue.renewal_thread.name) == 1
        assert not any(j.cancelled.is_set() for j in jobs)


def test_lost_lease_sets_cancelled_and_complete_raises_lease_lost(app, live_server, admin,
                                                                   worker_token):
    from app.projects import leasing
    project = new_project(admin)
    enqueue(admin, project, 2)
    with open_queue(live_server.url, worker_token, project, lease_seconds=2) as queue:
        lost, kept = queue.claim()
        # The master decides the lease is gone: expire it and run the reaper.
        sql(app, "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = :j",
            j=int(lost.info.job_id))
        with app.app_context():
            assert leasing.sweep()["expired"] == 1
        assert lost.cancelled.wait(5), "the next renewal should have been rejected"
        assert "renewal rejected" in lost.cancel_reason
        with pytest.raises(LeaseLost) as err:
            lost.complete()
        assert err.value.code == "stale_attempt" and err.value.job_id == lost.info.job_id
        assert not kept.cancelled.is_set()
        assert kept.complete().status == "applied"


def test_lease_running_out_while_renewals_fail_sets_cancelled(live_server, admin, worker_token):
    project = new_project(admin)
    enqueue(admin, project, 1)
    session = RecordingSession(fail_paths=("/jobs/extend-lease",))
    with open_queue(live_server.url, worker_token, project, lease_seconds=2, session=session,
                    retry=FAST_RETRY) as queue:
        started = time.monotonic()
        (job,) = queue.claim()
        assert job.cancelled.wait(6)
        assert time.monotonic() - started >= 1.5  # not before the lease could end
        assert "ran out" in job.cancel_reason
        assert session.bodies("/jobs/extend-lease")  # it did try


def test_heartbeat_renews_at_once(live_server, admin, worker_token):
    project = new_project(admin)
    enqueue(admin, project, 1)
    with open_queue(live_server.url, worker_token, project, lease_seconds=30, renew=False) as queue:
        (job,) = queue.claim()
        assert queue.renewal_thread is None
        assert job.heartbeat(600) >= job.info.lease_expires_at + 500
        job.complete()


def test_close_stops_the_renewal_thread(live_server, admin, worker_token):
    project = new_project(admin)
    enqueue(admin, project, 2)
    queue = open_queue(live_server.url, worker_token, project, lease_seconds=60)
    done, held = queue.claim()
    thread = queue.renewal_thread
    assert thread is not None and thread in threading.enumerate()
    done.complete()
    queue.close()
    assert thread not in threading.enumerate()
    assert held.cancelled.is_set() and not done.cancelled.is_set()
    queue.close()  # idempotent
    with pytest.raises(sdk.FleetHQError):
        queue.claim()


# ------------------------------------------------------- errors and retries

def test_rate_limited_claims_wait_retry_after_and_succeed(live_server, admin, worker_token):
    project = new_project(admin, dispatch_qps=1)
    enqueue(admin, project, 5)
    session = RecordingSession()
    with open_queue(live_server.url, worker_token, project, session=session) as queue:
        started = time.monotonic()
        claimed = [job for _ in range(3) for job in queue.claim(max_jobs=1)]
        assert len(claimed) == 3
        assert time.monotonic() - started >= 1.5  # one token per second
        # Paced by the claims' retry_after_ms hints, or held back by 429s.
        assert session.statuses.count(200) >= 3
        for job in claimed:
            job.complete()


def test_upgrade_required_lists_allowed_versions(live_server, admin, worker_token):
    project = new_project(admin, client_versions=["other/2"])
    session = RecordingSession()
    with pytest.raises(UpgradeRequired) as err:
        open_queue(live_server.url, worker_token, project, session=session)
    assert err.value.status == 426 and err.value.client_versions == ["other/2"]
    assert session.statuses == [426]


def test_bad_token_raises_auth_error_without_retry(live_server, admin):
    project = new_project(admin)
    session = RecordingSession()
    with pytest.raises(AuthError) as err:
        open_queue(live_server.url, "fhq_" + "x" * 43, project, session=session)
    assert err.value.status == 401 and not err.value.retryable
    assert session.statuses == [401]


def test_user_without_worker_role_is_refused(live_server, admin, make_user):
    project = new_project(admin)
    with pytest.raises(AuthError) as err:
        open_queue(live_server.url, make_user("reader", ["reader"]), project)
    assert err.value.status == 403


def test_plain_http_is_refused_without_allow_http(live_server, admin, worker_token):
    project = new_project(admin)
    session = RecordingSession()
    with pytest.raises(ProtocolError, match="plain http"):
        open_queue(live_server.url, worker_token, project, allow_http=False, session=session)
    assert session.sent == []


class _Handler(http.server.BaseHTTPRequestHandler):
    """Routes every method to ``self.server.handle(self)``."""

    def _any(self):
        self.server.handle(self)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _any

    def log_message(self, *args):
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, handle):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.handle = handle
        self.url = f"http://127.0.0.1:{self.server_port}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture
def serve():
    servers = []

    def start(handle):
        servers.append(_Server(handle))
        return servers[-1]
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


class FlakyProxy:
    """Forwards to the master, but first answers ``errors`` requests with 503
    and drops the connection of the next ``drops`` ones."""

    def __init__(self, target: str, errors: int = 0, drops: int = 0):
        self.target, self.errors, self.drops = target, errors, drops
        self.seen = 0
        self.lock = threading.Lock()
        self.upstream = requests.Session()

    def __call__(self, handler):
        with self.lock:
            self.seen += 1
            n = self.seen
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        if n <= self.errors:
            # A load balancer's answer: no envelope, no Cache-Control.
            handler.send_response(503)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        if n <= self.errors + self.drops:
            handler.close_connection = True  # hang up without an answer
            return
        headers = {k: v for k, v in handler.headers.items()
                   if k.lower() in ("authorization", "content-type", "x-client-version",
                                   "x-savewebhq-client-version", "accept")}
        upstream = self.upstream.request(handler.command, self.target + handler.path,
                                         data=body, headers=headers, allow_redirects=False)
        handler.send_response(upstream.status_code)
        for name in ("Content-Type", "Cache-Control", "Retry-After"):
            if name in upstream.headers:
                handler.send_header(name, upstream.headers[name])
        handler.send_header("Content-Length", str(len(upstream.content)))
        handler.end_headers()
        handler.wfile.write(upstream.content)


def test_5xx_and_dropped_connections_are_retried(live_server, admin, worker_token, serve):
    project = new_project(admin)
    enqueue(admin, project, 1)
    proxy = FlakyProxy(live_server.url, errors=2, drops=2)
    server = serve(proxy)
    with open_queue(server.url, worker_token, project, retry=FAST_RETRY) as queue:
        assert proxy.seen == 5  # 2 × 503, 2 × dropped, then the policy read
        (job,) = queue.claim()
        proxy.errors, proxy.drops, proxy.seen = 2, 0, 0
        assert job.complete().status == "applied"  # safe to retry: replays are applied
        assert proxy.seen == 3
    assert admin.counts(project)["done"] == 1


def test_retries_are_bounded(live_server, admin, worker_token, serve):
    project = new_project(admin)
    proxy = FlakyProxy(live_server.url, errors=10**6)
    server = serve(proxy)
    with pytest.raises(ServerError) as err:
        open_queue(server.url, worker_token, project,
                   retry=RetryPolicy(attempts=3, backoff_base_s=0.01))
    assert err.value.status == 503 and proxy.seen == 3
    proxy.errors, proxy.drops, proxy.seen = 0, 10**6, 0
    with pytest.raises(TransportError):
        open_queue(server.url, worker_token, project,
                   retry=RetryPolicy(attempts=2, backoff_base_s=0.01))
    assert proxy.seen == 2


def test_redirects_are_not_followed_with_the_token(live_server, admin, worker_token, serve):
    project = new_project(admin)
    leaked = []

    def elsewhere(handler):
        leaked.append(handler.headers.get("Authorization"))
        handler.send_response(200)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
    target = serve(elsewhere)

    def redirect(handler):
        handler.send_response(307)
        handler.send_header("Location", target.url + handler.path)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
    server = serve(redirect)
    with pytest.raises(ProtocolError, match="redirect"):
        open_queue(server.url, worker_token, project)
    assert leaked == []


# ------------------------------------------- transport rules, mock adapter

class MockAdapter(requests.adapters.BaseAdapter):
    """Answers from a list of (status, headers, body) or exceptions."""

    def __init__(self, answers):
        super().__init__()
        self.answers = list(answers)
        self.requests = []

    def send(self, request, **kw):
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        status, headers, body = answer
        response = requests.Response()
        response.status_code = status
        response.headers.update(headers)
        response._content = json.dumps(body).encode() if body is not None else b""
        response.url = request.url
        response.request = request
        return response

    def close(self):
        pass


POLICY = {"project_id": "p", "dispatch_qps": None, "worker_claim_qps": None,
          "max_jobs_per_claim": 256, "recommended_lease_seconds": 300, "policy_version": 1,
          "refresh_after_ms": 60_000}
NO_STORE = {"Cache-Control": "no-store", "Content-Type": "application/json"}


def mock_open(answers, **kw):
    adapter = MockAdapter(answers)
    session = requests.Session()
    session.mount("https://hq.test/", adapter)
    kw.setdefault("retry", FAST_RETRY)
    queue = open_project_queue("https://hq.test", "fhq_token", "p", client_version=VERSION,
                               worker_id="w1", session=session, **kw)
    return queue, adapter


@pytest.mark.parametrize("headers", [
    {"Content-Type": "application/json"},
    {"Cache-Control": "private", "Content-Type": "application/json"},
    {"Cache-Control": "no-store, max-age=60"},
    {"Cache-Control": "public, no-store"},
    {"Cache-Control": "no-store", "Age": "12"},
])
def test_cacheable_answers_are_refused(headers):
    with pytest.raises(ProtocolError, match="Cache-Control|cacheable"):
        mock_open([(200, headers, POLICY)])


def test_sends_bearer_and_client_version():
    queue, adapter = mock_open([(200, NO_STORE, POLICY)])
    (request,) = adapter.requests
    assert request.headers["Authorization"] == "Bearer fhq_token"
    assert request.headers["X-SavewebHQ-Client-Version"] == VERSION  # understood by both masters
    assert request.url == "https://hq.test/api/v1/projects/p"
    queue.close()


def test_mock_503_then_network_error_then_success():
    queue, adapter = mock_open([(503, {}, None), requests.ConnectionError("reset"),
                                requests.Timeout("slow"), (200, NO_STORE, POLICY)])
    assert len(adapter.requests) == 4 and queue.policy.policy_version == 1
    queue.close()


def test_retry_after_header_is_honoured_without_an_envelope():
    started = time.monotonic()
    queue, adapter = mock_open([(429, {"Retry-After": "1"}, None), (200, NO_STORE, POLICY)])
    assert time.monotonic() - started >= 1.0 and len(adapter.requests) == 2
    queue.close()


def test_other_4xx_are_never_retried():
    envelope = {"error": {"code": "invalid_request", "message": "bad", "retryable": False,
                          "retry_after_ms": None, "details": {"field": "x"}}}
    adapter = MockAdapter([(400, NO_STORE, envelope), (200, NO_STORE, POLICY)])
    session = requests.Session()
    session.mount("https://hq.test/", adapter)
    with pytest.raises(sdk.APIError) as err:
        open_project_queue("https://hq.test", "fhq_token", "p", client_version=VERSION,
                           worker_id="w1", session=session, retry=FAST_RETRY)
    assert len(adapter.requests) == 1
    assert (err.value.status, err.value.code, err.value.details) == (400, "invalid_request",
                                                                     {"field": "x"})
    assert type(err.value) is sdk.APIError


def test_malformed_policy_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        mock_open([(200, NO_STORE, {"project_id": "p"})])


# ------------------------------------------------------------- public API

def test_all_is_sorted_and_complete():
    # Submodules (workers.sdk.savewebhq) are imported by name, not exported.
    public = {name for name, value in vars(sdk).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert sdk.__all__ == sorted(sdk.__all__)
    assert set(sdk.__all__) == public
    assert all(hasattr(sdk, name) for name in sdk.__all__)


def test_exception_tree_matches_the_docstring():
    for name in sdk.__all__:
        obj = getattr(sdk, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert name in sdk.__doc__, f"{name} missing from the drawn tree"
            assert issubclass(obj, sdk.FleetHQError)
    for name in ("AuthError", "NotFound", "Conflict", "UpgradeRequired", "RateLimited",
                 "ServerError"):
        assert issubclass(getattr(sdk, name), sdk.APIError)
