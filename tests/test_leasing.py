"""Leases, outcomes and expiry (DESIGN §4.1, §5, §6): complete / fail /
extend-lease results, stale attempts, idempotent replays, lease expiry through
the claim path and through the periodic sweep, resets, requeue, backoff,
deadlines and job counts."""
from __future__ import annotations

import time

import pytest

from tests.helpers import Api, body, sql, values

RESULT_KEYS = {"job_id", "attempt_id", "status", "job_status", "lease_expires_at", "error"}
ALL_ZERO = {"todo": 0, "wip": 0, "staged": 0, "done": 0, "failed": 0, "reset_exhausted": 0}


# ------------------------------------------------------------------ helpers


def expire(app, job_id: str, seconds_ago: int = 1) -> None:
    """Move a job's live lease (and its current attempt's) into the past."""
    sql(app, "UPDATE jobs SET lease_expires_at = now() - make_interval(secs => :s) WHERE id = :id",
        id=int(job_id), s=seconds_ago)
    sql(app, "UPDATE attempts SET lease_expires_at = now() - make_interval(secs => :s) "
             "WHERE id = (SELECT current_attempt_id FROM jobs WHERE id = :id)",
        id=int(job_id), s=seconds_ago)


def sweep(app) -> dict:
    from app.extensions import db
    from app.projects import leasing
    with app.app_context():
        out = leasing.sweep()
        db.session.remove()
    return out


def detail(api: Api, project: str, job_id: str) -> dict:
    response = api.call("GET", f"/api/v1/fleethq/projects/{project}/jobs/{job_id}")
    assert response.status_code == 200, body(response)
    return body(response)


def history_states(api: Api, project: str, job_id: str) -> list[str]:
    return [a["state"] for a in detail(api, project, job_id)["attempt_history"]]


def real_counts(app, project: str) -> dict:
    counts = dict(ALL_ZERO)
    for state, n in sql(app, "SELECT state, count(*) FROM jobs WHERE project_id = :p GROUP BY state",
                        p=project):
        counts[state] = n
    return counts


def claim_jobs(api: Api, project: str, **kw) -> list[dict]:
    response = api.claim(project, **kw)
    assert response.status_code == 200, body(response)
    return body(response)["jobs"]


def results(response) -> list[dict]:
    assert response.status_code == 200, body(response)
    out = body(response)
    assert list(out) == ["results"]
    for r in out["results"]:
        assert set(r) == RESULT_KEYS
    return out["results"]


def db_now(app) -> float:
    return float(sql(app, "SELECT extract(epoch FROM now())")[0][0])


@pytest.fixture
def bob(client, make_user):
    """A second user whose machine token may also run workers."""
    return Api(client, make_user("bob", ["worker"]))


# ------------------------------------------------------------ result shapes

def test_complete_fail_extend_answer_one_result_per_item(api):
    api.put_project("p")
    api.enqueue("p", values(3))
    a, b, c = claim_jobs(api, "p", max_jobs=3, lease_seconds=60)

    done = results(api.complete("p", [a]))
    assert done == [{"job_id": a["job_id"], "attempt_id": a["attempt_id"], "status": "applied",
                     "job_status": "done", "lease_expires_at": None, "error": None}]

    failed = results(api.fail("p", [b], retryable=False))
    assert failed == [{"job_id": b["job_id"], "attempt_id": b["attempt_id"], "status": "applied",
                       "job_status": "failed", "lease_expires_at": None, "error": None}]

    extended = results(api.extend("p", [c], seconds=600))
    assert len(extended) == 1
    ext = extended[0]
    assert (ext["job_id"], ext["attempt_id"], ext["status"], ext["job_status"], ext["error"]) == \
        (c["job_id"], c["attempt_id"], "applied", "wip", None)
    assert isinstance(ext["lease_expires_at"], int)
    assert abs(ext["lease_expires_at"] - (time.time() + 600)) < 5

    assert api.counts("p") == {**ALL_ZERO, "wip": 1, "done": 1, "failed": 1}


