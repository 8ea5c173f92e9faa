"""Find any job and act on a whole filter (issue "Pages an operator lives in"
§4): search by id, external id, value prefix, attribute and error text,
filters, paging; bulk requeue and delete of every matching job with a count
first, a confirmation, background batches with progress, and the audit log."""
from __future__ import annotations

import re

import pytest

from tests.helpers import body, sql
from tests.support.pages import Pages, sign_in


@pytest.fixture
def pages(app, client):
    sign_in(app, client)
    return Pages(client, "page-admin")


def _found(page: str) -> list[int]:
    section = page.split('id="job-search-results"', 1)[-1]
    return [int(n) for n in re.findall(r'<td class="num"><a href="/admin/jobs/(\d+)">', section)]


def _jobs(api, project="lib", n=6):
    api.put_project(project, max_resets=0)
    specs = [{"id": f"doc-{i}", "value": f"https://example.org/{'ab_c' if i % 2 else 'xyz'}/{i}",
              "type": "asset" if i == 5 else "seed", "attr": {"pages": i, "lang": "pl" if i < 3 else "en"}}
             for i in range(n)]
    assert api.enqueue(project, specs).status_code == 200
    ids = {spec["id"]: int(job_id) for spec, (job_id,) in zip(
        specs, sql(api.client.application, "SELECT id FROM jobs WHERE project_id = :p ORDER BY id", p=project))}
    return ids


def test_search_finds_by_id_external_id_value_prefix_attribute_and_error(pages, api, app):
    ids = _jobs(api)
    claimed = body(api.claim("lib", max_jobs=2))["jobs"]
    api.fail("lib", claimed[:1], retryable=False, code="http_451")
    failed = int(claimed[0]["job_id"])
    base = "/admin/projects/lib/jobs/search"
    assert _found(pages.text(f"{base}?q={ids['doc-3']}")) == [ids["doc-3"]]          # job id
    assert _found(pages.text(f"{base}?q=doc-4")) == [ids["doc-4"]]                     # external id
    assert _found(pages.text(f"{base}?q=https://example.org/xyz/")) == [
        ids["doc-4"], ids["doc-2"], ids["doc-0"]]                                      # value prefix, newest first
    # LIKE's wildcards are literal: "ab_c" must not match "abXc".
    assert len(_found(pages.text(f"{base}?value_prefix=https://example.org/ab_c/"))) == 3
    assert _found(pages.text(f"{base}?value_prefix=https://example.org/abXc/")) == []
    assert _found(pages.text(f"{base}?q=attr:pages=3")) == [ids["doc-3"]]              # a number
    assert _found(pages.text(f'{base}?q=attr:pages="3"')) == []                        # not the string
    assert sorted(_found(pages.text(f"{base}?q=attr:lang=pl"))) == sorted(
        ids[f"doc-{i}"] for i in range(3))
    assert _found(pages.text(f"{base}?q=error:boo")) == [failed]                       # message "boom"
    assert _found(pages.text(f"{base}?error_code=http_451")) == [failed]
    assert _found(pages.text(f"{base}?type=asset")) == [ids["doc-5"]]
    assert _found(pages.text(f"{base}?state=wip")) == [int(claimed[1]["job_id"])]
    assert _found(pages.text(f"{base}?worker_id=w1&state=wip")) == [int(claimed[1]["job_id"])]
    assert len(_found(pages.text(f"{base}?created_after=2000-01-01"))) == 6
    assert _found(pages.text(f"{base}?created_before=2000-01-01")) == []
    for bad, said in (("q=attr:pages", "attr:key=value"), ("q=error:ab", "at least 3"),
                      ("q=" + "x" * 257, "limited to 256 characters"),
                      ("state=lost", "unknown job state"), ("created_after=yesterday", "created_after")):
        response = pages.get(f"{base}?{bad}")
        assert response.status_code == 400 and said in response.get_data(as_text=True), bad
    assert pages.get("/admin/projects/none/jobs/search").status_code == 404


def test_search_pages_newest_first(pages, api):
    api.put_project("many")
    api.enqueue("many", [{"id": f"m{i}", "value": f"v{i}"} for i in range(120)])
    first = pages.text("/admin/projects/many/jobs/search?value_prefix=v")
    assert len(_found(first)) == 50
    older = re.search(r'href="([^"]+)" id="older-jobs"', first).group(1).replace("&amp;", "&")
    second = pages.text(older)
    assert len(_found(second)) == 50 and max(_found(second)) < min(_found(first))
    assert "value_prefix=v" in older


