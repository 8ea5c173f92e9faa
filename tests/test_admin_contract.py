"""The v1 contract's admin project and job routes (DESIGN §6): exactly the
contract's shapes, status codes and error codes, so that clients written
for the contract (strict decoders that reject unknown fields) work.

FleetHQ's fuller views of the same data, on ``/api/v1/fleethq/``, are
checked here too where the two must agree."""
from __future__ import annotations

import time

import pytest

from tests.helpers import VERSION, api_error, body, sql, values

ADMIN = "/api/v1/admin/projects"
FLEETHQ = "/api/v1/fleethq/projects"
SUMMARY_KEYS = {"id", "status", "identity_mode", "claim_order", "dispatch_qps", "worker_claim_qps",
                "max_jobs_per_claim", "max_resets", "recommended_lease_seconds", "client_versions",
                "policy_version", "job_counts", "created_at", "updated_at"}
COUNT_KEYS = {"todo", "wip", "done", "failed", "reset_exhausted"}
ZERO = dict.fromkeys(COUNT_KEYS, 0)


_error = api_error


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
    ("max_worker_attempts", 3),
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
                    retry_backoff_seconds=5, task_timeout_seconds=1200, max_worker_attempts=7)
    before = _ok(api.call("GET", f"{FLEETHQ}/papers"))
    _ok(_put(api, "papers", status="draining", dispatch_qps=2.0, max_jobs_per_claim=8))
    after = _ok(api.call("GET", f"{FLEETHQ}/papers"))
    kept = ("kind", "max_in_flight", "max_worker_in_flight", "retry_backoff_seconds",
            "prefer_new_worker", "task_timeout_seconds", "attempt_timeout_seconds",
            "upload_timeout_seconds", "max_worker_attempts", "fallback_after_seconds")
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept}
    assert after["max_worker_attempts"] == 7
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


# ------------------------------------------------------- jobs: AdminJob (A7, A8, R3)

JOB_KEYS = {"value", "type", "job_id", "random_key", "status", "attempt_id", "worker_id",
            "lease_expires_at", "reset_count", "outcome", "artifact_receipts", "execution_error",
            "created_at", "updated_at", "completed_at"}
RECEIPT = {"id": "r-1", "issuer": "archive.example.org", "object_id": "bucket/obj-1",
           "checksum": "sha256:" + "ab" * 32, "size_bytes": 1234, "accepted_at": 1_700_000_000}


def _jobs(api, project_id: str, query: str = "") -> dict:
    return _ok(api.call("GET", f"{ADMIN}/{project_id}/jobs?{query}"))


def _job(api, project_id: str, job_id) -> dict:
    return _ok(api.call("GET", f"{ADMIN}/{project_id}/jobs/{job_id}"))


def _complete(api, project_id, job, outcome, receipts=None):
    item = {"job_id": job["job_id"], "attempt_id": job["attempt_id"], "outcome": outcome}
    if receipts is not None:
        item["artifact_receipts"] = receipts
    response = api.call("POST", f"/api/v1/projects/{project_id}/jobs/complete",
                        {"worker_id": "w1", "items": [item]})
    assert body(response)["results"][0]["status"] == "applied", body(response)


def _fail(api, project_id, job, retryable, error):
    response = api.call("POST", f"/api/v1/projects/{project_id}/jobs/fail", {
        "worker_id": "w1", "items": [{"job_id": job["job_id"], "attempt_id": job["attempt_id"],
                                      "retryable": retryable, "error": error}]})
    assert body(response)["results"][0]["status"] == "applied", body(response)


