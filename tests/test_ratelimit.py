"""The project dispatch token bucket (DESIGN §5): the arithmetic of
app/projects/ratelimit.py, and what a worker sees over HTTP."""
from __future__ import annotations

import math

import pytest

from app.projects import ratelimit
from tests.helpers import API_CACHE_CONTROL, Api, body, sql, values

# ------------------------------------------------------------------ arithmetic


@pytest.mark.parametrize("qps, expected", [
    (2.5, 1.0),
    (1000, 1.0),      # one token up to 1000 qps
    (2000, 200.0),    # above: qps / 10 ...
    (1e300, 256.0),   # ... capped at 256
])
def test_capacity(qps, expected):
    assert ratelimit.capacity(qps) == expected


def test_refill_at_2_5_qps():
    assert ratelimit.refill(0.0, 0.1, 2.5) == pytest.approx(0.25)
    # 0.4 s at 2.5 qps is one whole token, and the bucket never holds more than one.
    assert ratelimit.grantable(ratelimit.refill(0.0, 0.4, 2.5), 10) == 1
    assert ratelimit.refill(0.0, 3600.0, 2.5) == 1.0
    assert ratelimit.refill(0.5, 10.0, 2.5) == 1.0
    # A clock that steps backwards never drains the bucket.
    assert ratelimit.refill(0.5, -5.0, 2.5) == 0.5


def test_refill_at_2000_qps():
    assert ratelimit.refill(0.0, 0.05, 2000) == pytest.approx(100.0)
    assert ratelimit.refill(0.0, 10.0, 2000) == 200.0
    assert ratelimit.refill(150.0, 1.0, 2000) == 200.0


def test_refill_at_1e300_qps_does_not_overflow():
    for tokens, elapsed in [(0.0, 1e-9), (0.0, 1.0), (0.0, 1e300), (255.5, 1.7e9)]:
        refilled = ratelimit.refill(tokens, elapsed, 1e300)
        assert refilled == 256.0
        assert not math.isnan(refilled)
    assert ratelimit.grantable(ratelimit.refill(0.0, 1e300, 1e300), 1000) == 256


def test_grantable():
    assert ratelimit.grantable(0.0, 10) == 0
    assert ratelimit.grantable(0.5, 10) == 0
    assert ratelimit.grantable(1.0, 10) == 1
    assert ratelimit.grantable(200.0, 256) == 200
    assert ratelimit.grantable(256.0, 300) == 256
    assert ratelimit.grantable(3.7, 2) == 2
    assert ratelimit.grantable(5.0, 0) == 0
    # A float refill a hair under a whole token counts as that token.
    assert ratelimit.grantable(0.9999999999, 1) == 1


@pytest.mark.parametrize("tokens, qps, expected", [
    (0.0, 2.5, 400),      # empty bucket: 1 token / 2.5 qps
    (0.5, 2.5, 200),
    (0.25, 2.5, 300),
    (0.9, 2.5, 40),
    (0.0, 2000, 1),       # 0.5 ms rounds up to 1 ms
    (0.0, 1000, 1),
    (0.0, 1, 1000),
    (0.0, 1e300, 1),      # never 0, never NaN
    (0.9999999999, 2.5, 1),
])
def test_retry_after_ms(tokens, qps, expected):
    result = ratelimit.retry_after_ms(tokens, qps)
    assert isinstance(result, int)
    assert result == expected


# ------------------------------------------------------------------------ HTTP


def _rated_project(api, project_id, qps, n_jobs):
    api.put_project(project_id, dispatch_qps=qps)
    if n_jobs:
        assert body(api.enqueue(project_id, values(n_jobs)))["inserted"] == n_jobs


def test_2_5_qps_grants_one_job_then_429(client, admin_token):
    api = Api(client, admin_token)
    _rated_project(api, "slow", 2.5, 10)

    first = api.claim("slow", max_jobs=10)
    assert first.status_code == 200, body(first)
    assert len(body(first)["jobs"]) == 1

    second = api.claim("slow", max_jobs=10)
    assert second.status_code == 429, body(second)
    err = body(second)["error"]
    assert err["code"] == "project_dispatch_rate_limited"
    assert err["retryable"] is True
    assert isinstance(err["retry_after_ms"], int)
    assert 1 <= err["retry_after_ms"] <= 400
    assert set(err) == {"code", "message", "retryable", "retry_after_ms", "details"}
    assert second.headers["Retry-After"] == "1"
    assert second.headers["Cache-Control"] == API_CACHE_CONTROL
    # Nothing was handed out by the refused claim.
    assert api.counts("slow")["wip"] == 1
    assert api.counts("slow")["todo"] == 9


