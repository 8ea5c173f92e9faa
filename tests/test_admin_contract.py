"""The v1 contract's admin project and job routes (DESIGN §6): exactly the
contract's shapes, status codes and error codes, so that clients written
for the contract (strict decoders that reject unknown fields) work.

FleetHQ's fuller views of the same data, on ``/api/v1/fleethq/``, are
checked here too where the two must agree."""
from __future__ import annotations

import time

import pytest

from tests.helpers import VERSION, Api, body, sql, values

ADMIN = "/api/v1/admin/projects"
FLEETHQ = "/api/v1/fleethq/projects"
ENVELOPE_KEYS = {"code", "message", "retryable", "retry_after_ms", "details"}
SUMMARY_KEYS = {"id", "status", "identity_mode", "claim_order", "dispatch_qps", "worker_claim_qps",
                "max_jobs_per_claim", "max_resets", "recommended_lease_seconds", "client_versions",
                "policy_version", "job_counts", "created_at", "updated_at"}
COUNT_KEYS = {"todo", "wip", "done", "failed", "reset_exhausted"}
ZERO = dict.fromkeys(COUNT_KEYS, 0)


@pytest.fixture
def api(client, admin_token):
    return Api(client, admin_token)


def _error(response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.status_code, body(response))
    assert response.headers["Cache-Control"] == "no-store"
    payload = body(response)
    assert set(payload) == {"error"}
    assert set(payload["error"]) == ENVELOPE_KEYS
    assert payload["error"]["code"] == code
    return payload["error"]


def _ok(response, status: int = 200):
    assert response.status_code == status, (response.status_code, body(response))
    return body(response)


def _summary(api, project_id: str) -> dict:
    return _ok(api.call("GET", f"{ADMIN}/{project_id}"))


def _check_summary(summary: dict) -> None:
    assert set(summary) == SUMMARY_KEYS
    assert set(summary["job_counts"]) == COUNT_KEYS
    for key in ("policy_version", "created_at", "updated_at", "max_jobs_per_claim", "max_resets",
                "recommended_lease_seconds"):
        assert type(summary[key]) is int, key
    assert all(type(n) is int for n in summary["job_counts"].values())
    assert isinstance(summary["client_versions"], list)


# ------------------------------------------------------------- summaries (A1, A2)


def test_summary_has_exactly_the_contract_fields(api):
    api.put_project("p", kind="pdf", max_in_flight=4, dispatch_qps=2.5, claim_order="random",
                    client_versions=["b", "a"])
    summary = _summary(api, "p")
    _check_summary(summary)
    assert summary["id"] == "p"
    assert summary["dispatch_qps"] == 2.5 and summary["worker_claim_qps"] is None
    assert summary["claim_order"] == "random"
    assert summary["client_versions"] == ["a", "b"]
    assert summary["job_counts"] == ZERO
    assert abs(summary["created_at"] - time.time()) < 3600
    assert summary["updated_at"] >= summary["created_at"]
    # FleetHQ's own view of the same project keeps everything else.
    full = _ok(api.call("GET", f"{FLEETHQ}/p"))
    assert (full["kind"], full["max_in_flight"]) == ("pdf", 4)
    assert {k: full[k] for k in SUMMARY_KEYS - {"job_counts"}} == {
        k: summary[k] for k in SUMMARY_KEYS - {"job_counts"}}


def test_list_has_exactly_the_contract_fields(api):
    assert _ok(api.call("GET", ADMIN)) == {"projects": []}
    api.put_project("b-proj", kind="pdf")
    api.put_project("a-proj")
    api.enqueue("a-proj", values(2))
    listing = _ok(api.call("GET", ADMIN))
    assert set(listing) == {"projects"}
    assert [p["id"] for p in listing["projects"]] == ["a-proj", "b-proj"]
    for project in listing["projects"]:
        _check_summary(project)
        assert project == _summary(api, project["id"])
    assert listing["projects"][0]["job_counts"] == {**ZERO, "todo": 2}
    full = _ok(api.call("GET", FLEETHQ))["projects"]
    assert [(p["id"], p["kind"]) for p in full] == [("a-proj", "generic"), ("b-proj", "pdf")]


def test_job_counts_have_five_states_and_staged_counts_as_wip(api, app):
    api.put_project("p", max_resets=0)
    api.enqueue("p", values(7))
    a, b, c, d, e = body(api.claim("p", max_jobs=5))["jobs"]
    api.complete("p", [a])
    api.fail("p", [b], retryable=False)
    api.fail("p", [c], retryable=True)
    # An upload waiting for its archive commit is staged: still in flight.
    sql(app, "UPDATE jobs SET state = 'staged' WHERE id = :id", id=int(d["job_id"]))
    counts = _summary(api, "p")["job_counts"]
    assert counts == {"todo": 2, "wip": 2, "done": 1, "failed": 1, "reset_exhausted": 1}
    assert _ok(api.call("GET", ADMIN))["projects"][0]["job_counts"] == counts
    assert _ok(api.call("GET", f"{FLEETHQ}/p"))["job_counts"] == {**counts, "wip": 1, "staged": 1}


