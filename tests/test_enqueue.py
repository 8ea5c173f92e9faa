"""Enqueue (DESIGN §4.2, §4.3) and the admin job routes (§6): identity modes,
idempotency, conflicts, JobSpec limits, claim order, paging, detail,
requeue and delete. The exact AdminJob shape is checked in test_admin_contract.py."""
from __future__ import annotations

import pytest

from tests.helpers import api_error, body, values
from workers.wire.protocol import default_job_id

ZERO = {"todo": 0, "wip": 0, "staged": 0, "done": 0, "failed": 0, "reset_exhausted": 0}


_error = api_error


def _enqueued(response, submitted: int, inserted: int, project_id: str):
    assert response.status_code == 200, body(response)
    assert body(response) == {"project_id": project_id, "submitted": submitted, "inserted": inserted}


def _all_jobs(api, project_id: str, status: str | None = None) -> list[dict]:
    jobs, after = [], None
    while True:
        query = "limit=200" + (f"&status={status}" if status else "") + \
            (f"&after_job_id={after}" if after else "")
        response = api.call("GET", f"/api/v1/admin/projects/{project_id}/jobs?{query}")
        assert response.status_code == 200, body(response)
        page = body(response)
        jobs += page["jobs"]
        after = page["next_after_job_id"]
        if after is None:
            return jobs


def _detail(api, project_id: str, job_id: str) -> dict:
    response = api.call("GET", f"/api/v1/admin/projects/{project_id}/jobs/{job_id}")
    assert response.status_code == 200, body(response)
    return body(response)


def _only_job(api, project_id: str) -> dict:
    jobs = _all_jobs(api, project_id)
    assert len(jobs) == 1
    return _detail(api, project_id, jobs[0]["job_id"])


# ------------------------------------------------------------ identity modes


def _spec(mode: str, **fields) -> dict:
    spec = {"value": "https://example.org/x", **fields}
    if mode == "external_id":
        spec.setdefault("id", "job-1")
    return spec


@pytest.mark.parametrize("mode", ["external_id", "unique_value"])
def test_reenqueue_is_idempotent_and_keeps_random_key(api, mode):
    api.put_project("p", identity_mode=mode)
    spec = _spec(mode, via="https://example.org/", hops=2, attr={"k": [1, 2]}, random_key=123)
    _enqueued(api.enqueue("p", [spec]), 1, 1, "p")
    job = _only_job(api, "p")
    assert job["random_key"] == 123

    again = {**spec, "random_key": -999}
    _enqueued(api.enqueue("p", [again]), 1, 0, "p")
    _enqueued(api.enqueue("p", [{k: v for k, v in spec.items() if k != "random_key"}]), 1, 0, "p")
    assert _only_job(api, "p")["random_key"] == 123
    assert _only_job(api, "p")["job_id"] == job["job_id"]
    assert api.counts("p") == {**ZERO, "todo": 1}


@pytest.mark.parametrize("mode", ["external_id", "unique_value"])
def test_reenqueue_keeps_a_server_chosen_random_key(api, mode):
    api.put_project("p", identity_mode=mode)
    _enqueued(api.enqueue("p", [_spec(mode)]), 1, 1, "p")
    chosen = _only_job(api, "p")["random_key"]
    assert -(2**31) <= chosen < 2**31
    replacement = chosen + 1 if chosen < 2**31 - 1 else chosen - 1
    _enqueued(api.enqueue("p", [_spec(mode, random_key=replacement)]), 1, 0, "p")
    assert _only_job(api, "p")["random_key"] == chosen


@pytest.mark.parametrize("mode", ["external_id", "unique_value"])
def test_reenqueue_of_a_finished_job_is_idempotent(api, mode):
    api.put_project("p", identity_mode=mode)
    _enqueued(api.enqueue("p", [_spec(mode)]), 1, 1, "p")
    claimed = body(api.claim("p"))["jobs"]
    assert body(api.complete("p", claimed))["results"][0]["status"] == "applied"
    _enqueued(api.enqueue("p", [_spec(mode)]), 1, 0, "p")
    assert api.counts("p") == {**ZERO, "done": 1}


def test_none_mode_makes_every_submission_a_new_job(api):
    api.put_project("p", identity_mode="none")
    spec = {"value": "https://example.org/same", "random_key": 5}
    _enqueued(api.enqueue("p", [spec]), 1, 1, "p")
    _enqueued(api.enqueue("p", [spec]), 1, 1, "p")
    _enqueued(api.enqueue("p", [spec, spec]), 2, 2, "p")
    jobs = _all_jobs(api, "p")
    assert len(jobs) == 4
    assert {j["value"] for j in jobs} == {"https://example.org/same"}
    assert len({j["job_id"] for j in jobs}) == 4
    assert api.counts("p") == {**ZERO, "todo": 4}