def test_bulk_requeue_of_a_filter_counts_first_then_runs_in_batches(pages, api, app, hints):
    api.put_project("big", max_resets=0)
    api.enqueue("big", [{"id": f"b{i}", "value": f"https://example.org/{i}"} for i in range(30)])
    jobs = body(api.claim("big", max_jobs=30))["jobs"]
    api.fail("big", jobs[:25], retryable=False, code="http_503")
    api.complete("big", jobs[25:])
    search = pages.text("/admin/projects/big/jobs/search?error_code=http_503")
    confirm_url = re.search(r'id="bulk-requeue" href="([^"]+)"', search).group(1).replace("&amp;", "&")
    confirm = pages.text(confirm_url)
    assert re.search(r'id="bulk-count"><strong>25</strong> jobs match', confirm)
    form = {"action": "requeue", "error_code": "http_503"}
    message, _ = pages.act("/admin/projects/big/jobs/bulk-start", form, expect="error")
    assert "confirmation box" in message and sql(app, "SELECT count(*) FROM bulk_actions")[0][0] == 0
    started = pages.post("/admin/projects/big/jobs/bulk-start", {**form, "confirm": "yes",
                                                                 "reason": "publisher back up"})
    assert started.status_code == 303 and "/admin/projects/big/bulk/" in started.headers["Location"]
    (action_id, matched, state) = sql(app, "SELECT id, matched, state FROM bulk_actions")[0]
    assert (matched, state) == (25, "running")
    assert ("bulk_jobs", action_id) in hints
    (audited,) = sql(app, "SELECT details, reason FROM audit_log WHERE action = 'jobs.bulk_requeue'")
    assert audited[0]["matched"] == 25 and audited[1] == "publisher back up"

    from app.extensions import db
    from app.projects import bulk
    with app.app_context():
        # One batch per slice: the first hands over to a fresh message.
        assert bulk.run(action_id, slice_s=0, batch=10) == "more"
        db.session.remove()
    progress = pages.text(f"/admin/projects/big/bulk/{action_id}/live")
    assert "10 of 25 matching jobs looked at" in progress and "10 requeued" in progress
    with app.app_context():
        assert bulk.run(action_id, batch=10) == "done"
        assert bulk.run(action_id, batch=10) == "gone"  # a duplicate message does nothing
        db.session.remove()
    assert sql(app, "SELECT state, count(*) FROM jobs GROUP BY 1 ORDER BY 1") == [("done", 5), ("todo", 25)]
    assert sql(app, "SELECT processed, changed, skipped, state FROM bulk_actions")[0] == (25, 25, 0, "done")
    assert sql(app, "SELECT done_at IS NOT NULL FROM outbox WHERE topic = 'bulk_jobs'")[0][0] is True
    page = pages.text(f"/admin/projects/big/bulk/{action_id}")
    assert "badge-done" in page and "publisher back up" in page
    assert sql(app, "SELECT details FROM audit_log WHERE action = 'jobs.bulk_requeue_done'")[0][0][
        "changed"] == 25


def test_bulk_delete_needs_a_reason_skips_jobs_in_flight_and_can_be_stopped(pages, api, app):
    api.put_project("del")
    api.enqueue("del", [{"id": f"d{i}", "value": f"https://example.org/del/{i}"} for i in range(12)])
    body(api.claim("del", max_jobs=2))
    form = {"action": "delete", "value_prefix": "https://example.org/del/", "confirm": "yes"}
    message, _ = pages.act("/admin/projects/del/jobs/bulk-start", form, expect="error")
    assert "reason" in message
    pages.post("/admin/projects/del/jobs/bulk-start", {**form, "reason": "wrong list"})
    (action_id,) = sql(app, "SELECT id FROM bulk_actions")[0]
    from app.extensions import db
    from app.projects import bulk
    with app.app_context():
        assert bulk.run(action_id, slice_s=0, batch=5) == "more"
        db.session.remove()
    pages.act(f"/admin/projects/del/bulk/{action_id}/cancel", {})
    with app.app_context():
        assert bulk.run(action_id, batch=5) == "gone"  # stopped: nothing more happens
        db.session.remove()
    assert sql(app, "SELECT state, processed, changed, skipped FROM bulk_actions")[0] == ("cancelled", 5, 3, 2)
    assert sql(app, "SELECT count(*) FROM jobs")[0][0] == 9
    # A filterless bulk action is refused: it would touch every job.
    message, _ = pages.act("/admin/projects/del/jobs/bulk-start",
                           {"action": "delete", "confirm": "yes", "reason": "all"}, expect="error")
    assert "needs a filter" in message


@pytest.mark.parametrize("window", [2, 5, 2000])
def test_error_search_is_newest_first_whichever_way_it_is_answered(pages, api, app, monkeypatch, window):
    """A common error text is answered from the newest jobs of each state, a
    rare one from the trigram index: both give the newest matches in order."""
    from app.projects import job_search
    monkeypatch.setattr(job_search, "ERROR_PROBE_ROWS", window)
    api.put_project("errs", max_resets=1)
    api.enqueue("errs", [{"id": f"e{i}", "value": f"v{i}"} for i in range(14)])
    jobs = body(api.claim("errs", max_jobs=14))["jobs"]
    for n, job in enumerate(jobs):   # failed for good, or retryable (todo with an error)
        api.fail("errs", [job], retryable=n % 3 == 0, code="http_500" if n % 2 else "timeout")
    expected = [r[0] for r in sql(app, "SELECT id FROM jobs WHERE project_id = 'errs' AND "
                                       "last_error ->> 'message' ILIKE '%boom%' ORDER BY id DESC")]
    assert len(expected) == 14
    with app.app_context():
        from app.extensions import db
        seen, before = [], None
        while True:
            page = job_search.search("errs", job_search.JobFilter(q="error:boom"), before_id=before,
                                     limit=3)
            seen += [int(j["job_id"]) for j in page["jobs"]]
            before = page["next_before_id"]
            if before is None:
                break
        only_failed = job_search.search("errs", job_search.JobFilter(q="error:boom", state="failed"), limit=3)
        db.session.remove()
    assert seen == expected
    assert all(j["state"] == "failed" for j in only_failed["jobs"]) and len(only_failed["jobs"]) == 3