def test_a_queued_job_has_exactly_the_contract_fields(api):
    api.put_project("p")
    api.enqueue("p", [{"id": "bare", "value": "https://example.org/b", "random_key": -7},
                      {"id": "full", "value": "https://example.org/f", "type": "asset",
                       "via": "https://example.org/", "hops": 0, "attr": {"a": [1, "x"]}}])
    bare, full = _jobs(api, "p")["jobs"]
    assert set(bare) == JOB_KEYS | {"id"}
    assert set(full) == JOB_KEYS | {"id", "via", "hops", "attr"}
    assert type(bare["job_id"]) is int and type(full["job_id"]) is int
    assert (bare["id"], bare["type"], bare["random_key"]) == ("bare", "seed", -7)
    assert (full["type"], full["via"], full["hops"], full["attr"]) == (
        "asset", "https://example.org/", 0, {"a": [1, "x"]})
    assert type(full["random_key"]) is int
    for job in (bare, full):
        assert job["status"] == "todo" and job["reset_count"] == 0
        assert job["attempt_id"] is job["worker_id"] is job["lease_expires_at"] is None
        assert job["outcome"] is None and job["execution_error"] is None
        assert job["artifact_receipts"] == [] and job["completed_at"] is None
        assert type(job["created_at"]) is int and type(job["updated_at"]) is int
        assert job == _job(api, "p", job["job_id"])


def test_jobs_without_external_ids_have_no_id(api):
    api.put_project("p", identity_mode="unique_value")
    api.enqueue("p", [{"value": "https://example.org/u"}])
    (job,) = _jobs(api, "p")["jobs"]
    assert set(job) == JOB_KEYS


def test_a_job_in_flight_shows_its_attempt_worker_and_lease(api):
    api.put_project("p")
    api.enqueue("p", values(1))
    (claimed,) = body(api.claim("p", worker_id="w1", lease_seconds=120))["jobs"]
    job = _job(api, "p", claimed["job_id"])
    assert job["job_id"] == int(claimed["job_id"])
    assert job["status"] == "wip"
    assert job["attempt_id"] == str(claimed["attempt_id"]) and isinstance(job["attempt_id"], str)
    assert job["worker_id"] == "w1"
    assert job["lease_expires_at"] == claimed["lease_expires_at"]
    assert job["completed_at"] is None


def test_a_done_job_shows_its_outcome_and_artifact_receipts(api):
    api.put_project("p")
    api.enqueue("p", values(2))
    first, second = body(api.claim("p", max_jobs=2))["jobs"]
    before = int(time.time())
    _complete(api, "p", first, {"kind": "http_error", "code": 404, "uri": "https://example.org/x",
                                "meta": {"etag": "abc"}}, [RECEIPT, {**RECEIPT, "id": "r-2"}])
    _complete(api, "p", second, {"kind": "success"})
    done = _job(api, "p", first["job_id"])
    assert done["status"] == "done"
    assert done["outcome"] == {"kind": "http_error", "code": 404, "uri": "https://example.org/x",
                               "meta": {"etag": "abc"}}
    assert done["artifact_receipts"] == [RECEIPT, {**RECEIPT, "id": "r-2"}]
    assert done["attempt_id"] is done["worker_id"] is done["lease_expires_at"] is None
    assert done["execution_error"] is None
    assert before - 1 <= done["completed_at"] <= int(time.time()) + 1
    # The four outcome keys are always there; no receipts is an empty list.
    bare = _job(api, "p", second["job_id"])
    assert bare["outcome"] == {"kind": "success", "code": None, "uri": None, "meta": {}}
    assert bare["artifact_receipts"] == []
    listed = _jobs(api, "p", "status=done")["jobs"]
    assert listed == [done, bare]


