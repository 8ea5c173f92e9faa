"""Project policy (DESIGN §5) through FleetHQ's own project routes
(``/api/v1/fleethq/projects``), and the worker-facing shapes of §6: defaults,
partial changes, policy_version, field ranges, exact response fields, claim
clamping and filters, project status, in-flight caps, summaries, delete.
The v1 contract's admin project routes are covered in test_admin_contract.py."""
from __future__ import annotations

import time

import pytest

from tests.helpers import VERSION, api_error, body, values

ZERO = {"todo": 0, "wip": 0, "staged": 0, "done": 0, "failed": 0, "reset_exhausted": 0}
POLICY_KEYS = {"kind", "status", "identity_mode", "claim_order", "dispatch_qps", "worker_claim_qps",
               "max_jobs_per_claim", "max_resets", "recommended_lease_seconds",
               "retry_backoff_seconds", "client_versions", "max_in_flight", "max_worker_in_flight",
               "prefer_new_worker", "max_worker_attempts", "task_timeout_seconds",
               "attempt_timeout_seconds", "upload_timeout_seconds", "fallback_after_seconds",
               "share_weight", "lane_order"}
SUMMARY_KEYS = POLICY_KEYS | {"id", "policy_version", "job_counts", "created_at", "updated_at"}
WORKER_POLICY_KEYS = {"project_id", "dispatch_qps", "worker_claim_qps", "max_jobs_per_claim",
                      "recommended_lease_seconds", "policy_version", "refresh_after_ms"}
CLAIM_KEYS = {"project_id", "jobs", "retry_after_ms", "policy_version"}

GENERIC_DEFAULTS = {
    "kind": "generic", "status": "active", "identity_mode": "external_id", "claim_order": "fifo",
    "dispatch_qps": None, "worker_claim_qps": None, "max_jobs_per_claim": 256, "max_resets": 3,
    "recommended_lease_seconds": 300, "retry_backoff_seconds": 0, "max_in_flight": None,
    "max_worker_in_flight": None, "prefer_new_worker": False, "max_worker_attempts": None,
    "task_timeout_seconds": None,
    "attempt_timeout_seconds": None, "upload_timeout_seconds": 120, "fallback_after_seconds": 60,
    "share_weight": 1, "lane_order": "remote_first",
}
PDF_DEFAULTS = {
    **GENERIC_DEFAULTS, "kind": "pdf", "retry_backoff_seconds": 30, "max_in_flight": 6,
    "max_worker_in_flight": 2, "prefer_new_worker": True, "max_worker_attempts": 3,
    "task_timeout_seconds": 900,
    "attempt_timeout_seconds": 360, "upload_timeout_seconds": 120, "lane_order": "local_first",
}


_error = api_error


def _put(api, project_id, fields, method="PUT"):
    return api.call(method, f"/api/v1/fleethq/projects/{project_id}", fields)


def _summary(api, project_id) -> dict:
    response = api.call("GET", f"/api/v1/fleethq/projects/{project_id}")
    assert response.status_code == 200, body(response)
    return body(response)


def _patch(api, project_id, **fields) -> dict:
    response = _put(api, project_id, fields, "PATCH")
    assert response.status_code == 200, body(response)
    return body(response)


def _worker_policy(api, project_id) -> dict:
    response = api.call("GET", f"/api/v1/projects/{project_id}")
    assert response.status_code == 200, body(response)
    return body(response)


# --------------------------------------------------------------- create / read


@pytest.mark.parametrize("kind, defaults", [("generic", GENERIC_DEFAULTS), ("pdf", PDF_DEFAULTS)])
def test_put_creates_with_documented_defaults(api, kind, defaults):
    response = _put(api, "p", {"kind": kind})
    assert response.status_code == 201, body(response)
    created = body(response)
    assert set(created) == SUMMARY_KEYS
    assert {k: created[k] for k in defaults} == defaults
    assert created["client_versions"] == []
    assert created["id"] == "p"
    assert created["policy_version"] == 1
    assert created["job_counts"] == ZERO
    assert isinstance(created["created_at"], int) and isinstance(created["updated_at"], int)
    assert abs(created["created_at"] - time.time()) < 3600
    assert _summary(api, "p") == created
    # Putting it again is not a creation.
    again = _put(api, "p", {"kind": kind})
    assert again.status_code == 200, body(again)


