"""FleetHQ's own admin routes (``/api/v1/fleethq/``): the full project and
job views beside the v1 contract's admin routes. Policy semantics of the
project PUT/PATCH are covered in test_policy.py."""
from __future__ import annotations

import pytest

from tests.helpers import Api, body, sql, values

FLEETHQ = "/api/v1/fleethq/projects"
FULL_JOB_KEYS = {"job_id", "id", "value", "type", "via", "hops", "attr", "random_key", "site", "state",
                 "created_at", "updated_at", "not_before", "deadline_at", "current_attempt_id",
                 "worker_id", "lease_expires_at", "resets", "attempts", "last_error"}


def _ok(response, status=200):
    assert response.status_code == status, (response.status_code, body(response))
    return body(response)


def test_put_creates_a_pdf_project_with_201_and_patch_changes_it(api):
    created = _ok(api.call("PUT", f"{FLEETHQ}/papers", {"kind": "pdf"}), 201)
    assert (created["kind"], created["max_in_flight"], created["job_counts"]["staged"]) == ("pdf", 6, 0)
    assert _ok(api.call("PUT", f"{FLEETHQ}/papers", {"kind": "pdf"}))["kind"] == "pdf"
    patched = _ok(api.call("PATCH", f"{FLEETHQ}/papers", {"max_in_flight": 9}))
    assert patched["max_in_flight"] == 9 and patched["kind"] == "pdf"
    assert _ok(api.call("GET", f"{FLEETHQ}/papers")) == patched


def test_job_list_and_detail_carry_the_full_view_with_integer_ids(api, app):
    api.put_project("p")
    api.enqueue("p", values(3))
    first, second = body(api.claim("p", max_jobs=2))["jobs"]
    api.fail("p", [first], retryable=True)
    sql(app, "UPDATE jobs SET state = 'staged' WHERE id = :id", id=int(second["job_id"]))
    page = _ok(api.call("GET", f"{FLEETHQ}/p/jobs?limit=2"))
    assert [j["state"] for j in page["jobs"]] == ["todo", "staged"]
    assert all(set(j) == FULL_JOB_KEYS and type(j["job_id"]) is int for j in page["jobs"])
    assert page["next_after_job_id"] == page["jobs"][-1]["job_id"]
    rest = _ok(api.call("GET", f"{FLEETHQ}/p/jobs?after_job_id={page['next_after_job_id']}"))
    assert len(rest["jobs"]) == 1 and rest["next_after_job_id"] is None
    assert [j["job_id"] for j in _ok(api.call("GET", f"{FLEETHQ}/p/jobs?status=staged"))["jobs"]] == [
        int(second["job_id"])]

    job = _ok(api.call("GET", f"{FLEETHQ}/p/jobs/{first['job_id']}"))
    assert job["job_id"] == int(first["job_id"]) and job["state"] == "todo" and job["resets"] == 1
    assert [a["state"] for a in job["attempt_history"]] == ["failed"]
    assert job["attempt_history"][0]["attempt_id"] == str(first["attempt_id"])
    assert job["last_error"]["code"] == "network"


@pytest.mark.parametrize("query", ["bogus=1", "status=queued", "limit=0", "limit=201",
                                   "after_job_id=-1", "after_job_id=abc"])
def test_job_list_query_is_checked_strictly(api, query):
    api.put_project("p")
    response = api.call("GET", f"{FLEETHQ}/p/jobs?{query}")
    assert response.status_code == 400, body(response)
    assert body(response)["error"]["code"] == "invalid_request"


def test_job_list_defaults_to_100(api):
    api.put_project("p", identity_mode="none")
    api.enqueue("p", [{"value": f"v{i}"} for i in range(101)])
    page = _ok(api.call("GET", f"{FLEETHQ}/p/jobs"))
    assert len(page["jobs"]) == 100 and page["next_after_job_id"] == page["jobs"][-1]["job_id"]


@pytest.mark.parametrize("path", [FLEETHQ, f"{FLEETHQ}/p", f"{FLEETHQ}/p/jobs", f"{FLEETHQ}/p/jobs/1"])
def test_fleethq_routes_need_role_admin(api, make_user, client, path):
    api.put_project("p")
    api.enqueue("p", values(1))
    worker = Api(client, make_user("wk", ["worker"]))
    response = worker.call("GET", path)
    assert response.status_code == 403
    assert body(response)["error"]["code"] == "permission_denied"
    assert client.get(path).status_code == 401