def test_unknown_project_is_404(api):
    _error(api.call("GET", f"{ADMIN}/nope"), 404, "not_found")
    _error(api.call("GET", f"{FLEETHQ}/nope"), 404, "not_found")


# ------------------------------------------------------------ PUT (A3, P3, P4)

REQUEST = {"status": "active", "dispatch_qps": None, "worker_claim_qps": None,
           "max_jobs_per_claim": 256, "client_versions": [VERSION]}


def _put(api, project_id: str, **fields):
    return api.call("PUT", f"{ADMIN}/{project_id}", {**REQUEST, **fields})


def test_put_creates_with_200_and_the_contract_summary(api):
    created = _ok(_put(api, "p", dispatch_qps=4.0, max_jobs_per_claim=10))
    _check_summary(created)
    assert {k: created[k] for k in ("id", "status", "identity_mode", "claim_order",
                                    "dispatch_qps", "worker_claim_qps", "max_jobs_per_claim",
                                    "max_resets", "recommended_lease_seconds", "client_versions",
                                    "policy_version", "job_counts")} == {
        "id": "p", "status": "active", "identity_mode": "external_id", "claim_order": "fifo",
        "dispatch_qps": 4.0, "worker_claim_qps": None, "max_jobs_per_claim": 10, "max_resets": 3,
        "recommended_lease_seconds": 300, "client_versions": [VERSION], "policy_version": 1,
        "job_counts": ZERO}
    assert created == _summary(api, "p")
    assert _ok(api.call("GET", f"{FLEETHQ}/p"))["kind"] == "generic"
    # A change answers 200 as well, with the new summary.
    changed = _ok(_put(api, "p", status="draining", dispatch_qps=4.0, max_jobs_per_claim=10))
    assert changed["status"] == "draining"
    assert changed == _summary(api, "p")


def test_put_sets_every_optional_field_on_creation(api):
    created = _ok(_put(api, "p", identity_mode="unique_value", claim_order="random", max_resets=0,
                       recommended_lease_seconds=3600, worker_claim_qps=0.5))
    assert (created["identity_mode"], created["claim_order"], created["max_resets"],
            created["recommended_lease_seconds"], created["worker_claim_qps"]) == (
        "unique_value", "random", 0, 3600, 0.5)


@pytest.mark.parametrize("field", ["status", "dispatch_qps", "worker_claim_qps",
                                   "max_jobs_per_claim", "client_versions"])
def test_put_requires_the_contract_fields(api, field):
    request = {k: v for k, v in REQUEST.items() if k != field}
    err = _error(api.call("PUT", f"{ADMIN}/p", request), 400, "invalid_request")
    assert err["details"]["field"] == field
    _error(api.call("GET", f"{ADMIN}/p"), 404, "not_found")


@pytest.mark.parametrize("field, value", [
    ("kind", "generic"), ("max_in_flight", 3), ("retry_backoff_seconds", 0), ("id", "p"),
    ("policy_version", 1), ("job_counts", {}), ("nonsense", None)])
def test_put_refuses_fields_outside_the_contract(api, field, value):
    err = _error(_put(api, "p", **{field: value}), 400, "invalid_request")
    assert err["details"]["field"] == field
    _error(api.call("GET", f"{ADMIN}/p"), 404, "not_found")
    _ok(_put(api, "p"))
    before = _summary(api, "p")
    _error(_put(api, "p", **{field: value}), 400, "invalid_request")
    assert _summary(api, "p") == before


@pytest.mark.parametrize("field, value", [
    ("status", "paused"), ("status", None), ("identity_mode", "sha"), ("claim_order", "lifo"),
    ("dispatch_qps", 0), ("dispatch_qps", -1), ("dispatch_qps", "1"), ("worker_claim_qps", 0),
    ("max_jobs_per_claim", 0), ("max_jobs_per_claim", 257), ("max_jobs_per_claim", None),
    ("max_resets", -1), ("max_resets", 1001), ("recommended_lease_seconds", 0),
    ("recommended_lease_seconds", 3601), ("client_versions", None),
    ("client_versions", [f"v{i}" for i in range(65)]), ("client_versions", [""]),
    ("client_versions", ["x" * 129]), ("client_versions", [" v1"]), ("client_versions", ["v1 "]),
    ("client_versions", ["v1", "v1"]), ("client_versions", ["v1", "v2", "v1"])])