def test_generic_is_the_default_kind(api):
    response = _put(api, "p", {})
    assert response.status_code == 201
    assert {k: body(response)[k] for k in GENERIC_DEFAULTS} == GENERIC_DEFAULTS


def test_summary_counts_jobs_by_state(api):
    api.put_project("p", max_resets=0)
    assert body(api.enqueue("p", values(6)))["inserted"] == 6
    a, b, c, d = body(api.claim("p", max_jobs=4))["jobs"]
    api.complete("p", [a])
    api.fail("p", [b], retryable=False)
    api.fail("p", [c], retryable=True)
    summary = _summary(api, "p")
    assert set(summary) == SUMMARY_KEYS
    assert summary["job_counts"] == {"todo": 2, "wip": 1, "staged": 0, "done": 1, "failed": 1,
                                     "reset_exhausted": 1}


def test_list_projects(api):
    assert body(api.call("GET", "/api/v1/fleethq/projects")) == {"projects": []}
    api.put_project("b-proj", kind="pdf")
    api.put_project("a-proj")
    api.enqueue("a-proj", values(2))
    response = api.call("GET", "/api/v1/fleethq/projects")
    assert response.status_code == 200
    listing = body(response)
    assert set(listing) == {"projects"}
    assert [p["id"] for p in listing["projects"]] == ["a-proj", "b-proj"]
    for project in listing["projects"]:
        assert set(project) == SUMMARY_KEYS
        assert project == _summary(api, project["id"])
    assert listing["projects"][0]["job_counts"] == {**ZERO, "todo": 2}
    assert listing["projects"][1]["kind"] == "pdf"


def test_get_unknown_project_is_404(api):
    _error(api.call("GET", "/api/v1/fleethq/projects/nope"), 404, "not_found")
    _error(_put(api, "nope", {"max_resets": 1}, "PATCH"), 404, "not_found")
    _error(api.call("GET", "/api/v1/fleethq/projects/nope"), 404, "not_found")


@pytest.mark.parametrize("project_id", ["has%20space", "x" * 129, "a%3Fb", "%C3%A4"])
def test_project_id_must_be_an_identifier(api, project_id):
    _error(_put(api, project_id, {}), 400, "invalid_request")
    assert body(api.call("GET", "/api/v1/fleethq/projects"))["projects"] == []


def test_body_id_must_match_url(api):
    err = _error(_put(api, "p", {"id": "q"}), 400, "invalid_request")
    assert err["details"]["field"] == "id"
    assert _put(api, "p", {"id": "p"}).status_code == 201


# ------------------------------------------------------------------- changes


def test_patch_changes_only_the_given_fields(api):
    before = api.put_project("p", max_resets=7, dispatch_qps=3.5, claim_order="random",
                             client_versions=["a", "b"], max_in_flight=9)
    after = _patch(api, "p", max_jobs_per_claim=17)
    assert after["max_jobs_per_claim"] == 17
    unchanged = {k: v for k, v in before.items()
                 if k not in ("max_jobs_per_claim", "policy_version", "updated_at")}
    assert {k: after[k] for k in unchanged} == unchanged
    assert _summary(api, "p")["max_jobs_per_claim"] == 17


def test_full_put_resets_omitted_fields(api):
    api.put_project("p", max_resets=7, client_versions=["x"])
    replaced = body(_put(api, "p", {"client_versions": ["y"]}))
    assert replaced["max_resets"] == 3
    assert replaced["client_versions"] == ["y"]
    assert replaced["policy_version"] == 2  # one change of the policy, one bump


def test_patch_can_clear_nullable_fields(api):
    api.put_project("p", dispatch_qps=5, max_in_flight=3, task_timeout_seconds=120,
                    max_worker_attempts=4)
    cleared = _patch(api, "p", dispatch_qps=None, max_in_flight=None, task_timeout_seconds=None,
                     max_worker_attempts=None)
    assert cleared["max_worker_attempts"] is None
    assert cleared["dispatch_qps"] is None
    assert cleared["max_in_flight"] is None
    assert cleared["task_timeout_seconds"] is None


