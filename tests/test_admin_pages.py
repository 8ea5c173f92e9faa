"""Admin pages (DESIGN §10, issue 5) through the Flask test client, signed in
as an admin: every page and action, the 303 rhythm with flashed outcomes,
escaping of user data, cursor paging, enqueue (paste, JSON Lines, .zst),
fleet actions with confirmation, requeue, users, hooks, and the throughput
aggregates behind the dashboard."""
from __future__ import annotations

import html
import io
import re
from datetime import UTC, timedelta

import pytest

from tests.conftest import unique
from tests.fleet_helpers import Node
from tests.helpers import VERSION, Api, body, sql, values
from tests.support.pages import XSS, sign_in
from workers.wire.protocol import default_job_id
from workers.wire.source import write_source


def job_ids(page_html: str) -> list[int]:
    """The job links of a project page's job list (its #jobs section)."""
    listed = re.search(r'<section class="card" id="jobs">.*?</section>', page_html, re.S)
    return [int(i) for i in re.findall(r'href="/admin/jobs/(\d+)"', listed.group(0) if listed else page_html)]


# ------------------------------------------------------------------ access

def test_signed_out_is_sent_to_login_and_non_admins_get_403(app, client):
    response = client.get("/admin/projects")
    assert response.status_code == 302 and "/login" in response.headers["Location"]
    sign_in(app, client, "just-worker", roles=("worker",))
    assert client.get("/admin").status_code == 403
    assert client.get("/admin/workers").status_code == 403


def test_post_without_csrf_token_is_rejected(pages, api):
    api.put_project("p1")
    response = pages.client.post("/admin/projects/p1/status", data={"status": "draining"})
    assert response.status_code == 400
    assert api.call("GET", "/api/v1/admin/projects/p1").json["status"] == "active"


def test_machine_token_does_not_open_pages(client, admin_token):
    response = client.get("/admin", headers={"Authorization": f"Bearer {admin_token}"})
    assert response.status_code == 302


# ------------------------------------------------------------------ dashboard

def test_dashboard_shows_counts_throughput_workers_backlog_and_errors(app, client, pages, api):
    api.put_project("alpha", max_resets=0)
    assert api.enqueue("alpha", [{"id": f"a{i}", "value": f"https://example.org/{i}"}
                                 for i in range(5)]).status_code == 200
    claimed = body(api.claim("alpha", max_jobs=3))["jobs"]
    assert api.complete("alpha", claimed[:1]).status_code == 200
    assert api.fail("alpha", claimed[1:2], retryable=False, code="http_404").status_code == 200
    Node(client, app, name="pending-node", approve=False)
    page = pages.text("/admin")
    row = re.search(r'<a href="/admin/projects/alpha">alpha</a>.*?</tr>', page, re.S).group(0)
    cells = [int(c.replace(",", "")) for c in re.findall(r'<td class="num">([\d,]+)</td>', row)]
    # todo, wip, staged, done, failed, reset_exhausted, total, claims/h, done/h
    assert cells == [2, 1, 0, 1, 1, 0, 5, 3, 1]
    assert page.count("<svg") >= 3 and "last day" in page
    assert "Last hour: 3 claims" in page
    assert 'badge-pending">pending</span> 1' in page
    assert "http_404" in page  # recent errors
    assert "Staged uploads" in page and "Outbox rows not done" in page
    live = pages.text("/admin/live")
    assert "<html" not in live and 'id="throughput"' in live and "http_404" in live


def test_dashboard_warns_before_the_spool_is_full(pages, app, monkeypatch):
    from app.extensions import db
    from app.uploads import spool
    monkeypatch.setitem(app.config, "SPOOL_MAX_BYTES", 10 * 1024 * 1024)
    row = re.compile(r'<tr id="spool-fill">.*?</tr>', re.S)
    shown = row.search(pages.text("/admin")).group(0)
    assert "0.0 %" in shown and "nearly full" not in shown
    with app.app_context():
        spool.reserve(spool.Spool.from_config(app.config), 9 * 1024 * 1024)
        db.session.commit()
        db.session.remove()
    shown = row.search(pages.text("/admin/live")).group(0)
    assert "90.0 %" in shown and "nearly full" in shown and "507" in shown


def test_dashboard_counts_come_from_counters_not_jobs(pages, api, app):
    """The page reads the trigger-maintained delta rows: a fake delta shows up."""
    api.put_project("beta")
    sql(app, "INSERT INTO job_counts (project_id, state, delta) VALUES ('beta', 'done', 1234567)")
    assert "1,234,567" in pages.text("/admin")


def test_throughput_aggregates_per_minute_with_settled_cache(app, pages, api):
    from app.extensions import db
    from app.pages import aggregates
    api.put_project("gamma")
    assert api.enqueue("gamma", [{"id": "g1", "value": "https://example.org/g"}]).status_code == 200
    job_id = sql(app, "SELECT id FROM jobs WHERE project_id = 'gamma'")[0][0]
    now = sql(app, "SELECT date_trunc('minute', now())")[0][0]
    # 4 claims 10 minutes ago (2 done a minute later), 1 claim 3 hours ago.
    for minutes, state in ((10, "done"), (10, "done"), (10, "failed"), (10, "running"), (180, "done")):
        created = now - timedelta(minutes=minutes) + timedelta(seconds=5)
        sql(app, "INSERT INTO attempts (job_id, project_id, worker_id, state, created_at, "
                 "lease_expires_at, finished_at) VALUES (:j, 'gamma', 'w', :s, :c, :c, "
                 "CASE WHEN :s IN ('done', 'failed') THEN CAST(:c AS timestamptz) + interval '1 minute' END)",
            j=job_id, s=state, c=created)
    with app.app_context():
        _, series = aggregates.throughput(["gamma"])
        claims, done = series["claims"]["gamma"], series["completions"]["gamma"]
        failed = series["failures"]["gamma"]
        assert len(claims) == aggregates.DAY_MINUTES
        assert claims[-11] == 4 and claims[-181] == 1 and sum(claims) == 5
        assert done[-10] == 2 and done[-180] == 1 and sum(done) == 3
        assert failed[-10] == 1 and sum(failed) == 1
        # Settled minutes come from the cache now: a row slipped into the past
        # is not re-read, a new claim in the current minute is.
        sql(app, "INSERT INTO attempts (job_id, project_id, worker_id, state, created_at, "
                 "lease_expires_at) VALUES (:j, 'gamma', 'w', 'running', :c, :c), "
                 "(:j, 'gamma', 'w', 'running', now(), now())", j=job_id, c=now - timedelta(minutes=30))
        _, series = aggregates.throughput(["gamma"])
        assert sum(series["claims"]["gamma"]) == 6
        db.session.remove()
    page = pages.text("/admin/projects/gamma")
    assert "claims (peak 4/min)" in page and "failures (peak 1/min)" in page
    # Clock times on round ten minutes along the axis (UTC here, the viewer's
    # clock once local-time.js runs), and each minute's values on hover.
    utc_now = now.astimezone(UTC)
    tick = utc_now - timedelta(minutes=utc_now.minute % 10)
    assert f'data-clock="{int(tick.timestamp())}">{tick:%H:%M}</text>' in page
    assert f'data-clock="{int((tick - timedelta(minutes=10)).timestamp())}">' in page
    nine_ago = utc_now - timedelta(minutes=9)
    assert f">{nine_ago:%H:%M} — claims 0 · completions 2 · failures 1/min</title>" in page
    assert f">{(nine_ago - timedelta(minutes=1)):%H:%M} — claims 4 · completions 0 · failures 0/min</title>" in page
    zh = pages.text("/zh/admin/projects/gamma")
    assert "失败" in zh and "failures (peak" not in zh


