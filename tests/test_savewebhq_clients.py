"""SavewebHQ's own clients work against FleetHQ unchanged.

The clients are stood in for by tests/savewebhq_clients.py, which sends
exactly what SavewebHQ's Python SDK (``saveweb_hq``), its Go worker SDK and
tracker client (``sdk/worker``, ``internal/trackerclient``) and its Go
``hqctl`` send, and refuses what they refuse: cacheable or non-JSON answers,
unknown fields, ``job_id`` that is not an int64, errors without the envelope.
"""
from __future__ import annotations

import time

import pytest

from tests.savewebhq_clients import (GoAPIError, GoClient, GoHqctl, GoQueue, PythonSdkAPIError,
                                     PythonSdkQueue, PythonSdkTransport, go_default_job_id)
from tests.savewebhq_wire import (CLIENT_VERSION, admin_path, each_case, hq, hq_server,  # noqa: F401
                                  receipt, source_file, specs, worker_path)

P = "proj"


@pytest.fixture
def sdk(hq):
    """The Python SDK's queue for project ``proj``, holding the worker token."""
    hq.put_project(P)
    transport = PythonSdkTransport(hq.url, hq.worker.token, CLIENT_VERSION)
    yield PythonSdkQueue(transport, P)
    transport.close()


@pytest.fixture
def go(hq):
    """The Go SDK's queue for project ``proj``, holding the worker token."""
    hq.put_project(P)
    return GoQueue(GoClient(hq.url, hq.worker.token, CLIENT_VERSION), P)


def sent_body(sdk_or_client, index=-1):
    return sdk_or_client.sent[index][2]


# ============================================================= Python SDK

def test_python_sdk_whoami_returns_the_tokens_user(sdk):
    assert sdk.whoami() == "hq-worker"


def test_python_sdk_accepts_the_policy_answer(hq, sdk):
    hq.put_project(P, dispatch_qps=50, worker_claim_qps=1.5, max_jobs_per_claim=32)
    policy = sdk.policy()
    assert (policy["dispatch_qps"], policy["worker_claim_qps"], policy["max_jobs_per_claim"]) == (50, 1.5, 32)


def test_python_sdk_default_claim_sends_empty_accept_types_and_gets_every_type(hq, sdk):
    hq.enqueue(P, specs(2, "s", "seed") + specs(2, "a", "asset"))
    response = sdk.claim()
    body = sent_body(sdk.transport)
    assert list(body) == ["worker_id", "max_jobs", "lease_seconds", "accept_types", "policy_version"]
    assert (body["max_jobs"], body["lease_seconds"], body["accept_types"], body["policy_version"]) == (
        64, 300, [], 1)
    assert len(body["worker_id"]) == 7 and body["worker_id"].isalnum()
    assert sorted(job["type"] for job in response["jobs"]) == ["asset", "asset", "seed", "seed"]
    assert all(type(job["job_id"]) is int for job in response["jobs"]), response


def test_python_sdk_completes_a_batch_with_receipts(hq, sdk):
    hq.enqueue(P, specs(3))
    jobs = sdk.claim(accept_types=["seed"])["jobs"]
    assert len(jobs) == 3
    items = [{"job_id": job["job_id"], "attempt_id": job["attempt_id"],
              "outcome": {"kind": "success", "code": 200, "uri": None, "meta": {}},
              "artifact_receipts": [receipt(i)]} for i, job in enumerate(jobs)]
    results = sdk.complete(items)["results"]
    assert [(r["job_id"], r["status"], r["job_status"]) for r in results] == [
        (job["job_id"], "applied", "done") for job in jobs]


def test_python_sdk_completes_256_jobs_with_receipts_in_one_request(hq, sdk):
    hq.enqueue(P, specs(256))
    jobs = sdk.claim(max_jobs=256, accept_types=["seed"])["jobs"]
    assert len(jobs) == 256
    items = [{"job_id": job["job_id"], "attempt_id": job["attempt_id"],
              "outcome": {"kind": "success", "code": 200, "uri": None, "meta": {}},
              "artifact_receipts": [receipt(i)]} for i, job in enumerate(jobs)]
    assert [r["status"] for r in sdk.complete(items)["results"]] == ["applied"] * 256


