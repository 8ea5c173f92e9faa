"""The readers' progress page (issue "Pages an operator lives in" §2, seed row
E1): the page twin of /api/v1/remote-jobs — states a reader understands,
filters, at most 500 rows, no topology and no credentials."""
from __future__ import annotations

import re

from tests import scans
from tests.fleet_helpers import Node, papers, pdf_project
from tests.helpers import Api, body, sql, values
from tests.support.pages import sign_in


def _states(page: str) -> dict[str, str]:
    """job id → shown state, in the newest jobs' table."""
    page = page[page.index('id="progress-jobs"'):]
    rows = re.findall(r'<tr><td class="num">(\d+)</td>.*?<span class="badge badge-(\w+)">', page, re.S)
    return dict(rows)


def _text(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.get_data(as_text=True)


def _fleet(app, client, admin_token, tmp_path):
    api = Api(client, admin_token)
    api.put_project("generic")
    api.enqueue("generic", values(5))
    claimed = body(api.claim("generic", max_jobs=3))["jobs"]
    assert body(api.complete("generic", claimed[:1]))["results"][0]["status"] == "applied"
    assert body(api.fail("generic", claimed[1:2], retryable=False, code="http_410"))["results"][0][
        "status"] == "applied"
    pdf_project(api, "papers")
    api.enqueue("papers", papers(2))
    node = Node(client, app, name="secret-lab-host")
    assert node.heartbeat().status_code == 200
    staged, uploading = body(node.claim("papers", max_jobs=2))["jobs"]
    scan = scans.scanned_pdf(tmp_path / "s.pdf", [["lantern falcon"], ["orchid sailor"]]).read_bytes()
    assert node.upload(staged["attempt_id"], scan).status_code == 202
    # An upload still streaming: its attempt is 'uploading' until the body ends.
    sql(app, "UPDATE attempts SET state = 'uploading' WHERE id = :a", a=int(uploading["attempt_id"]))
    return {"done": claimed[0], "failed": claimed[1], "running": claimed[2], "staged": staged,
            "uploading": uploading}, node


def test_a_reader_sees_every_state_and_filters(app, client, admin_token, tmp_path, dirs):  # noqa: F811
    jobs, node = _fleet(app, client, admin_token, tmp_path)
    sign_in(app, client, "reader-1", roles=("reader",))
    assert client.get("/").headers["Location"].endswith("/progress")
    shown = _text(client, "/progress")
    states = _states(shown)
    for state, job in jobs.items():
        assert states[str(job["job_id"])] == state, (state, states)
    assert sum(1 for s in states.values() if s == "queued") == 2
    assert "http_410" in shown
    # No topology and no credentials: not the node's name, tier, or any token.
    assert "secret-lab-host" not in shown and "fallback" not in shown and node.secret not in shown
    assert "fhq_" not in shown and "/admin/" not in shown

    only = _states(_text(client, "/progress?state=uploading"))
    assert list(only.values()) == ["uploading"]
    papers_only = _states(_text(client, "/progress?project=papers"))
    assert set(papers_only.values()) == {"staged", "uploading"}
    assert client.get("/progress?state=exploded").status_code == 404
    assert client.get("/progress?project=nope").status_code == 404


def test_rows_are_bounded_and_the_page_is_for_readers_and_admins(app, client, admin_token):
    api = Api(client, admin_token)
    api.put_project("big")
    for start in range(0, 600, 200):
        api.enqueue("big", [{"id": f"j{n}", "value": f"https://example.org/{n}"}
                            for n in range(start, start + 200)])
    sign_in(app, client, "reader-2", roles=("reader",))
    assert len(_states(client.get("/progress").get_data(as_text=True))) == 100
    assert len(_states(client.get("/progress?limit=500").get_data(as_text=True))) == 500
    assert len(_states(client.get("/progress?limit=100000").get_data(as_text=True))) == 100
    sign_in(app, client, "just-a-worker", roles=("worker",))
    assert client.get("/progress").status_code == 403
    assert "Progress" not in client.get("/worker").get_data(as_text=True)
    sign_in(app, client, "page-admin", roles=("admin", "worker"))
    assert client.get("/progress").status_code == 200


def _row(page: str, element_id: str) -> str:
    return re.search(rf'<tr id="{element_id}">(.*?)</tr>', page, re.S).group(1)


def test_each_project_has_a_bar_a_rate_and_the_time_left_and_workers_a_leaderboard(app, client, admin_token):
    from app.pages import aggregates
    aggregates.reset_cache()
    api = Api(client, admin_token)
    api.put_project("crawl", max_resets=0)
    api.put_project("idle")
    api.enqueue("crawl", values(10))
    api.enqueue("idle", values(3))
    claimed = body(api.claim("crawl", max_jobs=6, worker_id="laptop-1"))["jobs"]
    assert body(api.complete("crawl", claimed[:4], worker_id="laptop-1"))["results"][0]["status"] == "applied"
    assert body(api.fail("crawl", claimed[4:5], retryable=False, worker_id="laptop-1"))["results"][0][
        "status"] == "applied"
    sign_in(app, client, "reader-3", roles=("reader",))
    page = _text(client, "/progress")
    crawl = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", _row(page, "progress-crawl")))
    # 4 done and 1 failed of 10 (50 %); 5 left at 4 an hour: about 1 hour 15 minutes.
    assert "50.0 %" in crawl and " 4 1 5 10 4/h " in crawl, crawl
    assert "about 1 hour" in crawl
    assert "crawl: 4 done, 1 failed, 5 left of 10" in _row(page, "progress-crawl")
    idle = re.sub(r"<[^>]+>", " ", _row(page, "progress-idle"))
    assert "no completions in the last hour" in idle
    # The leaderboard: the token worker's user, 4 jobs, in the hour and the day.
    for board in ("hour", "day"):
        section = re.search(rf'id="leaderboard-{board}">(.*?)</table>', page, re.S).group(1)
        rows = re.findall(r'<tr><td class="num">(\d+)</td>\s*<td>(.*?)</td>\s*<td class="num">([\d,]+)</td>',
                          section, re.S)
        assert len(rows) == 1 and rows[0][0] == "1" and rows[0][2] == "4", rows
    zh = _text(client, "/zh/progress")
    assert "排行榜" in zh and "Leaderboard" not in zh