# ------------------------------------------------------------------ projects

def test_create_project_then_patch_policy_and_status(pages, api):
    message, page = pages.act("/admin/projects", {"id": "papers", "kind": "pdf",
                                                  "identity_mode": "unique_value",
                                                  "client_versions": "v1\nv2"})
    assert "created" in message and "Project papers" in page
    # The policy form explains when the task deadline starts and the worker cap.
    assert "counted from its first claim, not from enqueue" in page
    assert 'id="policy-max_worker_attempts" name="max_worker_attempts"' in page
    summary = api.call("GET", "/api/v1/fleethq/projects/papers").json
    assert (summary["kind"], summary["identity_mode"], summary["client_versions"]) == (
        "pdf", "unique_value", ["v1", "v2"])
    assert summary["max_in_flight"] == 6  # pdf defaults
    message, _ = pages.act("/admin/projects", {"id": "papers"}, expect="error")
    assert "already exists" in message

    form = {"status": "active", "claim_order": "random", "dispatch_qps": "2.5", "worker_claim_qps": "",
            "max_jobs_per_claim": "10", "max_resets": "5", "recommended_lease_seconds": "120",
            "retry_backoff_seconds": "60", "max_in_flight": "", "max_worker_in_flight": "3",
            "task_timeout_seconds": "", "attempt_timeout_seconds": "300",
            "upload_timeout_seconds": "90", "prefer_new_worker__shown": "1",
            "client_versions": "v3", "max_worker_attempts": "5"}
    message, _ = pages.act("/admin/projects/papers/policy", form)
    assert "version 2" in message
    after = api.call("GET", "/api/v1/fleethq/projects/papers").json
    assert after["claim_order"] == "random" and after["dispatch_qps"] == 2.5
    assert after["max_in_flight"] is None and after["prefer_new_worker"] is False
    assert after["client_versions"] == ["v3"] and after["max_worker_in_flight"] == 3
    assert after["max_worker_attempts"] == 5
    # The same form again changes nothing: no version bump.
    message, _ = pages.act("/admin/projects/papers/policy", form)
    assert "version 2" in message

    message, _ = pages.act("/admin/projects/papers/policy", {**form, "max_resets": "abc"}, expect="error")
    assert "max_resets must be a whole number" in message
    message, _ = pages.act("/admin/projects/papers/policy", {**form, "max_jobs_per_claim": "999"},
                           expect="error")
    assert "max_jobs_per_claim" in message
    message, _ = pages.act("/admin/projects/papers/policy", {**form, "dispatch_qps": "nan"}, expect="error")
    assert "dispatch_qps" in message
    message, _ = pages.act("/admin/projects/papers/policy", {**form, "max_worker_attempts": "21"},
                           expect="error")
    assert "max_worker_attempts must be an integer 1..20 or null" in message

    message, page = pages.act("/admin/projects/papers/status", {"status": "draining"})
    assert "is now draining" in message and 'badge-draining' in page
    message, _ = pages.act("/admin/projects/papers/status", {"status": "paused"}, expect="error")
    assert "status must be one of" in message
    message, _ = pages.act("/admin/projects/papers/status", {"status": "archived"})
    message, _ = pages.act("/admin/projects/papers/enqueue/values", {"values": "10.1/x"}, expect="error")
    assert "archived" in message


def test_project_pages_unknown_project_is_404(pages):
    assert pages.get("/admin/projects/nope").status_code == 404
    assert pages.get("/admin/jobs/999999").status_code == 404
    assert pages.get("/admin/jobs/abc").status_code == 404


def test_job_list_pages_by_cursor_and_filters_by_state(pages, api, app):
    api.put_project("many", max_resets=0)
    jobs = [{"id": f"m{i:03}", "value": f"https://example.org/{i}"} for i in range(120)]
    assert api.enqueue("many", jobs).status_code == 200
    claimed = body(api.claim("many", max_jobs=7))["jobs"]
    assert api.fail("many", claimed, retryable=False).status_code == 200
    first = pages.text("/admin/projects/many")
    ids = job_ids(first)
    assert len(ids) == 50 and ids == sorted(ids)
    next_url = html.unescape(re.search(r'id="next-page" href="([^"]+)"', first).group(1))
    assert f"after_job_id={ids[-1]}" in next_url
    second = job_ids(pages.text(next_url))
    assert len(second) == 50 and second[0] > ids[-1]
    third_page = pages.text(f"/admin/projects/many?after_job_id={second[-1]}")
    assert len(job_ids(third_page)) == 20 and 'id="next-page"' not in third_page
    failed = pages.text("/admin/projects/many?status=failed")
    assert len(job_ids(failed)) == 7 and "Requeue all 7 failed on this page" in failed
    response = pages.get("/admin/projects/many?status=bogus")
    assert response.status_code == 303
    response = pages.get("/admin/projects/many?after_job_id=-1")
    assert response.status_code == 303


