"""Errors of the machine API (DESIGN §6, §11): one envelope, the right status
and code for every refusal, ``Cache-Control: no-store`` on every /api/
response, and machine-token handling."""
from __future__ import annotations

import hashlib
import io
import json

import pytest

from tests.helpers import API_CACHE_CONTROL, ENVELOPE_KEYS, VERSION, Api, api_error, body, values

CLAIM_PATH = "/api/v1/projects/p/jobs/claim"
GOOD_CLAIM = {"worker_id": "w1", "max_jobs": 1, "lease_seconds": 60}


_error = api_error


@pytest.fixture
def api(client, admin_token):
    api = Api(client, admin_token)
    api.put_project("p")
    return api


@pytest.fixture
def users(make_user):
    return {"worker": make_user("wk", ["worker"]), "admin": make_user("adm", ["admin"]),
            "reader": make_user("rd", ["reader"]), "none": make_user("nobody", [])}


def _raw(client, method, path, data, content_type="application/json", token=None, version=VERSION,
         **kw):
    headers = {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if version:
        headers["X-Client-Version"] = version
    if content_type:
        headers["Content-Type"] = content_type
    return getattr(client, method.lower())(path, data=data, headers=headers, **kw)


# ------------------------------------------------------------------------ 401

ROUTES = [
    ("GET", "/api/v1/whoami", None),
    ("GET", "/api/v1/admin/projects", None),
    ("GET", "/api/v1/admin/projects/p", None),
    ("POST", "/api/v1/admin/projects/p/jobs", {"jobs": values(1)}),
    ("GET", "/api/v1/projects/p", None),
    ("POST", CLAIM_PATH, GOOD_CLAIM),
]


@pytest.mark.parametrize("method, path, payload", ROUTES)
@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Bearer ", "Basic Zm9vOmJhcg==",
                                           "Bearer fhq_not-a-real-token", "Bearer garbage",
                                           "fhq_token-without-scheme"])
def test_missing_or_bad_token_is_401(api, client, method, path, payload, authorization):
    headers = {"X-Client-Version": VERSION}
    if authorization is not None:
        headers["Authorization"] = authorization
    response = getattr(client, method.lower())(path, json=payload, headers=headers)
    _error(response, 401, "invalid_machine_token")


def test_revoked_token_is_401(api, client, users):
    worker = Api(client, users["worker"])
    assert worker.call("GET", "/api/v1/whoami").status_code == 200
    assert api.call("DELETE", "/api/v1/admin/users/wk/machine-token").status_code == 204
    _error(worker.call("GET", "/api/v1/whoami"), 401, "invalid_machine_token")
    _error(worker.claim("p"), 401, "invalid_machine_token")


@pytest.mark.parametrize("status", ["suspended", "pending"])
def test_token_of_an_inactive_user_authenticates_but_is_refused_403(api, client, users, status):
    worker = Api(client, users["worker"])
    assert worker.claim("p").status_code == 200
    response = api.call("PUT", "/api/v1/admin/users/wk", {"roles": ["worker"], "status": status})
    assert response.status_code == 204, body(response)
    # As SavewebHQ: whoami still names the user; routes needing a role refuse.
    assert body(worker.call("GET", "/api/v1/whoami")) == {"user_id": "wk"}
    _error(worker.claim("p"), 403, "permission_denied")
    _error(worker.call("GET", "/api/v1/projects/p"), 403, "permission_denied")
    # Reactivated, the same token works again.
    api.call("PUT", "/api/v1/admin/users/wk", {"roles": ["worker"], "status": "active"})
    assert worker.claim("p").status_code == 200


def test_token_of_a_deleted_user_is_401(api, client, users):
    assert api.call("DELETE", "/api/v1/admin/users/wk").status_code == 204
    _error(Api(client, users["worker"]).call("GET", "/api/v1/whoami"), 401, "invalid_machine_token")


# ------------------------------------------------------------------------ 403


CONTRACT_PROJECT = {"status": "active", "dispatch_qps": None, "worker_claim_qps": None,
                    "max_jobs_per_claim": 256, "client_versions": []}