@pytest.mark.parametrize("mode", ["none", "unique_value"])
def test_keys_the_server_draws_spread_over_the_whole_range(api, mode):
    """A job without a random key gets one drawn from all of int32, copied
    straight into jobs (none) or staged (identities): random claim order
    depends on it. A named key is kept as named."""
    api.put_project("p", identity_mode=mode)
    specs = [{"value": f"https://example.org/r/{i}"} for i in range(400)]
    specs[7]["random_key"] = -17
    _enqueued(api.enqueue("p", specs), 400, 400, "p")
    keys = {job["value"]: job["random_key"] for job in _all_jobs(api, "p")}
    assert keys["https://example.org/r/7"] == -17
    drawn = [key for value, key in keys.items() if value != "https://example.org/r/7"]
    assert len(set(drawn)) >= 395, "keys repeat"
    assert all(-2**31 <= key < 2**31 for key in drawn)
    # Of 399 uniform draws, each quarter of the range holds about 100.
    quarters = [sum(1 for key in drawn if -2**31 + q * 2**30 <= key < -2**31 + (q + 1) * 2**30) for q in range(4)]
    assert min(quarters) >= 50, quarters
    # Batch order is job-id order.
    ids = [job["job_id"] for job in sorted(_all_jobs(api, "p"), key=lambda j: int(j["value"].rsplit("/", 1)[1]))]
    assert ids == sorted(ids, key=int)


BASE = {"value": "https://example.org/base", "type": "seed", "via": "https://example.org/",
        "hops": 1, "attr": {"k": "v"}}
CHANGES = {
    "value": {"value": "https://example.org/other"},
    "type": {"type": "asset"},
    "via": {"via": "https://example.org/elsewhere"},
    "via-dropped": {"via": None},
    "hops": {"hops": 2},
    "hops-dropped": {"hops": None},
    "attr": {"attr": {"k": "w"}},
    "attr-dropped": {"attr": None},
    "attr-bool-vs-int": {"attr": {"k": True}},
}


def _changed(change: str) -> dict:
    spec = {**BASE, **CHANGES[change]}
    return {k: v for k, v in spec.items() if v is not None}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_external_id_conflict_across_batches(api, change):
    api.put_project("p", identity_mode="external_id")
    base = {**BASE, "id": "a", "attr": {"k": 1} if change == "attr-bool-vs-int" else BASE["attr"]}
    _enqueued(api.enqueue("p", [base]), 1, 1, "p")
    before = _only_job(api, "p")
    other = {**_changed(change), "id": "a"}
    err = _error(api.enqueue("p", [{"id": "fresh", "value": "v"}, other]), 409, "identity_conflict")
    assert err["details"]["index"] == 1
    # Nothing changed: the stored job keeps its fields and the new job was not inserted.
    after = _only_job(api, "p")
    assert after == before
    assert api.counts("p") == {**ZERO, "todo": 1}


@pytest.mark.parametrize("change", sorted(set(CHANGES) - {"value"}))
def test_unique_value_conflict_across_batches(api, change):
    api.put_project("p", identity_mode="unique_value")
    base = {**BASE, "attr": {"k": 1}} if change == "attr-bool-vs-int" else BASE
    _enqueued(api.enqueue("p", [base]), 1, 1, "p")
    err = _error(api.enqueue("p", [_changed(change)]), 409, "identity_conflict")
    assert err["details"]["index"] == 0
    assert api.counts("p") == {**ZERO, "todo": 1}


@pytest.mark.parametrize("mode", ["external_id", "unique_value"])
def test_in_batch_identical_duplicates_collapse(api, mode):
    api.put_project("p", identity_mode=mode)
    spec = _spec(mode, attr={"a": 1}, hops=0)
    _enqueued(api.enqueue("p", [spec, dict(spec)]), 2, 1, "p")
    assert api.counts("p") == {**ZERO, "todo": 1}


def _other(mode: str, n: int) -> dict:
    return _spec(mode, value=f"https://example.org/y{n}",
                 **({"id": f"job-y{n}"} if mode == "external_id" else {}))


@pytest.mark.parametrize("mode", ["external_id", "unique_value"])
def test_in_batch_duplicates_with_different_random_keys_are_a_conflict(api, mode):
    """A5: one batch may not name two random keys for one job."""
    api.put_project("p", identity_mode=mode)
    other = _other(mode, 1)
    batch = [_other(mode, 0), {**other, "random_key": 1}, {**other, "random_key": 2}]
    err = _error(api.enqueue("p", batch), 409, "identity_conflict")
    assert (err["details"]["index"], err["details"]["first_index"]) == (2, 1)
    assert api.counts("p") == ZERO