def test_paging_never_uses_offset(pages, api, app):
    """The listing reads by cursor: the SQL it sends has no OFFSET."""
    from sqlalchemy import event

    from app.extensions import db
    api.put_project("cur")
    assert api.enqueue("cur", [{"id": "c1", "value": "v"}]).status_code == 200
    seen = []
    with app.app_context():
        engine = db.engine

    def capture(conn, cursor, statement, *args):
        seen.append(statement)
    event.listen(engine, "before_cursor_execute", capture)
    try:
        pages.text("/admin/projects/cur?after_job_id=0")
        project_page = list(seen)
        seen.clear()
        pages.text("/admin")
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    job_queries = [s for s in project_page if "FROM jobs" in s]
    assert job_queries and not any("OFFSET" in s.upper() for s in job_queries)
    assert not any("count(" in s.lower() and "from jobs" in s.lower() for s in project_page)
    # The dashboard reads counters, and of jobs only each project's oldest
    # queued one (an index probe, LIMIT 1): nothing that grows with the queue.
    dashboard_job_reads = [s for s in seen if "from jobs" in s.lower()]
    assert all("LIMIT 1" in s and "count(" not in s.lower() for s in dashboard_job_reads), dashboard_job_reads


def test_nul_characters_are_a_bad_request_not_a_500(pages, api):
    api.put_project("nul")
    assert pages.get("/admin/projects/a%00b").status_code == 400
    assert pages.post("/admin/workers/node/a%00b/approve", {"confirm": "yes"}).status_code == 400
    assert pages.post("/admin/hooks/consumers", {"project_id": "nul", "name": "a\x00b",
                                                "url": "https://x.org"}).status_code == 400


# ------------------------------------------------------------------ enqueue

def test_enqueue_by_paste_uses_default_ids_and_is_idempotent(pages, api, app):
    api.put_project("paste")
    values = "https://example.org/a\n\n  https://example.org/b  \r\nhttps://example.org/a\n"
    message, page = pages.act("/admin/projects/paste/enqueue/values", {"values": values, "type": "seed"})
    assert message == "3 jobs submitted: 2 new, 1 already queued."
    assert default_job_id("https://example.org/a") in page
    # The value exactly as typed, as hqctl and the API keep it.
    assert sql(app, "SELECT value FROM jobs WHERE project_id = 'paste' ORDER BY id") == [
        ("https://example.org/a",), ("  https://example.org/b  ",)]
    message, _ = pages.act("/admin/projects/paste/enqueue/values", {"values": values, "type": "seed"})
    assert "0 new" in message
    message, _ = pages.act("/admin/projects/paste/enqueue/values", {"values": "\n \n"}, expect="error")
    assert "empty" in message
    message, _ = pages.act("/admin/projects/paste/enqueue/values", {"values": "x", "type": "bogus"},
                           expect="error")
    assert "line 1" in message
    api.put_project("uv", identity_mode="unique_value")
    message, _ = pages.act("/admin/projects/uv/enqueue/values", {"values": "a\nb\na"})
    assert "2 new" in message


def test_enqueue_json_lines_pasted_and_as_file(pages, api):
    api.put_project("jl")
    lines = '{"id": "j1", "value": "one"}\n{"id": "j2", "value": "two", "attr": {"k": 1}}\n'
    message, _ = pages.act("/admin/projects/jl/enqueue/jsonl", {"jsonl": lines})
    assert "2 new" in message
    data = {"jsonl": "", "jsonl_file": (io.BytesIO(b'{"id": "j3", "value": "three"}\n'), "jobs.jsonl")}
    message, _ = pages.act("/admin/projects/jl/enqueue/jsonl", data, content_type="multipart/form-data")
    assert "1 new" in message
    message, _ = pages.act("/admin/projects/jl/enqueue/jsonl", {"jsonl": '{"id": "j4", "value": NaN}'},
                           expect="error")
    assert "line 1" in message
    # A conflicting identity rolls the whole batch back.
    message, _ = pages.act("/admin/projects/jl/enqueue/jsonl",
                           {"jsonl": '{"id": "j9", "value": "nine"}\n{"id": "j1", "value": "other"}'},
                           expect="error")
    assert "different fields" in message
    assert api.counts("jl")["todo"] == 3


def test_enqueue_zst_source_upload(pages, api):
    api.put_project("src", identity_mode="none")
    buffer = io.BytesIO()
    write_source([{"value": f"https://example.org/{i}"} for i in range(250)], buffer)
    message, _ = pages.act("/admin/projects/src/enqueue/source",
                           {"source": (io.BytesIO(buffer.getvalue()), "jobs.jsonl.zst")},
                           content_type="multipart/form-data")
    assert message == "Source imported: 250 jobs read, 250 new."
    assert api.counts("src")["todo"] == 250
    message, _ = pages.act("/admin/projects/src/enqueue/source",
                           {"source": (io.BytesIO(b"not zstd at all"), "bad.zst")},
                           content_type="multipart/form-data", expect="error")
    assert "0 jobs were committed" in message
    message, _ = pages.act("/admin/projects/src/enqueue/source", {}, expect="error")
    assert "choose a .zst" in message


# ------------------------------------------------------------------ escaping and jobs

def test_user_data_is_escaped_everywhere(pages, api, app):
    api.put_project("esc", max_resets=0)
    assert api.enqueue("esc", [{"id": "x1", "value": XSS, "attr": {"note": XSS}}]).status_code == 200
    claimed = body(api.claim("esc", worker_id="w1", max_jobs=1))["jobs"]
    api.call("POST", "/api/v1/projects/esc/jobs/fail", {"worker_id": "w1", "items": [{
        "job_id": claimed[0]["job_id"], "attempt_id": claimed[0]["attempt_id"], "retryable": False,
        "error": {"code": "bad", "message": XSS}}]})
    for url in ("/admin/projects/esc", f"/admin/jobs/{claimed[0]['job_id']}", "/admin", "/admin/workers"):
        page = pages.text(url)
        assert XSS not in page, url
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert escaped in pages.text("/admin/projects/esc")
    job_page = pages.text(f"/admin/jobs/{claimed[0]['job_id']}")
    assert job_page.count(escaped) >= 3  # value, attr, the attempt's error message
    assert escaped in pages.text("/admin")  # recent errors


