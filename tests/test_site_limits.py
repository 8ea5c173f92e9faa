"""Fleet-wide limits per site (issue "Polite at fleet scale" §2, and the
operator's pause of §3): a claim passes over the jobs of a site at its
limit or paused and hands out the others, in the statement that leases; a
limit holds under concurrent claims from many workers."""
from __future__ import annotations

import re
import threading
import time
from collections import Counter

import pytest
import requests

from tests.helpers import Api, body, sql
from tests.support.cli import assert_cli_error, cli, cli_json
from tests.support.jobs import run_threads


def _enqueue(api, project, sites: dict[str, int], *, kind="generic"):
    """``sites``: site -> number of jobs, in that order (the queue's head first)."""
    specs = [{"value": f"https://www.{site}/{i}"} for site, n in sites.items() for i in range(n)]
    assert api.enqueue(project, specs).status_code == 200


def _claimed_sites(jobs) -> Counter:
    return Counter(j["value"].split("/")[2].removeprefix("www.") for j in jobs)


def _claim(api, project, n, worker="w1"):
    response = api.claim(project, worker_id=worker, max_jobs=n)
    assert response.status_code == 200, body(response)
    return body(response)["jobs"]


@pytest.fixture
def queue(api):
    # prefer_new_worker and a worker cap: the claim's fullest shape (as pdf projects)
    api.put_project("crawl", identity_mode="none", max_jobs_per_claim=100, prefer_new_worker=True,
                    max_worker_attempts=3)
    return api


def test_a_site_at_its_limit_is_passed_over_and_the_rest_of_the_queue_goes_on(queue, app):
    # The queue's head is 100 jobs of one site: a limit of 2 must not keep
    # the claim from the other site's jobs behind them.
    _enqueue(queue, "crawl", {"slow.example": 100, "other.example": 5})
    cli_json(cli(app, "fleet", "sites", "limit", "slow.example", "--max-in-flight", "2"))
    first = _claim(queue, "crawl", 10)
    assert _claimed_sites(first) == {"slow.example": 2, "other.example": 5}
    assert _claimed_sites(_claim(queue, "crawl", 10)) == {}
    # A finished attempt frees its slot.
    done = [j for j in first if "slow" in j["value"]][:1]
    assert queue.complete("crawl", done).status_code == 200
    assert _claimed_sites(_claim(queue, "crawl", 10)) == {"slow.example": 1}


def test_starts_per_second_and_a_limit_of_zero(queue, app):
    _enqueue(queue, "crawl", {"a.example": 5, "b.example": 5})
    cli_json(cli(app, "fleet", "sites", "limit", "a.example", "--max-starts-per-s", "0.5"))
    cli_json(cli(app, "fleet", "sites", "limit", "b.example", "--max-in-flight", "0"))
    assert _claimed_sites(_claim(queue, "crawl", 10)) == {"a.example": 1}
    assert _claimed_sites(_claim(queue, "crawl", 10)) == {}       # the bucket is empty
    time.sleep(2.1)
    assert _claimed_sites(_claim(queue, "crawl", 10)) == {"a.example": 1}
    cli_json(cli(app, "fleet", "sites", "unlimit", "b.example"))
    assert _claimed_sites(_claim(queue, "crawl", 10)) == {"b.example": 5}


def test_a_group_is_one_site_and_a_project_rule_replaces_the_fleet_wide_one(api, app):
    for project in ("p1", "p2"):
        api.put_project(project, identity_mode="none")
    _enqueue(api, "p1", {"sciencedirect.com": 3, "elsevier.com": 3})
    _enqueue(api, "p2", {"sciencedirect.com": 3, "elsevier.com": 3})
    grouped = cli_json(cli(app, "fleet", "sites", "group", "Elsevier", "sciencedirect.com", "elsevier.com"))
    assert grouped == {"site": "elsevier", "keys": ["elsevier.com", "sciencedirect.com"]}
    cli_json(cli(app, "fleet", "sites", "limit", "elsevier", "--max-in-flight", "2"))
    cli_json(cli(app, "fleet", "sites", "limit", "elsevier", "--project", "p2", "--max-in-flight", "3"))
    assert sum(_claimed_sites(_claim(api, "p1", 10)).values()) == 2     # both domains count as one
    assert sum(_claimed_sites(_claim(api, "p2", 10)).values()) == 3     # its own rule, its own count
    # The fleet-wide rule counts every project's attempts: p1 gets no more.
    assert _claim(api, "p1", 10) == []
    listed = cli_json(cli(app, "fleet", "sites", "list"))
    rules = {(r["site"], r["project_id"]): r for r in listed["limits"]}
    assert rules[("elsevier", None)]["in_flight"] == 5
    assert rules[("elsevier", "p2")]["in_flight"] == 3
    assert listed["groups"] == [{"site": "elsevier", "keys": ["elsevier.com", "sciencedirect.com"]}]
    # A grouped key has no rule of its own.
    assert_cli_error(cli(app, "fleet", "sites", "limit", "elsevier.com", "--max-in-flight", "1"),
                     "site_in_group")


