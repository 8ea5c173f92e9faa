"""Back-pressure the fleet obeys (issue "Polite at fleet scale" §3): a site
that pushes back (429/503, a bot check) is paused for every worker until the
time it named, growing on repeats and capped; the job goes back without
losing a reset; the pages and /metrics show the pause."""
from __future__ import annotations

import pytest

from app.sites import pushback
from tests.helpers import body, sql
from tests.support.cli import cli, cli_json


@pytest.fixture
def queue(api):
    api.put_project("crawl", identity_mode="none", max_resets=1)
    specs = [{"value": f"https://www.{site}/{i}"} for site in ("slow.example", "calm.example")
             for i in range(3)]
    assert api.enqueue("crawl", specs).status_code == 200
    return api


def _throttled(job, retry_after=None, code="throttled"):
    details = {"http_status": 429, **({"retry_after_s": retry_after} if retry_after is not None else {})}
    return {"job_id": job["job_id"], "attempt_id": job["attempt_id"], "retryable": True,
            "error": {"code": code, "message": "https://www.slow.example/1 is rate limiting us (HTTP 429)",
                      "details": details}}


def _fail(api, items):
    answer = api.call("POST", "/api/v1/projects/crawl/jobs/fail", {"worker_id": "w1", "items": items})
    assert answer.status_code == 200, body(answer)
    return body(answer)["results"]


def _pause(app, site):
    rows = sql(app, "SELECT extract(epoch FROM until - now()), strikes, reason, source FROM site_pauses "
                    "WHERE site = :s", s=site)
    return rows[0] if rows else None


def test_a_429_pauses_the_site_for_every_worker_and_the_job_keeps_its_resets(queue, app):
    jobs = body(queue.claim("crawl", max_jobs=6))["jobs"]
    slow = [j for j in jobs if "slow" in j["value"]]
    queue.fail("crawl", [j for j in jobs if "slow" not in j["value"]])  # back to the queue
    results = _fail(queue, [_throttled(slow[0], retry_after=300)])
    assert results[0]["status"] == "applied" and results[0]["job_status"] == "todo"
    left, strikes, reason, source = _pause(app, "slow.example")
    assert 295 < left <= 300 and strikes == 1                   # what the site asked, not the base
    assert reason.startswith("throttled: ") and source == "worker w1"
    (resets, state), = sql(app, "SELECT resets, state FROM jobs WHERE id = :i", i=slow[0]["job_id"])
    assert (resets, state) == (0, "todo")                       # no reset charged
    # The two other attempts of the site were started before the pause: their
    # reports add no strike, and the job is still not charged.
    _fail(queue, [_throttled(j) for j in slow[1:]])
    assert _pause(app, "slow.example")[1] == 1
    # Another worker asks: nothing of the paused site, the rest of the queue.
    again = body(queue.claim("crawl", worker_id="w2", max_jobs=10))["jobs"]
    assert again and all("calm.example" in j["value"] for j in again)
    # The pages and the metrics say so.
    listed = cli_json(cli(app, "fleet", "sites", "list"))
    assert [p["site"] for p in listed["pauses"]] == ["slow.example"]
    metrics = queue.client.get("/metrics").get_data(as_text=True)
    assert 'fleethq_site_paused_seconds{site="slow.example"}' in metrics


def test_repeats_grow_the_pause_up_to_its_cap(queue, app):
    jobs = body(queue.claim("crawl", max_jobs=6))["jobs"]
    slow = [j for j in jobs if "slow" in j["value"]]
    _fail(queue, [_throttled(slow[0])])
    assert pushback.BASE_PAUSE_S - 5 < _pause(app, "slow.example")[0] <= pushback.BASE_PAUSE_S
    sql(app, "UPDATE site_pauses SET until = now() - interval '1 second'")  # it ran out; the site
    _fail(queue, [_throttled(slow[1], code="challenge")])                     # pushes back again
    left, strikes, *_ = _pause(app, "slow.example")
    assert strikes == 2 and pushback.BASE_PAUSE_S * 2 - 5 < left <= pushback.BASE_PAUSE_S * 2
    assert pushback.pause_seconds(30, None) == pushback.MAX_PAUSE_S
    assert pushback.pause_seconds(1, 10 ** 8) == pushback.MAX_PAUSE_S
    # A pushback long after the last pause starts from the base again.
    sql(app, "UPDATE site_pauses SET until = now() - interval '2 hours'")
    _fail(queue, [_throttled(slow[2])])
    assert _pause(app, "slow.example")[1] == 1


def test_the_pause_is_on_the_group_and_an_operators_longer_pause_stays(api, app):
    api.put_project("crawl", identity_mode="none")
    api.enqueue("crawl", [{"value": "https://www.sciencedirect.com/a"}, {"value": "https://www.elsevier.com/b"}])
    cli_json(cli(app, "fleet", "sites", "group", "elsevier", "sciencedirect.com", "elsevier.com"))
    jobs = body(api.claim("crawl", max_jobs=1))["jobs"]
    cli_json(cli(app, "fleet", "sites", "pause", "elsevier", "--seconds", "7200", "--reason", "by hand"))
    _fail(api, [_throttled(jobs[0])])
    left, _, reason, source = _pause(app, "elsevier")
    assert left > 7000 and reason == "by hand" and source == "operator"
    assert _pause(app, "sciencedirect.com") is None


def test_other_failures_still_charge_a_reset(queue, app):
    job = body(queue.claim("crawl", max_jobs=1))["jobs"][0]
    queue.fail("crawl", [job], code="network")
    (resets,), = sql(app, "SELECT resets FROM jobs WHERE id = :i", i=job["job_id"])
    assert resets == 1 and _pause(app, "slow.example") is None