def test_job_page_says_when_the_task_deadline_starts(pages, api):
    """A queued job's deadline has not started: the page says it starts at
    the first claim, then shows the time the claim set."""
    api.put_project("slow", task_timeout_seconds=600)
    api.put_project("open")
    api.enqueue("slow", [{"id": "a", "value": "v"}])
    api.enqueue("open", [{"id": "b", "value": "v"}])
    ids = {p: body(api.call("GET", f"/api/v1/admin/projects/{p}/jobs"))["jobs"][0]["job_id"]
           for p in ("slow", "open")}

    def deadline(job_id):
        page = pages.text(f"/admin/jobs/{job_id}")
        cell = re.search(r'id="job-deadline">(.*?)</td>', page).group(1)
        return re.sub(r"<[^>]+>", "", cell)

    assert deadline(ids["slow"]) == "600 s from its first claim (not started)"
    assert deadline(ids["open"]) == "none"
    body(api.claim("slow", max_jobs=1))
    assert "not started" not in deadline(ids["slow"]) and deadline(ids["slow"]).endswith(" UTC")


def test_job_detail_requeue_and_delete(pages, api, app, client):
    api.put_project("jobs", max_resets=0)
    assert api.enqueue("jobs", [{"id": f"j{i}", "value": f"v{i}"} for i in range(4)]).status_code == 200
    claimed = body(api.claim("jobs", max_jobs=3))["jobs"]
    api.fail("jobs", claimed[:1], retryable=False, code="gone")
    api.fail("jobs", claimed[1:2], retryable=True, code="flaky")  # max_resets 0 → reset_exhausted
    failed_id, exhausted_id, wip_id = (c["job_id"] for c in claimed)
    page = pages.text(f"/admin/jobs/{failed_id}")
    assert "Attempt history" in page and "gone" in page and 'badge-failed' in page
    assert "No uploads for this job." in page

    message, page = pages.act(f"/admin/jobs/{failed_id}/requeue")
    assert "back in the queue" in message and 'badge-todo' in page
    message, _ = pages.act(f"/admin/jobs/{failed_id}/requeue", expect="error")
    assert "only failed or reset_exhausted" in message

    # Bulk: every failed/exhausted job on the page.
    page = pages.text("/admin/projects/jobs?status=reset_exhausted")
    page_ids = re.findall(r'name="page_job_id" value="(\d+)"', page)
    assert page_ids == [str(exhausted_id)]
    message, _ = pages.act("/admin/projects/jobs/jobs/bulk",
                           {"action": "requeue_page", "page_job_id": page_ids,
                            "back_status": "reset_exhausted"})
    assert message == "1 job requeued."
    assert api.counts("jobs")["reset_exhausted"] == 0

    message, _ = pages.act(f"/admin/jobs/{wip_id}/delete", {"confirm": "yes"}, expect="error")
    assert "a wip job cannot be deleted" in message
    message, _ = pages.act(f"/admin/jobs/{failed_id}/delete", {}, expect="error")
    assert "confirmation" in message
    message, _ = pages.act(f"/admin/jobs/{failed_id}/delete", {"confirm": "yes"})
    assert "deleted" in message
    assert pages.get(f"/admin/jobs/{failed_id}").status_code == 404
    message, _ = pages.act("/admin/projects/jobs/jobs/bulk",
                           {"action": "requeue", "job_id": [wip_id]}, expect="error")
    assert "refused" in message


def test_job_detail_shows_receipts_and_hook_deliveries(pages, api, app):
    api.put_project("pdfs", kind="pdf", identity_mode="unique_value")
    assert api.enqueue("pdfs", [{"value": "10.1234/abc"}]).status_code == 200
    job_id = sql(app, "SELECT id FROM jobs WHERE project_id = 'pdfs'")[0][0]
    sql(app, "INSERT INTO attempts (id, job_id, project_id, worker_id, state, lease_expires_at, finished_at) "
             "VALUES (900, :j, 'pdfs', 'n1', 'done', now(), now())", j=job_id)
    sql(app, "INSERT INTO uploads (attempt_id, job_id, project_id, worker_id, state, sha256, size, asset_key) "
             "VALUES (900, :j, 'pdfs', 'n1', 'done', :h, 12345, 'doi/10.1234/abc.pdf')", j=job_id, h="ab" * 32)
    consumer = sql(app, "INSERT INTO hook_consumers (project_id, name, url, secret) VALUES "
                        "('pdfs', 'ocr', 'https://ocr.example.org/h', 'sssssssssssssssssss') RETURNING id")[0][0]
    sql(app, "INSERT INTO hook_deliveries (consumer_id, project_id, attempt_id, asset_key, state, tries, last_error) "
             "VALUES (:c, 'pdfs', 900, 'doi/10.1234/abc.pdf', 'failed', 20, 'HTTP 500: boom')", c=consumer)
    page = pages.text(f"/admin/jobs/{job_id}")
    assert "ab" * 32 in page and "12.1 KiB" in page and "doi/10.1234/abc.pdf" in page
    assert "https://ocr.example.org/h" in page and "HTTP 500: boom" in page and "Retry now" in page


# ------------------------------------------------------------------ workers

def test_approve_drain_enable_revoke_a_registered_node(pages, app, client):
    node = Node(client, app, name="lab-<pc>", approve=False)
    page = pages.text("/admin/workers")
    assert "lab-&lt;pc&gt;" in page and 'badge-pending' in page and "?action=approve" in page
    confirm = pages.text(f"/admin/workers/node/{node.node_id}?action=approve")
    assert "Confirm: approve" in confirm and 'id="do-approve"' in confirm and 'id="do-revoke"' not in confirm
    message, _ = pages.act(f"/admin/workers/node/{node.node_id}/approve", {}, expect="error")
    assert "Tick the box" in message
    message, page = pages.act(f"/admin/workers/node/{node.node_id}/approve", {"confirm": "yes"})
    assert message == f"Node lab-<pc> ({node.node_id}) is now active."
    assert node.heartbeat().status_code == 200
    message, _ = pages.act(f"/admin/workers/node/{node.node_id}/approve", {"confirm": "yes"}, expect="error")
    assert "cannot approve a active node" in message
    message, _ = pages.act(f"/admin/workers/node/{node.node_id}/drain", {"confirm": "yes"})
    assert "is now draining" in message
    message, _ = pages.act(f"/admin/workers/node/{node.node_id}/enable", {"confirm": "yes"})
    assert "is now active" in message
    message, _ = pages.act(f"/admin/workers/node/{node.node_id}/drain", {"confirm": "yes"})
    message, _ = pages.act(f"/admin/workers/node/{node.node_id}/revoke", {"confirm": "yes", "reason": "retired"})
    assert "is now revoked" in message
    assert node.heartbeat().status_code == 401
    message, _ = pages.act(f"/admin/workers/node/{node.node_id}/fly", {"confirm": "yes"}, expect="error")
    assert "unknown action" in message
    assert pages.get("/admin/workers/node/does-not-exist").status_code == 404