ADMIN_ROUTES = [
    ("GET", "/api/v1/admin/projects", None),
    ("GET", "/api/v1/admin/projects/p", None),
    ("PUT", "/api/v1/admin/projects/q", CONTRACT_PROJECT),
    ("PUT", "/api/v1/admin/projects/p", {**CONTRACT_PROJECT, "max_resets": 1}),
    ("GET", "/api/v1/fleethq/projects", None),
    ("GET", "/api/v1/fleethq/projects/p", None),
    ("PUT", "/api/v1/fleethq/projects/q", {}),
    ("PATCH", "/api/v1/fleethq/projects/p", {"max_resets": 1}),
    ("DELETE", "/api/v1/admin/projects/p", None),
    ("POST", "/api/v1/admin/projects/p/jobs", {"jobs": values(1)}),
    ("GET", "/api/v1/admin/projects/p/jobs", None),
    ("GET", "/api/v1/admin/users", None),
    ("POST", "/api/v1/admin/users/admin/machine-token", None),
]
WORKER_ROUTES = [
    ("GET", "/api/v1/projects/p", None),
    ("POST", CLAIM_PATH, GOOD_CLAIM),
    ("POST", "/api/v1/projects/p/jobs/complete",
     {"worker_id": "w1", "items": [{"job_id": "1", "attempt_id": "1", "outcome": {"kind": "success"}}]}),
    ("POST", "/api/v1/projects/p/jobs/fail",
     {"worker_id": "w1", "items": [{"job_id": "1", "attempt_id": "1", "retryable": True,
                                    "error": {"code": "network", "message": "x"}}]}),
    ("POST", "/api/v1/projects/p/jobs/extend-lease",
     {"worker_id": "w1", "extend_seconds": 60, "items": [{"job_id": "1", "attempt_id": "1"}]}),
]


@pytest.mark.parametrize("method, path, payload", ADMIN_ROUTES)
@pytest.mark.parametrize("role", ["worker", "reader", "none"])
def test_admin_routes_need_role_admin(api, client, users, role, method, path, payload):
    caller = Api(client, users[role])
    err = _error(caller.call(method, path, payload), 403, "permission_denied")
    assert "admin" in err["message"]
    # Nothing happened.
    assert api.counts("p")["todo"] == 0
    assert body(api.call("GET", "/api/v1/admin/projects/p"))["max_resets"] == 3


@pytest.mark.parametrize("method, path, payload", WORKER_ROUTES)
@pytest.mark.parametrize("role", ["admin", "reader", "none"])
def test_worker_routes_need_role_worker(api, client, users, role, method, path, payload):
    api.enqueue("p", values(1))
    caller = Api(client, users[role])
    _error(caller.call(method, path, payload), 403, "permission_denied")
    assert api.counts("p")["todo"] == 1


def test_whoami_answers_any_valid_token(api, client, users):
    for user_id, token in (("wk", users["worker"]), ("rd", users["reader"]), ("nobody", users["none"])):
        response = Api(client, token).call("GET", "/api/v1/whoami")
        assert response.status_code == 200
        assert response.headers["Cache-Control"] == API_CACHE_CONTROL
        assert body(response) == {"user_id": user_id}


# ------------------------------------------------------------------------ 404


def test_unknown_project_is_404(api):
    for method, path, payload in [("GET", "/api/v1/admin/projects/nope", None),
                                  ("DELETE", "/api/v1/admin/projects/nope", None),
                                  ("GET", "/api/v1/admin/projects/nope/jobs", None),
                                  ("POST", "/api/v1/admin/projects/nope/jobs", {"jobs": values(1)}),
                                  ("GET", "/api/v1/projects/nope", None),
                                  ("POST", "/api/v1/projects/nope/jobs/claim", GOOD_CLAIM)]:
        err = _error(api.call(method, path, payload), 404, "not_found")
        assert err["details"].get("project_id") == "nope"


def test_unknown_job_is_404_to_read_and_400_to_change(api):
    """As SavewebHQ: reading an unknown job is not_found; requeue and delete
    of a job it cannot find are invalid requests."""
    _error(api.call("GET", "/api/v1/admin/projects/p/jobs/123456"), 404, "not_found")
    for method, path in [("POST", "/api/v1/admin/projects/p/jobs/123456/requeue"),
                         ("DELETE", "/api/v1/admin/projects/p/jobs/123456")]:
        _error(api.call(method, path), 400, "invalid_request")


def test_unknown_api_route_and_user_are_404(api):
    _error(api.call("GET", "/api/v1/no-such-route"), 404, "not_found")
    _error(api.call("GET", "/api/v2/whoami"), 404, "not_found")
    _error(api.call("POST", "/api/v1/admin/users/ghost/machine-token"), 404, "not_found")
    _error(api.call("GET", "/api/v1/admin/users/ghost/machine-token"), 404, "not_found")
    _error(api.call("DELETE", "/api/v1/admin/users/ghost"), 404, "not_found")


