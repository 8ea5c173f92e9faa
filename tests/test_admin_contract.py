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