@pytest.mark.parametrize("mode", ["external_id", "unique_value"])
def test_in_batch_duplicates_agree_on_the_random_key_any_copy_names(api, mode):
    api.put_project("p", identity_mode=mode)
    same, late, early = _other(mode, 1), _other(mode, 2), _other(mode, 3)
    _enqueued(api.enqueue("p", [{**same, "random_key": 5}, {**same, "random_key": 5},
                                late, {**late, "random_key": -9},
                                {**early, "random_key": 11}, early]), 6, 3, "p")
    keys = {j["value"]: j["random_key"] for j in _all_jobs(api, "p")}
    assert keys == {same["value"]: 5, late["value"]: -9, early["value"]: 11}


@pytest.mark.parametrize("change", sorted(set(CHANGES) - {"value"}))
@pytest.mark.parametrize("mode", ["external_id", "unique_value"])
def test_in_batch_differing_duplicates_are_a_conflict(api, mode, change):
    api.put_project("p", identity_mode=mode)
    first = {**BASE, "attr": {"k": 1}} if change == "attr-bool-vs-int" else dict(BASE)
    second = _changed(change)
    if mode == "external_id":
        first["id"] = second["id"] = "dup"
    batch = [{"value": "https://example.org/unrelated", **({"id": "u"} if mode == "external_id" else {})},
             first, second]
    err = _error(api.enqueue("p", batch), 409, "identity_conflict")
    assert err["details"]["index"] == 2
    assert api.counts("p") == ZERO


def test_external_id_in_batch_value_difference_is_a_conflict(api):
    api.put_project("p")
    err = _error(api.enqueue("p", [{"id": "a", "value": "x"}, {"id": "a", "value": "y"}]),
                 409, "identity_conflict")
    assert err["details"]["index"] == 1
    assert api.counts("p") == ZERO


def test_whole_batch_rolls_back_on_a_conflict_with_a_stored_job(api):
    api.put_project("p")
    _enqueued(api.enqueue("p", [{"id": "old", "value": "original"}]), 1, 1, "p")
    batch = values(5, "new") + [{"id": "old", "value": "changed"}]
    err = _error(api.enqueue("p", batch), 409, "identity_conflict")
    assert err["details"]["index"] == 5
    assert api.counts("p") == {**ZERO, "todo": 1}
    assert [j["id"] for j in _all_jobs(api, "p")] == ["old"]
    # The same new jobs go in once the conflict is removed.
    _enqueued(api.enqueue("p", values(5, "new")), 5, 5, "p")


def test_whole_batch_rolls_back_when_the_conflict_comes_first(api):
    api.put_project("p", identity_mode="unique_value")
    _enqueued(api.enqueue("p", [{"value": "old", "hops": 1}]), 1, 1, "p")
    batch = [{"value": "old", "hops": 2}] + [{"value": f"new{i}"} for i in range(5)]
    err = _error(api.enqueue("p", batch), 409, "identity_conflict")
    assert err["details"]["index"] == 0
    assert api.counts("p") == {**ZERO, "todo": 1}


def test_whole_batch_rolls_back_on_an_in_batch_conflict(api):
    api.put_project("p")
    batch = values(5, "new") + [{"id": "new0", "value": "something else"}]
    _error(api.enqueue("p", batch), 409, "identity_conflict")
    assert api.counts("p") == ZERO
    assert _all_jobs(api, "p") == []


# ------------------------------------------------------------------- the id


@pytest.mark.parametrize("mode", ["none", "unique_value"])
def test_id_is_rejected_outside_external_id(api, mode):
    api.put_project("p", identity_mode=mode)
    batch = [{"value": "a"}, {"value": "b"}, {"id": "c", "value": "c"}]
    err = _error(api.enqueue("p", batch), 400, "invalid_job")
    assert err["details"]["index"] == 2
    assert err["details"]["field"] == "id"
    assert api.counts("p") == ZERO


def test_id_is_required_in_external_id(api):
    api.put_project("p", identity_mode="external_id")
    batch = [{"id": "a", "value": "a"}, {"value": "b"}]
    err = _error(api.enqueue("p", batch), 400, "invalid_job")
    assert err["details"]["index"] == 1
    assert err["details"]["field"] == "id"
    assert api.counts("p") == ZERO


def test_external_id_is_the_default_identity_mode(api):
    summary = api.put_project("p")
    assert summary["identity_mode"] == "external_id"
    _error(api.enqueue("p", [{"value": "no id"}]), 400, "invalid_job")


# ---------------------------------------------------------------- JobSpec limits

QUOTE_8192 = '"' * 8192  # 8192 bytes, 16384 once JSON-escaped