def test_failures_show_the_execution_error(api):
    api.put_project("p", max_resets=1)
    api.enqueue("p", values(2))
    retried, hard = body(api.claim("p", max_jobs=2))["jobs"]
    _fail(api, "p", retried, True, {"code": "network", "message": "reset by peer",
                                    "details": {"errno": 104}})
    _fail(api, "p", hard, False, {"code": "not_found", "message": "gone"})
    queued = _job(api, "p", retried["job_id"])
    assert queued["status"] == "todo" and queued["reset_count"] == 1
    assert queued["execution_error"] == {"code": "network", "message": "reset by peer",
                                         "details": {"errno": 104}}
    assert queued["completed_at"] is None
    failed = _job(api, "p", hard["job_id"])
    assert failed["status"] == "failed" and failed["reset_count"] == 0
    assert failed["execution_error"] == {"code": "not_found", "message": "gone", "details": {}}
    assert type(failed["completed_at"]) is int
    assert failed["outcome"] is None and failed["artifact_receipts"] == []

    # The second retryable failure exhausts the job; its error is the last one.
    (again,) = body(api.claim("p"))["jobs"]
    _fail(api, "p", again, True, {"code": "timeout", "message": "slow"})
    exhausted = _job(api, "p", retried["job_id"])
    assert exhausted["status"] == "reset_exhausted" and exhausted["reset_count"] == 2
    assert exhausted["execution_error"]["code"] == "timeout"
    assert type(exhausted["completed_at"]) is int


def test_success_after_a_failure_clears_the_execution_error(api):
    api.put_project("p")
    api.enqueue("p", values(1))
    (job,) = body(api.claim("p"))["jobs"]
    _fail(api, "p", job, True, {"code": "network", "message": "x"})
    (job,) = body(api.claim("p"))["jobs"]
    assert _job(api, "p", job["job_id"])["execution_error"]["code"] == "network"
    _complete(api, "p", job, {"kind": "skipped"})
    done = _job(api, "p", job["job_id"])
    assert done["execution_error"] is None and done["reset_count"] == 1
    assert done["outcome"]["kind"] == "skipped"


def test_a_staged_job_is_wip_and_found_by_status_wip(api, app):
    api.put_project("p")
    api.enqueue("p", values(3))
    held, staged = body(api.claim("p", max_jobs=2))["jobs"]
    sql(app, "UPDATE jobs SET state = 'staged' WHERE id = :id", id=int(staged["job_id"]))
    job = _job(api, "p", staged["job_id"])
    assert job["status"] == "wip" and job["attempt_id"] == str(staged["attempt_id"])
    assert [j["job_id"] for j in _jobs(api, "p", "status=wip")["jobs"]] == [
        int(held["job_id"]), int(staged["job_id"])]
    assert [j["status"] for j in _jobs(api, "p")["jobs"]] == ["wip", "wip", "todo"]
    # FleetHQ's own view names the state.
    full = _ok(api.call("GET", f"{FLEETHQ}/p/jobs?status=staged"))["jobs"]
    assert [(j["job_id"], j["state"]) for j in full] == [(int(staged["job_id"]), "staged")]


def test_an_attempt_with_a_wire_id_is_shown_by_it(api, app):
    api.put_project("p")
    api.enqueue("p", values(1))
    (claimed,) = body(api.claim("p"))["jobs"]
    sql(app, "UPDATE attempts SET wire_id = 'at_imported1' WHERE id = :a",
        a=int(claimed["attempt_id"]))
    assert _job(api, "p", claimed["job_id"])["attempt_id"] == "at_imported1"


def test_cursor_paging_with_integer_cursors(api, app):
    api.put_project("p")
    api.enqueue("p", values(7))
    claimed = body(api.claim("p", max_jobs=2))["jobs"]
    sql(app, "UPDATE jobs SET state = 'staged' WHERE id = :id", id=int(claimed[1]["job_id"]))
    seen, after, pages = [], 0, 0
    while True:
        page = _jobs(api, "p", f"limit=3&after_job_id={after}")
        assert set(page) == {"jobs", "next_after_job_id"}
        seen += page["jobs"]
        pages += 1
        after = page["next_after_job_id"]
        if after is None:
            break
        assert type(after) is int and after == page["jobs"][-1]["job_id"]
    assert pages == 3
    assert [j["id"] for j in seen] == [f"v{i}" for i in range(7)]
    # An exact last page has no next cursor.
    assert _jobs(api, "p", "limit=7")["next_after_job_id"] is None
    assert _jobs(api, "p", "limit=6")["next_after_job_id"] == seen[5]["job_id"]
    assert _jobs(api, "p", "limit=1&status=wip")["next_after_job_id"] == seen[0]["job_id"]


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "1.5", "99999999999999999999"])
def test_a_malformed_job_id_is_400(api, raw):
    api.put_project("p")
    for method, path in (("GET", f"{ADMIN}/p/jobs/{raw}"), ("DELETE", f"{ADMIN}/p/jobs/{raw}"),
                         ("POST", f"{ADMIN}/p/jobs/{raw}/requeue")):
        _error(api.call(method, path), 400, "invalid_request")


