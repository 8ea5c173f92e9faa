"""The one HTTP layer under the SDK, the worker program and hqctl
(workers/sdk/_http.py): every client reads the same answer the same way,
ignores proxies and netrc from the environment unless it passes them on
purpose, never follows a redirect, and pauses by the SDK's retry policy."""
from __future__ import annotations

import http.server
import json
import random
import threading

import pytest

from tests.conftest import free_port
from workers.cli.http import ApiError, Client
from workers.runner.master import RETRY, Master, MasterError, Unreachable
from workers.sdk import APIError, FleetHQError, RateLimited, RetryPolicy, TransportError
from workers.sdk._retry import DEFAULT
from workers.sdk._transport import Transport

ENVELOPE = {"error": {"code": "rate_limited", "message": "slow down", "retryable": True,
                      "retry_after_ms": 1500, "details": {"limit": 3}}}


class Scripted(http.server.BaseHTTPRequestHandler):
    """Answers every request with the server's ``answer`` (status, headers, body)."""

    def _answer(self):
        status, headers, body = self.server.answer
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization")))
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    srv.seen = []
    srv.url = f"http://127.0.0.1:{srv.server_port}"
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def clients(url):
    return (Master(url, client_version="t/1", allow_http=True, secret="fhqn_s"),
            Client(url, "fhq_token", allow_http=True),
            Transport(url, "fhq_token", "t/1", allow_http=True,
                      retry=RetryPolicy(attempts=1)))


def errors_of(url) -> list[FleetHQError]:
    """What the worker program, hqctl and the SDK raise for one GET (one
    hierarchy: whatever the client, its errors are the SDK's FleetHQError)."""
    master, cli, sdk = clients(url)
    caught = []
    for call in (lambda: master.call("GET", "/api/v1/fleet/status"),
                 lambda: cli.request("GET", "projects"), lambda: sdk.call("GET", "projects")):
        with pytest.raises(FleetHQError) as error:
            call()
        caught.append(error.value)
    return caught


def test_every_client_reads_the_error_envelope_alike(server):
    server.answer = (429, {"Content-Type": "application/json", "Cache-Control": "no-store",
                           "Retry-After": "9"}, json.dumps(ENVELOPE).encode())
    by_master, by_cli, by_sdk = errors_of(server.url)
    assert isinstance(by_master, MasterError) and isinstance(by_cli, ApiError)
    assert isinstance(by_sdk, RateLimited)
    assert (by_master.code, by_master.message, by_master.retry_after_s, by_master.details) == (
        "rate_limited", "slow down", 1.5, {"limit": 3})
    assert (by_cli.code, by_cli.retry_after_ms, by_cli.enveloped) == ("rate_limited", 1500, True)
    assert (by_sdk.code, by_sdk.retry_after_ms) == ("rate_limited", 1500)


def test_a_proxy_page_gets_the_same_code_and_its_retry_after_header(server):
    server.answer = (502, {"Content-Type": "text/html", "Retry-After": "4"}, b"<h1>Bad Gateway</h1>")
    by_master, by_cli, by_sdk = errors_of(server.url)
    assert isinstance(by_sdk, APIError)
    assert {by_master.code, by_cli.code, by_sdk.code} == {"http_502"}
    assert (by_master.retry_after_s, by_cli.retry_after_ms, by_sdk.retry_after_ms) == (
        4.0, 4000, 4000)
    assert by_master.retryable and by_sdk.retryable
    assert not by_cli.retryable and not by_cli.enveloped  # hqctl takes only the master's word


def test_no_client_follows_a_redirect_or_takes_a_proxy_or_netrc_from_the_environment(
        server, monkeypatch, tmp_path):
    server.answer = (302, {"Location": server.url + "/elsewhere"}, b"")
    nowhere = f"http://127.0.0.1:{free_port()}"
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password other-secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, nowhere)  # a proxy that is not there
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    master, _cli, sdk = clients(server.url)
    with pytest.raises(MasterError) as by_master:
        master.call("GET", "/api/v1/fleet/status")
    with pytest.raises(FleetHQError, match="redirect"):
        sdk.call("GET", "projects")
    assert by_master.value.code == "redirect"
    assert server.seen == [("GET", "/api/v1/fleet/status", "Bearer fhqn_s"),
                           ("GET", "/api/v1/projects", "Bearer fhq_token")]


def test_hqctl_passes_the_environment_proxy_on_purpose(server, monkeypatch):
    """A shell tool honours HTTP_PROXY: here it names a port nobody listens on."""
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with pytest.raises(ApiError) as caught:
        Client(server.url, "fhq_token", allow_http=True).request("GET", "projects")
    assert caught.value.code == "connection_error" and caught.value.status is None
    assert server.seen == []


def test_no_answer_is_unreachable_for_the_worker_and_a_transport_error_for_the_sdk():
    by_master, by_cli, by_sdk = errors_of(f"http://127.0.0.1:{free_port()}")
    assert isinstance(by_master, Unreachable) and isinstance(by_sdk, TransportError)
    assert (by_cli.code, by_cli.connected) == ("connection_error", False)


def test_one_retry_policy_paces_every_client():
    assert RETRY is DEFAULT
    from workers.hqctl import enqueue as hqctl_enqueue
    assert hqctl_enqueue.RETRY is DEFAULT
    rng = random.Random(7)
    policy = RetryPolicy(backoff_base_s=1.0, backoff_cap_s=8.0, max_retry_after_s=60.0)
    assert all(0.5 <= policy.pause(0, rng=rng) <= 1.0 for _ in range(50))
    assert all(4.0 <= policy.pause(9, rng=rng) <= 8.0 for _ in range(50))  # capped
    assert all(30.0 <= policy.pause(0, 30.0, rng=rng) <= 33.0 for _ in range(50))  # a little over the hint
    assert all(policy.pause(5, 0.1, server_error=True, rng=rng) >= 4.0 for _ in range(50))
    assert policy.pause(0, 61.0) is None  # longer than the policy waits: the caller's decision