def test_an_operator_pauses_and_resumes_a_site_for_every_project(api, app):
    for project in ("p1", "p2"):
        api.put_project(project, identity_mode="none")
        _enqueue(api, project, {"busy.example": 2, "calm.example": 2})
    paused = cli_json(cli(app, "fleet", "sites", "pause", "busy.example", "--seconds", "600",
                          "--reason", "asked us to slow down"))
    assert paused["reason"] == "asked us to slow down" and paused["paused_until"] > time.time() + 590
    for project in ("p1", "p2"):
        assert _claimed_sites(_claim(api, project, 10)) == {"calm.example": 2}
    assert cli_json(cli(app, "fleet", "sites", "list"))["pauses"][0]["site"] == "busy.example"
    cli_json(cli(app, "fleet", "sites", "resume", "busy.example"))
    assert _claimed_sites(_claim(api, "p1", 10)) == {"busy.example": 2}
    actions = [a for (a,) in sql(app, "SELECT action FROM audit_log WHERE object_kind = 'site' ORDER BY id")]
    assert actions == ["sites.pause", "sites.resume"]


def test_bad_rules_are_refused_clearly(api, app):
    assert_cli_error(cli(app, "fleet", "sites", "limit", "a b", "--max-in-flight", "1"), "invalid_request")
    assert_cli_error(cli(app, "fleet", "sites", "limit", "a.example"), "invalid_request")
    assert_cli_error(cli(app, "fleet", "sites", "limit", "a.example", "--max-starts-per-s", "0"),
                     "invalid_request")
    assert_cli_error(cli(app, "fleet", "sites", "limit", "a.example", "--max-in-flight", "1",
                         "--project", "nope"), "not_found")
    assert_cli_error(cli(app, "fleet", "sites", "unlimit", "a.example"), "not_found")
    assert_cli_error(cli(app, "fleet", "sites", "pause", "a.example", "--seconds", "0", "--reason", "x"),
                     "invalid_request")
    assert_cli_error(cli(app, "fleet", "sites", "resume", "a.example"), "not_found")
    assert sql(app, "SELECT count(*) FROM site_limits")[0][0] == 0


def test_no_rule_no_cost_the_claim_reads_no_site_table(queue, app):
    """Without rules or pauses the claim is the plain statement (the flag on
    the project view says so) and every job goes."""
    _enqueue(queue, "crawl", {"a.example": 30})
    assert len(_claim(queue, "crawl", 50)) == 30
    from app.extensions import db
    from app.projects import service
    with app.app_context():
        assert service.view("crawl").site_rules is False
        cli_json(cli(app, "fleet", "sites", "limit", "a.example", "--max-in-flight", "1"))
        assert service.view("crawl").site_rules is True
        db.session.remove()


def test_the_limit_holds_under_concurrent_claims_from_many_workers(app, live_server, admin_token):
    """Twelve workers claim, work a little and complete, concurrently; a
    watcher samples the site's attempts in flight all along."""
    limit, workers = 3, 12
    admin = Api(requests.Session(), admin_token, base=live_server.url)
    admin.put_project("race", identity_mode="none", max_jobs_per_claim=4)
    _enqueue(admin, "race", {"hot.example": 300, "cold.example": 100})
    cli_json(cli(app, "fleet", "sites", "limit", "hot.example", "--max-in-flight", str(limit)))
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            (n,), = sql(app, "SELECT count(*) FROM jobs WHERE project_id = 'race' AND state = 'wip' "
                             "AND site_key = 'hot.example'")
            seen.append(n)

    def work(index):
        def run():
            api = Api(requests.Session(), admin_token, base=live_server.url)
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                jobs = body(api.claim("race", worker_id=f"w{index}", max_jobs=4))["jobs"]
                if not jobs:
                    time.sleep(0.02)
                    continue
                time.sleep(0.01)
                assert api.complete("race", jobs, worker_id=f"w{index}").status_code == 200
        return run

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run_threads([work(i) for i in range(workers)])
    finally:
        stop.set()
        watcher.join(timeout=10)
    done = dict(sql(app, "SELECT site_key, count(*) FROM jobs WHERE project_id = 'race' AND state = 'done' "
                         "GROUP BY site_key"))
    assert max(seen) <= limit, max(seen)
    assert max(seen) == limit           # the limit was reached: the watcher was not blind
    assert done.get("hot.example", 0) > 20 and done.get("cold.example") == 100


# ------------------------------------------------------------------ the API