VERSIONED_CHANGES = {
    "client_versions": sorted([VERSION, "other-2"]), "dispatch_qps": 10.0, "worker_claim_qps": 2.0,
    "max_jobs_per_claim": 10, "max_resets": 5, "recommended_lease_seconds": 120,
    "retry_backoff_seconds": 5, "max_in_flight": 4, "max_worker_in_flight": 2,
    "prefer_new_worker": True, "task_timeout_seconds": 600, "attempt_timeout_seconds": 60,
    "upload_timeout_seconds": 60, "max_worker_attempts": 5,
}


@pytest.mark.parametrize("field", sorted(VERSIONED_CHANGES))
def test_versioned_change_bumps_policy_version(api, field):
    api.put_project("p")
    assert _worker_policy(api, "p")["policy_version"] == 1
    changed = _patch(api, "p", **{field: VERSIONED_CHANGES[field]})
    assert changed[field] == VERSIONED_CHANGES[field]
    assert changed["policy_version"] == 2
    assert _worker_policy(api, "p")["policy_version"] == 2
    assert body(api.claim("p"))["policy_version"] == 2
    # Setting the same value again is no change.
    assert _patch(api, "p", **{field: VERSIONED_CHANGES[field]})["policy_version"] == 2


def test_status_and_claim_order_do_not_bump_policy_version(api):
    """Workers never see the claim order or the fallback wait (the server
    applies them) and learn the status from 409 project_not_active: no reason
    to re-read the policy."""
    api.put_project("p")
    assert _patch(api, "p", fallback_after_seconds=5)["policy_version"] == 1
    assert _patch(api, "p", status="draining")["policy_version"] == 1
    assert _patch(api, "p", status="active")["policy_version"] == 1
    assert _patch(api, "p", claim_order="random")["policy_version"] == 1
    assert _patch(api, "p", claim_order="fifo")["policy_version"] == 1
    assert _worker_policy(api, "p")["policy_version"] == 1


def test_policy_version_in_the_body_is_ignored(api):
    api.put_project("p")
    assert _patch(api, "p", policy_version=99)["policy_version"] == 1


@pytest.mark.parametrize("field, value", [("kind", "pdf"), ("identity_mode", "none"),
                                          ("identity_mode", "unique_value")])
def test_kind_and_identity_mode_are_fixed(api, field, value):
    api.put_project("p")
    before = _summary(api, "p")
    for method in ("PATCH", "PUT"):
        err = _error(_put(api, "p", {field: value, "client_versions": [VERSION]}, method),
                     400, "invalid_request")
        assert err["details"]["field"] == field
    assert _summary(api, "p") == before
    # Repeating the current value is allowed.
    assert _patch(api, "p", **{field: before[field]})[field] == before[field]


INVALID_FIELDS = [
    ("max_jobs_per_claim", 0), ("max_jobs_per_claim", 257), ("max_jobs_per_claim", True),
    ("max_jobs_per_claim", 1.5), ("max_jobs_per_claim", None), ("max_jobs_per_claim", "10"),
    ("max_resets", -1), ("max_resets", 1001),
    ("recommended_lease_seconds", 0), ("recommended_lease_seconds", 3601),
    ("retry_backoff_seconds", -1), ("retry_backoff_seconds", 86401),
    ("dispatch_qps", 0), ("dispatch_qps", -1), ("dispatch_qps", "x"), ("dispatch_qps", True),
    ("dispatch_qps", [1]), ("worker_claim_qps", 0), ("worker_claim_qps", -0.5),
    ("task_timeout_seconds", 59), ("attempt_timeout_seconds", 14),
    ("upload_timeout_seconds", 9), ("upload_timeout_seconds", 601), ("upload_timeout_seconds", None),
    ("fallback_after_seconds", -1), ("fallback_after_seconds", 86401),
    ("fallback_after_seconds", None), ("fallback_after_seconds", 1.5),
    ("client_versions", [f"v{i}" for i in range(65)]), ("client_versions", "v1"),
    ("client_versions", [1]), ("client_versions", [""]), ("client_versions", [" v1"]),
    ("client_versions", ["v1\t"]), ("client_versions", ["v1", "v2", "v1"]),
    ("client_versions", ["x" * 129]), ("client_versions", ["é" * 65]),
    ("max_in_flight", 0), ("max_worker_in_flight", 0), ("max_worker_in_flight", False),
    ("prefer_new_worker", "yes"), ("prefer_new_worker", 1),
    ("max_worker_attempts", 0), ("max_worker_attempts", 21), ("max_worker_attempts", "3"),
    ("max_worker_attempts", 2.5), ("max_worker_attempts", True),
    ("claim_order", "lifo"), ("status", "paused"), ("status", None),
    ("kind", "html"), ("identity_mode", "sha"),
    ("nonsense", 1), ("job_counts", {}),
]