# ------------------------------------------------------------------------ 400

MALFORMED = {
    "truncated": b'{"worker_id": "w1", "max_jobs": ',
    "trailing-object": b'{"worker_id": "w1", "max_jobs": 1, "lease_seconds": 60} {}',
    "trailing-garbage": b'{"worker_id": "w1", "max_jobs": 1, "lease_seconds": 60}x',
    "two-documents": b'{"worker_id": "w1", "max_jobs": 1, "lease_seconds": 60}\n{"a": 1}',
    "empty": b"",
    "not-utf8": b'{"worker_id": "\xff\xfe"}',
    "nan-literal": b'{"worker_id": "w1", "max_jobs": NaN, "lease_seconds": 60}',
    "single-quotes": b"{'worker_id': 'w1'}",
    "array": b"[]",
    "string": b'"claim"',
    "number": b"1",
    "null": b"null",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_or_non_object_body_is_400(api, client, admin_token, case):
    api.enqueue("p", values(1))
    response = _raw(client, "POST", CLAIM_PATH, MALFORMED[case], token=admin_token)
    _error(response, 400, "invalid_request")
    assert api.counts("p")["todo"] == 1


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_json_number_literals_are_400(api, client, admin_token, literal):
    """NaN and Infinity are not JSON (RFC 8259): refused as malformed, never a 500."""
    data = '{"jobs": [{"id": "a", "value": "v", "attr": {"n": ' + literal + "}}]}"
    response = _raw(client, "POST", "/api/v1/admin/projects/p/jobs", data, token=admin_token)
    assert response.status_code == 400, (response.status_code, response.data[:300])
    assert body(response)["error"]["code"] in ("invalid_request", "invalid_job")
    _error(response, 400, body(response)["error"]["code"])
    assert api.counts("p")["todo"] == 0


@pytest.mark.parametrize("path", ["/api/v1/admin/projects/p/jobs", "/api/v1/admin/projects/p"])
def test_admin_routes_refuse_trailing_data_and_non_objects(api, client, admin_token, path):
    method = "POST" if path.endswith("/jobs") else "PUT"
    doc = json.dumps({"jobs": values(1)} if method == "POST" else {**CONTRACT_PROJECT, "max_resets": 1})
    for data in (doc + " {}", doc + "]", "[" + doc + "]", "null"):
        _error(_raw(client, method, path, data, token=admin_token), 400, "invalid_request")
    summary = body(api.call("GET", "/api/v1/admin/projects/p"))
    assert summary["job_counts"]["todo"] == 0 and summary["max_resets"] == 3


BAD_CLAIMS = {
    "unknown-field": ({**GOOD_CLAIM, "priority": 1}, "priority"),
    "missing-worker_id": ({"max_jobs": 1, "lease_seconds": 60}, "worker_id"),
    "missing-max_jobs": ({"worker_id": "w1", "lease_seconds": 60}, "max_jobs"),
    "worker_id-number": ({**GOOD_CLAIM, "worker_id": 5}, "worker_id"),
    "worker_id-space": ({**GOOD_CLAIM, "worker_id": "w 1"}, "worker_id"),
    "worker_id-129": ({**GOOD_CLAIM, "worker_id": "w" * 129}, "worker_id"),
    "max_jobs-string": ({**GOOD_CLAIM, "max_jobs": "1"}, "max_jobs"),
    "max_jobs-float": ({**GOOD_CLAIM, "max_jobs": 1.0}, "max_jobs"),
    "max_jobs-bool": ({**GOOD_CLAIM, "max_jobs": True}, "max_jobs"),
    "max_jobs-null": ({**GOOD_CLAIM, "max_jobs": None}, "max_jobs"),
    "max_jobs-0": ({**GOOD_CLAIM, "max_jobs": 0}, "max_jobs"),
    "max_jobs-257": ({**GOOD_CLAIM, "max_jobs": 257}, "max_jobs"),
    "lease_seconds-0": ({**GOOD_CLAIM, "lease_seconds": 0}, "lease_seconds"),
    "lease_seconds-3601": ({**GOOD_CLAIM, "lease_seconds": 3601}, "lease_seconds"),
    "lease_seconds-bool": ({**GOOD_CLAIM, "lease_seconds": False}, "lease_seconds"),
    "wait_ms-30001": ({**GOOD_CLAIM, "wait_ms": 30001}, "wait_ms"),
    "wait_ms-negative": ({**GOOD_CLAIM, "wait_ms": -1}, "wait_ms"),
    "wait_ms-bool": ({**GOOD_CLAIM, "wait_ms": True}, "wait_ms"),
    "accept_types-string": ({**GOOD_CLAIM, "accept_types": "seed"}, "accept_types"),
    "accept_types-unknown": ({**GOOD_CLAIM, "accept_types": ["page"]}, "accept_types[0]"),
    "accept_types-17": ({**GOOD_CLAIM, "accept_types": ["seed"] * 17}, "accept_types"),
    "policy_version-string": ({**GOOD_CLAIM, "policy_version": "1"}, "policy_version"),
    "policy_version-bool": ({**GOOD_CLAIM, "policy_version": True}, "policy_version"),
    "policy_version-0": ({**GOOD_CLAIM, "policy_version": 0}, "policy_version"),
    "policy_version-null": ({**GOOD_CLAIM, "policy_version": None}, "policy_version"),
}


@pytest.mark.parametrize("case", sorted(BAD_CLAIMS))
def test_invalid_claim_is_400_with_the_field(api, case):
    api.enqueue("p", values(1))
    payload, field = BAD_CLAIMS[case]
    err = _error(api.call("POST", CLAIM_PATH, payload), 400, "invalid_request")
    assert err["details"]["field"] == field
    assert api.counts("p")["todo"] == 1


def test_claim_edges_are_accepted(api):
    api.enqueue("p", values(2))
    for payload in ({**GOOD_CLAIM, "max_jobs": 256, "lease_seconds": 3600, "wait_ms": 0},
                    {**GOOD_CLAIM, "lease_seconds": 1, "policy_version": 1,
                     "accept_types": ["asset", "seed"]}):
        response = api.call("POST", CLAIM_PATH, payload)
        assert response.status_code == 200, body(response)


def _item(kind: str, n: int) -> dict:
    ids = [{"job_id": i + 1, "attempt_id": str(i + 1)} for i in range(n)]
    if kind == "complete":
        return {"worker_id": "w1", "items": [{**i, "outcome": {"kind": "success"}} for i in ids]}
    if kind == "fail":
        return {"worker_id": "w1", "items": [{**i, "retryable": True,
                                              "error": {"code": "network", "message": "x"}}
                                             for i in ids]}
    return {"worker_id": "w1", "extend_seconds": 60, "items": ids}


@pytest.mark.parametrize("kind", ["complete", "fail", "extend-lease"])
@pytest.mark.parametrize("n", [0, 257])
def test_items_must_be_1_to_256(api, kind, n):
    err = _error(api.call("POST", f"/api/v1/projects/p/jobs/{kind}", _item(kind, n)),
                 400, "invalid_request")
    assert err["details"]["field"] == "items"


@pytest.mark.parametrize("kind", ["complete", "fail", "extend-lease"])
def test_256_items_are_accepted(api, kind):
    response = api.call("POST", f"/api/v1/projects/p/jobs/{kind}", _item(kind, 256))
    assert response.status_code == 200, body(response)
    results = body(response)["results"]
    assert len(results) == 256
    assert {r["status"] for r in results} == {"rejected"}
    assert {r["error"]["code"] for r in results} == {"stale_attempt"}


@pytest.mark.parametrize("kind, payload, field", [
    ("complete", {"worker_id": "w1", "items": [{"job_id": 1, "attempt_id": "1",
                                                "outcome": {"kind": "failure"}}]}, "items[0].outcome.kind"),
    ("complete", {"worker_id": "w1", "items": [{"job_id": 1, "attempt_id": "1",
                                                "outcome": {"kind": "success", "code": 1000}}]},
     "items[0].outcome.code"),
    ("complete", {"worker_id": "w1", "items": [{"job_id": 1, "attempt_id": "1"}]},
     "items[0].outcome"),
    ("complete", {"worker_id": "w1", "items": [{"job_id": "1", "attempt_id": "1",
                                                "outcome": {"kind": "success"}}]},
     "items[0].job_id"),
    ("complete", {"worker_id": "w1", "items": [{"job_id": 0, "attempt_id": "1",
                                                "outcome": {"kind": "success"}}]},
     "items[0].job_id"),
    ("fail", {"worker_id": "w1", "items": [{"job_id": 1, "attempt_id": "1", "retryable": 1,
                                            "error": {"code": "network", "message": "x"}}]},
     "items[0].retryable"),
    ("fail", {"worker_id": "w1", "items": [{"job_id": 1, "attempt_id": "1", "retryable": True,
                                            "error": {"code": "network", "message": "x" * 2049}}]},
     "items[0].error.message"),
    ("fail", {"worker_id": "w1", "items": [{"job_id": 1, "attempt_id": "1", "retryable": True,
                                            "error": {"code": "has space", "message": "x"}}]},
     "items[0].error.code"),
    ("extend-lease", {"worker_id": "w1", "extend_seconds": 0,
                      "items": [{"job_id": "1", "attempt_id": "1"}]}, "extend_seconds"),
    ("extend-lease", {"worker_id": "w1", "extend_seconds": 60,
                      "items": [{"job_id": "1", "attempt_id": "1", "x": 1}]}, "items[0].x"),
])
def test_invalid_result_bodies_are_400(api, kind, payload, field):
    err = _error(api.call("POST", f"/api/v1/projects/p/jobs/{kind}", payload), 400, "invalid_request")
    assert err["details"]["field"] == field


# ------------------------------------------------------------------------ 413


def _receipt(i: int) -> dict:
    return {"id": f"r{i}", "issuer": "warc-receiver.example", "object_id": f"s3://bucket/obj/{i:08d}",
            "checksum": "sha256:" + hashlib.sha256(str(i).encode()).hexdigest(),
            "size_bytes": 1024 + i, "accepted_at": 1_700_000_000 + i}


def test_a_256_item_complete_with_receipts_is_accepted(api, client, admin_token):
    """About 100 KB: SavewebHQ's 8 MiB limit, not the fleet's 64 KiB one."""
    payload = json.dumps({"worker_id": "w1", "items": [
        {"job_id": i + 1, "attempt_id": str(i + 1), "outcome": {"kind": "success"},
         "artifact_receipts": [_receipt(i)]} for i in range(256)]})
    assert len(payload) > 64 * 1024
    response = _raw(client, "POST", "/api/v1/projects/p/jobs/complete", payload, token=admin_token)
    assert response.status_code == 200, body(response)
    assert len(body(response)["results"]) == 256


def test_worker_body_over_8_mib_is_400(api, client, admin_token):
    """SavewebHQ answers an oversized body as 400 invalid_request."""
    api.enqueue("p", values(1))
    payload = json.dumps({**GOOD_CLAIM, "worker_id": "w1", "pad": "x" * (8 * 1024 * 1024)})
    err = _error(_raw(client, "POST", CLAIM_PATH, payload, token=admin_token), 400, "invalid_request")
    assert err["details"].get("limit") == 8 * 1024 * 1024
    assert api.counts("p")["todo"] == 1


def test_worker_body_over_8_mib_without_content_length_is_400(api, client, admin_token):
    """A streamed body with no Content-Length is cut off at the limit too."""
    payload = json.dumps({**GOOD_CLAIM, "pad": "x" * (8 * 1024 * 1024)}).encode()
    response = client.post(CLAIM_PATH, input_stream=io.BytesIO(payload),
                           headers={"Authorization": f"Bearer {admin_token}",
                                    "X-Client-Version": VERSION, "Content-Type": "application/json"},
                           environ_overrides={"wsgi.input_terminated": True})
    _error(response, 400, "invalid_request")


def test_body_errors_come_after_the_token_check(api, client):
    """SavewebHQ authenticates first: a bad token with a bad body is 401."""
    _error(_raw(client, "POST", CLAIM_PATH, "{not json", token="fhq_not-a-real-token"),
           401, "invalid_machine_token")
    _error(_raw(client, "POST", CLAIM_PATH, "{not json", content_type="text/plain",
                token="fhq_not-a-real-token"), 401, "invalid_machine_token")


def test_enqueue_body_over_8_mib_is_400_and_below_is_accepted(api, client, admin_token):
    """SavewebHQ answers an oversized body as 400 invalid_request."""
    big_job = {"id": "big", "value": "x" * 8000}
    jobs = [{**big_job, "id": f"j{i}"} for i in range(1100)]  # ~8.9 MB
    payload = json.dumps({"jobs": jobs})
    assert len(payload) > 8 * 1024 * 1024
    err = _error(_raw(client, "POST", "/api/v1/admin/projects/p/jobs", payload, token=admin_token),
                 400, "invalid_request")
    assert err["details"].get("limit") == 8 * 1024 * 1024
    assert api.counts("p")["todo"] == 0
    # An enqueue body far above the worker limit is fine.
    payload = json.dumps({"jobs": jobs[:100]})
    assert len(payload) > 64 * 1024
    response = _raw(client, "POST", "/api/v1/admin/projects/p/jobs", payload, token=admin_token)
    assert response.status_code == 200, body(response)
    assert body(response)["inserted"] == 100


# ------------------------------------------------------------------------ 415


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "application/zstd"])
@pytest.mark.parametrize("method, path", [("POST", CLAIM_PATH),
                                          ("POST", "/api/v1/projects/p/jobs/complete"),
                                          ("POST", "/api/v1/admin/projects/p/jobs"),
                                          ("PUT", "/api/v1/admin/projects/p")])
