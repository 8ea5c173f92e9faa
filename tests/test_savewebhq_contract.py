"""FleetHQ answers SavewebHQ's v1 contract (``api/openapi-v1.yaml``) exactly.

Each of the contract's operations is called over real HTTP against a live
master with SavewebHQ's request bodies and headers; every JSON answer is
validated against the contract's schemas (tests/savewebhq_schemas.py), and
each documented refusal is checked for its status and error code. Where the
contract leaves a behaviour open, the tests follow what SavewebHQ's server
does (internal/projectqueuehttp, internal/tracker/postgres), and say so.

Operations: health, whoAmI, listAdminProjects, listAdminUsers, putAdminUser,
deleteAdminUser, getAdminMachineToken, rotateAdminMachineToken,
revokeAdminMachineToken, getAdminProject, putAdminProject,
deleteAdminProject, listAdminProjectJobs, enqueueAdminProjectJobs,
getProjectPolicy, enqueueAdminProjectSource, getAdminProjectJob,
deleteAdminProjectJob, requeueAdminProjectJob, claimProjectJobs,
completeProjectJobs, failProjectJobs, extendProjectJobLeases.
"""
from __future__ import annotations

import json
import math
import time

import pytest

from tests import savewebhq_schemas as S
from tests.savewebhq_wire import (CLIENT_VERSION, MIB, NO_BODY, SUCCESS, admin_path, claim_body,
                                  complete_body, each_case, expect, expect_error, extend_body, fail_body,
                                  hq, hq_server, job_id_of, make_account, project_body, receipt, ref,  # noqa: F401
                                  source_file, specs, worker_path)

P = "proj"
USER = "someone"
NOW_SLACK_S = 30


def rejection(result: dict) -> tuple:
    """An item result's status and error code (None when it has no error)."""
    return result["status"], (result.get("error") or {}).get("code")


def near_now(value: int, offset: int = 0) -> bool:
    return abs(value - (int(time.time()) + offset)) <= NOW_SLACK_S


# Every authenticated operation, by operationId, with a body SavewebHQ's
# clients would send: a dict goes as JSON, bytes as an application/zstd source.
OPERATIONS = {
    "whoAmI": ("GET", "/api/v1/whoami", NO_BODY),
    "listAdminProjects": ("GET", "/api/v1/admin/projects", NO_BODY),
    "listAdminUsers": ("GET", "/api/v1/admin/users", NO_BODY),
    "putAdminUser": ("PUT", f"/api/v1/admin/users/{USER}", {"status": "active", "roles": ["worker"]}),
    "deleteAdminUser": ("DELETE", f"/api/v1/admin/users/{USER}", NO_BODY),
    "getAdminMachineToken": ("GET", f"/api/v1/admin/users/{USER}/machine-token", NO_BODY),
    "rotateAdminMachineToken": ("POST", f"/api/v1/admin/users/{USER}/machine-token", NO_BODY),
    "revokeAdminMachineToken": ("DELETE", f"/api/v1/admin/users/{USER}/machine-token", NO_BODY),
    "getAdminProject": ("GET", admin_path(P), NO_BODY),
    "putAdminProject": ("PUT", admin_path(P), project_body()),
    "deleteAdminProject": ("DELETE", admin_path(P), NO_BODY),
    "listAdminProjectJobs": ("GET", admin_path(P, "/jobs"), NO_BODY),
    "enqueueAdminProjectJobs": ("POST", admin_path(P, "/jobs"), {"jobs": specs(1)}),
    "enqueueAdminProjectSource": ("POST", admin_path(P, "/source"), source_file(specs(1))),
    "getAdminProjectJob": ("GET", admin_path(P, "/jobs/1"), NO_BODY),
    "deleteAdminProjectJob": ("DELETE", admin_path(P, "/jobs/1"), NO_BODY),
    "requeueAdminProjectJob": ("POST", admin_path(P, "/jobs/1/requeue"), NO_BODY),
    "getProjectPolicy": ("GET", worker_path(P), NO_BODY),
    "claimProjectJobs": ("POST", worker_path(P, "/jobs/claim"), claim_body()),
    "completeProjectJobs": ("POST", worker_path(P, "/jobs/complete"),
                            complete_body([{"job_id": 1, "attempt_id": "1"}])),
    "failProjectJobs": ("POST", worker_path(P, "/jobs/fail"),
                        fail_body([{"job_id": 1, "attempt_id": "1"}], retryable=True)),
    "extendProjectJobLeases": ("POST", worker_path(P, "/jobs/extend-lease"),
                               extend_body([{"job_id": 1, "attempt_id": "1"}])),
}


def operations(where) -> dict:
    return {name: op for name, op in OPERATIONS.items() if where(name, *op)}


ADMIN_OPERATIONS = operations(lambda name, method, path, body: path.startswith("/api/v1/admin/"))
WORKER_OPERATIONS = operations(lambda name, method, path, body: path.startswith("/api/v1/projects/"))
JSON_OPERATIONS = operations(lambda name, method, path, body: isinstance(body, dict))

# The three batch mutations of a claimed attempt: route tail, body maker.
MUTATIONS = {
    "completeProjectJobs": ("/jobs/complete", complete_body),
    "failProjectJobs": ("/jobs/fail", lambda jobs: fail_body(jobs, retryable=False)),
    "extendProjectJobLeases": ("/jobs/extend-lease", extend_body),
}


def send(wire, operation):
    method, path, body = operation
    if isinstance(body, bytes):
        return wire.call(method, path, raw=body, content_type="application/zstd")
    return wire.call(method, path, body)


def caller_of(hq, operation):
    """The caller entitled to ``operation``: the worker for worker routes, else the admin."""
    return hq.worker if operation[1].startswith("/api/v1/projects/") else hq.admin


# ================================================================ health

def test_health_answers_status_ok_without_a_token(hq):
    assert expect(hq.anonymous.get("/healthz"), 200, S.HEALTH) == {"status": "ok"}


# ====================================================== authentication (401)

def test_every_operation_refuses_a_missing_or_unknown_token_with_401(hq):
    callers = {"no token": hq.wire(None), "unknown token": hq.wire("hq_not-a-token-this-master-issued")}
    each_case(OPERATIONS, lambda operation: each_case(callers, lambda wire: expect_error(
        send(wire, operation), 401, "invalid_machine_token")))


# ======================================================= authorization (403)

def test_admin_operations_refuse_a_worker_token_with_403_permission_denied(hq):
    each_case(ADMIN_OPERATIONS, lambda operation: expect_error(
        send(hq.worker, operation), 403, "permission_denied"))


def test_admin_operations_refuse_an_admin_who_is_not_active_with_403(hq):
    callers = {status: hq.wire(make_account(hq.app, f"{status}-admin", ["admin"], status=status), None)
               for status in ("suspended", "pending")}
    each_case(ADMIN_OPERATIONS, lambda operation: each_case(callers, lambda wire: expect_error(
        send(wire, operation), 403, "permission_denied")))


def test_worker_operations_refuse_a_token_without_the_worker_role_with_403(hq):
    hq.put_project(P)
    admin_as_worker = hq.wire(hq.admin.token)
    each_case(WORKER_OPERATIONS, lambda operation: expect_error(
        send(admin_as_worker, operation), 403, "permission_denied"))


def test_worker_operations_refuse_a_worker_who_is_not_active_with_403(hq):
    hq.put_project(P)
    callers = {status: hq.wire(make_account(hq.app, f"{status}-worker", ["worker"], status=status))
               for status in ("suspended", "pending")}
    each_case(WORKER_OPERATIONS, lambda operation: each_case(callers, lambda wire: expect_error(
        send(wire, operation), 403, "permission_denied")))