def test_stale_item_is_rejected_without_rolling_back_the_others(api, app):
    api.put_project("p")
    api.enqueue("p", values(4))
    a, b, c, d = claim_jobs(api, "p", max_jobs=4)
    # An attempt id that is not the job's current attempt (it belongs to job b).
    stale = {"job_id": a["job_id"], "attempt_id": b["attempt_id"]}

    out = results(api.complete("p", [a, stale]))
    assert out[0]["status"] == "applied" and out[0]["job_status"] == "done"
    assert out[1]["status"] == "rejected"
    assert out[1]["error"]["code"] == "stale_attempt"
    assert (out[1]["job_id"], out[1]["attempt_id"]) == (a["job_id"], b["attempt_id"])

    # Stale first, good second: order does not matter either.
    out = results(api.fail("p", [{"job_id": c["job_id"], "attempt_id": "999999"}, b],
                           retryable=False))
    assert [r["status"] for r in out] == ["rejected", "applied"]
    assert out[0]["error"]["code"] == "stale_attempt"
    assert out[1]["job_status"] == "failed"

    expire(app, d["job_id"])
    out = results(api.extend("p", [c, d], seconds=120))
    assert [r["status"] for r in out] == ["applied", "rejected"]
    assert out[1]["error"]["code"] == "stale_attempt"

    # An item sent to the wrong project is stale too, and does not touch the job.
    api.put_project("q")
    [r] = results(api.complete("q", [c]))
    assert r["status"] == "rejected" and r["error"]["code"] == "stale_attempt"
    assert detail(api, "p", c["job_id"])["state"] == "wip"

    assert detail(api, "p", a["job_id"])["state"] == "done"
    assert detail(api, "p", b["job_id"])["state"] == "failed"
    assert detail(api, "p", c["job_id"])["lease_expires_at"] >= int(time.time()) + 100
    assert real_counts(app, "p") == {**ALL_ZERO, "wip": 2, "done": 1, "failed": 1}


def test_wrong_worker_id_is_stale(api):
    api.put_project("p")
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p", worker_id="w1")

    for response in (api.complete("p", [job], worker_id="w2"),
                     api.fail("p", [job], worker_id="w2"),
                     api.extend("p", [job], worker_id="w2")):
        [r] = results(response)
        assert r["status"] == "rejected"
        assert r["error"]["code"] == "stale_attempt"
        assert r["job_status"] is None  # as SavewebHQ answers a rejected item

    info = detail(api, "p", job["job_id"])
    assert info["state"] == "wip" and info["resets"] == 0
    assert [a["state"] for a in info["attempt_history"]] == ["running"]
    # The real owner still can finish it.
    [r] = results(api.complete("p", [job], worker_id="w1"))
    assert r["status"] == "applied"


def test_other_users_token_with_same_worker_id_is_stale(api, bob):
    api.put_project("p")
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p", worker_id="shared")

    for response in (bob.complete("p", [job], worker_id="shared"),
                     bob.fail("p", [job], worker_id="shared", retryable=False),
                     bob.extend("p", [job], worker_id="shared")):
        [r] = results(response)
        assert r["status"] == "rejected"
        assert r["error"]["code"] == "stale_attempt"

    assert detail(api, "p", job["job_id"])["state"] == "wip"
    [r] = results(api.complete("p", [job], worker_id="shared"))
    assert r["status"] == "applied"
    # Bob replaying "the same" complete must not look like his own replay either.
    [r] = results(bob.complete("p", [job], worker_id="shared"))
    assert r["status"] == "rejected" and r["error"]["code"] == "stale_attempt"


# ------------------------------------------------------------------ replays

def test_replayed_complete_is_applied_again_and_changes_nothing(api, app):
    api.put_project("p")
    api.enqueue("p", values(2))
    [job] = claim_jobs(api, "p", max_jobs=1)
    [first] = results(api.complete("p", [job]))
    assert first["status"] == "applied"
    before = detail(api, "p", job["job_id"])
    counts = api.counts("p")
    time.sleep(1.1)  # a second write would move updated_at / finished_at

    [again] = results(api.complete("p", [job]))
    assert again == first
    assert detail(api, "p", job["job_id"]) == before
    assert api.counts("p") == counts == {**ALL_ZERO, "todo": 1, "done": 1}
    assert sql(app, "SELECT count(*) FROM attempts")[0][0] == 1

    # A "replay" with a different outcome is not the same report: rejected.
    [other] = results(api.complete("p", [job], kind="skipped"))
    assert other["status"] == "rejected" and other["error"]["code"] == "stale_attempt"
    assert detail(api, "p", job["job_id"]) == before