def test_unknown_jobs_and_projects_are_404(api):
    api.put_project("p")
    api.put_project("q")
    api.enqueue("q", values(1))
    other = _jobs(api, "q")["jobs"][0]["job_id"]
    for path in (f"{ADMIN}/p/jobs/999999", f"{ADMIN}/p/jobs/{other}", f"{ADMIN}/nope/jobs/{other}",
                 f"{ADMIN}/nope/jobs", f"{FLEETHQ}/p/jobs/{other}", f"{FLEETHQ}/nope/jobs"):
        _error(api.call("GET", path), 404, "not_found")


# ----------------------------------------------------- requeue and delete (A4, A9, A10)


def test_requeue_answers_204_and_clears_the_failure(api):
    api.put_project("p", max_resets=0)
    api.enqueue("p", values(2))
    hard, soft = body(api.claim("p", max_jobs=2))["jobs"]
    _fail(api, "p", hard, False, {"code": "not_found", "message": "gone", "details": {"n": 1}})
    _fail(api, "p", soft, True, {"code": "network", "message": "flaky"})
    assert _job(api, "p", soft["job_id"])["status"] == "reset_exhausted"
    for claimed in (hard, soft):
        response = api.call("POST", f"{ADMIN}/p/jobs/{claimed['job_id']}/requeue")
        assert response.status_code == 204, body(response)
        assert response.data == b""
        job = _job(api, "p", claimed["job_id"])
        assert (job["status"], job["reset_count"]) == ("todo", 0)
        assert job["execution_error"] is None and job["outcome"] is None
        assert job["artifact_receipts"] == [] and job["completed_at"] is None
        assert _ok(api.call("GET", f"{FLEETHQ}/p/jobs/{claimed['job_id']}"))["last_error"] is None
    again = body(api.claim("p", max_jobs=5))["jobs"]
    assert sorted(int(j["job_id"]) for j in again) == sorted(int(j["job_id"]) for j in (hard, soft))


def test_requeue_refuses_jobs_that_are_not_failed_or_exhausted(api, app):
    api.put_project("p")
    api.enqueue("p", values(4))
    done, wip, staged = body(api.claim("p", max_jobs=3))["jobs"]
    _complete(api, "p", done, {"kind": "success"}, [RECEIPT])
    sql(app, "UPDATE jobs SET state = 'staged' WHERE id = :id", id=int(staged["job_id"]))
    todo = _jobs(api, "p", "status=todo")["jobs"][0]
    for job_id in (done["job_id"], wip["job_id"], staged["job_id"], todo["job_id"]):
        before = _job(api, "p", job_id)
        err = _error(api.call("POST", f"{ADMIN}/p/jobs/{job_id}/requeue"), 400, "invalid_request")
        assert err["details"]["state"] in ("done", "wip", "staged", "todo")
        assert _job(api, "p", job_id) == before
    assert _job(api, "p", done["job_id"])["artifact_receipts"] == [RECEIPT]