# ========================================================== not found (404)

def test_worker_operations_on_an_unknown_project_are_404(hq):
    each_case(WORKER_OPERATIONS, lambda operation: expect_error(
        send(hq.worker, operation), 404, "not_found"))


def test_admin_operations_on_an_unknown_project_are_404(hq):
    # A job route of an unknown project is covered by the job tests (SavewebHQ
    # answers 400 for a job it cannot delete or requeue, found or not).
    scoped = operations(lambda name, method, path, body: "/admin/projects/" in path and name not in (
        "putAdminProject", "deleteAdminProjectJob", "requeueAdminProjectJob"))
    each_case(scoped, lambda operation: expect_error(send(hq.admin, operation), 404, "not_found"))


def test_an_unknown_api_route_is_404_not_found(hq):
    expect_error(hq.admin.get("/api/v1/no-such-route"), 404, "not_found")


def test_an_unsupported_method_is_405_invalid_request(hq):
    # SavewebHQ's router answers 405 with its invalid_request code.
    hq.put_project(P)
    expect_error(hq.worker.get(worker_path(P, "/jobs/claim")), 405, "invalid_request")


# ============================================== request decoding (400)

def test_an_unknown_field_is_400_invalid_request(hq):
    hq.put_project(P)
    each_case(JSON_OPERATIONS, lambda operation: expect_error(
        caller_of(hq, operation).call(operation[0], operation[1], {**operation[2], "unexpected": 1}),
        400, "invalid_request"))


@pytest.mark.parametrize("name", MUTATIONS)
def test_an_unknown_field_inside_an_item_is_400_for_the_whole_batch(hq, name):
    hq.put_project(P)
    hq.enqueue(P, specs(2))
    jobs = hq.claimed(P, 2)
    tail, make_body = MUTATIONS[name]
    body = make_body(jobs)
    body["items"][1]["unexpected"] = True
    expect_error(hq.worker.post(worker_path(P, tail), body), 400, "invalid_request")
    hq.completes(P, jobs)  # nothing of the refused batch was applied


def test_the_fleethq_kind_field_is_unknown_to_the_savewebhq_project_route(hq):
    expect_error(hq.admin.put(admin_path(P), project_body(kind="generic")), 400, "invalid_request")


CONTENT_TYPES = {"text/plain": "text/plain", "form": "application/x-www-form-urlencoded",
                 "no content type": None}


def test_a_json_body_without_the_json_content_type_is_400_invalid_request(hq):
    hq.put_project(P)

    def refused(operation):
        method, path, body = operation
        raw = json.dumps(body).encode()
        each_case(CONTENT_TYPES, lambda content_type: expect_error(
            caller_of(hq, operation).call(method, path, raw=raw, content_type=content_type),
            400, "invalid_request"))
    each_case(JSON_OPERATIONS, refused)


BAD_JSON = {"truncated": b'{"status":', "two objects": b"{} {}", "array": b"[]", "empty": b"",
            "nan": b'{"max_jobs": NaN}', "not json": b"hello"}


def test_a_body_that_is_not_one_json_object_is_400_invalid_request(hq):
    hq.put_project(P)
    each_case(JSON_OPERATIONS, lambda operation: each_case(BAD_JSON, lambda raw: expect_error(
        caller_of(hq, operation).call(operation[0], operation[1], raw=raw), 400, "invalid_request")))


def padded(body: dict, size: int) -> bytes:
    """``body`` as JSON grown to ``size`` bytes with insignificant whitespace."""
    data = json.dumps(body, separators=(",", ":")).encode()
    return b"{" + b" " * (size - len(data)) + data[1:]


def test_a_body_over_8_mib_is_400_invalid_request(hq):
    hq.put_project(P)
    each_case(JSON_OPERATIONS, lambda operation: expect_error(
        caller_of(hq, operation).call(operation[0], operation[1], raw=padded(operation[2], 8 * MIB + 1)),
        400, "invalid_request"))


@pytest.mark.parametrize("path_tail, make_body", [
    ("/jobs/claim", lambda jobs: claim_body()),
    ("/jobs/extend-lease", lambda jobs: extend_body(jobs)),
], ids=["claimProjectJobs", "extendProjectJobLeases"])
def test_a_worker_body_just_under_8_mib_is_accepted(hq, path_tail, make_body):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1) if path_tail != "/jobs/claim" else []
    raw = padded(make_body(jobs), 8 * MIB - 1024)
    expect(hq.worker.post(worker_path(P, path_tail), raw=raw), 200)


# ================================================================ whoAmI

def test_whoami_returns_the_user_id_of_the_token(hq):
    assert expect(hq.worker.get("/api/v1/whoami"), 200, S.WHO_AM_I) == {"user_id": "hq-worker"}
    assert expect(hq.admin.get("/api/v1/whoami"), 200, S.WHO_AM_I) == {"user_id": "hq-admin"}


# ===================================================== listAdminProjects

def test_list_projects_answers_every_project_with_its_five_counts(hq):
    hq.put_project("b-proj")
    hq.put_project("a-proj")
    hq.enqueue("b-proj", specs(2))
    projects = expect(hq.admin.get("/api/v1/admin/projects"), 200, S.ADMIN_PROJECT_LIST)["projects"]
    assert [p["id"] for p in projects] == ["a-proj", "b-proj"]
    assert projects[1]["job_counts"] == {"todo": 2, "wip": 0, "done": 0, "failed": 0,
                                         "reset_exhausted": 0}


def test_list_projects_is_an_empty_list_when_there_are_none(hq):
    assert expect(hq.admin.get("/api/v1/admin/projects"), 200, S.ADMIN_PROJECT_LIST) == {"projects": []}


# ===================================================== getAdminProject

def test_get_project_answers_the_summary_with_unix_second_timestamps(hq):
    hq.put_project(P, claim_order="random", dispatch_qps=5, worker_claim_qps=2.5,
                   max_jobs_per_claim=10, max_resets=7, recommended_lease_seconds=120)
    summary = expect(hq.admin.get(admin_path(P)), 200, S.ADMIN_PROJECT_SUMMARY)
    assert {k: summary[k] for k in ("id", "status", "identity_mode", "claim_order", "dispatch_qps",
                                    "worker_claim_qps", "max_jobs_per_claim", "max_resets",
                                    "recommended_lease_seconds", "client_versions")} == {
        "id": P, "status": "active", "identity_mode": "external_id", "claim_order": "random",
        "dispatch_qps": 5, "worker_claim_qps": 2.5, "max_jobs_per_claim": 10, "max_resets": 7,
        "recommended_lease_seconds": 120, "client_versions": [CLIENT_VERSION]}
    assert near_now(summary["created_at"]) and near_now(summary["updated_at"])


# ===================================================== putAdminProject

def test_put_project_creates_with_200_and_answers_the_summary_with_defaults(hq):
    body = {"status": "active", "dispatch_qps": None, "worker_claim_qps": None,
            "max_jobs_per_claim": 256, "client_versions": ["v1"]}
    summary = expect(hq.admin.put(admin_path(P), body, schema=S.ADMIN_PROJECT_REQUEST), 200,
                     S.ADMIN_PROJECT_SUMMARY)
    assert summary["identity_mode"] == "external_id" and summary["claim_order"] == "fifo"
    assert summary["max_resets"] == 3 and summary["recommended_lease_seconds"] == 300
    assert summary["policy_version"] == 1 and sum(summary["job_counts"].values()) == 0


def test_put_project_updates_an_existing_project_with_200(hq):
    hq.put_project(P)
    summary = expect(hq.admin.put(admin_path(P), project_body(status="draining"),
                                  schema=S.ADMIN_PROJECT_REQUEST), 200, S.ADMIN_PROJECT_SUMMARY)
    assert summary["status"] == "draining"