def test_python_sdk_fails_a_batch_retryable_and_permanent(hq, sdk):
    hq.enqueue(P, specs(2))
    first, second = sdk.claim(accept_types=["seed"])["jobs"]
    items = [{"job_id": job["job_id"], "attempt_id": job["attempt_id"], "retryable": retryable,
              "error": {"code": "fetch_failed", "message": "boom", "details": {}}}
             for job, retryable in ((first, True), (second, False))]
    results = sdk.fail(items)["results"]
    assert [(r["status"], r["job_status"]) for r in results] == [("applied", "todo"), ("applied", "failed")]


def test_python_sdk_extends_a_batch_of_leases(hq, sdk):
    hq.enqueue(P, specs(2))
    jobs = sdk.claim(accept_types=["seed"])["jobs"]
    results = sdk.extend_lease(600, [{"job_id": j["job_id"], "attempt_id": j["attempt_id"]} for j in jobs])
    assert [(r["status"], r["job_status"]) for r in results["results"]] == [("applied", "wip")] * 2
    assert all(r["lease_expires_at"] >= time.time() + 590 for r in results["results"])


def test_python_sdk_waits_out_a_dispatch_429_then_claims(hq, sdk):
    hq.put_project(P, dispatch_qps=1)
    hq.enqueue(P, specs(2))
    assert len(sdk.claim(accept_types=["seed"])["jobs"]) == 1
    started = time.monotonic()
    assert len(sdk.claim(accept_types=["seed"])["jobs"]) == 1
    # retry_after_ms is exact: one wait of about a second is enough.
    assert 1 <= sdk.rate_limited <= 2 and time.monotonic() - started < 3


def test_python_sdk_gets_api_errors_it_can_read(hq, sdk):
    """Every refusal reaches the SDK as APIError: not cacheable, JSON, enveloped."""
    hq.put_project("other", client_versions=["other-v1"])

    def other_project():
        return PythonSdkQueue(sdk.transport, "other").policy()

    def bad_token():
        transport = PythonSdkTransport(hq.url, "hq_wrong", CLIENT_VERSION)
        try:
            return PythonSdkQueue(transport, P).whoami()
        finally:
            transport.close()

    def missing_project():
        return PythonSdkQueue(sdk.transport, "missing").policy()

    def check(case):
        call, status, code = case
        with pytest.raises(PythonSdkAPIError) as raised:
            call()
        assert (raised.value.status, raised.value.code) == (status, code), raised.value.error
    each_case({"426": (other_project, 426, "client_upgrade_required"),
               "401": (bad_token, 401, "invalid_machine_token"),
               "404": (missing_project, 404, "not_found")}, check)


# ================================================================= Go SDK

def test_go_sdk_claim_without_accept_types_sends_null_and_gets_every_type(hq, go):
    hq.enqueue(P, specs(1, "s", "seed") + specs(1, "a", "asset"))
    jobs = go.claim(10)
    assert b'"accept_types":null' in go.client.sent[-1][2]
    assert sorted(job["type"] for job in jobs) == ["asset", "seed"]


def test_go_sdk_claim_decodes_int64_job_ids(hq, go):
    hq.enqueue(P, specs(2, "s", "seed") + specs(2, "a", "asset"))
    jobs = go.claim(10, accept_types=["asset"])
    assert [job["type"] for job in jobs] == ["asset", "asset"]
    assert all(type(job["job_id"]) is int and job["job_id"] >= 1 for job in jobs)


def test_go_sdk_reads_the_policy_strictly(hq, go):
    hq.put_project(P, dispatch_qps=12.5, recommended_lease_seconds=45)
    policy = go.policy()
    assert (policy["dispatch_qps"], policy["recommended_lease_seconds"]) == (12.5, 45)


def test_go_sdk_completes_with_go_zero_values_for_meta_and_receipts(hq, go):
    hq.enqueue(P, specs(1))
    (job,) = go.claim(1, accept_types=["seed"])
    go.complete(job, {"kind": "success"})
    assert b'"meta":null' in go.client.sent[-1][2] and b'"artifact_receipts":null' in go.client.sent[-1][2]


def test_go_sdk_completes_with_receipts_and_the_result_matches_its_job(hq, go):
    hq.enqueue(P, specs(1))
    (job,) = go.claim(1, accept_types=["seed"])
    go.complete(job, {"kind": "success", "code": 200, "uri": "https://example.test/", "meta": {}},
                [receipt(1), receipt(2)])
    assert [r["id"] for r in hq.job(P, job["job_id"])["artifact_receipts"]] == ["receipt-1", "receipt-2"]