@pytest.mark.parametrize("retryable", [True, False])
def test_replayed_fail_is_applied_again_and_changes_nothing(api, app, retryable):
    api.put_project("p")
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p")
    [first] = results(api.fail("p", [job], retryable=retryable))
    assert first["status"] == "applied"
    assert first["job_status"] == ("todo" if retryable else "failed")
    before = detail(api, "p", job["job_id"])
    assert before["resets"] == (1 if retryable else 0)
    counts = api.counts("p")
    time.sleep(1.1)

    [again] = results(api.fail("p", [job], retryable=retryable))
    assert again["status"] == "applied"
    assert again["error"] is None
    assert again["job_status"] == first["job_status"]
    after = detail(api, "p", job["job_id"])
    assert after == before  # resets not counted twice, no new timestamps
    assert api.counts("p") == counts


def test_replayed_fail_after_the_job_was_reclaimed_does_not_touch_the_new_attempt(api):
    api.put_project("p")
    api.enqueue("p", values(1))
    [old] = claim_jobs(api, "p", worker_id="w1")
    results(api.fail("p", [old], worker_id="w1"))
    [new] = claim_jobs(api, "p", worker_id="w2")
    assert new["job_id"] == old["job_id"] and new["attempt_id"] != old["attempt_id"]

    [again] = results(api.fail("p", [old], worker_id="w1"))
    assert again["status"] == "applied"
    info = detail(api, "p", old["job_id"])
    assert info["state"] == "wip" and info["current_attempt_id"] == new["attempt_id"]
    assert info["resets"] == 1
    assert [a["state"] for a in info["attempt_history"]] == ["failed", "running"]


def test_complete_after_fail_of_the_same_attempt_is_rejected(api):
    api.put_project("p")
    api.enqueue("p", values(2))
    a, b = claim_jobs(api, "p", max_jobs=2)

    results(api.fail("p", [a], retryable=True))
    [r] = results(api.complete("p", [a]))
    assert r["status"] == "rejected" and r["error"]["code"] == "stale_attempt"
    assert r["job_status"] is None
    info = detail(api, "p", a["job_id"])
    assert info["state"] == "todo" and info["outcome"] is None
    assert [x["state"] for x in info["attempt_history"]] == ["failed"]

    # And the other way round: a fail after a complete.
    results(api.complete("p", [b]))
    [r] = results(api.fail("p", [b], retryable=False))
    assert r["status"] == "rejected" and r["error"]["code"] == "stale_attempt"
    assert detail(api, "p", b["job_id"])["state"] == "done"


# ------------------------------------------------------------------- expiry

def test_expired_lease_rejects_complete_and_the_claim_path_reaps_it(api, app):
    api.put_project("p")
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p", worker_id="w1")
    expire(app, job["job_id"])

    [r] = results(api.complete("p", [job], worker_id="w1"))
    assert r["status"] == "rejected" and r["error"]["code"] == "stale_attempt"
    assert detail(api, "p", job["job_id"])["outcome"] is None

    # Nobody swept: the next claim reaps the lease itself and hands the job out again.
    [again] = claim_jobs(api, "p", worker_id="w2")
    assert again["job_id"] == job["job_id"]
    assert again["attempt_id"] != job["attempt_id"]
    info = detail(api, "p", job["job_id"])
    assert info["state"] == "wip" and info["resets"] == 1 and info["worker_id"] == "w2"
    assert [a["state"] for a in info["attempt_history"]] == ["expired", "running"]
    assert info["attempt_history"][0]["attempt_id"] == job["attempt_id"]

    # The old attempt stays dead; the new one finishes the job.
    [r] = results(api.complete("p", [job], worker_id="w1"))
    assert r["status"] == "rejected"
    [r] = results(api.complete("p", [again], worker_id="w2"))
    assert r["status"] == "applied"
    assert [a["state"] for a in detail(api, "p", job["job_id"])["attempt_history"]] == \
        ["expired", "done"]


def test_a_claim_that_takes_nothing_still_reaps_expired_leases(api, app):
    api.put_project("p")
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p", worker_id="w1")
    expire(app, job["job_id"])
    # This worker only takes assets: the seed job is reaped back to todo but not claimed.
    assert claim_jobs(api, "p", worker_id="w2", accept_types=["asset"]) == []
    info = detail(api, "p", job["job_id"])
    assert info["state"] == "todo" and info["resets"] == 1
    assert [a["state"] for a in info["attempt_history"]] == ["expired"]
    assert api.counts("p") == {**ALL_ZERO, "todo": 1}
    [r] = results(api.complete("p", [job], worker_id="w1"))
    assert r["status"] == "rejected" and r["error"]["code"] == "stale_attempt"
    assert r["job_status"] is None