def test_worker_page_lists_its_jobs_and_flags_a_lease_that_ran_out(pages, app, client, api):
    api.put_project("gen")
    assert api.enqueue("gen", values(2)).status_code == 200
    node = Node(client, app, name="busy-node")
    assert node.heartbeat().status_code == 200
    assert len(body(node.claim("gen", max_jobs=2))["jobs"]) == 2
    running = pages.text(f"/admin/workers/node/{node.node_id}").split('id="live-jobs"')[1]
    assert "Running now (2)" in running and "ran out" not in running
    sql(app, "UPDATE jobs SET lease_expires_at = now() - interval '1 second' "
             "WHERE id = (SELECT min(id) FROM jobs WHERE project_id = 'gen')")
    running = pages.text(f"/admin/workers/node/{node.node_id}").split('id="live-jobs"')[1]
    assert "Running now (1)" in running and running.count("ran out") == 1


def test_stale_heartbeat_is_flagged(pages, app, client):
    node = Node(client, app, name="old-node")
    assert node.heartbeat().status_code == 200
    assert "stale" not in pages.text(f"/admin/workers/node/{node.node_id}").split('id="health"')[1][:600]
    sql(app, "UPDATE fleet_nodes SET last_heartbeat_at = now() - interval '91 seconds'")
    page = pages.text("/admin/workers")
    assert "· stale" in page and "1 stale" in page


def test_workers_page_sets_a_tier_and_flips_the_remote_switch(pages, app, client, api):
    node = Node(client, app, name="split-host")
    page = pages.text("/admin/workers")
    assert f'action="/admin/workers/node/{node.node_id}/tier"' in page
    message, page = pages.act(f"/admin/workers/node/{node.node_id}/tier", {"tier": "fallback"})
    assert message == f"Worker {node.node_id} is now fallback."
    assert sql(app, "SELECT tier FROM fleet_nodes WHERE id = :n", n=node.node_id)[0][0] == "fallback"
    message, _ = pages.act(f"/admin/workers/node/{node.node_id}/tier", {"tier": "second"},
                           expect="error")
    assert "tier must be one of auto, first, fallback" in message
    # Without the CSRF token the form is refused and nothing changes.
    response = client.post(f"/admin/workers/node/{node.node_id}/tier", data={"tier": "first"})
    assert response.status_code in (400, 403)
    assert sql(app, "SELECT tier FROM fleet_nodes WHERE id = :n", n=node.node_id)[0][0] == "fallback"

    assert "Remote delegation: on" in page
    message, _ = pages.act("/admin/workers/remote", {"remote": "off"}, expect="error")
    assert "confirm" in message  # stopping every remote claim needs the box ticked
    message, page = pages.act("/admin/workers/remote", {"remote": "off", "confirm": "yes"})
    assert message == "Remote delegation is off."
    assert 'id="remote-on"' in page
    api.put_project("gen")
    api.enqueue("gen", values(1))
    assert body(node.claim("gen"))["jobs"] == []
    message, _ = pages.act("/admin/workers/remote", {"remote": "on"})
    assert message == "Remote delegation is on."
    assert len(body(node.claim("gen"))["jobs"]) == 1


def test_token_worker_drain_and_revoke(pages, client, make_user):
    token = make_user("alice", ["worker"])
    response = client.post("/api/v1/fleet/heartbeat", headers={"Authorization": f"Bearer {token}",
                                                               "X-Client-Version": VERSION},
                           json={"worker_id": "laptop", "capacity": 1, "browser_ok": False,
                                 "disk_free_bytes": 5 * 1024**3, "spool_bytes": 0,
                                 "running_attempt_ids": [], "last_error": "chromium crashed"})
    assert response.status_code == 200, response.json
    page = pages.text("/admin/workers")
    assert "chromium crashed" in page and "/admin/workers/token/alice/laptop" in page
    message, _ = pages.act("/admin/workers/token/alice/laptop/drain", {"confirm": "yes"})
    assert message == "Token worker alice/laptop is now draining."
    message, _ = pages.act("/admin/workers/token/alice/laptop/revoke", {"confirm": "yes", "reason": "lost laptop",
                                                                       "token": "end"})
    assert message == ("Token worker alice/laptop is now revoked. Running attempts cancelled: 0. The machine "
                       "token of alice is ended too: every worker using it is refused until an admin issues "
                       "a new one (Users).")
    again = client.post("/api/v1/fleet/heartbeat", headers={"Authorization": f"Bearer {token}",
                                                            "X-Client-Version": VERSION},
                        json={"worker_id": "laptop-2", "capacity": 1, "browser_ok": False,
                              "disk_free_bytes": 1, "spool_bytes": 0, "running_attempt_ids": []})
    assert again.status_code == 401, again.json
    message, _ = pages.act("/admin/workers/token/alice/laptop/enable", {"confirm": "yes"}, expect="error")
    assert "cannot enable a revoked token worker" in message


def test_a_token_worker_revoke_may_keep_the_token_and_says_so(pages, client, make_user):
    token = make_user("bob", ["worker"])
    beat = {"worker_id": "desk", "capacity": 1, "browser_ok": False, "disk_free_bytes": 1, "spool_bytes": 0,
            "running_attempt_ids": []}
    headers = {"Authorization": f"Bearer {token}", "X-Client-Version": VERSION}
    assert client.post("/api/v1/fleet/heartbeat", headers=headers, json=beat).status_code == 200
    form = pages.text("/admin/workers/token/bob/desk?action=revoke")
    assert 'name="token" value="end" checked' in form and 'name="token" value="keep"' in form
    message, _ = pages.act("/admin/workers/token/bob/desk/revoke", {"confirm": "yes", "reason": "moved desks",
                                                                   "token": "keep"})
    assert message.endswith("The machine token of bob still works: a worker using it may claim again "
                            "under a new worker id.")
    assert client.post("/api/v1/fleet/heartbeat", headers=headers,
                       json={**beat, "worker_id": "desk-2"}).status_code == 200


