"""Workers that stop when they are the problem (issue "Polite at fleet scale"
§4): the verdict rules, and a real worker process whose DNS is gone."""
from __future__ import annotations

import time

from workers.runner import fitness
from workers.runner.fitness import Fitness
from tests.worker_harness import (archiver, fleet, master, publisher, sql,  # noqa: F401
                                  wait_for)

DNS = {"reason": "dns"}


def _dns(host):
    return {**DNS, "host": host}


def test_a_streak_from_several_servers_convicts_the_worker_and_the_pause_grows():
    now = [1000.0]
    fit = Fitness(clock=lambda: now[0])
    assert fit.failed("1", "network", _dns("a.example")) == (True, [])     # held, no verdict yet
    assert fit.failed("2", "not_found", {"http_status": 404}) == (False, [])   # the site answered
    assert fit.failed("3", "timeout", {"url": "https://b.example/x"}) == (True, [])
    hold, convicted = fit.failed("4", "network", _dns("c.example"))
    assert hold and convicted == ["1", "3", "4"]
    assert fit.paused().startswith(f"backing off {fitness.BACKOFF_FIRST_S:.0f} s: 3 fetches")
    assert fit.slots(4) == 4
    now[0] += fitness.BACKOFF_FIRST_S + 1
    assert fit.paused() is None and fit.slots(4) == 1                     # probing: one at a time
    assert fit.failed("5", "network", _dns("d.example"))[1] == ["5"]      # one more: convicted again
    assert fit.paused().startswith(f"backing off {2 * fitness.BACKOFF_FIRST_S:.0f} s")
    now[0] += 2 * fitness.BACKOFF_FIRST_S + 1
    fit.paused()
    assert fit.succeeded() == [] and fit.paused() is None and fit.slots(4) == 4


def test_one_dead_site_is_not_the_worker_and_a_success_releases_the_held_failures():
    fit = Fitness()
    for aid in ("1", "2", "3", "4"):
        assert fit.failed(aid, "network", _dns("down.example")) == (True, [])   # one server only
    assert fit.succeeded() == ["1", "2", "3", "4"]
    assert fit.paused() is None
    assert fit.failed("5", "network", {"reason": "connection", "blocked": True}) == (False, [])
    assert fit.failed("6", "disk", {}) == (True, ["6"])                   # a full disk: at once


def test_a_worker_without_dns_stops_claiming_and_its_jobs_keep_their_resets(fleet):
    project = fleet.project(max_resets=1)
    fleet.enqueue(project, [f"http://paper-{i}.invalid/{i}.pdf" for i in range(12)])
    worker = fleet.worker(project, FLEETHQ_NO_BROWSER="1")
    wait_for(lambda: "backs off for 30 s and stops claiming" in worker.output(), 60,
             "the worker to back off")
    wait_for(lambda: "reported worker_unfit" in worker.output(), 60, "the reports")
    time.sleep(3)                               # it keeps its pause: no claims meanwhile
    attempts = sql(fleet.app, "SELECT count(*) AS n FROM attempts WHERE project_id = :p", p=project)[0]["n"]
    assert attempts <= fitness.TRIP_STREAK + 1, worker.output()[-3000:]
    jobs = sql(fleet.app, "SELECT state, resets, last_error->>'code' AS code FROM jobs "
                          "WHERE project_id = :p AND attempts_count > 0", p=project)
    assert jobs and {(j["state"], j["resets"]) for j in jobs} == {("todo", 0)}, jobs
    assert {j["code"] for j in jobs} <= {"worker_unfit"}
    node = wait_for(lambda: (sql(fleet.app, "SELECT capacity, last_error FROM fleet_nodes "
                                            "WHERE last_error LIKE 'backing off%'") or [None])[0],
                    15, "the heartbeat saying so")
    assert node["capacity"] == 0 and "fetches in a row failed" in node["last_error"]
    assert worker.terminate() == 0