def test_expired_lease_sweep_returns_job_to_todo(api, app):
    api.put_project("p")
    api.enqueue("p", values(2))
    a, b = claim_jobs(api, "p", max_jobs=2)
    expire(app, a["job_id"])

    assert sweep(app)["expired"] == 1
    info = detail(api, "p", a["job_id"])
    assert info["state"] == "todo" and info["resets"] == 1
    assert info["lease_expires_at"] is None
    assert info["last_error"]["code"] == "lease_expired"
    assert [x["state"] for x in info["attempt_history"]] == ["expired"]
    assert detail(api, "p", b["job_id"])["state"] == "wip"  # a live lease is left alone

    [r] = results(api.complete("p", [a]))
    assert r["status"] == "rejected" and r["error"]["code"] == "stale_attempt"
    assert r["job_status"] is None
    assert api.counts("p") == {**ALL_ZERO, "todo": 1, "wip": 1}
    [again] = claim_jobs(api, "p")
    assert again["job_id"] == a["job_id"]


def test_real_one_second_lease_runs_out(api, app):
    api.put_project("p")
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p", lease_seconds=1)
    time.sleep(1.3)
    [r] = results(api.complete("p", [job]))
    assert r["status"] == "rejected" and r["error"]["code"] == "stale_attempt"
    [again] = claim_jobs(api, "p", worker_id="w2")
    assert again["job_id"] == job["job_id"]
    assert history_states(api, "p", job["job_id"]) == ["expired", "running"]


# ------------------------------------------------------- failures and resets

def test_retryable_fail_returns_job_to_todo_with_one_more_reset(api):
    api.put_project("p")
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p")
    [r] = results(api.fail("p", [job], retryable=True, code="timeout"))
    assert r["job_status"] == "todo"
    info = detail(api, "p", job["job_id"])
    assert info["state"] == "todo" and info["resets"] == 1
    assert info["last_error"]["code"] == "timeout"
    assert info["attempt_history"][0]["state"] == "failed"
    assert info["attempt_history"][0]["error"]["error"]["code"] == "timeout"
    # Generic projects retry immediately (retry_backoff_seconds 0).
    [again] = claim_jobs(api, "p")
    assert again["job_id"] == job["job_id"]


def test_non_retryable_fail_fails_the_job(api):
    api.put_project("p")
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p")
    [r] = results(api.fail("p", [job], retryable=False, code="not_found"))
    assert r["job_status"] == "failed"
    info = detail(api, "p", job["job_id"])
    assert info["state"] == "failed" and info["resets"] == 0
    assert info["last_error"]["code"] == "not_found"
    assert claim_jobs(api, "p") == []
    assert api.counts("p") == {**ALL_ZERO, "failed": 1}


def test_max_resets_counts_failures_and_expiries_together(api, app):
    api.put_project("p", max_resets=2)
    api.enqueue("p", values(2))

    # 1: retryable failure
    [job] = claim_jobs(api, "p", max_jobs=1)
    job_id = job["job_id"]
    [r] = results(api.fail("p", [job]))
    assert r["job_status"] == "todo"
    # 2: lease expiry, reaped by the sweep
    [job] = claim_jobs(api, "p", max_jobs=1)
    assert job["job_id"] == job_id
    expire(app, job_id)
    sweep(app)
    info = detail(api, "p", job_id)
    assert info["state"] == "todo" and info["resets"] == 2
    # 3: retryable failure again: the resets are used up
    [job] = claim_jobs(api, "p", max_jobs=1)
    assert job["job_id"] == job_id
    [r] = results(api.fail("p", [job]))
    assert r["status"] == "applied" and r["job_status"] == "reset_exhausted"

    info = detail(api, "p", job_id)
    assert info["state"] == "reset_exhausted" and info["resets"] == 3
    assert [a["state"] for a in info["attempt_history"]] == ["failed", "expired", "failed"]
    # Only the other job is left to claim.
    left = claim_jobs(api, "p", max_jobs=10)
    assert [j["job_id"] for j in left] != [job_id] and len(left) == 1
    assert api.counts("p") == {**ALL_ZERO, "wip": 1, "reset_exhausted": 1}


def test_max_resets_exhausted_by_an_expiry_reaped_in_the_claim_path(api, app):
    api.put_project("p", max_resets=2)
    api.enqueue("p", values(1))
    for _ in range(2):
        [job] = claim_jobs(api, "p")
        results(api.fail("p", [job]))
    [job] = claim_jobs(api, "p")
    expire(app, job["job_id"])
    assert claim_jobs(api, "p") == []  # reaps to reset_exhausted, nothing to hand out
    info = detail(api, "p", job["job_id"])
    assert info["state"] == "reset_exhausted" and info["resets"] == 3
    assert [a["state"] for a in info["attempt_history"]] == ["failed", "failed", "expired"]
    assert api.counts("p") == {**ALL_ZERO, "reset_exhausted": 1}