@pytest.mark.parametrize("field, value", INVALID_FIELDS,
                         ids=[f"{f}={str(v)[:12]}" for f, v in INVALID_FIELDS])
def test_field_ranges_are_enforced(api, field, value):
    # On creation: nothing is created.
    err = _error(_put(api, "p", {field: value}), 400, "invalid_request")
    assert err["details"]["field"] == field
    _error(api.call("GET", "/api/v1/fleethq/projects/p"), 404, "not_found")
    # On change: nothing changes.
    api.put_project("p")
    before = _summary(api, "p")
    err = _error(_put(api, "p", {field: value}, "PATCH"), 400, "invalid_request")
    assert err["details"]["field"] == field
    assert _summary(api, "p") == before


def test_a_huge_integer_rate_is_a_client_error(api):
    """10**400 is a JSON number > 0 but no finite double: 400, not a crash."""
    api.put_project("p")
    raw = '{"dispatch_qps": 1' + "0" * 400 + "}"
    response = api.client.patch("/api/v1/fleethq/projects/p", data=raw,
                                headers={**api.headers, "Content-Type": "application/json"})
    err = _error(response, 400, "invalid_request")
    assert err["details"]["field"] == "dispatch_qps"


VALID_EDGES = [
    ("max_jobs_per_claim", 1), ("max_jobs_per_claim", 256), ("max_resets", 0), ("max_resets", 1000),
    ("recommended_lease_seconds", 1), ("recommended_lease_seconds", 3600),
    ("retry_backoff_seconds", 0), ("retry_backoff_seconds", 86400), ("dispatch_qps", 0.001),
    ("dispatch_qps", 1e300), ("task_timeout_seconds", 60), ("attempt_timeout_seconds", 15),
    ("upload_timeout_seconds", 10), ("upload_timeout_seconds", 600), ("max_in_flight", 1),
    ("max_worker_in_flight", 1), ("max_worker_attempts", 1), ("max_worker_attempts", 20),
    ("client_versions", [f"v{i}" for i in range(64)]),
    ("client_versions", []), ("client_versions", ["x" * 128]), ("client_versions", ["é" * 64]),
    ("client_versions", ["v 1"]), ("fallback_after_seconds", 0), ("fallback_after_seconds", 86400),
]


@pytest.mark.parametrize("field, value", VALID_EDGES,
                         ids=[f"{f}={str(v)[:12]}" for f, v in VALID_EDGES])
def test_field_range_edges_are_accepted(api, field, value):
    response = _put(api, "p", {field: value})
    assert response.status_code == 201, body(response)
    stored = body(response)[field]
    assert sorted(stored) == sorted(value) if isinstance(value, list) else stored == value


# ------------------------------------------------------- worker-facing shapes


def test_worker_policy_has_exactly_the_documented_fields(api):
    api.put_project("p", dispatch_qps=12.5, worker_claim_qps=0.5, max_jobs_per_claim=33,
                    recommended_lease_seconds=90)
    policy = _worker_policy(api, "p")
    assert set(policy) == WORKER_POLICY_KEYS
    assert policy["project_id"] == "p"
    assert policy["dispatch_qps"] == 12.5
    assert policy["worker_claim_qps"] == 0.5
    assert policy["max_jobs_per_claim"] == 33
    assert policy["recommended_lease_seconds"] == 90
    assert policy["policy_version"] == 1
    assert isinstance(policy["refresh_after_ms"], int) and policy["refresh_after_ms"] > 0