def test_put_project_keeps_the_claim_order_when_an_update_omits_it(hq):
    hq.put_project(P, claim_order="random")
    summary = expect(hq.admin.put(admin_path(P), project_body()), 200, S.ADMIN_PROJECT_SUMMARY)
    assert summary["claim_order"] == "random"


def test_put_project_keeps_the_identity_mode_when_an_update_omits_it(hq):
    hq.put_project(P, identity_mode="unique_value")
    body = project_body()
    del body["identity_mode"]
    assert expect(hq.admin.put(admin_path(P), body), 200, S.ADMIN_PROJECT_SUMMARY)[
        "identity_mode"] == "unique_value"


def test_put_project_refuses_to_change_the_identity_mode(hq):
    hq.put_project(P, identity_mode="external_id")
    expect_error(hq.admin.put(admin_path(P), project_body(identity_mode="none")), 400, "invalid_request")


def test_put_project_raises_policy_version_when_the_client_allowlist_changes(hq):
    hq.put_project(P)
    summary = expect(hq.admin.put(admin_path(P), project_body(client_versions=[CLIENT_VERSION, "v2"])),
                     200, S.ADMIN_PROJECT_SUMMARY)
    assert summary["policy_version"] == 2


def test_put_project_raises_policy_version_when_a_claim_policy_changes(hq):
    hq.put_project(P)
    summary = expect(hq.admin.put(admin_path(P), project_body(dispatch_qps=10)), 200,
                     S.ADMIN_PROJECT_SUMMARY)
    assert summary["policy_version"] == 2


def test_put_project_keeps_policy_version_when_only_the_status_changes(hq):
    hq.put_project(P)
    summary = expect(hq.admin.put(admin_path(P), project_body(status="draining")), 200,
                     S.ADMIN_PROJECT_SUMMARY)
    assert summary["policy_version"] == 1


BAD_PROJECT_FIELDS = {
    "unknown status": {"status": "paused"},
    "no status": {"status": None},
    "bad identity mode": {"identity_mode": "by_url"},
    "bad claim order": {"claim_order": "lifo"},
    "zero dispatch qps": {"dispatch_qps": 0},
    "negative claim qps": {"worker_claim_qps": -1},
    "257 jobs per claim": {"max_jobs_per_claim": 257},
    "1001 resets": {"max_resets": 1001},
    "negative resets": {"max_resets": -1},
    "lease 0": {"recommended_lease_seconds": 0},
    "lease 3601": {"recommended_lease_seconds": 3601},
    "version with spaces": {"client_versions": [" v1"]},
    "duplicate versions": {"client_versions": ["v1", "v1"]},
    "empty version": {"client_versions": [""]},
    "65 versions": {"client_versions": [f"v{i}" for i in range(65)]},
}


def test_put_project_refuses_an_invalid_policy_with_400_invalid_request(hq):
    def refused(fields):
        body = {k: v for k, v in project_body(**fields).items() if v is not None or k != "status"}
        expect_error(hq.admin.put(admin_path(P), body), 400, "invalid_request")
    each_case(BAD_PROJECT_FIELDS, refused)
    expect_error(hq.admin.get(admin_path(P)), 404, "not_found")


def test_an_empty_client_allowlist_is_allowed_and_blocks_every_worker(hq):
    expect(hq.admin.put(admin_path(P), project_body(client_versions=[])), 200, S.ADMIN_PROJECT_SUMMARY)
    error = expect_error(hq.worker.get(worker_path(P)), 426, "client_upgrade_required")
    assert error["details"]["client_versions"] == []


# ===================================================== deleteAdminProject

def test_delete_project_is_204_and_takes_its_jobs_with_it(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(3))
    expect(hq.admin.delete(admin_path(P)), 204)
    expect_error(hq.admin.get(admin_path(P)), 404, "not_found")
    hq.put_project(P)
    assert expect(hq.admin.get(admin_path(P, "/jobs")), 200, S.ADMIN_JOB_LIST)["jobs"] == []