def test_the_api_keeps_limits_groups_and_pauses(api, app):
    api.put_project("crawl", identity_mode="none")
    put = api.call("PUT", "/api/v1/fleethq/sites/Example.org/limit", {"max_in_flight": 2, "reason": "fragile"})
    assert put.status_code == 200, body(put)
    assert body(put) == {"site": "example.org", "project_id": None, "max_in_flight": 2, "max_starts_per_s": None}
    put = api.call("PUT", "/api/v1/fleethq/projects/crawl/sites/example.org/limit", {"max_starts_per_s": 0.5})
    assert body(put)["project_id"] == "crawl"
    listed = body(api.call("GET", "/api/v1/fleethq/sites"))
    assert [(r["site"], r["project_id"], r["in_flight"]) for r in listed["limits"]] == [
        ("example.org", None, 0), ("example.org", "crawl", 0)]
    assert api.call("DELETE", "/api/v1/fleethq/projects/crawl/sites/example.org/limit").status_code == 204
    assert api.call("DELETE", "/api/v1/fleethq/projects/crawl/sites/example.org/limit").status_code == 404
    grouped = api.call("PUT", "/api/v1/fleethq/sites/elsevier/group", {"keys": ["10.1016", "sciencedirect.com"]})
    assert body(grouped) == {"site": "elsevier", "keys": ["10.1016", "sciencedirect.com"]}
    member = api.call("PUT", "/api/v1/fleethq/sites/10.1016/limit", {"max_in_flight": 1})
    assert member.status_code == 409 and body(member)["error"]["code"] == "site_in_group"
    paused = api.call("PUT", "/api/v1/fleethq/sites/elsevier/pause", {"seconds": 120, "reason": "429 storm"})
    assert paused.status_code == 200 and body(paused)["reason"] == "429 storm"
    assert body(api.call("GET", "/api/v1/fleethq/sites"))["pauses"][0]["site"] == "elsevier"
    assert api.call("DELETE", "/api/v1/fleethq/sites/elsevier/pause").status_code == 204
    assert api.call("DELETE", "/api/v1/fleethq/sites/elsevier/pause").status_code == 404
    audited = [a for (a,) in sql(app, "SELECT action FROM audit_log WHERE object_kind = 'site' ORDER BY id")]
    assert audited == ["sites.limit", "sites.limit", "sites.unlimit", "sites.group", "sites.pause",
                       "sites.resume"]


@pytest.mark.parametrize("path, payload, field", [
    ("/api/v1/fleethq/sites/example.org/limit", {"max_in_flight": -1}, "max_in_flight"),
    ("/api/v1/fleethq/sites/example.org/limit", {"max_starts_per_s": 0}, "max_starts_per_s"),
    ("/api/v1/fleethq/sites/example.org/limit", {}, "max_in_flight"),
    ("/api/v1/fleethq/sites/example.org/limit", {"max_in_flight": 1, "extra": 1}, "extra"),
    ("/api/v1/fleethq/sites/a%20b/limit", {"max_in_flight": 1}, "site"),
    ("/api/v1/fleethq/sites/example.org/pause", {"seconds": 0, "reason": "x"}, "seconds"),
    ("/api/v1/fleethq/sites/example.org/pause", {"seconds": 60}, "reason"),
    ("/api/v1/fleethq/sites/g/group", {"keys": ["ok.example", "not a key"]}, "keys"),
])
def test_the_api_refuses_bad_rules_in_the_envelope(api, app, path, payload, field):
    answer = api.call("PUT", path, payload)
    assert answer.status_code == 400, body(answer)
    error = body(answer)["error"]
    assert error["code"] == "invalid_request" and field in (error["details"].get("field") or "") + error["message"]
    assert sql(app, "SELECT count(*) FROM site_limits")[0][0] == 0


def test_the_api_is_for_admins(make_user, client):
    worker_api = Api(client, make_user("volunteer", ["worker"]))
    answer = worker_api.call("PUT", "/api/v1/fleethq/sites/example.org/limit", {"max_in_flight": 1})
    assert answer.status_code == 403


# ----------------------------------------------------------------- the page

def test_the_sites_page_limits_pauses_and_groups(pages, api, app):
    api.put_project("crawl", identity_mode="none")
    message, page = pages.act("/admin/sites/limit", {"site": "example.org", "project_id": "",
                                                     "max_in_flight": "2", "max_starts_per_s": ""})
    assert message == "example.org is limited."
    assert re.search(r'<tr id="site-example.org"><td>example.org</td><td>every project</td>\s*'
                     r'<td class="num">0</td><td class="num">2</td>', page)
    message, page = pages.act("/admin/sites/pause", {"site": "example.org", "minutes": "30",
                                                     "reason": "asked us to slow down"})
    assert "paused for every worker" in message and "asked us to slow down" in page
    message, page = pages.act("/admin/sites/resume", {"site": "example.org"})
    assert "No site is paused" in page
    message, page = pages.act("/admin/sites/group", {"site": "elsevier", "keys": "10.1016, sciencedirect.com"})
    assert message == "elsevier now groups 2 keys." and "10.1016, sciencedirect.com" in page
    message, _ = pages.act("/admin/sites/limit", {"site": "example.org", "max_in_flight": "lots"},
                           expect="error")
    assert "max_in_flight must be a number" in message
    message, _ = pages.act("/admin/sites/unlimit", {"site": "example.org"})
    assert message == "The limit on example.org is removed."
    zh = pages.text("/zh/admin/sites")
    assert "站点" in zh and "暂停" in zh