def test_put_refuses_bad_values_and_changes_nothing(api, field, value):
    _error(_put(api, "p", **{field: value}), 400, "invalid_request")
    _error(api.call("GET", f"{ADMIN}/p"), 404, "not_found")
    existing = {"max_resets": 5, "client_versions": ["a", "b"]}
    before = _ok(_put(api, "p", **existing))
    err = _error(_put(api, "p", **{**existing, field: value}), 400, "invalid_request")
    assert err["details"]["field"] == field
    assert _summary(api, "p") == before


def test_client_versions_are_stored_as_given_in_sorted_order(api):
    stored = _ok(_put(api, "p", client_versions=["v2", "v10", "v1", "a b"]))["client_versions"]
    assert stored == ["a b", "v1", "v10", "v2"]
    assert _ok(_put(api, "p", client_versions=["x" * 128, "é" * 64]))["client_versions"] == [
        "x" * 128, "é" * 64]
    assert _ok(_put(api, "p", client_versions=[]))["client_versions"] == []


def test_omitted_optional_fields_on_a_change(api):
    """identity_mode and claim_order are kept; max_resets and
    recommended_lease_seconds return to their defaults."""
    _ok(_put(api, "p", identity_mode="none", claim_order="random", max_resets=9,
             recommended_lease_seconds=60))
    changed = _ok(_put(api, "p"))
    assert (changed["identity_mode"], changed["claim_order"]) == ("none", "random")
    assert (changed["max_resets"], changed["recommended_lease_seconds"]) == (3, 300)
    assert _ok(_put(api, "p", claim_order="fifo"))["claim_order"] == "fifo"


def test_identity_mode_cannot_change(api):
    _ok(_put(api, "p", identity_mode="unique_value"))
    before = _summary(api, "p")
    err = _error(_put(api, "p", identity_mode="external_id"), 400, "invalid_request")
    assert err["details"]["field"] == "identity_mode"
    assert _summary(api, "p") == before
    assert _ok(_put(api, "p", identity_mode="unique_value"))["identity_mode"] == "unique_value"


def test_put_keeps_the_kind_and_fleethq_fields_of_an_existing_project(api):
    api.put_project("papers", kind="pdf", max_in_flight=16, max_worker_in_flight=4,
                    retry_backoff_seconds=5, task_timeout_seconds=1200)
    before = _ok(api.call("GET", f"{FLEETHQ}/papers"))
    _ok(_put(api, "papers", status="draining", dispatch_qps=2.0, max_jobs_per_claim=8))
    after = _ok(api.call("GET", f"{FLEETHQ}/papers"))
    kept = ("kind", "max_in_flight", "max_worker_in_flight", "retry_backoff_seconds",
            "prefer_new_worker", "task_timeout_seconds", "attempt_timeout_seconds",
            "upload_timeout_seconds")
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept}
    assert after["kind"] == "pdf" and after["max_in_flight"] == 16
    assert (after["status"], after["dispatch_qps"], after["max_jobs_per_claim"]) == (
        "draining", 2.0, 8)


@pytest.mark.parametrize("field, value", [
    ("dispatch_qps", 3.0), ("worker_claim_qps", 1.5), ("max_jobs_per_claim", 9), ("max_resets", 4),
    ("recommended_lease_seconds", 90), ("client_versions", [VERSION, "v-next"])])
def test_policy_version_goes_up_when_a_worker_facing_field_changes(api, field, value):
    assert _ok(_put(api, "p"))["policy_version"] == 1
    assert _ok(_put(api, "p", **{field: value}))["policy_version"] == 2
    assert body(api.call("GET", "/api/v1/projects/p"))["policy_version"] == 2
    # The same request again is no change.
    assert _ok(_put(api, "p", **{field: value}))["policy_version"] == 2


def test_policy_version_stays_for_status_claim_order_and_identical_puts(api):
    assert _ok(_put(api, "p", max_resets=7))["policy_version"] == 1
    assert _ok(_put(api, "p", max_resets=7))["policy_version"] == 1
    assert _ok(_put(api, "p", max_resets=7, status="draining"))["policy_version"] == 1
    assert _ok(_put(api, "p", max_resets=7, claim_order="random"))["policy_version"] == 1
    # Omitting max_resets returns it to 3: a change, so a bump.
    assert _ok(_put(api, "p", claim_order="random"))["policy_version"] == 2


def test_patch_is_not_a_contract_operation(api):
    _ok(_put(api, "p"))
    response = api.call("PATCH", f"{ADMIN}/p", {"max_resets": 1})
    assert response.status_code == 405
    assert "PATCH" not in response.headers["Allow"] and "PUT" in response.headers["Allow"]
    assert _summary(api, "p")["max_resets"] == 3
    # FleetHQ's own route keeps PATCH.
    assert _ok(api.call("PATCH", f"{FLEETHQ}/p", {"max_resets": 1}))["max_resets"] == 1