INVALID_SPECS = {
    "value-empty": ({"value": ""}, "value"),
    "value-8193-bytes": ({"value": "x" * 8193}, "value"),
    "value-8193-bytes-multibyte": ({"value": "é" * 4096 + "x"}, "value"),
    "value-missing": ({}, "value"),
    "value-not-string": ({"value": 42}, "value"),
    "value-null": ({"value": None}, "value"),
    "value-lone-surrogate": ({"value": "\ud800"}, "value"),
    "value-nul": ({"value": "a\x00b"}, "value"),
    "via-8193-bytes": ({"value": "v", "via": "x" * 8193}, "via"),
    "via-not-string": ({"value": "v", "via": 7}, "via"),
    "attr-over-8KiB": ({"value": "v", "attr": {"k": "x" * 8185}}, "attr"),
    "attr-not-object": ({"value": "v", "attr": [1, 2]}, "attr"),
    "attr-string": ({"value": "v", "attr": "{}"}, "attr"),
    "hops-negative": ({"value": "v", "hops": -1}, "hops"),
    "hops-bool": ({"value": "v", "hops": True}, "hops"),
    "hops-float": ({"value": "v", "hops": 1.5}, "hops"),
    "hops-string": ({"value": "v", "hops": "1"}, "hops"),
    "random_key-above-int32": ({"value": "v", "random_key": 2**31}, "random_key"),
    "random_key-below-int32": ({"value": "v", "random_key": -(2**31) - 1}, "random_key"),
    "random_key-bool": ({"value": "v", "random_key": False}, "random_key"),
    "random_key-float": ({"value": "v", "random_key": 1.5}, "random_key"),
    "unknown-field": ({"value": "v", "priority": 1}, "priority"),
    "type-page": ({"value": "v", "type": "page"}, "type"),
    "type-upper": ({"value": "v", "type": "SEED"}, "type"),
    "id-space": ({"id": "a b"}, "id"),
    "id-slash": ({"id": "a/b"}, "id"),
    "id-unicode": ({"id": "ä"}, "id"),
    "id-129": ({"id": "x" * 129}, "id"),
    "id-empty": ({"id": ""}, "id"),
    "id-number": ({"id": 12}, "id"),
    "id-newline": ({"id": "abc\n"}, "id"),
    "spec-over-32KiB": ({"value": QUOTE_8192, "via": QUOTE_8192, "attr": {"k": "x" * 100}}, None),
    "not-an-object": ("https://example.org/", None),
}


@pytest.mark.parametrize("case", sorted(INVALID_SPECS))
def test_invalid_jobspec_is_rejected(api, case):
    api.put_project("p")
    raw, field = INVALID_SPECS[case]
    if isinstance(raw, dict):
        raw = {"id": "bad", "value": "v", **raw} if "id" not in raw else {"value": "v", **raw}
        if case == "value-missing":
            raw.pop("value")
    batch = [{"id": "ok", "value": "fine"}, raw]
    err = _error(api.enqueue("p", batch), 400, "invalid_job")
    assert err["details"]["index"] == 1
    if field is not None:
        assert err["details"]["field"] == field
    assert api.counts("p") == ZERO


VALID_SPECS = {
    "value-1-byte": {"value": "x"},
    "value-8192-ascii": {"value": "x" * 8192},
    "value-8192-two-byte": {"value": "é" * 4096},
    "value-8192-three-byte": {"value": "€" * 2730 + "ab"},
    "value-8192-four-byte": {"value": "😀" * 2048},
    "via-8192": {"value": "v", "via": "y" * 8192},
    "attr-8192-encoded": {"value": "v", "attr": {"k": "x" * (8192 - len('{"k":""}'))}},
    "hops-0": {"value": "v", "hops": 0},
    "random_key-int32-max": {"value": "v", "random_key": 2**31 - 1},
    "random_key-int32-min": {"value": "v", "random_key": -(2**31)},
    "type-asset": {"value": "v", "type": "asset"},
    "id-128": {"value": "v", "id": "x" * 128},
    "id-all-allowed-chars": {"value": "v", "id": "AZaz09._:-"},
    "nulls-are-absent": {"value": "v", "via": None, "hops": None, "attr": None, "random_key": None},
}


@pytest.mark.parametrize("case", sorted(VALID_SPECS))
def test_valid_jobspec_at_the_limits_is_stored_exactly(api, case):
    api.put_project("p")
    spec = {"id": "edge", **VALID_SPECS[case]}
    _enqueued(api.enqueue("p", [spec]), 1, 1, "p")
    job = _only_job(api, "p")
    assert job["id"] == spec["id"]
    assert job["value"] == spec["value"]
    assert job["type"] == spec.get("type", "seed")
    for field in ("via", "hops", "attr"):  # present exactly when set
        assert job.get(field) == spec.get(field)
        assert (field in job) == (spec.get(field) is not None)
    if spec.get("random_key") is not None:
        assert job["random_key"] == spec["random_key"]


