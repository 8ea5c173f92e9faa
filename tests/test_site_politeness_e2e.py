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
    fleet.enqueue(light, [f"{url}/papers/{n}.pdf" for n in range(300, 340)])
    fleet.enqueue(heavy, [f"{url}/papers/{n}.pdf" for n in range(400, 440)])
    worker = fleet.worker([light, heavy], FLEETHQ_NO_BROWSER="1")

    def first_claims():
        rows = sql(fleet.app, "SELECT j.project_id FROM attempts a JOIN jobs j ON j.id = a.job_id "
                              "WHERE j.project_id IN (:h, :l) ORDER BY a.id", h=heavy, l=light)
        return rows[:40] if len(rows) >= 40 else None
    first = wait_for(first_claims, 120,
                     f"40 claims: {fleet.counts(heavy)} {fleet.counts(light)}\n{worker.output()[-3000:]}")
    heavy_share = sum(1 for row in first if row["project_id"] == heavy) / len(first)
    assert 0.65 <= heavy_share <= 0.85, (heavy_share, worker.output()[-3000:])
    assert worker.terminate() == 0