def test_non_json_body_to_a_contract_route_is_400(api, client, admin_token, method, path,
                                                  content_type):
    """As SavewebHQ: a wrong content type is an invalid request."""
    err = _error(_raw(client, method, path, json.dumps(GOOD_CLAIM), content_type=content_type,
                      token=admin_token), 400, "invalid_request")
    assert err["details"].get("content_type") == content_type


@pytest.mark.parametrize("method, path", [("PATCH", "/api/v1/fleethq/projects/p"),
                                          ("PUT", "/api/v1/fleethq/users/someone")])
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "application/zstd"])
def test_non_json_body_to_a_json_route_is_415(api, client, admin_token, method, path, content_type):
    payload = json.dumps(GOOD_CLAIM)
    err = _error(_raw(client, method, path, payload, content_type=content_type, token=admin_token),
                 415, "unsupported_media_type")
    assert err["details"].get("content_type") == content_type


def test_json_with_charset_parameter_is_json(api, client, admin_token):
    response = _raw(client, "POST", CLAIM_PATH, json.dumps(GOOD_CLAIM),
                    content_type="application/json; charset=utf-8", token=admin_token)
    assert response.status_code == 200, body(response)


def test_json_to_the_source_route_is_415(api, client, admin_token):
    """The contract's code for a source body of another type is invalid_request."""
    response = _raw(client, "POST", "/api/v1/admin/projects/p/source", json.dumps({"jobs": values(1)}),
                    token=admin_token)
    _error(response, 415, "invalid_request")
    assert api.counts("p")["todo"] == 0