def test_enrollment_credential_is_shown_once_and_works(pages, client):
    response = pages.post("/admin/workers/enrollments")
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "no-store"
    credential = re.search(r'id="enrollment-credential">(fhqe_[A-Za-z0-9_-]+)<',
                           response.get_data(as_text=True)).group(1)
    assert credential not in pages.text("/admin/workers")
    from tests.fleet_helpers import new_identity
    node_id, secret = new_identity()
    registered = client.post("/api/v1/fleet/register", json={"id": node_id, "name": "n", "secret": secret,
                                                            "enrollment_token": credential})
    assert registered.status_code == 201


def test_enrollment_command_names_the_public_url_behind_a_proxy(pages, app, monkeypatch):
    """Behind a TLS proxy the request arrives as http://localhost: the
    printed command must carry PUBLIC_URL, or the worker refuses it."""
    command = re.compile(r"fleethq-worker run --master (\S+) ")
    shown = pages.post("/admin/workers/enrollments").get_data(as_text=True)
    assert command.search(shown).group(1) == "http://localhost"
    monkeypatch.setitem(app.config, "PUBLIC_URL", "https://hq.example.org/")
    shown = pages.post("/admin/workers/enrollments").get_data(as_text=True)
    assert command.search(shown).group(1) == "https://hq.example.org"
    assert "http://localhost" not in shown


# ------------------------------------------------------------------ users

def test_users_activate_roles_tokens_and_sessions(pages, app, client):
    from app.accounts import service as accounts
    from app.extensions import db
    with app.app_context():
        accounts.put_user("gh-42", ["worker"], "pending")
        db.session.remove()
    page = pages.text("/admin/users")
    assert "Waiting for activation" in page and "gh-42" in page
    message, page = pages.act("/admin/users/gh-42/activate")
    assert "is active" in message and "Waiting for activation" not in page
    message, _ = pages.act("/admin/users/gh-42/activate", expect="error")
    assert "already active" in message
    message, _ = pages.act("/admin/users/gh-42", {"status": "active", "roles": ["worker", "reader"]})
    assert "roles reader, worker" in message
    message, _ = pages.act("/admin/users/gh-42", {"status": "frozen", "roles": ["worker"]}, expect="error")
    assert "status must be one of" in message
    message, _ = pages.act("/admin/users/page-admin", {"status": "active", "roles": ["worker"]},
                           expect="error")
    assert "your own admin role" in message

    response = pages.post("/admin/users/gh-42/token")
    assert response.status_code == 200 and response.headers["Cache-Control"] == "no-store"
    token = re.search(r'id="machine-token">(fhq_[A-Za-z0-9_-]+)<', response.get_data(as_text=True)).group(1)
    assert client.get("/api/v1/projects/none", headers={"Authorization": f"Bearer {token}"}).status_code != 401
    message, _ = pages.act("/admin/users/gh-42/token/revoke", {}, expect="error")
    message, _ = pages.act("/admin/users/gh-42/token/revoke", {"confirm": "yes"})
    assert "revoked" in message
    assert client.get("/api/v1/projects/none", headers={"Authorization": f"Bearer {token}"}).status_code == 401

    message, page = pages.act("/admin/users", {"user_id": "robot", "roles": ["worker"], "status": "active"})
    assert "User robot created" in message
    message, _ = pages.act("/admin/users", {"user_id": "robot", "roles": ["worker"]}, expect="error")
    assert "already exists" in message
    message, _ = pages.act("/admin/users", {"user_id": "bad id!", "roles": []}, expect="error")

    other = app.test_client()
    sign_in(app, other, "gh-42", roles=("worker",))
    assert other.get("/worker").status_code == 200
    message, _ = pages.act("/admin/users/gh-42/sessions/end")
    assert "1 browser session of gh-42 ended." == message
    assert other.get("/worker").status_code == 302


# ------------------------------------------------------------------ hooks

def test_hooks_consumers_deliveries_and_retry(pages, api, app):
    api.put_project("hooked", kind="pdf", identity_mode="unique_value")
    response = pages.post("/admin/hooks/consumers", {"project_id": "hooked", "name": "ocr",
                                                    "url": "https://ocr.example.org/in"})
    assert response.status_code == 200 and response.headers["Cache-Control"] == "no-store"
    assert re.search(r'id="hook-secret">[^<]{16,}<', response.get_data(as_text=True))
    message, _ = pages.act("/admin/hooks/consumers", {"project_id": "hooked", "name": "x", "url": "ftp://x"},
                           expect="error")
    assert "http(s)" in message
    message, _ = pages.act("/admin/hooks/consumers", {"project_id": "nope", "name": "x",
                                                     "url": "https://x.org"}, expect="error")
    assert "not found" in message
    consumer = sql(app, "SELECT id FROM hook_consumers")[0][0]
    message, page = pages.act(f"/admin/hooks/consumers/{consumer}/disable",
                              {"project_id": "hooked", "back_project": "hooked"})
    assert "disabled" in message and "Enable" in page
    message, _ = pages.act(f"/admin/hooks/consumers/{consumer}/enable", {"project_id": "hooked"})
    assert "enabled" in message
    delivery = sql(app, "INSERT INTO hook_deliveries (consumer_id, project_id, attempt_id, asset_key, state, "
                        "tries, last_error) VALUES (:c, 'hooked', 77, 'doi/x.pdf', 'failed', 20, :e) RETURNING id",
                   c=consumer, e=XSS)[0][0]
    page = pages.text("/admin/hooks?state=failed")
    assert "doi/x.pdf" in page and XSS not in page and "&lt;script&gt;" in page
    message, _ = pages.act(f"/admin/hooks/deliveries/{delivery}/retry")
    assert "is due now" in message
    assert sql(app, "SELECT state FROM hook_deliveries")[0][0] == "pending"
    sql(app, "UPDATE hook_deliveries SET state = 'delivered'")
    message, _ = pages.act(f"/admin/hooks/deliveries/{delivery}/retry", expect="error")
    assert "delivered" in message
    assert pages.get("/admin/hooks?state=bogus").status_code == 303