def test_delete_project_with_wip_jobs_is_400_invalid_request_and_keeps_it(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    hq.claimed(P, 1)
    expect_error(hq.admin.delete(admin_path(P)), 400, "invalid_request")
    expect(hq.admin.get(admin_path(P)), 200, S.ADMIN_PROJECT_SUMMARY)


# ================================================== listAdminProjectJobs

def test_list_jobs_pages_50_by_default_with_an_integer_cursor(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(51))
    page = expect(hq.admin.get(admin_path(P, "/jobs")), 200, S.ADMIN_JOB_LIST)
    assert len(page["jobs"]) == 50
    job_ids = [job["job_id"] for job in page["jobs"]]
    assert job_ids == sorted(job_ids)
    assert page["next_after_job_id"] == job_ids[-1]
    rest = expect(hq.admin.get(admin_path(P, f"/jobs?after_job_id={job_ids[-1]}")), 200, S.ADMIN_JOB_LIST)
    assert len(rest["jobs"]) == 1 and rest["next_after_job_id"] is None
    assert rest["jobs"][0]["job_id"] > job_ids[-1]


def test_list_jobs_filters_by_status_and_limit(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(4))
    hq.claimed(P, 1, max_jobs=1)
    page = expect(hq.admin.get(admin_path(P, "/jobs?status=todo&limit=2")), 200, S.ADMIN_JOB_LIST)
    assert [job["status"] for job in page["jobs"]] == ["todo", "todo"]
    assert page["next_after_job_id"] == page["jobs"][-1]["job_id"]
    wip = expect(hq.admin.get(admin_path(P, "/jobs?status=wip")), 200, S.ADMIN_JOB_LIST)
    assert [job["status"] for job in wip["jobs"]] == ["wip"]


BAD_LIST_QUERIES = ["status=staged", "status=running", "limit=0", "limit=201", "limit=ten",
                    "after_job_id=abc"]


def test_list_jobs_refuses_a_bad_query_with_400_invalid_request(hq):
    hq.put_project(P)
    each_case({q: q for q in BAD_LIST_QUERIES}, lambda query: expect_error(
        hq.admin.get(admin_path(P, f"/jobs?{query}")), 400, "invalid_request"))


def test_list_jobs_ignores_query_parameters_it_does_not_know(hq):
    # SavewebHQ reads only status, after_job_id and limit.
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    assert len(expect(hq.admin.get(admin_path(P, "/jobs?page=2")), 200, S.ADMIN_JOB_LIST)["jobs"]) == 1


# ================================================ enqueueAdminProjectJobs

def test_enqueue_answers_project_submitted_and_inserted(hq):
    hq.put_project(P)
    jobs = [{"id": "seed-1", "value": "https://example.test/seed/1", "type": "seed", "via": None,
             "attr": {"group": "seed"}},
            {"id": "asset-1", "value": "https://example.test/asset/1", "type": "asset",
             "via": "https://example.test/seed/1", "hops": 1, "attr": {}, "random_key": -5}]
    answer = hq.admin.post(admin_path(P, "/jobs"), {"jobs": jobs}, schema=S.ADMIN_ENQUEUE_JOBS_REQUEST)
    assert expect(answer, 200, S.ADMIN_ENQUEUE_JOBS_RESPONSE) == {"project_id": P, "submitted": 2,
                                                                  "inserted": 2}


def test_enqueue_of_the_same_batch_again_inserts_nothing(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(4))
    again = expect(hq.admin.post(admin_path(P, "/jobs"), {"jobs": specs(4)}), 200,
                   S.ADMIN_ENQUEUE_JOBS_RESPONSE)
    assert (again["submitted"], again["inserted"]) == (4, 0)


def test_enqueue_of_a_known_id_with_another_value_is_409_identity_conflict(hq):
    hq.put_project(P)
    hq.enqueue(P, [{"id": "a", "value": "https://example.test/1"}])
    answer = hq.admin.post(admin_path(P, "/jobs"), {"jobs": [{"id": "a", "value": "https://example.test/2"}]})
    expect_error(answer, 409, "identity_conflict")


def test_enqueue_has_no_job_count_cap_below_the_body_limit(hq):
    hq.put_project(P)
    jobs = [{"id": f"j{i}", "value": str(i)} for i in range(10_001)]
    result = expect(hq.admin.post(admin_path(P, "/jobs"), {"jobs": jobs}), 200,
                    S.ADMIN_ENQUEUE_JOBS_RESPONSE)
    assert (result["submitted"], result["inserted"]) == (10_001, 10_001)


def test_enqueue_into_an_archived_project_is_409_project_not_active(hq):
    hq.put_project(P, status="archived")
    expect_error(hq.admin.post(admin_path(P, "/jobs"), {"jobs": specs(1)}), 409, "project_not_active")


def test_enqueue_into_a_draining_project_is_accepted(hq):
    hq.put_project(P, status="draining")
    expect(hq.admin.post(admin_path(P, "/jobs"), {"jobs": specs(1)}), 200, S.ADMIN_ENQUEUE_JOBS_RESPONSE)


def test_enqueue_of_no_jobs_is_400_invalid_request(hq):
    hq.put_project(P)
    expect_error(hq.admin.post(admin_path(P, "/jobs"), {"jobs": []}), 400, "invalid_request")


@pytest.mark.parametrize("mode, job", [
    ("external_id", {"value": "https://example.test/no-id"}),
    ("none", {"id": "x", "value": "https://example.test/with-id"}),
    ("unique_value", {"id": "x", "value": "https://example.test/with-id"}),
])
def test_enqueue_checks_ids_against_the_identity_mode_with_400_invalid_job(hq, mode, job):
    hq.put_project(P, identity_mode=mode)
    expect_error(hq.admin.post(admin_path(P, "/jobs"), {"jobs": [job]}), 400, "invalid_job")


# ============================================== enqueueAdminProjectSource

@pytest.mark.parametrize("content_type", ["application/zstd", "application/octet-stream"])
def test_source_import_answers_project_jobs_inserted_and_bytes(hq, content_type):
    hq.put_project(P)
    answer = hq.admin.post(admin_path(P, "/source"), raw=source_file(specs(3, "src")),
                           content_type=content_type)
    result = expect(answer, 200, S.ADMIN_ENQUEUE_SOURCE_RESPONSE)
    assert (result["project_id"], result["jobs"], result["inserted"]) == (P, 3, 3)
    assert result["uncompressed_bytes"] > 0


def test_source_import_of_another_media_type_is_415_invalid_request(hq):
    # SavewebHQ's only 415, and its code is invalid_request.
    hq.put_project(P)
    answer = hq.admin.post(admin_path(P, "/source"), raw=source_file(specs(1)), content_type="text/plain")
    expect_error(answer, 415, "invalid_request")


# ====================================================== getProjectPolicy

def test_policy_answers_the_seven_policy_fields(hq):
    hq.put_project(P, dispatch_qps=20, worker_claim_qps=0.5, max_jobs_per_claim=16,
                   recommended_lease_seconds=90)
    policy = expect(hq.worker.get(worker_path(P)), 200, S.PROJECT_POLICY)
    assert {k: v for k, v in policy.items() if k != "refresh_after_ms"} == {
        "project_id": P, "dispatch_qps": 20, "worker_claim_qps": 0.5, "max_jobs_per_claim": 16,
        "recommended_lease_seconds": 90, "policy_version": 1}


@pytest.mark.parametrize("status", ["draining", "archived"])
def test_policy_of_a_project_that_is_not_active_is_409_project_not_active(hq, status):
    hq.put_project(P, status=status)
    expect_error(hq.worker.get(worker_path(P)), 409, "project_not_active")


# ================================================= client versions (426)

REFUSED_VERSIONS = {"missing": None, "not allowed": "obsolete-v1", "other case": CLIENT_VERSION.upper()}


def test_worker_operations_need_an_allowed_client_version_426(hq):
    hq.put_project(P, client_versions=[CLIENT_VERSION, "other-v2"])

    def refused(operation, version):
        error = expect_error(send(hq.wire(hq.worker.token, version), operation), 426,
                             "client_upgrade_required")
        assert sorted(error["details"]["client_versions"]) == sorted([CLIENT_VERSION, "other-v2"]), error
    each_case(WORKER_OPERATIONS, lambda operation: each_case(
        REFUSED_VERSIONS, lambda version: refused(operation, version)))


# ====================================================== claimProjectJobs

def test_claim_answers_jobs_with_int64_ids_attempts_and_leases(hq):
    hq.put_project(P)
    hq.enqueue(P, [{"id": "s1", "value": "https://example.test/1", "type": "seed",
                    "via": "https://example.test/", "hops": 2, "attr": {"k": "v"}}])
    answer = hq.worker.post(worker_path(P, "/jobs/claim"),
                            claim_body(lease_seconds=120, accept_types=["seed", "asset"]),
                            schema=S.PROJECT_CLAIM_REQUEST)
    result = expect(answer, 200, S.PROJECT_CLAIM_RESPONSE)
    assert result["project_id"] == P and result["policy_version"] == 1
    assert len(result["jobs"]) == 1, str(answer)
    (job,) = result["jobs"]
    assert {k: job[k] for k in ("id", "value", "type", "via", "hops", "attr")} == {
        "id": "s1", "value": "https://example.test/1", "type": "seed",
        "via": "https://example.test/", "hops": 2, "attr": {"k": "v"}}
    assert near_now(job["lease_expires_at"], 120)


def test_claim_of_an_empty_queue_is_200_with_no_jobs(hq):
    hq.put_project(P)
    result = expect(hq.claim(P), 200, S.PROJECT_CLAIM_RESPONSE)
    assert result["jobs"] == []


@pytest.mark.parametrize("accept_types", ["empty list", "omitted", "null"])
def test_claim_accept_types_empty_omitted_or_null_means_every_type(hq, accept_types):
    hq.put_project(P)
    hq.enqueue(P, specs(1, "s", "seed") + specs(1, "a", "asset"))
    body = claim_body()
    if accept_types == "omitted":
        del body["accept_types"]
    elif accept_types == "null":
        body["accept_types"] = None
    result = expect(hq.worker.post(worker_path(P, "/jobs/claim"), body), 200, S.PROJECT_CLAIM_RESPONSE)
    assert sorted(job["type"] for job in result["jobs"]) == ["asset", "seed"]


def test_claim_accept_types_limits_the_types_handed_out(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(2, "s", "seed") + specs(2, "a", "asset"))
    result = expect(hq.claim(P, accept_types=["asset"]), 200, S.PROJECT_CLAIM_RESPONSE)
    assert [job["type"] for job in result["jobs"]] == ["asset", "asset"]


def test_claim_accept_types_may_repeat_types_up_to_16_entries(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    result = expect(hq.claim(P, accept_types=["seed", "asset"] * 8), 200, S.PROJECT_CLAIM_RESPONSE)
    assert len(result["jobs"]) == 1


def test_claim_is_clamped_to_the_projects_max_jobs_per_claim(hq):
    hq.put_project(P, max_jobs_per_claim=2)
    hq.enqueue(P, specs(5))
    assert len(expect(hq.claim(P, max_jobs=10), 200, S.PROJECT_CLAIM_RESPONSE)["jobs"]) == 2


def test_claim_with_an_old_policy_version_answers_the_current_one(hq):
    hq.put_project(P)
    hq.put_project(P, dispatch_qps=100)
    hq.enqueue(P, specs(1))
    result = expect(hq.claim(P, policy_version=1), 200, S.PROJECT_CLAIM_RESPONSE)
    assert result["policy_version"] == 2 and len(result["jobs"]) == 1


BAD_CLAIMS = {
    "max_jobs 0": {"max_jobs": 0}, "max_jobs 257": {"max_jobs": 257},
    "lease 0": {"lease_seconds": 0}, "lease 3601": {"lease_seconds": 3601},
    "policy_version 0": {"policy_version": 0}, "worker_id with space": {"worker_id": "a b"},
    "17 accept types": {"accept_types": ["seed"] * 17}, "unknown type": {"accept_types": ["video"]},
    "max_jobs as string": {"max_jobs": "10"}, "max_jobs fractional": {"max_jobs": 1.5},
}


def test_claim_refuses_an_invalid_request_with_400_invalid_request(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    each_case(BAD_CLAIMS, lambda fields: expect_error(
        hq.worker.post(worker_path(P, "/jobs/claim"), claim_body(**fields)), 400, "invalid_request"))
    assert len(hq.claimed(P)) == 1  # control: no refused claim took the job


@pytest.mark.parametrize("status", ["draining", "archived"])
def test_claim_on_a_project_that_is_not_active_is_409_project_not_active(hq, status):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    hq.put_project(P, status=status)
    expect_error(hq.claim(P), 409, "project_not_active")


def test_claim_over_the_dispatch_rate_is_429_with_retry_after(hq):
    hq.put_project(P, dispatch_qps=0.5)
    hq.enqueue(P, specs(3))
    # Up to 1000 QPS the bucket holds one job: the first claim gets exactly one.
    assert len(expect(hq.claim(P), 200, S.PROJECT_CLAIM_RESPONSE)["jobs"]) == 1
    answer = hq.claim(P)
    error = expect_error(answer, 429, "project_dispatch_rate_limited")
    assert error["retryable"] is True
    assert 0 < error["retry_after_ms"] <= 2000
    assert answer.headers.get("Retry-After") == str(math.ceil(error["retry_after_ms"] / 1000)), answer.headers


def test_claim_of_a_rate_limited_but_empty_queue_is_200_with_no_jobs(hq):
    hq.put_project(P, dispatch_qps=0.5)
    hq.enqueue(P, specs(1))
    hq.claimed(P, 1)
    assert expect(hq.claim(P), 200, S.PROJECT_CLAIM_RESPONSE)["jobs"] == []


def test_an_expired_lease_is_claimed_again_and_its_old_attempt_is_stale(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    (first,) = hq.claimed(P, 1, lease_seconds=1)
    time.sleep(2.1)
    (second,) = hq.claimed(P, 1)
    assert job_id_of(second) == job_id_of(first) and second["attempt_id"] != first["attempt_id"]
    result = expect(hq.worker.post(worker_path(P, "/jobs/complete"), complete_body([first])), 200,
                    S.BATCH_RESULT)["results"][0]
    assert rejection(result) == ("rejected", "stale_attempt"), result
    assert hq.job(P, job_id_of(first))["reset_count"] == 1


def test_an_expired_lease_beyond_max_resets_leaves_the_job_reset_exhausted(hq):
    hq.put_project(P, max_resets=0)
    hq.enqueue(P, specs(1))
    (job,) = hq.claimed(P, 1, lease_seconds=1)
    time.sleep(2.1)
    assert hq.claimed(P) == []
    assert hq.job(P, job_id_of(job))["status"] == "reset_exhausted"


# =================================================== completeProjectJobs

def test_complete_applies_and_answers_integer_job_ids(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(2))
    jobs = hq.claimed(P, 2)
    body = complete_body(jobs, receipts=[receipt()])
    answer = hq.worker.post(worker_path(P, "/jobs/complete"), body, schema=S.PROJECT_COMPLETE_REQUEST)
    results = expect(answer, 200, S.BATCH_RESULT)["results"]
    assert [(r["job_id"], r["attempt_id"], r["status"], r["job_status"]) for r in results] == [
        (job_id_of(job), job["attempt_id"], "applied", "done") for job in jobs]


def test_complete_of_256_items_with_a_receipt_each_is_accepted(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(256))
    jobs = hq.claimed(P, 256, max_jobs=256)
    body = {"worker_id": "worker-1", "items": [
        {**ref(job), "outcome": {"kind": "success", "code": 200, "uri": f"https://example.test/{i}",
                                 "meta": {}},
         "artifact_receipts": [receipt(i, object_id=f"artifacts/2024/{i:08d}.warc.zst")]}
        for i, job in enumerate(jobs)]}
    size = len(json.dumps(body, separators=(",", ":")))
    assert 90_000 < size < 8 * MIB, size  # about 100 KB, as SavewebHQ measured
    results = expect(hq.worker.post(worker_path(P, "/jobs/complete"), body,
                                     schema=S.PROJECT_COMPLETE_REQUEST), 200, S.BATCH_RESULT)["results"]
    assert [r["status"] for r in results] == ["applied"] * 256


def test_complete_stores_the_outcome_and_receipts_for_the_admin_job(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    (job,) = hq.claimed(P, 1)
    outcome = {"kind": "http_error", "code": 404, "uri": "https://example.test/gone", "meta": {"try": 1}}
    receipts = [receipt(1), receipt(2, checksum="blake3:" + "0f" * 32, size_bytes=1)]
    expect(hq.worker.post(worker_path(P, "/jobs/complete"),
                          complete_body([job], outcome=outcome, receipts=receipts)), 200, S.BATCH_RESULT)
    stored = expect(hq.admin.get(admin_path(P, f"/jobs/{job_id_of(job)}")), 200, S.ADMIN_JOB)
    assert stored["status"] == "done"
    assert stored["outcome"] == outcome and stored["artifact_receipts"] == receipts
    assert stored["execution_error"] is None


def test_a_stale_item_is_rejected_without_rolling_back_the_others(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(2))
    jobs = hq.claimed(P, 2)
    body = complete_body(jobs)
    body["items"][0]["attempt_id"] = "not-the-attempt"
    results = expect(hq.worker.post(worker_path(P, "/jobs/complete"), body), 200,
                     S.BATCH_RESULT)["results"]
    assert [r["status"] for r in results] == ["rejected", "applied"]
    assert results[0]["job_id"] == job_id_of(jobs[0]) and results[0]["attempt_id"] == "not-the-attempt"
    error = results[0]["error"]
    assert error["code"] == "stale_attempt" and error["retryable"] is False
    assert error["retry_after_ms"] == 0
    assert hq.job(P, job_id_of(jobs[1]))["status"] == "done"


def test_completing_an_attempt_again_is_answered_applied_and_changes_nothing(hq):
    # A deliberate difference (docs/protocol.md): SavewebHQ rejects the replay
    # as stale; FleetHQ answers a replay of the same outcome applied again, so
    # a lost answer is harmless. Either way the job stays done as first reported.
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    expect(hq.worker.post(worker_path(P, "/jobs/complete"), complete_body(jobs)), 200, S.BATCH_RESULT)
    stored = hq.job(P, job_id_of(jobs[0]))
    again = expect(hq.worker.post(worker_path(P, "/jobs/complete"), complete_body(jobs)), 200,
                   S.BATCH_RESULT)["results"][0]
    assert (again["status"], again["job_status"]) == ("applied", "done"), again
    assert hq.job(P, job_id_of(jobs[0])) == stored


def test_completing_another_workers_attempt_is_rejected_as_stale(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1, worker_id="worker-1")
    result = expect(hq.worker.post(worker_path(P, "/jobs/complete"),
                                   complete_body(jobs, worker_id="worker-2")), 200,
                    S.BATCH_RESULT)["results"][0]
    assert rejection(result) == ("rejected", "stale_attempt"), result
    assert hq.job(P, job_id_of(jobs[0]))["status"] == "wip"


ACCEPTED_RECEIPTS = {
    "issuer of 512 bytes": {"issuer": "i" * 512},
    "object id of 1024 bytes": {"object_id": "o" * 1024},
    "128 hex digits": {"checksum": "sha512:" + "ab" * 64},
    "32-character algorithm": {"checksum": "a" * 32 + ":00"},
    "algorithm with - and _": {"checksum": "x-y_z9:00ff"},
    "size 1 accepted at 1": {"size_bytes": 1, "accepted_at": 1},
    "128-character id": {"id": "r" * 128},
}


def test_receipts_at_the_edge_of_savewebhqs_rules_are_accepted(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(len(ACCEPTED_RECEIPTS)))
    jobs = iter(hq.claimed(P, len(ACCEPTED_RECEIPTS)))

    def accepted(fields):
        body = complete_body([next(jobs)], receipts=[receipt(**fields)])
        result = expect(hq.worker.post(worker_path(P, "/jobs/complete"), body,
                                       schema=S.PROJECT_COMPLETE_REQUEST), 200, S.BATCH_RESULT)
        assert result["results"][0]["status"] == "applied", result
    each_case(ACCEPTED_RECEIPTS, accepted)


def test_sixteen_receipts_for_one_job_are_accepted(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    body = complete_body(jobs, receipts=[receipt(i) for i in range(16)])
    result = expect(hq.worker.post(worker_path(P, "/jobs/complete"), body), 200, S.BATCH_RESULT)
    assert result["results"][0]["status"] == "applied"


REFUSED_RECEIPTS = {
    "id with a space": {"id": "has space"},
    "id of 129 characters": {"id": "r" * 129},
    "empty issuer": {"issuer": ""},
    "issuer of 513 bytes": {"issuer": "i" * 513},
    "empty object id": {"object_id": ""},
    "object id of 1025 bytes": {"object_id": "o" * 1025},
    "odd hex digits": {"checksum": "sha256:abc"},
    "upper-case hex": {"checksum": "sha256:AB"},
    "upper-case algorithm": {"checksum": "SHA256:ab"},
    "no digest": {"checksum": "sha256:"},
    "no algorithm": {"checksum": ":ab"},
    "algorithm starting with -": {"checksum": "-sha:ab"},
    "33-character algorithm": {"checksum": "a" * 33 + ":00"},
    "130 hex digits": {"checksum": "sha512:" + "ab" * 65},
    "no colon": {"checksum": "abcdef"},
    "size 0": {"size_bytes": 0},
    "accepted at 0": {"accepted_at": 0},
    "negative accepted at": {"accepted_at": -1},
    "unknown receipt field": {"signature": "x"},
    "missing issuer": {"issuer": None},
}


def test_a_receipt_savewebhq_refuses_is_400_invalid_request_for_the_batch(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)

    def refused(fields):
        bad = {k: v for k, v in receipt(**fields).items() if v is not None}
        answer = hq.worker.post(worker_path(P, "/jobs/complete"), complete_body(jobs, receipts=[bad]))
        expect_error(answer, 400, "invalid_request")
    each_case(REFUSED_RECEIPTS, refused)
    hq.completes(P, jobs)


def test_seventeen_receipts_for_one_job_are_400_invalid_request(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    answer = hq.worker.post(worker_path(P, "/jobs/complete"),
                            complete_body(jobs, receipts=[receipt(i) for i in range(17)]))
    expect_error(answer, 400, "invalid_request")
    hq.completes(P, jobs)


BAD_OUTCOMES = {"unknown kind": {"kind": "ok"}, "code 1000": {"code": 1000},
                "uri over 4096": {"uri": "u" * 4097},
                "meta over 8 KiB": {"meta": {"m": "x" * (8 * 1024)}}}


def test_an_invalid_outcome_is_400_invalid_request(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    each_case(BAD_OUTCOMES, lambda fields: expect_error(hq.worker.post(
        worker_path(P, "/jobs/complete"), complete_body(jobs, outcome={**SUCCESS, **fields})),
        400, "invalid_request"))
    hq.completes(P, jobs)


# ===================================== job ids in complete / fail / extend

@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_job_id_that_is_not_a_positive_int64_is_400_invalid_request(hq, mutation):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    tail, make_body = MUTATIONS[mutation]
    bad_ids = {"decimal string": str(job_id_of(jobs[0])), "0": 0, "-1": -1, "1.0": 1.0,
               "2**63": 2**63}

    def refused(job_id):
        body = make_body(jobs)
        body["items"][0]["job_id"] = job_id
        expect_error(hq.worker.post(worker_path(P, tail), body), 400, "invalid_request")
    each_case(bad_ids, refused)
    hq.completes(P, jobs)


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_batch_of_no_items_or_over_256_is_400_invalid_request(hq, mutation):
    hq.put_project(P)
    tail, make_body = MUTATIONS[mutation]
    each_case({"no items": 0, "257 items": 257}, lambda items: expect_error(
        hq.worker.post(worker_path(P, tail), make_body(
            [{"job_id": i + 1, "attempt_id": str(i + 1)} for i in range(items)])),
        400, "invalid_request"))


@pytest.mark.parametrize("status", ["draining", "archived"])
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_reports_of_attempts_in_flight_are_kept_on_a_project_that_is_not_active(hq, mutation, status):
    # A deliberate difference (docs/protocol.md): SavewebHQ refuses the batch
    # with 409 and the attempt's work is lost at its lease's end; FleetHQ keeps
    # it. A SavewebHQ client sees success where it expected a retried error.
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    hq.put_project(P, status=status)
    tail, make_body = MUTATIONS[mutation]
    result = expect(hq.worker.post(worker_path(P, tail), make_body(jobs)), 200,
                    S.BATCH_RESULT)["results"][0]
    assert result["status"] == "applied", result


@pytest.mark.parametrize("status", ["draining", "archived"])
def test_claims_on_a_project_that_is_not_active_are_409_project_not_active(hq, status):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    hq.put_project(P, status=status)
    expect_error(hq.worker.post(worker_path(P, "/jobs/claim"), claim_body()), 409,
                 "project_not_active")


# ======================================================= failProjectJobs

def test_a_retryable_failure_puts_the_job_back_to_todo(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    answer = hq.worker.post(worker_path(P, "/jobs/fail"), fail_body(jobs, retryable=True),
                            schema=S.PROJECT_FAIL_REQUEST)
    result = expect(answer, 200, S.BATCH_RESULT)["results"][0]
    assert (result["job_id"], result["status"], result["job_status"]) == (job_id_of(jobs[0]), "applied", "todo")


def test_a_permanent_failure_fails_the_job_and_keeps_the_error(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    body = fail_body(jobs, retryable=False, code="not_found")
    body["items"][0]["error"]["details"] = {"status": 404}
    result = expect(hq.worker.post(worker_path(P, "/jobs/fail"), body), 200, S.BATCH_RESULT)["results"][0]
    assert (result["status"], result["job_status"]) == ("applied", "failed")
    stored = expect(hq.admin.get(admin_path(P, f"/jobs/{job_id_of(jobs[0])}")), 200, S.ADMIN_JOB)
    assert stored["execution_error"] == body["items"][0]["error"]
    assert stored["outcome"] is None and isinstance(stored["completed_at"], int)


def test_a_retryable_failure_beyond_max_resets_is_reset_exhausted(hq):
    hq.put_project(P, max_resets=0)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    result = expect(hq.worker.post(worker_path(P, "/jobs/fail"), fail_body(jobs, retryable=True)), 200,
                    S.BATCH_RESULT)["results"][0]
    assert (result["status"], result["job_status"]) == ("applied", "reset_exhausted")


def test_failing_a_stale_attempt_is_rejected(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    body = fail_body(jobs, retryable=True)
    body["items"][0]["attempt_id"] = "someone-elses"
    result = expect(hq.worker.post(worker_path(P, "/jobs/fail"), body), 200, S.BATCH_RESULT)["results"][0]
    assert rejection(result) == ("rejected", "stale_attempt"), result


BAD_EXECUTION_ERRORS = {"code not an identifier": {"code": "not an identifier"},
                        "message over 2048": {"message": "m" * 2049}}


def test_an_invalid_execution_error_is_400_invalid_request(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)

    def refused(fields):
        body = fail_body(jobs, retryable=True)
        body["items"][0]["error"].update(fields)
        expect_error(hq.worker.post(worker_path(P, "/jobs/fail"), body), 400, "invalid_request")
    each_case(BAD_EXECUTION_ERRORS, refused)
    hq.completes(P, jobs)


# ================================================= extendProjectJobLeases

def test_extend_lease_answers_the_new_deadline(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1, lease_seconds=60)
    answer = hq.worker.post(worker_path(P, "/jobs/extend-lease"), extend_body(jobs, 600),
                            schema=S.PROJECT_EXTEND_LEASE_REQUEST)
    result = expect(answer, 200, S.BATCH_RESULT)["results"][0]
    assert (result["job_id"], result["status"], result["job_status"]) == (job_id_of(jobs[0]), "applied", "wip")
    assert near_now(result["lease_expires_at"], 600)
    assert near_now(hq.job(P, job_id_of(jobs[0]))["lease_expires_at"], 600)


def test_extend_lease_never_moves_a_deadline_back(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1, lease_seconds=600)
    result = expect(hq.worker.post(worker_path(P, "/jobs/extend-lease"), extend_body(jobs, 30)), 200,
                    S.BATCH_RESULT)["results"][0]
    assert result["status"] == "applied"
    assert near_now(hq.job(P, job_id_of(jobs[0]))["lease_expires_at"], 600)


def test_extending_a_stale_attempt_is_rejected(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    body = extend_body(jobs)
    body["items"][0]["attempt_id"] = "old-attempt"
    result = expect(hq.worker.post(worker_path(P, "/jobs/extend-lease"), body), 200,
                    S.BATCH_RESULT)["results"][0]
    assert rejection(result) == ("rejected", "stale_attempt"), result


def test_extend_seconds_outside_1_to_3600_is_400_invalid_request(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    each_case({"0": 0, "3601": 3601}, lambda seconds: expect_error(hq.worker.post(
        worker_path(P, "/jobs/extend-lease"), extend_body(jobs, seconds)), 400, "invalid_request"))
    hq.completes(P, jobs)


# ==================================================== getAdminProjectJob

def test_a_wip_job_shows_its_attempt_worker_and_lease(hq):
    hq.put_project(P)
    hq.enqueue(P, [{"id": "j", "value": "https://example.test/j", "type": "asset", "attr": {"a": 1},
                    "random_key": 77}])
    (job,) = hq.claimed(P, 1, worker_id="abc1234")
    stored = expect(hq.admin.get(admin_path(P, f"/jobs/{job_id_of(job)}")), 200, S.ADMIN_JOB)
    assert {k: stored[k] for k in ("id", "value", "type", "attr", "random_key", "status", "attempt_id",
                                   "worker_id", "lease_expires_at", "reset_count", "outcome",
                                   "artifact_receipts", "execution_error", "completed_at")} == {
        "id": "j", "value": "https://example.test/j", "type": "asset", "attr": {"a": 1},
        "random_key": 77, "status": "wip", "attempt_id": job["attempt_id"], "worker_id": "abc1234",
        "lease_expires_at": job["lease_expires_at"], "reset_count": 0, "outcome": None,
        "artifact_receipts": [], "execution_error": None, "completed_at": None}
    assert stored["job_id"] == job_id_of(job) and near_now(stored["created_at"])


def test_a_done_job_has_no_attempt_and_a_completion_time(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    expect(hq.worker.post(worker_path(P, "/jobs/complete"), complete_body(jobs)), 200, S.BATCH_RESULT)
    stored = expect(hq.admin.get(admin_path(P, f"/jobs/{job_id_of(jobs[0])}")), 200, S.ADMIN_JOB)
    assert (stored["attempt_id"], stored["worker_id"], stored["lease_expires_at"]) == (None, None, None)
    assert near_now(stored["completed_at"]) and stored["outcome"] == SUCCESS


def test_an_unknown_job_is_404_not_found(hq):
    hq.put_project(P)
    expect_error(hq.admin.get(admin_path(P, "/jobs/999999")), 404, "not_found")


def test_a_job_id_that_is_not_a_number_is_400_invalid_request(hq):
    hq.put_project(P)
    expect_error(hq.admin.get(admin_path(P, "/jobs/abc")), 400, "invalid_request")


# ================================================= deleteAdminProjectJob

def test_delete_job_is_204_and_the_job_is_gone(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    (job_id,) = hq.job_ids(P)
    expect(hq.admin.delete(admin_path(P, f"/jobs/{job_id}")), 204)
    expect_error(hq.admin.get(admin_path(P, f"/jobs/{job_id}")), 404, "not_found")


def test_delete_of_a_wip_job_is_400_invalid_request(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    (job,) = hq.claimed(P, 1)
    expect_error(hq.admin.delete(admin_path(P, f"/jobs/{job_id_of(job)}")), 400, "invalid_request")
    assert hq.job(P, job_id_of(job))["status"] == "wip"


def test_delete_of_a_job_that_does_not_exist_is_400_invalid_request(hq):
    # SavewebHQ: "job not found or is WIP".
    hq.put_project(P)
    expect_error(hq.admin.delete(admin_path(P, "/jobs/999999")), 400, "invalid_request")


# ================================================ requeueAdminProjectJob

def test_requeue_of_a_failed_job_is_204_and_clears_its_result(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    expect(hq.worker.post(worker_path(P, "/jobs/fail"), fail_body(jobs, retryable=False)), 200, S.BATCH_RESULT)
    expect(hq.admin.post(admin_path(P, f"/jobs/{job_id_of(jobs[0])}/requeue")), 204)
    stored = expect(hq.admin.get(admin_path(P, f"/jobs/{job_id_of(jobs[0])}")), 200, S.ADMIN_JOB)
    assert {k: stored[k] for k in ("status", "reset_count", "execution_error", "outcome",
                                   "artifact_receipts", "completed_at")} == {
        "status": "todo", "reset_count": 0, "execution_error": None, "outcome": None,
        "artifact_receipts": [], "completed_at": None}


def test_requeue_of_a_reset_exhausted_job_is_204(hq):
    hq.put_project(P, max_resets=0)
    hq.enqueue(P, specs(1))
    jobs = hq.claimed(P, 1)
    expect(hq.worker.post(worker_path(P, "/jobs/fail"), fail_body(jobs, retryable=True)), 200, S.BATCH_RESULT)
    expect(hq.admin.post(admin_path(P, f"/jobs/{job_id_of(jobs[0])}/requeue")), 204)
    assert len(hq.claimed(P)) == 1


@pytest.mark.parametrize("state", ["todo", "wip", "done", "missing"])
def test_requeue_of_a_job_that_is_not_failed_is_400_invalid_request(hq, state):
    hq.put_project(P)
    hq.enqueue(P, specs(1))
    (job_id,) = hq.job_ids(P)
    if state in ("wip", "done"):
        jobs = hq.claimed(P, 1)
        if state == "done":
            expect(hq.worker.post(worker_path(P, "/jobs/complete"), complete_body(jobs)), 200, S.BATCH_RESULT)
    if state == "missing":
        job_id = 999999
    expect_error(hq.admin.post(admin_path(P, f"/jobs/{job_id}/requeue")), 400, "invalid_request")


# ========================================================= listAdminUsers

def test_list_users_answers_id_status_roles_and_token_state(hq):
    expect(hq.admin.put(f"/api/v1/admin/users/{USER}", {"status": "pending", "roles": ["worker", "admin"]}), 204)
    users = expect(hq.admin.get("/api/v1/admin/users"), 200, S.ADMIN_USER_LIST)["users"]
    assert [u["id"] for u in users] == sorted(u["id"] for u in users)
    (someone,) = [u for u in users if u["id"] == USER]
    assert someone["status"] == "pending" and sorted(someone["roles"]) == ["admin", "worker"]
    assert (someone["machine_token_active"], someone["machine_token_viewable"]) == (False, False)
    assert near_now(someone["created_at"]) and near_now(someone["updated_at"])


def test_a_user_whose_token_was_issued_has_an_active_viewable_token(hq):
    expect(hq.admin.put(f"/api/v1/admin/users/{USER}", {"status": "active", "roles": ["worker"]}), 204)
    expect(hq.admin.post(f"/api/v1/admin/users/{USER}/machine-token"), 201, S.ADMIN_MACHINE_TOKEN)
    users = expect(hq.admin.get("/api/v1/admin/users"), 200, S.ADMIN_USER_LIST)["users"]
    (someone,) = [u for u in users if u["id"] == USER]
    assert (someone["machine_token_active"], someone["machine_token_viewable"]) == (True, True)


# =========================================================== putAdminUser

def test_put_user_creates_and_updates_with_204(hq):
    path = f"/api/v1/admin/users/{USER}"
    expect(hq.admin.put(path, {"status": "active", "roles": ["worker"]}, schema=S.ADMIN_USER_REQUEST), 204)
    expect(hq.admin.put(path, {"status": "suspended", "roles": []}, schema=S.ADMIN_USER_REQUEST), 204)
    users = expect(hq.admin.get("/api/v1/admin/users"), 200, S.ADMIN_USER_LIST)["users"]
    (someone,) = [u for u in users if u["id"] == USER]
    assert (someone["status"], someone["roles"]) == ("suspended", [])


BAD_USERS = {"reader role": {"status": "active", "roles": ["reader"]},
             "duplicate roles": {"status": "active", "roles": ["worker", "worker"]},
             "no status": {"roles": ["worker"]},
             "unknown status": {"status": "banned", "roles": ["worker"]}}


def test_put_user_refuses_an_invalid_user_with_400_invalid_request(hq):
    each_case(BAD_USERS, lambda body: expect_error(
        hq.admin.put(f"/api/v1/admin/users/{USER}", body), 400, "invalid_request"))


def test_put_user_refuses_an_id_that_is_not_an_identifier(hq):
    answer = hq.admin.put("/api/v1/admin/users/bad%20id", {"status": "active", "roles": ["worker"]})
    expect_error(answer, 400, "invalid_request")


# ========================================================= deleteAdminUser

def test_delete_user_is_204_and_its_token_stops_working(hq):
    token = make_account(hq.app, USER, ["worker"])
    expect(hq.admin.delete(f"/api/v1/admin/users/{USER}"), 204)
    users = expect(hq.admin.get("/api/v1/admin/users"), 200, S.ADMIN_USER_LIST)["users"]
    assert USER not in [u["id"] for u in users]
    expect_error(hq.wire(token).get("/api/v1/whoami"), 401, "invalid_machine_token")


def test_delete_of_an_unknown_user_is_404(hq):
    expect_error(hq.admin.delete("/api/v1/admin/users/nobody-here"), 404, "not_found")


# ======================================== machine tokens (get, rotate, revoke)

def test_rotate_token_is_201_and_get_answers_the_same_token_again(hq):
    expect(hq.admin.put(f"/api/v1/admin/users/{USER}", {"status": "active", "roles": ["worker"]}), 204)
    issued = expect(hq.admin.post(f"/api/v1/admin/users/{USER}/machine-token"), 201, S.ADMIN_MACHINE_TOKEN)
    assert issued["user_id"] == USER
    for _ in range(2):
        viewed = expect(hq.admin.get(f"/api/v1/admin/users/{USER}/machine-token"), 200, S.ADMIN_MACHINE_TOKEN)
        assert viewed == issued
    assert expect(hq.wire(issued["token"]).get("/api/v1/whoami"), 200, S.WHO_AM_I) == {"user_id": USER}


def test_rotate_token_replaces_the_old_token(hq):
    old = make_account(hq.app, USER, ["worker"])
    new = expect(hq.admin.post(f"/api/v1/admin/users/{USER}/machine-token"), 201, S.ADMIN_MACHINE_TOKEN)
    assert new["token"] != old
    expect_error(hq.wire(old).get("/api/v1/whoami"), 401, "invalid_machine_token")
    expect(hq.wire(new["token"]).get("/api/v1/whoami"), 200, S.WHO_AM_I)


def test_rotate_token_of_an_unknown_user_is_404(hq):
    expect_error(hq.admin.post("/api/v1/admin/users/nobody-here/machine-token"), 404, "not_found")


def test_get_token_of_a_user_without_one_is_404(hq):
    expect(hq.admin.put(f"/api/v1/admin/users/{USER}", {"status": "active", "roles": ["worker"]}), 204)
    expect_error(hq.admin.get(f"/api/v1/admin/users/{USER}/machine-token"), 404, "not_found")


def test_revoke_token_is_204_then_404_and_the_token_stops_working(hq):
    token = make_account(hq.app, USER, ["worker"])
    expect(hq.admin.delete(f"/api/v1/admin/users/{USER}/machine-token"), 204)
    expect_error(hq.wire(token).get("/api/v1/whoami"), 401, "invalid_machine_token")
    expect_error(hq.admin.get(f"/api/v1/admin/users/{USER}/machine-token"), 404, "not_found")
    expect_error(hq.admin.delete(f"/api/v1/admin/users/{USER}/machine-token"), 404, "not_found")


# ========================================================= no FleetHQ extras

def test_no_savewebhq_answer_mentions_the_staged_state(hq):
    hq.put_project(P)
    hq.enqueue(P, specs(2))
    hq.claimed(P, 1, max_jobs=1)
    answers = [hq.admin.get("/api/v1/admin/projects"), hq.admin.get(admin_path(P)),
               hq.admin.get(admin_path(P, "/jobs"))]
    for answer in answers:
        assert answer.status == 200, str(answer)
        assert b"staged" not in answer.content, str(answer)
    expect_error(hq.admin.get(admin_path(P, "/jobs?status=staged")), 400, "invalid_request")


def test_every_api_answer_is_marked_no_store(hq):
    hq.put_project(P)
    for answer in (hq.admin.get(admin_path(P)), hq.worker.get(worker_path(P)),
                   hq.anonymous.get("/api/v1/whoami"), hq.admin.delete(admin_path("missing"))):
        assert "no-store" in answer.headers.get("Cache-Control", "").lower(), str(answer)