# ------------------------------------------------------------------------ 426


def _worker_calls(api, version_headers):
    yield api.call("GET", "/api/v1/projects/p", headers=version_headers)
    for kind in ("claim", "complete", "fail", "extend-lease"):
        payload = GOOD_CLAIM if kind == "claim" else _item(kind, 1)
        yield api.call("POST", f"/api/v1/projects/p/jobs/{kind}", payload, headers=version_headers)


def test_missing_client_version_is_426(client, admin_token):
    api = Api(client, admin_token, version=None)
    api.put_project("p", client_versions=["1.0", "2.0"])
    api.enqueue("p", values(1))
    for response in _worker_calls(api, {}):
        err = _error(response, 426, "client_upgrade_required")
        assert sorted(err["details"]["client_versions"]) == ["1.0", "2.0"]
    assert api.counts("p")["todo"] == 1


def test_unknown_client_version_is_426(client, admin_token):
    api = Api(client, admin_token, version=None)
    api.put_project("p", client_versions=["1.0"])
    api.enqueue("p", values(1))
    for header in ("X-Client-Version", "X-SavewebHQ-Client-Version"):
        for response in _worker_calls(api, {header: "0.9"}):
            err = _error(response, 426, "client_upgrade_required")
            assert err["details"]["client_versions"] == ["1.0"]
    assert api.counts("p")["todo"] == 1