def test_jobs_list_bounds(api):
    api.put_project("p")
    for jobs in ([], None, {"id": "a", "value": "b"}, "x"):
        response = api.call("POST", "/api/v1/admin/projects/p/jobs", {"jobs": jobs})
        err = _error(response, 400, "invalid_request")
        assert err["details"]["field"] == "jobs"
    _error(api.call("POST", "/api/v1/admin/projects/p/jobs", {}), 400, "invalid_request")
    _error(api.call("POST", "/api/v1/admin/projects/p/jobs", {"jobs": values(1), "extra": 1}),
           400, "invalid_request")


def test_enqueue_into_unknown_project_is_404(api):
    _error(api.enqueue("nope", values(1)), 404, "not_found")


def test_enqueue_refusals_keep_their_order(api, client, make_user):
    """The caller and the project are read in one statement; the answers
    stay in the order the route always gave: who first, then the body, then
    the project."""
    api.put_project("p")
    worker = make_user("w1", ["worker"])
    good, bad = {"jobs": values(1)}, {"jobs": []}

    def post(token, project_id, payload):
        return client.post(f"/api/v1/admin/projects/{project_id}/jobs", json=payload,
                           headers={"Authorization": f"Bearer {token}"})

    for token in ("hq_" + "x" * 40, "fhqn_" + "x" * 40):   # unknown machine token, unknown node
        for project_id in ("p", "nope"):
            _error(post(token, project_id, bad), 401, "invalid_machine_token")
    for project_id in ("p", "nope"):
        _error(post(worker, project_id, bad), 403, "permission_denied")
    _error(api.call("POST", "/api/v1/admin/projects/nope/jobs", bad), 400, "invalid_request")
    _error(api.call("POST", "/api/v1/admin/projects/nope/jobs", good), 404, "not_found")
    assert api.counts("p") == ZERO
    _enqueued(api.call("POST", "/api/v1/admin/projects/p/jobs", good), 1, 1, "p")


# --------------------------------------------------------------- project status


def test_archived_project_refuses_enqueue(api):
    api.put_project("p")
    _enqueued(api.enqueue("p", values(1)), 1, 1, "p")
    assert api.call("PATCH", "/api/v1/fleethq/projects/p", {"status": "archived"}).status_code == 200
    err = _error(api.enqueue("p", values(3, "late")), 409, "project_not_active")
    assert err["details"].get("status") == "archived"
    assert api.counts("p") == {**ZERO, "todo": 1}


def test_draining_project_accepts_enqueue(api):
    api.put_project("p", status="draining")
    _enqueued(api.enqueue("p", values(3)), 3, 3, "p")
    assert api.counts("p") == {**ZERO, "todo": 3}


# ------------------------------------------------------------------ claim order


def test_fifo_claims_in_creation_order(api):
    api.put_project("p", claim_order="fifo")
    # Ids, values and random keys all sort differently from creation order.
    first = [{"id": "z", "value": "3", "random_key": 10}, {"id": "m", "value": "1", "random_key": -5},
             {"id": "a", "value": "2", "random_key": 7}]
    second = [{"id": "b", "value": "0", "random_key": -100}, {"id": "y", "value": "9", "random_key": 0}]
    _enqueued(api.enqueue("p", first), 3, 3, "p")
    _enqueued(api.enqueue("p", second), 2, 2, "p")
    head = body(api.claim("p", max_jobs=2))["jobs"]
    assert [j["id"] for j in head] == ["z", "m"]
    rest = body(api.claim("p", max_jobs=10))["jobs"]
    assert [j["id"] for j in rest] == ["a", "b", "y"]


def test_random_order_follows_random_key(api):
    api.put_project("p", claim_order="random")
    keys = {"a": 50, "b": -10, "c": 2**31 - 1, "d": -(2**31), "e": 0, "f": 49}
    _enqueued(api.enqueue("p", [{"id": k, "value": k, "random_key": rk} for k, rk in keys.items()]),
              6, 6, "p")
    by_key = sorted(keys, key=keys.get)
    head = body(api.claim("p", max_jobs=2))["jobs"]
    assert [j["id"] for j in head] == by_key[:2]
    rest = body(api.claim("p", max_jobs=10))["jobs"]
    assert [j["id"] for j in rest] == by_key[2:]