def test_error_filters_match_current_errors_only_and_a_bulk_stays_within_what_was_confirmed(
        pages, api, app):
    """A retried job that finished keeps its old error in last_error: error
    searches (and so bulk deletes of them) must not match it; and jobs that
    arrive after the confirmation are not touched."""
    api.put_project("stale", max_resets=3)
    api.enqueue("stale", [{"id": f"s{i}", "value": f"v{i}"} for i in range(3)])
    jobs = body(api.claim("stale", max_jobs=3))["jobs"]
    api.fail("stale", jobs, retryable=True, code="timeout")         # all back in the queue, with an error
    sql(app, "UPDATE jobs SET not_before = now() WHERE project_id = 'stale'")
    again = body(api.claim("stale", max_jobs=1))["jobs"]
    api.complete("stale", again)                                      # done, the old error kept
    done_id = int(again[0]["job_id"])
    assert sql(app, "SELECT last_error IS NOT NULL FROM jobs WHERE id = :j", j=done_id)[0][0]
    for query in ("q=error:boom", "error_code=timeout"):
        found = _found(pages.text(f"/admin/projects/stale/jobs/search?{query}"))
        assert done_id not in found and len(found) == 2, query
    # attr values JSON cannot carry are strings, not a server error.
    for odd in ("NaN", "Infinity", "1e999"):
        assert pages.get(f"/admin/projects/stale/jobs/search?q=attr:x={odd}").status_code == 200

    from app.extensions import db
    from app.projects import bulk
    from app.projects.job_search import JobFilter
    with app.app_context():
        action_id = bulk.start("stale", "delete", JobFilter(value_prefix="v"), actor="t", reason="r")
        db.session.remove()
    api.enqueue("stale", [{"id": "late", "value": "vlate"}])         # matches, but after the confirmation
    with app.app_context():
        assert bulk.run(action_id) == "done"
        db.session.remove()
    late_id = sql(app, "SELECT id FROM jobs WHERE ext_id = 'late'")[0][0]
    assert {r[0] for r in sql(app, "SELECT id FROM jobs WHERE project_id = 'stale'")} == {late_id}


def test_a_bulk_action_past_the_count_cap_reads_as_more_than(pages, api, app):
    """The search counts at most COUNT_CAP matches: an action over more jobs
    than that says "more than", never "150,000 of 100,000 (150 %)"."""
    from app.projects.job_search import COUNT_CAP
    api.put_project("huge")
    (action_id,) = sql(app, "INSERT INTO bulk_actions (project_id, action, filter, matched, through_job_id, "
                            "processed, changed, skipped, created_by) VALUES ('huge', 'requeue', "
                            "'{\"state\": \"failed\"}', :m, 1, :p, :p, 0, 'user:page-admin') RETURNING id",
                       m=COUNT_CAP, p=COUNT_CAP + 50_000)[0]
    progress = pages.text(f"/admin/projects/huge/bulk/{action_id}/live")
    assert "150,000 of more than 100,000 matching jobs looked at: 150,000 requeued, 0 skipped." in progress
    assert "%" not in progress.split('id="bulk-state"', 1)[1].split("</p>", 1)[0]
    assert '<progress aria-label="progress"></progress>' in progress      # activity, not a share



def test_search_says_how_many_jobs_match_when_it_costs_nothing_or_when_asked(pages, api, app):
    api.put_project("counted")
    api.enqueue("counted", [{"id": f"c{i}", "value": f"v{i}"} for i in range(120)]
                + [{"id": "w1", "value": "w1"}])

    def heading(query):
        page = pages.text(f"/admin/projects/counted/jobs/search?{query}")
        return page.split('id="match-count">', 1)[1].split("</h2>", 1)[0].strip()
    assert heading("value_prefix=w") == "1 job matches, newest first"        # one page: as shown
    assert heading("") == "121 jobs match, newest first"                     # every job: the counters
    assert heading("state=todo") == "121 jobs match, newest first"           # one state: the counters
    # Any other filter past one page is counted when asked: it may take a scan.
    unasked = heading("value_prefix=v")
    assert unasked.startswith("Matching jobs, newest first") and "count=1" in unasked
    assert heading("value_prefix=v&count=1") == "120 jobs match, newest first"
    zh = pages.text("/zh/admin/projects/counted/jobs/search?value_prefix=w")
    assert "1 个任务匹配" in zh.split('id="match-count">', 1)[1].split("</h2>", 1)[0]