@pytest.mark.parametrize("header", ["X-Client-Version", "X-SavewebHQ-Client-Version"])
def test_allowed_client_version_in_either_header(client, admin_token, header):
    api = Api(client, admin_token, version=None)
    api.put_project("p", client_versions=["1.0"])
    api.enqueue("p", values(1))
    policy = api.call("GET", "/api/v1/projects/p", headers={header: "1.0"})
    assert policy.status_code == 200, body(policy)
    claim = api.call("POST", CLAIM_PATH, GOOD_CLAIM, headers={header: "1.0"})
    assert claim.status_code == 200, body(claim)
    assert len(body(claim)["jobs"]) == 1


def test_empty_allow_list_blocks_every_worker(client, admin_token):
    api = Api(client, admin_token)
    api.put_project("p", client_versions=[])
    api.enqueue("p", values(1))
    for version in (VERSION, "", "anything"):
        for response in _worker_calls(api, {"X-Client-Version": version}):
            err = _error(response, 426, "client_upgrade_required")
            assert err["details"]["client_versions"] == []
    # Allow-listing the version lets the same worker in.
    api.call("PATCH", "/api/v1/fleethq/projects/p", {"client_versions": [VERSION]})
    assert len(body(api.claim("p"))["jobs"]) == 1


def test_admin_routes_need_no_client_version(client, admin_token):
    api = Api(client, admin_token, version=None)
    api.put_project("p", client_versions=[])
    assert api.enqueue("p", values(1)).status_code == 200
    assert api.call("GET", "/api/v1/admin/projects/p").status_code == 200