def test_random_order_ties_break_by_job_id(api):
    api.put_project("p", claim_order="random", identity_mode="none")
    _enqueued(api.enqueue("p", [{"value": f"v{i}", "random_key": 7} for i in range(4)]), 4, 4, "p")
    claimed = body(api.claim("p", max_jobs=10))["jobs"]
    assert [j["value"] for j in claimed] == ["v0", "v1", "v2", "v3"]
    assert [int(j["job_id"]) for j in claimed] == sorted(int(j["job_id"]) for j in claimed)


# --------------------------------------------------------------- default job id

JOB_ID_V1 = [
    ("seed", "https://example.org/",
     "j1_92f50438a02ab171b6735678275a2f9db233d4c88e301a0243886c2679ce7070"),
    ("asset", "https://example.org/a.png",
     "j1_3415498e0d810218fb682c5192529b4ec15d74dfbaedf293c3b13d5d5c652998"),
    ("seed", "https://例子.测试/路径",
     "j1_6f244c2352df6cd3f399df55501a1b77c57f98b85a94a2193849f5532e766528"),
]


@pytest.mark.parametrize("job_type, value, expected", JOB_ID_V1)
def test_default_job_id_vectors(job_type, value, expected):
    assert default_job_id(value, job_type) == expected


def test_default_job_id_is_a_valid_external_id(api):
    api.put_project("p")
    specs = [{"id": default_job_id(value, t), "value": value, "type": t} for t, value, _ in JOB_ID_V1]
    _enqueued(api.enqueue("p", specs), 3, 3, "p")
    assert sorted(j["id"] for j in _all_jobs(api, "p")) == sorted(e for _, _, e in JOB_ID_V1)


# --------------------------------------------------------------------- paging


def _page(api, query: str):
    return api.call("GET", f"/api/v1/admin/projects/p/jobs?{query}")


def test_cursor_paging_walks_every_job_once(api):
    api.put_project("p")
    _enqueued(api.enqueue("p", values(7)), 7, 7, "p")
    seen, after, pages = [], None, 0
    while True:
        response = _page(api, "limit=3" + (f"&after_job_id={after}" if after else ""))
        assert response.status_code == 200, body(response)
        page = body(response)
        assert len(page["jobs"]) <= 3
        seen += page["jobs"]
        pages += 1
        after = page["next_after_job_id"]
        if after is None:
            break
        assert after == page["jobs"][-1]["job_id"]
    assert pages == 3
    assert [j["id"] for j in seen] == [f"v{i}" for i in range(7)]
    ids = [int(j["job_id"]) for j in seen]
    assert ids == sorted(ids) and len(set(ids)) == 7


def test_paging_filters_by_status(api):
    api.put_project("p")
    _enqueued(api.enqueue("p", values(5)), 5, 5, "p")
    claimed = body(api.claim("p", max_jobs=2))["jobs"]
    wip = _all_jobs(api, "p", "wip")
    assert {j["job_id"] for j in wip} == {int(j["job_id"]) for j in claimed}
    assert {j["status"] for j in wip} == {"wip"}
    assert [j["id"] for j in _all_jobs(api, "p", "todo")] == ["v2", "v3", "v4"]
    assert _all_jobs(api, "p", "done") == []
    # The cursor composes with the filter.
    first = body(_page(api, "status=todo&limit=1"))
    assert [j["id"] for j in first["jobs"]] == ["v2"]
    second = body(_page(api, f"status=todo&limit=1&after_job_id={first['next_after_job_id']}"))
    assert [j["id"] for j in second["jobs"]] == ["v3"]


@pytest.mark.parametrize("limit", ["1", "200"])
def test_paging_limit_bounds_accepted(api, limit):
    api.put_project("p")
    _enqueued(api.enqueue("p", values(3)), 3, 3, "p")
    response = _page(api, f"limit={limit}")
    assert response.status_code == 200, body(response)
    assert len(body(response)["jobs"]) == min(int(limit), 3)


@pytest.mark.parametrize("query", ["limit=0", "limit=201", "limit=-1", "limit=abc", "limit=1.5",
                                   "limit=%C2%B2", "limit=99999999999999999999999"])
def test_paging_limit_out_of_bounds_is_400(api, query):
    api.put_project("p")
    err = _error(_page(api, query), 400, "invalid_request")
    assert err["details"]["field"] == "limit"


@pytest.mark.parametrize("query", ["status=queued", "status=staged", "status=WIP", "after_job_id=abc",
                                   "after_job_id=-1", "after_job_id=1.0", "after_job_id=%C2%B2",
                                   "after_job_id=99999999999999999999"])
def test_paging_bad_query_is_400(api, query):
    api.put_project("p")
    _error(_page(api, query), 400, "invalid_request")


