"""The fleet's politeness with real workers (issue "Polite at fleet scale"):
worker processes fetching from the test publisher, which records every
request it receives."""
from __future__ import annotations

import time

from tests.worker_harness import (archiver, fleet, master, publisher, sql,  # noqa: F401
                                  wait_for)


def _pause(fleet):
    rows = sql(fleet.app, "SELECT extract(epoch FROM created_at) AS at, extract(epoch FROM until - now()) AS left, "
                          "reason FROM site_pauses WHERE site = 'slowpub'")
    return rows[0] if rows else None


def _slow_jobs(fleet):
    return sql(fleet.app, "SELECT state, resets, last_error FROM jobs WHERE site_key = 'slowpub'")


def test_a_429_pauses_its_site_for_every_worker_and_the_rest_of_the_queue_goes_on(fleet, publisher):
    url = publisher.url
    project = fleet.project(max_resets=0)       # a charged reset would end a job at once
    specs = [{"value": f"{url}/throttled/{n}?after=600", "attr": {"fleethq_site": "slowpub"}}
             for n in range(1, 9)]
    specs += [{"value": f"{url}/papers/{n}.pdf", "attr": {"fleethq_site": "fastpub"}} for n in range(20, 26)]
    assert fleet.api.enqueue(project, specs).status_code == 200
    workers = [fleet.worker(project, FLEETHQ_NO_BROWSER="1") for _ in range(2)]
    wait_for(lambda: fleet.counts(project)["done"] == 6, 120,
             f"the other site's papers: {fleet.counts(project)}\n{workers[0].output()[-3000:]}")
    deadline = time.monotonic() + 30
    while not (pause := _pause(fleet)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pause, f"no pause: {_slow_jobs(fleet)}\n{workers[0].output()[-3000:]}"
    assert 590 < pause["left"] <= 600 and "HTTP 429" in pause["reason"]
    seen_at = time.time()

    def slow_attempts():
        return sql(fleet.app, "SELECT extract(epoch FROM a.created_at) AS at FROM attempts a "
                              "JOIN jobs j ON j.id = a.job_id WHERE j.site_key = 'slowpub'")
    before = slow_attempts()
    time.sleep(3)                               # the workers keep asking meanwhile
    attempts = slow_attempts()
    hits = [r for r in publisher.requests if r["path"].startswith("/throttled/")]
    # Only attempts claimed before the pause was in force ever reached the
    # site, one request each; none since.
    assert attempts == before and all(a["at"] <= seen_at for a in attempts), (attempts, seen_at)
    assert len(hits) == len(attempts) <= 4      # at most one per fetch slot (2 workers x 2)
    assert all(h["at"] <= seen_at for h in hits)
    jobs = sql(fleet.app, "SELECT state, resets FROM jobs WHERE site_key = 'slowpub'")
    assert {(j["state"], j["resets"]) for j in jobs} == {("todo", 0)}   # back, no reset charged
    for worker in workers:
        assert worker.terminate() == 0


def test_a_worker_serving_two_projects_takes_jobs_by_their_share_weights(fleet, publisher):
    url = publisher.url
    heavy, light = fleet.project(share_weight=3), fleet.project(share_weight=1)
    # Both queues deeper than the worker gets through: the light one first
    # and just as deep, so without weights it would take half.
    fleet.enqueue(light, [f"{url}/papers/{n}.pdf" for n in range(300, 380)])
    fleet.enqueue(heavy, [f"{url}/papers/{n}.pdf" for n in range(400, 480)])
    worker = fleet.worker([light, heavy], FLEETHQ_NO_BROWSER="1")

    def first_claims():
        rows = sql(fleet.app, "SELECT j.project_id FROM attempts a JOIN jobs j ON j.id = a.job_id "
                              "WHERE j.project_id IN (:h, :l) ORDER BY a.id", h=heavy, l=light)
        return rows[:80] if len(rows) >= 80 else None
    first = wait_for(first_claims, 180,
                     f"80 claims: {fleet.counts(heavy)} {fleet.counts(light)}\n{worker.output()[-3000:]}")
    # 3:1 is a share of 0.75; without weights it would be 0.5. Eighty claims
    # keep the spread well inside these bounds (forty once gave 0.625).
    heavy_share = sum(1 for row in first if row["project_id"] == heavy) / len(first)
    assert 0.62 <= heavy_share <= 0.88, (heavy_share, worker.output()[-3000:])
    assert worker.terminate() == 0


def _peak_overlap(requests: list[dict]) -> int:
    """The most requests the publisher was answering at one moment."""
    edges = sorted([(r["at"], 1) for r in requests] + [(r["done"], -1) for r in requests])
    peak = now = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def test_site_limits_hold_across_worker_processes_as_the_publisher_counts(fleet, publisher):
    url = publisher.url
    project = fleet.project()
    for site, rule in (("slowpub", {"max_in_flight": 2}), ("ratepub", {"max_starts_per_s": 2})):
        response = fleet.api.call("PUT", f"/api/v1/fleethq/sites/{site}/limit", rule)
        assert response.status_code == 200, response.json
    specs = [{"value": f"{url}/slow/{n}?delay=1", "attr": {"fleethq_site": "slowpub"}} for n in range(50, 62)]
    specs += [{"value": f"{url}/papers/{n}.pdf", "attr": {"fleethq_site": "ratepub"}} for n in range(70, 80)]
    assert fleet.api.enqueue(project, specs).status_code == 200
    # Nine fetch slots over three processes: without the rules the slow site
    # would see up to nine requests at once.
    workers = [fleet.worker(project, FLEETHQ_NO_BROWSER="1", FLEETHQ_CONCURRENCY="3") for _ in range(3)]
    fleet.wait_settled(project, len(specs), timeout=120, proc=workers[0])
    assert fleet.counts(project)["done"] == len(specs)
    slow = [r for r in publisher.requests if r["path"].startswith("/slow/") and "done" in r]
    rated = sorted(r["at"] for r in publisher.requests if r["path"].startswith("/papers/7"))
    assert len(slow) == 12 and len(rated) == 10
    assert _peak_overlap(slow) == 2, sorted((r["at"], r["done"]) for r in slow)
    # Two starts a second (a bucket of one): ten starts take at least 4.5 s;
    # allow the fetch's own jitter of a few tenths.
    assert rated[-1] - rated[0] >= 4.0, rated
    assert max(sum(1 for t in rated if start <= t < start + 1.0) for start in rated) <= 3, rated
    for worker in workers:
        assert worker.terminate() == 0