def test_empty_queue_with_empty_bucket_is_200_not_429(client, admin_token):
    api = Api(client, admin_token)
    _rated_project(api, "quiet", 2.5, 1)
    assert len(body(api.claim("quiet"))["jobs"]) == 1  # drains the one token and the queue
    again = api.claim("quiet")
    assert again.status_code == 200, body(again)
    assert body(again) == {"project_id": "quiet", "jobs": [], "retry_after_ms": 1000,
                           "policy_version": 1}


def test_fresh_rated_project_without_jobs_answers_empty(client, admin_token):
    api = Api(client, admin_token)
    _rated_project(api, "fresh", 2.5, 0)
    for _ in range(3):
        response = api.claim("fresh")
        assert response.status_code == 200, body(response)
        assert body(response)["jobs"] == []


def test_2000_qps_grants_a_burst_of_200(client, admin_token):
    api = Api(client, admin_token)
    _rated_project(api, "fast", 2000, 300)
    response = api.claim("fast", max_jobs=256)
    assert response.status_code == 200, body(response)
    assert len(body(response)["jobs"]) == 200


def test_absurd_qps_grants_a_burst_of_256(client, admin_token):
    api = Api(client, admin_token)
    _rated_project(api, "absurd", 1e300, 300)
    response = api.claim("absurd", max_jobs=256)
    assert response.status_code == 200, body(response)
    assert len(body(response)["jobs"]) == 256
    # The rest are still there for the next claim.
    assert api.counts("absurd")["todo"] == 44


def test_a_rate_limited_claim_says_when_the_next_token_is_due(client, admin_token):
    """As SavewebHQ: a claim that took the bucket's last token answers the
    wait until the next one in ``retry_after_ms``."""
    api = Api(client, admin_token)
    _rated_project(api, "paced", 2.5, 5)
    claim = body(api.claim("paced"))
    assert len(claim["jobs"]) == 1
    assert 1 <= claim["retry_after_ms"] <= 400


def test_paced_projects_keep_per_worker_claim_buckets(client, admin_token, app):
    """SavewebHQ's claim audit: one row per worker and minute on projects with
    worker_claim_qps, counting claims (refused ones too), jobs handed out and
    the policy version the worker reported; unpaced projects write nothing."""
    from app.extensions import db
    from app.projects import claim_audit
    api = Api(client, admin_token)
    api.put_project("paced", worker_claim_qps=2.0, dispatch_qps=1.0)
    api.put_project("free")
    assert body(api.enqueue("paced", values(3)))["inserted"] == 3
    assert body(api.enqueue("free", values(1)))["inserted"] == 1
    assert len(body(api.claim("paced", worker_id="a1", policy_version=1))["jobs"]) == 1
    assert api.claim("paced", worker_id="a1", policy_version=1).status_code == 429
    assert api.claim("paced", worker_id="b2").status_code == 429  # one bucket for the project
    assert body(api.claim("free", worker_id="a1"))["jobs"]
    rows = {(r[0], r[1]): r[2:] for r in sql(app, "SELECT project_id, worker_id, claim_requests, "
                                                  "jobs_dispatched, policy_version FROM worker_claim_buckets")}
    assert rows[("paced", "a1")] == (2, 1, 1)
    assert rows[("paced", "b2")][0] == 1 and rows[("paced", "b2")][2] is None
    assert ("free", "a1") not in rows
    sql(app, "UPDATE worker_claim_buckets SET bucket_started_at = now() - interval '31 days' "
             "WHERE worker_id = 'a1'")
    with app.app_context():
        assert claim_audit.prune(30) == 1
        assert [b["worker_id"] for b in claim_audit.buckets("paced")] == ["b2"]
        db.session.remove()