# ------------------------------------------------------------------------ 405


@pytest.mark.parametrize("method, path", [("DELETE", "/api/v1/whoami"),
                                          ("POST", "/api/v1/projects/p"),
                                          ("GET", CLAIM_PATH),
                                          ("PUT", "/api/v1/projects/p/jobs/complete"),
                                          ("POST", "/api/v1/admin/projects"),
                                          ("PATCH", "/api/v1/admin/users/admin"),
                                          ("POST", "/api/v1/openapi.json")])
def test_wrong_method_is_405(api, method, path):
    response = api.call(method, path)
    assert response.status_code == 405
    assert response.headers["Cache-Control"] == API_CACHE_CONTROL
    err = json.loads(response.data)["error"]
    assert set(err) == ENVELOPE_KEYS
    assert err["retryable"] is False


def test_405_names_the_allowed_methods(api):
    """RFC 9110 §15.5.6: a 405 response MUST carry an Allow header."""
    response = api.call("DELETE", "/api/v1/projects/p/jobs/claim")
    assert response.status_code == 405
    assert "POST" in response.headers.get("Allow", "")


# ------------------------------------------------------------------------ 500


def test_500_never_carries_internals(database_url):
    from app import create_app

    app = create_app({"DATABASE_URL": database_url, "LOG_JSON": False}, check_schema=False)
    secret = "psycopg.OperationalError: password=hunter2 at /srv/fleethq/app/secret.py line 42"

    def boom():
        raise RuntimeError(secret)

    app.add_url_rule("/api/v1/_test_boom", "test_boom", boom)
    response = app.test_client().get("/api/v1/_test_boom")
    assert response.status_code == 500
    assert response.headers["Cache-Control"] == API_CACHE_CONTROL
    err = json.loads(response.data)["error"]
    assert set(err) == ENVELOPE_KEYS
    assert err["code"] == "internal_error"
    text = response.data.decode()
    for leak in ("hunter2", "RuntimeError", "secret.py", "Traceback", "psycopg"):
        assert leak not in text


def test_an_unreachable_database_answers_a_retryable_internal_error():
    """A PostgreSQL restart mid-request: nothing changed, so the worker is told to try again."""
    from tests.conftest import closed_port_url, make_app

    app = make_app(closed_port_url(), check_schema=False)
    response = app.test_client().post("/api/v1/projects/p/jobs/claim", json={"worker_id": "w1"},
                                      headers={"Authorization": "Bearer fhq_x"})
    assert response.status_code == 500
    err = json.loads(response.data)["error"]
    assert set(err) == ENVELOPE_KEYS
    assert (err["code"], err["retryable"], err["retry_after_ms"]) == ("internal_error", True, 1000)
    assert "127.0.0.1" not in response.data.decode() and "psycopg" not in response.data.decode()


# --------------------------------------------------------------- Cache-Control