def test_claim_response_has_exactly_the_documented_fields(api):
    api.put_project("p")
    api.enqueue("p", [
        {"id": "full", "value": "https://example.org/f", "type": "asset", "via": "https://example.org/",
         "hops": 0, "attr": {"a": {"b": [1, "x"]}}, "random_key": 3},
        {"id": "bare", "value": "https://example.org/b"},
    ])
    before = int(time.time())
    response = api.claim("p", max_jobs=10, lease_seconds=120)
    after = int(time.time()) + 1
    assert response.status_code == 200
    claim = body(response)
    assert set(claim) == CLAIM_KEYS
    assert claim["project_id"] == "p"
    assert claim["retry_after_ms"] == 1000  # SavewebHQ's pause when the bucket gives no hint
    assert claim["policy_version"] == 1
    full, bare = claim["jobs"]
    assert set(full) == {"id", "value", "type", "via", "hops", "attr", "job_id", "attempt_id",
                         "lease_expires_at"}
    assert {k: full[k] for k in ("id", "value", "type", "via", "hops", "attr")} == {
        "id": "full", "value": "https://example.org/f", "type": "asset",
        "via": "https://example.org/", "hops": 0, "attr": {"a": {"b": [1, "x"]}}}
    assert set(bare) == {"id", "value", "type", "job_id", "attempt_id", "lease_expires_at"}
    assert bare["type"] == "seed"
    for job in claim["jobs"]:
        assert type(job["job_id"]) is int and job["job_id"] >= 1  # SavewebHQ's int64 JobID
        assert isinstance(job["attempt_id"], str)
        assert isinstance(job["lease_expires_at"], int)
        assert before + 120 - 1 <= job["lease_expires_at"] <= after + 120
    assert full["job_id"] != bare["job_id"] and full["attempt_id"] != bare["attempt_id"]


def test_claimed_job_has_no_id_without_external_ids(api):
    api.put_project("p", identity_mode="unique_value")
    api.enqueue("p", [{"value": "https://example.org/u"}])
    (job,) = body(api.claim("p"))["jobs"]
    assert set(job) == {"value", "type", "job_id", "attempt_id", "lease_expires_at"}


def test_empty_queue_claim_is_200_with_no_jobs(api):
    api.put_project("p")
    response = api.claim("p")
    assert response.status_code == 200
    assert body(response) == {"project_id": "p", "jobs": [], "retry_after_ms": 1000,
                              "policy_version": 1}


def test_server_clamps_max_jobs_to_max_jobs_per_claim(api):
    api.put_project("p", max_jobs_per_claim=3)
    api.enqueue("p", values(10))
    assert len(body(api.claim("p", max_jobs=256))["jobs"]) == 3
    assert len(body(api.claim("p", max_jobs=2))["jobs"]) == 2
    _patch(api, "p", max_jobs_per_claim=256)
    assert len(body(api.claim("p", max_jobs=256))["jobs"]) == 5


def test_accept_types_filters_claims(api):
    api.put_project("p")
    api.enqueue("p", [{"id": f"s{i}", "value": f"s{i}"} for i in range(3)]
                + [{"id": f"a{i}", "value": f"a{i}", "type": "asset"} for i in range(2)])
    assets = body(api.claim("p", accept_types=["asset"]))["jobs"]
    assert [(j["id"], j["type"]) for j in assets] == [("a0", "asset"), ("a1", "asset")]
    assert body(api.claim("p", accept_types=["asset"]))["jobs"] == []
    seeds = body(api.claim("p", accept_types=["seed"], max_jobs=1))["jobs"]
    assert [j["id"] for j in seeds] == ["s0"]
    both = body(api.claim("p", accept_types=["seed", "asset"]))["jobs"]
    assert [j["id"] for j in both] == ["s1", "s2"]


@pytest.mark.parametrize("accept_types", [[], None, "omitted"])
def test_empty_null_or_omitted_accept_types_take_every_type(api, accept_types):
    """SavewebHQ's Python SDK sends [], its Go SDK null: both mean every type."""
    api.put_project("p")
    api.enqueue("p", [{"id": "s", "value": "s"}, {"id": "a", "value": "a", "type": "asset"}])
    claim = {"worker_id": "w1", "max_jobs": 10, "lease_seconds": 60, "policy_version": 1}
    if accept_types != "omitted":
        claim["accept_types"] = accept_types
    response = api.call("POST", "/api/v1/projects/p/jobs/claim", claim)
    assert response.status_code == 200, body(response)
    assert sorted(j["id"] for j in body(response)["jobs"]) == ["a", "s"]