def test_requeue_puts_exhausted_and_failed_jobs_back(api, app):
    api.put_project("p", max_resets=0)
    api.enqueue("p", values(2))
    a, b = claim_jobs(api, "p", max_jobs=2)
    results(api.fail("p", [a], retryable=True))
    results(api.fail("p", [b], retryable=False))
    assert detail(api, "p", a["job_id"])["state"] == "reset_exhausted"
    assert claim_jobs(api, "p") == []

    for job in (a, b):
        response = api.call("POST", f"/api/v1/admin/projects/p/jobs/{job['job_id']}/requeue")
        assert response.status_code == 204, body(response)
        info = detail(api, "p", job["job_id"])
        assert info["state"] == "todo" and info["resets"] == 0 and info["last_error"] is None
    assert api.counts("p") == {**ALL_ZERO, "todo": 2}

    again = claim_jobs(api, "p", max_jobs=10)
    assert sorted(j["job_id"] for j in again) == sorted([a["job_id"], b["job_id"]])
    assert all(j["attempt_id"] not in (a["attempt_id"], b["attempt_id"]) for j in again)
    # A requeued job may use its resets again (max_resets 0: one retryable failure exhausts).
    first = next(j for j in again if j["job_id"] == a["job_id"])
    [r] = results(api.fail("p", [first], retryable=True))
    assert r["job_status"] == "reset_exhausted"


def test_requeue_of_a_live_or_queued_job_is_refused(api):
    api.put_project("p")
    api.enqueue("p", values(2))
    [job] = claim_jobs(api, "p", max_jobs=1)
    queued = body(api.call("GET", "/api/v1/fleethq/projects/p/jobs?status=todo"))["jobs"][0]
    for job_id, state in ((job["job_id"], "wip"), (queued["job_id"], "todo")):
        response = api.call("POST", f"/api/v1/admin/projects/p/jobs/{job_id}/requeue")
        assert response.status_code == 400
        assert body(response)["error"]["code"] == "invalid_request"
        assert detail(api, "p", job_id)["state"] == state
    [r] = results(api.complete("p", [job]))
    assert r["status"] == "applied"


def test_retry_backoff_holds_a_failed_job_back_but_not_the_others(api, app):
    api.put_project("p", retry_backoff_seconds=30)
    api.enqueue("p", values(3))
    [job] = claim_jobs(api, "p", max_jobs=1)
    [r] = results(api.fail("p", [job], retryable=True))
    assert r["job_status"] == "todo"

    info = detail(api, "p", job["job_id"])
    wait = info["not_before"] - db_now(app)
    assert 13 <= wait <= 31  # 30 s base, 50..100 % jitter

    others = claim_jobs(api, "p", max_jobs=10, worker_id="w2")
    assert len(others) == 2 and job["job_id"] not in {j["job_id"] for j in others}
    assert claim_jobs(api, "p", max_jobs=10, worker_id="w3") == []

    # Once the backoff has passed the job is claimable again.
    sql(app, "UPDATE jobs SET not_before = now() - interval '1 second' WHERE id = :id",
        id=int(job["job_id"]))
    [again] = claim_jobs(api, "p", worker_id="w3")
    assert again["job_id"] == job["job_id"]


def test_retry_backoff_applies_after_a_lease_expiry_too(api, app):
    api.put_project("p", retry_backoff_seconds=30)
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p")
    expire(app, job["job_id"])
    sweep(app)
    info = detail(api, "p", job["job_id"])
    assert info["state"] == "todo"
    assert info["not_before"] - db_now(app) >= 13
    assert claim_jobs(api, "p", worker_id="w2") == []


# ------------------------------------------------------------- extend-lease

def test_extend_never_shortens_a_lease(api, app):
    api.put_project("p")
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p", lease_seconds=600)
    original = job["lease_expires_at"]

    [r] = results(api.extend("p", [job], seconds=10))
    assert r["status"] == "applied"
    assert r["lease_expires_at"] == original
    assert detail(api, "p", job["job_id"])["lease_expires_at"] == original

    [r] = results(api.extend("p", [job], seconds=1200))
    assert r["status"] == "applied"
    assert abs(r["lease_expires_at"] - (db_now(app) + 1200)) <= 3
    assert r["lease_expires_at"] > original + 500
    info = detail(api, "p", job["job_id"])
    assert info["lease_expires_at"] == r["lease_expires_at"]
    assert info["attempt_history"][-1]["lease_expires_at"] == r["lease_expires_at"]