def test_delete_job_answers_204_and_refuses_jobs_in_flight(api, app):
    api.put_project("p", max_resets=0)
    api.enqueue("p", values(5))
    done, failed, wip, staged = body(api.claim("p", max_jobs=4))["jobs"]
    _complete(api, "p", done, {"kind": "success"})
    _fail(api, "p", failed, False, {"code": "x", "message": "y"})
    sql(app, "UPDATE jobs SET state = 'staged' WHERE id = :id", id=int(staged["job_id"]))
    todo = _jobs(api, "p", "status=todo")["jobs"][0]
    for job_id in (wip["job_id"], staged["job_id"]):
        err = _error(api.call("DELETE", f"{ADMIN}/p/jobs/{job_id}"), 400, "invalid_request")
        assert err["details"]["state"] in ("wip", "staged")
        assert _job(api, "p", job_id)["status"] == "wip"
    for job_id in (done["job_id"], failed["job_id"], todo["job_id"]):
        response = api.call("DELETE", f"{ADMIN}/p/jobs/{job_id}")
        assert response.status_code == 204 and response.data == b""
        _error(api.call("GET", f"{ADMIN}/p/jobs/{job_id}"), 404, "not_found")
        _error(api.call("DELETE", f"{ADMIN}/p/jobs/{job_id}"), 400, "invalid_request")
    assert _summary(api, "p")["job_counts"] == {**ZERO, "wip": 2}


def test_requeue_and_delete_of_unknown_jobs_are_400(api):
    """As SavewebHQ: a job it cannot requeue or delete is an invalid request."""
    api.put_project("p")
    api.put_project("q", max_resets=0)
    api.enqueue("q", values(1))
    (other,) = body(api.claim("q"))["jobs"]
    _fail(api, "q", other, False, {"code": "x", "message": "y"})
    for job_id in ("424242", other["job_id"]):
        _error(api.call("POST", f"{ADMIN}/p/jobs/{job_id}/requeue"), 400, "invalid_request")
        _error(api.call("DELETE", f"{ADMIN}/p/jobs/{job_id}"), 400, "invalid_request")
    assert _job(api, "q", other["job_id"])["status"] == "failed"


def test_delete_project_refuses_jobs_in_flight(api, app):
    api.put_project("p")
    api.enqueue("p", values(3))
    wip, staged = body(api.claim("p", max_jobs=2))["jobs"]
    sql(app, "UPDATE jobs SET state = 'staged' WHERE id = :id", id=int(staged["job_id"]))
    err = _error(api.call("DELETE", f"{ADMIN}/p"), 400, "invalid_request")
    assert err["details"]["in_flight"] == 2
    _complete(api, "p", wip, {"kind": "success"})
    _error(api.call("DELETE", f"{ADMIN}/p"), 400, "invalid_request")  # the staged one
    sql(app, "UPDATE jobs SET state = 'done' WHERE id = :id", id=int(staged["job_id"]))
    response = api.call("DELETE", f"{ADMIN}/p")
    assert response.status_code == 204 and response.data == b""
    _error(api.call("GET", f"{ADMIN}/p"), 404, "not_found")
    _error(api.call("DELETE", f"{ADMIN}/p"), 404, "not_found")


# ------------------------------------------------------------------ enqueue (A5)


def test_enqueue_has_no_job_count_cap(api):
    """Only the 8 MiB body limit bounds a batch: 25,000 small jobs go in at once."""
    api.put_project("p", identity_mode="none")
    jobs = [{"value": f"v{i}"} for i in range(25_000)]
    response = api.enqueue("p", jobs)
    assert _ok(response) == {"project_id": "p", "submitted": 25_000, "inserted": 25_000}
    assert _summary(api, "p")["job_counts"]["todo"] == 25_000


def test_enqueue_answer_has_exactly_the_contract_fields(api):
    api.put_project("p")
    assert _ok(api.enqueue("p", values(3) + values(1))) == {
        "project_id": "p", "submitted": 4, "inserted": 3}
    assert _ok(api.enqueue("p", values(3))) == {"project_id": "p", "submitted": 3, "inserted": 0}


@pytest.mark.parametrize("jobs", [[], None, {"value": "x"}, "x"])
def test_enqueue_needs_a_non_empty_list(api, jobs):
    api.put_project("p")
    err = _error(api.call("POST", f"{ADMIN}/p/jobs", {"jobs": jobs}), 400, "invalid_request")
    assert err["details"]["field"] == "jobs"