def test_go_sdk_fails_with_null_details(hq, go):
    hq.enqueue(P, specs(1))
    (job,) = go.claim(1, accept_types=["seed"])
    go.fail(job, retryable=False, code="gone", message="410 from origin")
    assert b'"details":null' in go.client.sent[-1][2]


def test_go_sdk_renews_its_leases_in_one_batch(hq, go):
    hq.enqueue(P, specs(3))
    jobs = go.claim(3, accept_types=["seed"])
    results = go.renew(jobs, 300)
    assert sorted(results) == sorted(job["attempt_id"] for job in jobs)
    assert {r["status"] for r in results.values()} == {"applied"}


def test_go_sdk_decodes_a_rejected_renewal(hq, go):
    hq.enqueue(P, specs(1))
    (job,) = go.claim(1, accept_types=["seed"])
    stale = {**job, "attempt_id": "replaced-attempt"}
    result = go.renew([stale], 300)["replaced-attempt"]
    assert (result["status"], (result.get("error") or {}).get("code")) == ("rejected", "stale_attempt"), result


def test_go_whoami_decodes_strictly(hq):
    from tests.savewebhq_clients import WHO_AM_I
    assert GoClient(hq.url, hq.worker.token).do("GET", "/api/v1/whoami", WHO_AM_I) == {"user_id": "hq-worker"}


# ================================================================ Go hqctl

def test_go_hqctl_enqueue_reads_the_project_and_accepts_every_answer(hq):
    hq.put_project(P)
    hqctl = GoHqctl(GoClient(hq.url, hq.admin.token))
    values = [f"https://example.test/{i}" for i in range(5)]
    result = hqctl.enqueue_values(P, values, job_type="asset", batch_size=2)
    assert result == {"project_id": P, "identity_mode": "external_id", "submitted": 5, "inserted": 5,
                      "batches": 3}
    (job_id,) = hq.job_ids(P)[:1]
    assert hq.job(P, job_id)["id"] == go_default_job_id("asset", values[0])


def test_go_hqctl_enqueue_source_accepts_the_answer(hq):
    hq.put_project(P)
    answer = GoHqctl(GoClient(hq.url, hq.admin.token)).enqueue_source(P, source_file(specs(4, "src")))
    assert (answer["project_id"], answer["jobs"], answer["inserted"]) == (P, 4, 4)


# ============================================================ Go errors

def test_go_client_decodes_every_refusal_as_an_api_error(hq):
    hq.put_project(P)
    hq.put_project("rated", dispatch_qps=0.1)
    hq.enqueue("rated", specs(2))
    hq.put_project("draining", status="draining")
    hq.claimed("rated", 1)  # the bucket is empty now
    worker = GoClient(hq.url, hq.worker.token, CLIENT_VERSION)
    from tests.savewebhq_clients import CLAIM_RESPONSE, POLICY, PROJECT_SUMMARY, WHO_AM_I
    claim = {"worker_id": "abc1234", "max_jobs": 1, "lease_seconds": 60, "accept_types": ["seed"],
             "policy_version": 1}
    cases = {
        "401": (lambda: GoClient(hq.url, "hq_wrong").do("GET", "/api/v1/whoami", WHO_AM_I), 401,
                "invalid_machine_token"),
        "403": (lambda: worker.do("GET", admin_path(P), PROJECT_SUMMARY), 403, "permission_denied"),
        "404": (lambda: worker.do("GET", worker_path("missing"), POLICY), 404, "not_found"),
        "426": (lambda: GoClient(hq.url, hq.worker.token, "old").do("GET", worker_path(P), POLICY), 426,
                "client_upgrade_required"),
        "400": (lambda: worker.json_call(worker_path(P, "/jobs/claim"), {**claim, "max_jobs": 0},
                                         CLAIM_RESPONSE), 400, "invalid_request"),
        "409": (lambda: worker.json_call(worker_path("draining", "/jobs/claim"), claim, CLAIM_RESPONSE),
                409, "project_not_active"),
        "429": (lambda: worker.json_call(worker_path("rated", "/jobs/claim"), claim, CLAIM_RESPONSE),
                429, "project_dispatch_rate_limited"),
    }

    def check(case):
        call, status, code = case
        with pytest.raises(GoAPIError) as raised:
            call()
        assert (raised.value.status, raised.value.api.get("code")) == (status, code), raised.value.api
    each_case(cases, check)