def test_extend_never_goes_past_the_task_deadline(api, app):
    api.put_project("p", task_timeout_seconds=60)
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p", lease_seconds=30)
    claimed_by = db_now(app)  # the deadline starts at the first claim, not at the enqueue
    info = detail(api, "p", job["job_id"])
    deadline = info["deadline_at"]
    assert deadline is not None and deadline <= claimed_by + 61  # whole seconds on the wire

    [r] = results(api.extend("p", [job], seconds=3600))
    assert r["status"] == "applied"
    assert job["lease_expires_at"] <= r["lease_expires_at"] <= deadline
    assert r["lease_expires_at"] >= deadline - 1
    assert detail(api, "p", job["job_id"])["lease_expires_at"] <= deadline


def test_claim_and_extend_never_go_past_the_attempt_deadline(api, app):
    api.put_project("p", attempt_timeout_seconds=15)
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p", lease_seconds=600)
    now = db_now(app)
    assert job["lease_expires_at"] <= now + 16
    [r] = results(api.extend("p", [job], seconds=3600))
    assert r["status"] == "applied"
    assert r["lease_expires_at"] <= now + 16
    attempt = detail(api, "p", job["job_id"])["attempt_history"][0]
    assert attempt["lease_expires_at"] <= attempt["deadline_at"]


def test_extend_of_an_expired_lease_is_rejected_and_never_revives_it(api, app):
    api.put_project("p")
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p", lease_seconds=60)
    expire(app, job["job_id"], seconds_ago=5)

    [r] = results(api.extend("p", [job], seconds=600))
    assert r["status"] == "rejected" and r["error"]["code"] == "stale_attempt"
    assert r["lease_expires_at"] is None
    info = detail(api, "p", job["job_id"])
    assert info["lease_expires_at"] < db_now(app)
    assert info["attempt_history"][0]["lease_expires_at"] < db_now(app)

    sweep(app)
    assert detail(api, "p", job["job_id"])["state"] == "todo"
    [r] = results(api.extend("p", [job], seconds=600))
    assert r["status"] == "rejected"
    assert history_states(api, "p", job["job_id"]) == ["expired"]


# ---------------------------------------------------------------- deadlines

def test_sweep_fails_a_queued_job_whose_task_deadline_passed(api, app):
    """A job back in the queue after an attempt (only a claim gives a job its
    task deadline) fails once that deadline has passed."""
    api.put_project("p", task_timeout_seconds=60)
    api.enqueue("p", values(2))
    jobs = body(api.call("GET", "/api/v1/fleethq/projects/p/jobs"))["jobs"]
    late, fine = jobs[0]["job_id"], jobs[1]["job_id"]
    sql(app, "UPDATE jobs SET deadline_at = now() - interval '1 second', attempts_count = 1 "
             "WHERE id = :id", id=late)

    assert sweep(app)["overdue"] == 1
    info = detail(api, "p", late)
    assert info["state"] == "failed"
    assert info["last_error"]["code"] == "timeout"
    assert detail(api, "p", fine)["state"] == "todo"
    assert [int(j["job_id"]) for j in claim_jobs(api, "p", max_jobs=10)] == [fine]
    assert api.counts("p") == {**ALL_ZERO, "wip": 1, "failed": 1}


def test_a_running_job_past_its_task_deadline_fails_instead_of_retrying(api, app):
    api.put_project("p", task_timeout_seconds=60)
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p")
    sql(app, "UPDATE jobs SET deadline_at = now() - interval '1 second', "
             "lease_expires_at = now() - interval '1 second' WHERE id = :id", id=int(job["job_id"]))
    sweep(app)
    info = detail(api, "p", job["job_id"])
    assert info["state"] == "failed"
    assert history_states(api, "p", job["job_id"]) == ["expired"]
    assert claim_jobs(api, "p") == []


def test_a_requeued_job_whose_task_deadline_passed_is_claimable_again(api, app):
    """Requeue puts the job back in the queue "with counters reset" (§4.1): a job
    that failed because its task deadline ran out must get a fresh deadline, or
    the requeue is a no-op that the sweep undoes."""
    api.put_project("p", task_timeout_seconds=60)
    api.enqueue("p", values(1))
    [job] = body(api.call("GET", "/api/v1/fleethq/projects/p/jobs"))["jobs"]
    # A retry whose deadline (started by its first claim) has passed.
    sql(app, "UPDATE jobs SET deadline_at = now() - interval '1 second', attempts_count = 1 "
             "WHERE id = :id", id=int(job["job_id"]))
    sweep(app)
    assert detail(api, "p", job["job_id"])["state"] == "failed"

    response = api.call("POST", f"/api/v1/admin/projects/p/jobs/{job['job_id']}/requeue")
    assert response.status_code == 204
    claimed = claim_jobs(api, "p")
    assert [int(j["job_id"]) for j in claimed] == [job["job_id"]]