def test_hooks_page_adds_a_derive_consumer(pages, api, app):
    api.put_project("papers", kind="pdf", identity_mode="unique_value")
    api.put_project("papers-ocr", kind="pdf", identity_mode="unique_value")
    page = pages.text("/admin/hooks")
    assert 'id="add-derive-consumer"' in page
    message, page = pages.act("/admin/hooks/derive", {
        "project_id": "papers", "name": "ocr", "target_project": "papers-ocr", "languages": "eng+pol"})
    assert message == ("Derive consumer ocr added: every archived asset of papers becomes a job in "
                       "papers-ocr.")
    assert "derive: jobs into papers-ocr (ocr, eng+pol)" in page
    (row,) = sql(app, "SELECT kind, url, target_project_id, profile FROM hook_consumers")
    assert tuple(row) == ("derive", None, "papers-ocr", {"name": "ocr", "languages": "eng+pol"})
    message, _ = pages.act("/admin/hooks/derive", {"project_id": "papers", "name": "self",
                                                  "target_project": "papers"}, expect="error")
    assert "another project" in message


def test_worker_id_search_finds_its_user(pages, api, make_user):
    """SavewebHQ's worker search: the user a worker id was last seen with."""
    api.put_project("p")
    api.enqueue("p", values(1))
    vol = Api(api.client, make_user("volunteer-7", ["worker"]))
    assert vol.claim("p", worker_id="k3x9q2a").status_code == 200
    page = pages.text("/admin/workers?worker_id=k3x9q2a")
    owners = page.split('id="worker-owners"', 1)[1].split("</table>", 1)[0]
    assert "k3x9q2a" in owners and "volunteer-7" in owners
    none = pages.text("/admin/workers?worker_id=nobody-uses-this")
    assert 'id="worker-owners-none"' in none and 'id="worker-owners"' not in none


def test_job_page_shows_artifact_receipts_completion_and_links_the_worker(pages, api):
    """SavewebHQ's job page rows: attempt id, completed time, artifact
    receipts, and the worker linked to the worker-id search."""
    api.put_project("rc")
    api.enqueue("rc", [{"id": "a", "value": "https://example.org/a"},
                       {"id": "b", "value": "https://example.org/b"}])
    done, running = body(api.claim("rc", worker_id="q7w8e9r", max_jobs=2))["jobs"]
    receipt = {"id": "warc-1", "issuer": "receiver.example", "object_id": "s3://warcs/1.warc.gz",
               "checksum": "sha256:" + "cd" * 32, "size_bytes": 4096, "accepted_at": 1_700_000_000}
    response = api.call("POST", "/api/v1/projects/rc/jobs/complete", {"worker_id": "q7w8e9r", "items": [
        {"job_id": done["job_id"], "attempt_id": done["attempt_id"], "outcome": {"kind": "success"},
         "artifact_receipts": [receipt]}]})
    assert body(response)["results"][0]["status"] == "applied"

    page = pages.text(f"/admin/jobs/{done['job_id']}")
    receipts = page.split('id="artifact-receipts"', 1)[1].split("</section>", 1)[0]
    assert "warc-1" in receipts and "s3://warcs/1.warc.gz" in receipts and "cd" * 32 in receipts
    assert "<th>completed</th><td>" in page and "<th>completed</th><td></td>" not in page

    page = pages.text(f"/admin/jobs/{running['job_id']}")
    assert f"<code>{running['attempt_id']}</code>" in page
    assert 'href="/admin/workers/token/admin/q7w8e9r" id="job-worker"' in page  # its token worker's page
    assert "No artifact receipts" in page


def test_hooks_page_sets_the_completion_timeout_and_shows_backfill_and_skipped(pages, api, app):
    api.put_project("hooked", kind="pdf", identity_mode="unique_value")
    message, _ = pages.act("/admin/hooks/consumers", {"project_id": "hooked", "name": "x",
                                                     "url": "https://x.org/h",
                                                     "completion_timeout_seconds": "9"},
                           expect="error")
    assert "completion_timeout_seconds must be an integer from 10 to 604800" == message
    response = pages.post("/admin/hooks/consumers", {"project_id": "hooked", "name": "ocr",
                                                    "url": "https://ocr.example.org/in",
                                                    "completion_timeout_seconds": "120"})
    assert response.status_code == 200
    consumer = sql(app, "SELECT id, completion_timeout_seconds FROM hook_consumers")[0]
    assert consumer[1] == 120
    for bad in ("", "abc", "5", "604801", "1" * 20):
        message, _ = pages.act(f"/admin/hooks/consumers/{consumer[0]}/timeout",
                               {"project_id": "hooked", "completion_timeout_seconds": bad},
                               expect="error")
        assert "completion_timeout_seconds" in message, bad
    message, page = pages.act(f"/admin/hooks/consumers/{consumer[0]}/timeout",
                              {"project_id": "hooked", "completion_timeout_seconds": "900"})
    assert message == "Consumer ocr: completion timeout 900 s."
    assert 'value="900"' in page

    # Two archived assets, one with a delivery: one still lacks one.
    for n in (1, 2):
        sql(app, "INSERT INTO assets (canonical_key, sha256, size, object_key, project_id, attempt_id) "
                 "VALUES (:k, :s, 1, :o, 'hooked', :a)", k=f"doi:10.1/{n}", s=str(n) * 64,
            o=f"sha256/{n}", a=n)
    sql(app, "INSERT INTO hook_deliveries (consumer_id, project_id, attempt_id, asset_key, state) "
             "VALUES (:c, 'hooked', 1, 'sha256/1', 'skipped')", c=consumer[0])
    page = pages.text("/admin/hooks?project=hooked")
    assert "1 asset without a delivery; 1 skipped, being re-sent" in page
    assert "No failed deliveries." in page
    assert "skipped" in pages.text("/admin/hooks?state=skipped")
    assert "No failed hook deliveries." in pages.text("/admin")