def test_paging_ignores_unknown_query_parameters(api):
    """As the contract's server does: only status, after_job_id and limit count."""
    api.put_project("p")
    _enqueued(api.enqueue("p", values(3)), 3, 3, "p")
    page = body(_page(api, "limit=2&bogus=1&offset=7&status="))
    assert [j["id"] for j in page["jobs"]] == ["v0", "v1"]
    assert page["next_after_job_id"] == page["jobs"][-1]["job_id"]


def test_paging_defaults_to_50_jobs(api):
    api.put_project("p")
    _enqueued(api.enqueue("p", values(51)), 51, 51, "p")
    first = body(_page(api, ""))
    assert len(first["jobs"]) == 50
    rest = body(_page(api, f"after_job_id={first['next_after_job_id']}"))
    assert [j["id"] for j in rest["jobs"]] == ["v50"] and rest["next_after_job_id"] is None
    assert len(body(_page(api, "after_job_id=0"))["jobs"]) == 50


def test_paging_unknown_project_is_404(api):
    _error(api.call("GET", "/api/v1/admin/projects/nope/jobs"), 404, "not_found")


# ------------------------------------------------------------------ job detail


def _full_detail(api, project_id: str, job_id) -> dict:
    response = api.call("GET", f"/api/v1/fleethq/projects/{project_id}/jobs/{job_id}")
    assert response.status_code == 200, body(response)
    return body(response)


def test_fleethq_job_detail_shows_attempts(api):
    api.put_project("p")
    _enqueued(api.enqueue("p", [{"id": "a", "value": "https://example.org/a", "hops": 3}]), 1, 1, "p")
    first = body(api.claim("p", worker_id="w1"))["jobs"]
    assert body(api.fail("p", first, retryable=True))["results"][0]["status"] == "applied"
    second = body(api.claim("p", worker_id="w1"))["jobs"]
    assert len(second) == 1 and second[0]["job_id"] == first[0]["job_id"]

    job = _full_detail(api, "p", first[0]["job_id"])
    assert job["job_id"] == int(first[0]["job_id"])
    assert job["id"] == "a" and job["value"] == "https://example.org/a" and job["hops"] == 3
    assert job["state"] == "wip"
    assert job["attempts"] == 2
    history = job["attempt_history"]
    assert [a["attempt_id"] for a in history] == [first[0]["attempt_id"], second[0]["attempt_id"]]
    assert [a["state"] for a in history] == ["failed", "running"]
    assert [a["worker_id"] for a in history] == ["w1", "w1"]
    assert history[0]["error"]["error"]["code"] == "network"
    assert job["current_attempt_id"] == second[0]["attempt_id"]

    assert body(api.complete("p", second))["results"][0]["status"] == "applied"
    job = _full_detail(api, "p", first[0]["job_id"])
    assert job["state"] == "done"
    assert [a["state"] for a in job["attempt_history"]] == ["failed", "done"]
    assert job["outcome"]["outcome"]["kind"] == "success"


def test_job_detail_of_unknown_job_is_404(api):
    api.put_project("p")
    api.put_project("q")
    _enqueued(api.enqueue("q", values(1)), 1, 1, "q")
    other = _all_jobs(api, "q")[0]["job_id"]
    _error(api.call("GET", "/api/v1/admin/projects/p/jobs/999999"), 404, "not_found")
    # A job of another project is not reachable through this one.
    _error(api.call("GET", f"/api/v1/admin/projects/p/jobs/{other}"), 404, "not_found")


@pytest.mark.parametrize("job_id", ["abc", "%C2%B2", "1e3"])
def test_job_detail_with_a_malformed_id_is_a_client_error(api, job_id):
    api.put_project("p")
    response = api.call("GET", f"/api/v1/admin/projects/p/jobs/{job_id}")
    assert response.status_code in (400, 404), (response.status_code, body(response))
    assert body(response)["error"]["code"] in ("invalid_request", "not_found")


# ----------------------------------------------------------- requeue and delete


def _requeue(api, job_id):
    return api.call("POST", f"/api/v1/admin/projects/p/jobs/{job_id}/requeue")


def _delete(api, job_id):
    return api.call("DELETE", f"/api/v1/admin/projects/p/jobs/{job_id}")