# ------------------------------------------------------------------ history

def test_every_claim_creates_a_new_attempt(api, app):
    api.put_project("p", max_resets=10)
    api.enqueue("p", values(1))
    seen = []
    [job] = claim_jobs(api, "p", worker_id="w1")
    seen.append(job["attempt_id"])
    results(api.fail("p", [job], worker_id="w1"))
    [job] = claim_jobs(api, "p", worker_id="w1")
    seen.append(job["attempt_id"])
    expire(app, job["job_id"])
    [job] = claim_jobs(api, "p", worker_id="w2")  # lazy reap + claim
    seen.append(job["attempt_id"])
    results(api.complete("p", [job], worker_id="w2"))

    assert len(set(seen)) == 3
    info = detail(api, "p", job["job_id"])
    assert [a["attempt_id"] for a in info["attempt_history"]] == seen
    assert [a["state"] for a in info["attempt_history"]] == ["failed", "expired", "done"]
    assert [a["worker_id"] for a in info["attempt_history"]] == ["w1", "w1", "w2"]
    assert info["attempts"] == 3
    assert info["outcome"]["outcome"] == {"kind": "success", "code": None, "uri": None, "meta": {}}
    assert sql(app, "SELECT count(*) FROM attempts")[0][0] == 3


def test_job_counts_match_the_jobs_after_a_mixed_sequence(api, app):
    api.put_project("p", max_resets=1)
    api.enqueue("p", values(12))
    jobs = claim_jobs(api, "p", max_jobs=10, worker_id="w1")
    results(api.complete("p", jobs[0:3], worker_id="w1"))                 # 3 done
    results(api.fail("p", jobs[3:5], retryable=False, worker_id="w1"))    # 2 failed
    results(api.fail("p", jobs[5:7], retryable=True, worker_id="w1"))     # 2 back to todo
    expire(app, jobs[7]["job_id"])
    sweep(app)                                                            # 1 back to todo
    results(api.complete("p", [jobs[0]], worker_id="w1"))                # replay: no change
    results(api.complete("p", [jobs[3]], worker_id="w1"))                # stale: no change
    # 2 untouched wip (8, 9); 2 never claimed + 3 released = 5 todo
    assert api.counts("p") == real_counts(app, "p") == \
        {**ALL_ZERO, "todo": 5, "wip": 2, "done": 3, "failed": 2}

    again = claim_jobs(api, "p", max_jobs=10, worker_id="w2")
    assert len(again) == 5
    retried = [j for j in again if j["job_id"] in {x["job_id"] for x in jobs[5:8]}]
    results(api.fail("p", retried, retryable=True, worker_id="w2"))      # resets used up
    api.call("POST", f"/api/v1/admin/projects/p/jobs/{jobs[3]['job_id']}/requeue")
    response = api.call("DELETE", f"/api/v1/admin/projects/p/jobs/{jobs[4]['job_id']}")
    assert response.status_code == 204
    assert api.counts("p") == real_counts(app, "p") == \
        {**ALL_ZERO, "todo": 1, "wip": 4, "done": 3, "reset_exhausted": 3}


def test_draining_project_still_takes_reports_of_in_flight_attempts(api, app):
    api.put_project("p")
    api.enqueue("p", values(5))
    a, b, c, d = claim_jobs(api, "p", max_jobs=4)
    response = api.call("PATCH", "/api/v1/fleethq/projects/p", {"status": "draining"})
    assert response.status_code == 200 and body(response)["status"] == "draining"

    response = api.claim("p")
    assert response.status_code == 409
    assert body(response)["error"]["code"] == "project_not_active"

    [r] = results(api.extend("p", [a], seconds=900))
    assert r["status"] == "applied" and r["lease_expires_at"] >= int(time.time()) + 800
    [r] = results(api.complete("p", [a]))
    assert r["status"] == "applied" and r["job_status"] == "done"
    [r] = results(api.fail("p", [b], retryable=False))
    assert r["status"] == "applied" and r["job_status"] == "failed"
    [r] = results(api.fail("p", [c], retryable=True))
    assert r["status"] == "applied" and r["job_status"] == "todo"
    [r] = results(api.complete("p", [d]))
    assert r["status"] == "applied"
    assert api.counts("p") == real_counts(app, "p") == \
        {**ALL_ZERO, "todo": 2, "done": 2, "failed": 1}