def test_every_api_response_is_no_store(api, client, admin_token):
    api.enqueue("p", values(2))
    (job,) = body(api.claim("p", max_jobs=1))["jobs"]
    responses = [
        client.get("/api/v1/openapi.json"),
        api.call("GET", "/api/v1/whoami"),
        api.call("GET", "/api/v1/admin/projects"),
        api.call("GET", "/api/v1/admin/projects/p"),
        api.call("GET", "/api/v1/admin/projects/p/jobs"),
        api.call("GET", f"/api/v1/admin/projects/p/jobs/{job['job_id']}"),
        api.call("GET", "/api/v1/projects/p"),
        api.claim("p"),
        api.extend("p", [job]),
        api.complete("p", [job]),
        api.call("GET", "/api/v1/admin/users"),
        api.call("GET", "/api/v1/admin/users/admin/machine-token"),
        api.call("PUT", "/api/v1/fleethq/projects/q", {}),
        api.call("GET", "/api/v1/fleethq/projects/q"),
        api.call("DELETE", "/api/v1/admin/projects/q"),
        api.call("GET", "/api/v1/nothing-here"),
        client.get("/api/v1/admin/projects"),
    ]
    assert {r.status_code for r in responses} >= {200, 201, 204, 401, 404}
    for response in responses:
        assert response.headers.get("Cache-Control") == API_CACHE_CONTROL, response.request.path


# ---------------------------------------------------------------- machine tokens


def test_rotate_returns_a_new_token_and_replaces_the_old_one(api, client, users):
    old = users["worker"]
    response = api.call("POST", "/api/v1/admin/users/wk/machine-token")
    assert response.status_code == 201
    rotated = body(response)
    assert set(rotated) == {"user_id", "token"}
    assert rotated["user_id"] == "wk"
    new = rotated["token"]
    assert new.startswith("fhq_") and new != old and len(new) >= 40

    _error(Api(client, old).call("GET", "/api/v1/whoami"), 401, "invalid_machine_token")
    assert body(Api(client, new).call("GET", "/api/v1/whoami")) == {"user_id": "wk"}

    # Rotating again gives yet another token; the second one stops working.
    newer = body(api.call("POST", "/api/v1/admin/users/wk/machine-token"))["token"]
    assert newer not in (old, new)
    _error(Api(client, new).call("GET", "/api/v1/whoami"), 401, "invalid_machine_token")
    assert Api(client, newer).call("GET", "/api/v1/whoami").status_code == 200


def test_the_user_list_never_shows_a_token(api, client, users):
    token = users["worker"]
    listing = api.call("GET", "/api/v1/admin/users")
    assert token not in listing.data.decode()
    assert hashlib.sha256(token.encode()).hexdigest() not in listing.data.decode()
    assert {u["id"] for u in body(listing)["users"]} >= {"admin", "wk", "adm", "rd"}


def test_revoke_then_view(api, client, users):
    assert api.call("DELETE", "/api/v1/admin/users/wk/machine-token").status_code == 204
    _error(api.call("GET", "/api/v1/admin/users/wk/machine-token"), 404, "not_found")
    _error(api.call("DELETE", "/api/v1/admin/users/wk/machine-token"), 404, "not_found")
    _error(Api(client, users["worker"]).call("GET", "/api/v1/whoami"), 401, "invalid_machine_token")
    # A fresh rotation issues a working token again.
    token = body(api.call("POST", "/api/v1/admin/users/wk/machine-token"))["token"]
    assert Api(client, token).call("GET", "/api/v1/whoami").status_code == 200


# ------------------------------------------------------------------ the tree

def _all_app_modules():
    import importlib
    import pkgutil

    import app
    for info in pkgutil.walk_packages(app.__path__, "app."):
        # A gunicorn settings file (read by gunicorn only) and entry points
        # (importing one runs its program) declare no errors.
        if info.name != "app.gunicorn_conf" and not info.name.endswith(".__main__"):
            importlib.import_module(info.name)


def _subclasses(cls):
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found


def test_every_domain_error_lives_in_app_errors_as_its_tree_draws_it():
    """The tree in app/errors.py's docstring is the one clients read: every
    FleetError subclass of the app is declared there, under its parent,
    with its status."""
    import re

    from app import errors
    _all_app_modules()
    declared = {cls for cls in _subclasses(errors.FleetError) if cls.__module__.startswith("app")}
    assert {cls.__module__ for cls in declared} == {"app.errors"}
    drawn, parents = {}, ["FleetError"]
    for line in errors.__doc__.splitlines():
        m = re.match(r"^(\s*(?:│\s+)*)[├└]── (\w+)\s+(\d{3})", line)
        if not m:
            continue
        depth = len(m.group(1).replace("│", " ")) // 4 - 1
        del parents[depth + 1:]
        drawn[m.group(2)] = (parents[depth], int(m.group(3)))
        parents.append(m.group(2))
    assert drawn == {cls.__name__: (cls.__bases__[0].__name__, cls.status) for cls in declared}