def test_requeue_only_failed_or_reset_exhausted(api):
    api.put_project("p", max_resets=0)
    _enqueued(api.enqueue("p", values(5)), 5, 5, "p")
    fail_hard, exhaust, wip, done = body(api.claim("p", max_jobs=4))["jobs"]
    api.fail("p", [fail_hard], retryable=False)
    api.fail("p", [exhaust], retryable=True)
    api.complete("p", [done])
    todo = [j for j in _all_jobs(api, "p", "todo")][0]
    assert api.counts("p") == {**ZERO, "todo": 1, "wip": 1, "done": 1, "failed": 1,
                               "reset_exhausted": 1}

    for job in (todo, wip, done):
        err = _error(_requeue(api, job["job_id"]), 400, "invalid_request")
        assert err["details"]["state"] in ("todo", "wip", "done")

    for job in (fail_hard, exhaust):
        response = _requeue(api, job["job_id"])
        assert response.status_code == 204, body(response)
        assert response.data == b""
        requeued = _detail(api, "p", job["job_id"])
        assert requeued["status"] == "todo"
        assert requeued["reset_count"] == 0
        assert requeued["execution_error"] is None and requeued["completed_at"] is None
    assert api.counts("p") == {**ZERO, "todo": 3, "wip": 1, "done": 1}
    # Requeued jobs can be claimed again at once.
    again = body(api.claim("p", max_jobs=10))["jobs"]
    assert {int(j["job_id"]) for j in again} == {
        int(fail_hard["job_id"]), int(exhaust["job_id"]), todo["job_id"]}


def test_requeue_of_unknown_job_is_400(api):
    """As SavewebHQ: a job it cannot requeue is an invalid request."""
    api.put_project("p")
    _error(_requeue(api, "424242"), 400, "invalid_request")


def test_delete_refuses_wip_and_removes_todo_and_done(api):
    api.put_project("p")
    _enqueued(api.enqueue("p", values(3)), 3, 3, "p")
    done, wip = body(api.claim("p", max_jobs=2))["jobs"]
    api.complete("p", [done])
    todo = _all_jobs(api, "p", "todo")[0]

    err = _error(_delete(api, wip["job_id"]), 400, "invalid_request")
    assert err["details"]["state"] == "wip"
    assert _detail(api, "p", wip["job_id"])["status"] == "wip"

    for job in (todo, done):
        response = _delete(api, job["job_id"])
        assert response.status_code == 204
        _error(api.call("GET", f"/api/v1/admin/projects/p/jobs/{job['job_id']}"), 404, "not_found")
    assert api.counts("p") == {**ZERO, "wip": 1}
    _error(_delete(api, todo["job_id"]), 400, "invalid_request")
    # The in-flight attempt still reports normally.
    assert body(api.complete("p", [wip]))["results"][0]["status"] == "applied"


def test_deleted_identity_can_be_enqueued_again(api):
    api.put_project("p")
    _enqueued(api.enqueue("p", [{"id": "a", "value": "one"}]), 1, 1, "p")
    job = _all_jobs(api, "p")[0]
    assert _delete(api, job["job_id"]).status_code == 204
    _enqueued(api.enqueue("p", [{"id": "a", "value": "two"}]), 1, 1, "p")
    assert [j["value"] for j in _all_jobs(api, "p")] == ["two"]


def test_enqueue_body_with_non_finite_attr_number_is_not_a_server_error(api):
    """1e400 is valid JSON syntax but no finite double: refuse it (400) or keep it, never 500."""
    api.put_project("p")
    raw = '{"jobs": [{"id": "a", "value": "v", "attr": {"n": 1e400}}]}'
    response = api.client.post("/api/v1/admin/projects/p/jobs", data=raw,
                               headers={**api.headers, "Content-Type": "application/json"})
    assert response.status_code in (200, 400), (response.status_code, body(response))
    if response.status_code == 400:
        assert body(response)["error"]["code"] in ("invalid_job", "invalid_request")


def test_requeued_job_that_missed_its_deadline_can_run_again(api, app):
    """A job failed by its task deadline and requeued by an admin is back in
    ``todo`` (DESIGN §4.1): it must be claimable again, not stuck there
    until the next sweep fails it once more."""
    from app.extensions import db
    from app.projects import leasing

    api.put_project("p", task_timeout_seconds=60)
    _enqueued(api.enqueue("p", values(1)), 1, 1, "p")
    job_id = _all_jobs(api, "p")[0]["job_id"]
    with app.app_context():  # a retry whose 60 s task deadline (from its first claim) passed
        db.session.execute(db.text("UPDATE jobs SET deadline_at = now() - interval '1 second', "
                                   "attempts_count = 1 WHERE id = :id"), {"id": int(job_id)})
        db.session.commit()
        assert leasing.sweep()["overdue"] == 1
        db.session.remove()
    assert api.counts("p") == {**ZERO, "failed": 1}
    assert _detail(api, "p", job_id)["execution_error"]["code"] == "timeout"

    response = _requeue(api, job_id)
    assert response.status_code == 204, body(response)
    assert _detail(api, "p", job_id)["status"] == "todo"
    claimed = body(api.claim("p"))["jobs"]
    assert [int(j["job_id"]) for j in claimed] == [job_id]