def test_the_hooks_page_shows_a_derive_consumer_and_its_waiting_delivery(pages, api, app):
    api.put_project("scans", kind="pdf", identity_mode="unique_value")
    api.put_project("scans-ocr", kind="pdf", identity_mode="unique_value")
    response = api.call("POST", "/api/v1/admin/projects/scans/hooks", {
        "name": "ocr", "kind": "derive", "target_project": "scans-ocr",
        "profile": {"name": "ocr", "languages": "eng+pol"}})
    assert response.status_code == 201
    html = pages.text("/admin/hooks?project=scans")
    assert "derive: jobs into scans-ocr (ocr, eng+pol)" in html
    assert "None" not in re.sub(r"<[^>]+>", "", html)


@pytest.mark.parametrize("odd", [".", ".."])
def test_dot_ids_get_links_a_browser_keeps(pages, api, app, make_user, odd):
    """'.' and '..' are valid ids (as in SavewebHQ); a browser resolves such
    path segments, even percent-encoded, so the links write them with '~'."""
    api.put_project(odd)
    listing = pages.text("/admin/projects")
    link = f'href="/admin/projects/{odd}~"'
    assert link in listing and f'href="/admin/projects/{odd}"' not in listing
    page = pages.text(f"/admin/projects/{odd}~")
    assert f"<h1>Project {odd} <span" in page
    message, _ = pages.act(f"/admin/projects/{odd}~/status", {"status": "draining"})
    assert sql(app, "SELECT status FROM projects WHERE id = :p", p=odd)[0][0] == "draining"
    make_user(odd, ["worker"])
    assert f'action="/admin/users/{odd}~/token"' in pages.text("/admin/users")
    # A plain id is untouched.
    api.put_project("plain.id")
    assert 'href="/admin/projects/plain.id"' in pages.text("/admin/projects")


def test_the_workers_page_shows_each_projects_lane_order(pages, app, client, api):
    papers, scans = unique("lanes-pdf"), unique("lanes-doc")
    api.put_project(papers, kind="pdf")
    api.put_project(scans, kind="documents")
    node = Node(client, app, name="fresh")
    page = pages.text("/admin/workers")
    for project, order in ((papers, "local first"), (scans, "remote first")):
        row = page.split(f">{project}</a>", 1)[1].split("</tr>", 1)[0]
        assert order in row, row
    worker_row = page.split(node.node_id, 1)[1].split("</tr>", 1)[0]
    assert '<option value="auto" selected>' in worker_row and "by lane order" in worker_row


def test_workers_raise_no_false_alarms(pages, app, client, api, make_user):
    """An SDK worker that only claims is not stale for sending no heartbeats,
    and a worker without a browser lane is not "failing" one."""
    token = make_user("sdk-user", ["worker"])
    api.put_project("quiet-gen")
    claim = client.post("/api/v1/projects/quiet-gen/jobs/claim", headers={
        "Authorization": f"Bearer {token}", "X-Client-Version": VERSION},
        json={"worker_id": "sdk-worker-1", "max_jobs": 1, "lease_seconds": 60})
    assert claim.status_code == 200, claim.json
    ocr = Node(client, app, name="ocr-host")
    assert ocr.heartbeat(browser_ok=None).status_code == 200
    sql(app, "UPDATE token_workers SET last_seen_at = now() - interval '10 minutes' "
             "WHERE worker_id = 'sdk-worker-1'")
    page = pages.text("/admin/workers")
    sdk_row = page.split("sdk-user/sdk-worker-1", 1)[1].split("</tr>", 1)[0]
    assert "sends no heartbeats" in sdk_row and "stale" not in sdk_row, sdk_row
    assert "0 stale" in page
    ocr_row = page.split(ocr.node_id, 1)[1].split("</tr>", 1)[0]
    assert "failing" not in ocr_row and "no browser lane" in ocr_row, ocr_row
    # One that stopped cleanly (its last heartbeat offered no slot) is not stale either.
    assert ocr.heartbeat(browser_ok=None, capacity=0).status_code == 200
    sql(app, "UPDATE fleet_nodes SET last_heartbeat_at = now() - interval '91 seconds' WHERE id = :n",
        n=ocr.node_id)
    page = pages.text("/admin/workers")
    ocr_row = page.split(ocr.node_id, 1)[1].split("</tr>", 1)[0]
    assert "signed off" in ocr_row and "stale" not in ocr_row and "0 stale" in page, ocr_row
    # A node that heartbeats and goes silent is stale, and a broken browser shows.
    assert ocr.heartbeat(browser_ok=False).status_code == 200
    sql(app, "UPDATE fleet_nodes SET last_heartbeat_at = now() - interval '91 seconds' WHERE id = :n",
        n=ocr.node_id)
    page = pages.text("/admin/workers")
    ocr_row = page.split(ocr.node_id, 1)[1].split("</tr>", 1)[0]
    assert "failing" in ocr_row and "stale" in ocr_row and "1 stale" in page



@pytest.mark.parametrize("method, path, allowed", [
    ("TRACE", "/healthz", {"GET", "HEAD", "OPTIONS"}),
    ("PUT", "/admin/projects", {"GET", "POST", "HEAD", "OPTIONS"}),
    ("DELETE", "/api/v1/fleet/heartbeat", {"POST", "OPTIONS"}),
])
def test_a_405_names_the_methods_the_url_takes(client, method, path, allowed):
    response = client.open(path, method=method)
    assert response.status_code == 405
    assert set(response.headers["Allow"].split(", ")) == allowed


def test_the_oldest_queued_jobs_wait_on_the_pages_and_in_metrics(pages, api, app, client):
    api.put_project("waiting")
    api.put_project("empty-queue")
    api.enqueue("waiting", values(3))
    sql(app, "UPDATE jobs SET created_at = now() - interval '2 hours' "
             "WHERE id = (SELECT min(id) FROM jobs WHERE project_id = 'waiting')")
    page = pages.text("/admin/projects/waiting")
    assert "The oldest queued job has waited 2 hours since it was enqueued." in page
    assert "Nothing is queued." in pages.text("/admin/projects/empty-queue")
    live = pages.text("/admin/live")
    row = live.split(">waiting</a>", 1)[1].split("</tr>", 1)[0]
    assert '<td class="num oldest-queued">2 hours</td>' in row, row
    metrics = client.get("/metrics").get_data(as_text=True)
    waited = re.search(r'fleethq_oldest_queued_seconds\{project="waiting"\} ([0-9.]+)', metrics)
    assert waited and 7199 <= float(waited.group(1)) <= 7300
    assert 'fleethq_oldest_queued_seconds{project="empty-queue"} 0' in metrics