# ------------------------------------------------- SavewebHQ attempt ids, worker map


def test_an_attempt_with_a_wire_id_is_finished_by_that_id(api, app):
    """Attempts imported from SavewebHQ keep the ``at_…`` ids their workers
    hold; complete, extend and fail find the attempt by it."""
    api.put_project("p")
    api.enqueue("p", values(2))
    a, b = claim_jobs(api, "p", max_jobs=2)
    sql(app, "UPDATE attempts SET wire_id = :w WHERE id = :id", w="at_imported-A", id=int(a["attempt_id"]))
    sql(app, "UPDATE attempts SET wire_id = :w WHERE id = :id", w="at_imported-B", id=int(b["attempt_id"]))
    held_a = {**a, "attempt_id": "at_imported-A"}
    held_b = {**b, "attempt_id": "at_imported-B"}

    [r] = results(api.extend("p", [held_a]))
    assert r["status"] == "applied" and r["attempt_id"] == "at_imported-A" and r["job_status"] == "wip"
    [r] = results(api.complete("p", [{**a, "attempt_id": "at_someone-else"}]))
    assert r["status"] == "rejected" and r["error"]["code"] == "stale_attempt"
    [r] = results(api.complete("p", [held_a]))
    assert r["status"] == "applied" and r["job_status"] == "done"
    [r] = results(api.complete("p", [held_a]))  # a lost answer, replayed
    assert r["status"] == "applied"
    [r] = results(api.fail("p", [held_b], retryable=False))
    assert r["status"] == "applied" and r["job_status"] == "failed"
    assert detail(api, "p", a["job_id"])["state"] == "done"


def test_rejected_items_carry_savewebhq_error_objects(api):
    api.put_project("p")
    [r] = results(api.complete("p", [{"job_id": 99, "attempt_id": "at_nothing"}]))
    message = r["error"].pop("message")
    assert isinstance(message, str) and message
    assert r == {"job_id": 99, "attempt_id": "at_nothing", "status": "rejected", "job_status": None,
                 "lease_expires_at": None,
                 "error": {"code": "stale_attempt", "retryable": False, "retry_after_ms": 0,
                           "details": {}}}


def test_claims_and_outcomes_map_the_worker_id_to_its_user(api, app, make_user):
    """SavewebHQ's worker map: one user per worker id, last writer wins,
    gone with the user."""
    api.put_project("p")
    api.enqueue("p", values(2))
    [job] = claim_jobs(api, "p", worker_id="abc1234", max_jobs=1)
    assert sql(app, "SELECT worker_id, user_id FROM worker_users") == [("abc1234", "admin")]
    other = Api(api.client, make_user("vol", ["worker"]))
    assert other.claim("p", worker_id="abc1234", max_jobs=1).status_code == 200
    assert sql(app, "SELECT worker_id, user_id FROM worker_users") == [("abc1234", "vol")]
    results(api.complete("p", [job], worker_id="abc1234"))
    assert sql(app, "SELECT worker_id, user_id FROM worker_users") == [("abc1234", "admin")]
    sql(app, "DELETE FROM users WHERE id = 'admin'")
    assert sql(app, "SELECT count(*) FROM worker_users") == [(0,)]


def test_every_worker_call_restores_the_worker_map(api, app):
    """Upserted on every call, as SavewebHQ does: a mapping deleted (or
    rewritten by another web process) is right again after the next call,
    not after a cache expires."""
    api.put_project("p")
    api.enqueue("p", values(1))
    [job] = claim_jobs(api, "p", worker_id="abc1234", max_jobs=1)
    for call in (lambda: api.extend("p", [job], worker_id="abc1234"),
                 lambda: api.fail("p", [job], worker_id="abc1234")):
        sql(app, "DELETE FROM worker_users")
        assert call().status_code == 200
        assert sql(app, "SELECT worker_id, user_id FROM worker_users") == [("abc1234", "admin")]


def test_policy_of_a_draining_project_is_409(api):
    api.put_project("p")
    api.put_project("p", status="draining")
    response = api.call("GET", "/api/v1/projects/p")
    assert response.status_code == 409
    assert body(response)["error"]["code"] == "project_not_active"