@pytest.mark.parametrize("status", ["draining", "archived"])
def test_inactive_projects_refuse_claims_but_finish_in_flight_attempts(api, status):
    api.put_project("p")
    api.enqueue("p", values(5))
    held = body(api.claim("p", max_jobs=3))["jobs"]
    _patch(api, "p", status=status)

    err = _error(api.claim("p"), 409, "project_not_active")
    assert err["details"]["status"] == status
    err = _error(api.claim("p", worker_id="w2", accept_types=[]), 409, "project_not_active")

    extended = body(api.extend("p", [held[0]], seconds=600))["results"]
    assert extended[0]["status"] == "applied"
    assert extended[0]["job_status"] == "wip"
    completed = body(api.complete("p", [held[1]]))["results"]
    assert completed[0]["status"] == "applied" and completed[0]["job_status"] == "done"
    failed = body(api.fail("p", [held[2]], retryable=False))["results"]
    assert failed[0]["status"] == "applied" and failed[0]["job_status"] == "failed"
    assert api.counts("p") == {**ZERO, "todo": 2, "wip": 1, "done": 1, "failed": 1}

    # Reactivated, the project hands out work again.
    _patch(api, "p", status="active")
    assert len(body(api.claim("p"))["jobs"]) == 2


def test_max_in_flight_and_max_worker_in_flight_caps(api):
    api.put_project("p", max_in_flight=3, max_worker_in_flight=2)
    api.enqueue("p", values(10))
    w1 = body(api.claim("p", worker_id="w1", max_jobs=10))["jobs"]
    assert len(w1) == 2  # per-worker cap
    refused = api.claim("p", worker_id="w1", max_jobs=10)
    assert refused.status_code == 200 and body(refused)["jobs"] == []
    w2 = body(api.claim("p", worker_id="w2", max_jobs=10))["jobs"]
    assert len(w2) == 1  # project cap: 3 live in all
    assert body(api.claim("p", worker_id="w2", max_jobs=10))["jobs"] == []
    assert body(api.claim("p", worker_id="w3", max_jobs=10))["jobs"] == []
    assert api.counts("p")["wip"] == 3

    # Finishing one of w1's attempts frees one slot, for w1 or anyone.
    api.complete("p", [w1[0]], worker_id="w1")
    assert len(body(api.claim("p", worker_id="w1", max_jobs=10))["jobs"]) == 1
    assert body(api.claim("p", worker_id="w3", max_jobs=10))["jobs"] == []
    # A failed attempt also frees its slot.
    api.fail("p", w2, worker_id="w2", retryable=False)
    assert len(body(api.claim("p", worker_id="w3", max_jobs=10))["jobs"]) == 1
    assert api.counts("p")["wip"] == 3


def test_worker_in_flight_cap_is_per_worker_id(api):
    api.put_project("p", max_worker_in_flight=1)
    api.enqueue("p", values(5))
    for worker in ("w1", "w2", "w3"):
        assert len(body(api.claim("p", worker_id=worker, max_jobs=5))["jobs"]) == 1
    assert body(api.claim("p", worker_id="w1", max_jobs=5))["jobs"] == []
    assert api.counts("p")["wip"] == 3


# -------------------------------------------------------------------- delete


def test_delete_project(api):
    api.put_project("p")
    api.put_project("other")
    api.enqueue("p", values(3))
    (job,) = body(api.claim("p", max_jobs=1))["jobs"]

    err = _error(api.call("DELETE", "/api/v1/admin/projects/p"), 400, "invalid_request")
    assert err["details"]["in_flight"] == 1
    assert _summary(api, "p")["job_counts"]["todo"] == 2
    api.complete("p", [job])

    response = api.call("DELETE", "/api/v1/admin/projects/p")
    assert response.status_code == 204
    assert response.data == b""
    _error(api.call("GET", "/api/v1/admin/projects/p"), 404, "not_found")
    _error(api.call("GET", "/api/v1/projects/p"), 404, "not_found")
    _error(api.claim("p"), 404, "not_found")
    assert [p["id"] for p in body(api.call("GET", "/api/v1/admin/projects"))["projects"]] == ["other"]
    _error(api.call("DELETE", "/api/v1/admin/projects/p"), 404, "not_found")

    # The name can be reused, and nothing of the old project remains.
    recreated = api.put_project("p")
    assert recreated["job_counts"] == ZERO
    assert recreated["policy_version"] == 1
    assert body(api.call("GET", "/api/v1/admin/projects/p/jobs"))["jobs"] == []
    assert body(api.enqueue("p", values(3)))["inserted"] == 3
