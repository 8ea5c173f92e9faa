"""What each worker did (issue "Pages an operator lives in" §2): the worker
page's recent tasks and the workers list's counts of the last hour and day."""
from __future__ import annotations

import re

import pytest

from tests import scans
from tests.fleet_helpers import Node, papers, pdf_project
from tests.helpers import Api, body, sql, values
from tests.support.pages import Pages, sign_in
from tests.support.uploads import archive


@pytest.fixture
def pages(app, client):
    sign_in(app, client)
    return Pages(client, "page-admin")


@pytest.fixture
def scan(tmp_path):
    return scans.scanned_pdf(tmp_path / "scan.pdf", [["lantern falcon"], ["orchid sailor"]]).read_bytes()


def _row(page: str, name: str) -> str:
    return re.search(rf'<tr id="worker-\d+">(?:(?!</tr>).)*?>{re.escape(name)}</a>.*?</tr>', page, re.S).group(0)


def test_worker_page_lists_recent_tasks_with_outcome_duration_and_bytes(app, client, pages, admin_token,
                                                                         dirs, scan):  # noqa: F811
    api = Api(client, admin_token)
    pdf_project(api, "papers")
    assert api.enqueue("papers", papers(2)).status_code in (200, 201)
    node = Node(client, app, name="busy-pc")
    assert node.heartbeat().status_code == 200
    first, second = body(node.claim("papers", max_jobs=2))["jobs"]
    assert node.upload(first["attempt_id"], scan).status_code == 202
    assert archive(app, first["attempt_id"]) == "done"
    assert node.fail("papers", second, retryable=False, code="http_404").status_code == 200
    # An old attempt counts for the day, not the hour.
    sql(app, "UPDATE attempts SET finished_at = now() - interval '3 hours' WHERE id = :a",
        a=int(second["attempt_id"]))

    page = pages.text(f"/admin/workers/node/{node.node_id}")
    tasks = re.search(r'<section class="card" id="recent-tasks">.*?</section>', page, re.S).group(0)
    rows = re.findall(r"<tr><td>.*?</tr>", tasks, re.S)
    assert len(rows) == 2
    assert f'/admin/jobs/{first["job_id"]}' in rows[0] and "badge-done" in rows[0]
    assert f"{len(scan) / 1024:.1f} KiB" in rows[0]
    assert f'/admin/jobs/{second["job_id"]}' in rows[1] and "<code>http_404</code>" in rows[1]
    assert "Last hour: 1 done, 0 failed" in tasks and "Last day: 1 done, 1 failed" in tasks

    listed = _row(pages.text("/admin/workers"), "busy-pc")
    hour = re.search(r'class="num activity-hour">(.*?)</td>', listed, re.S).group(1)
    day = re.search(r'class="num activity-day">(.*?)</td>', listed, re.S).group(1)
    assert hour.startswith("1 done") and "failed" not in hour and f"{len(scan) / 1024:.1f} KiB" in hour
    assert day.startswith("1 done") and "1 failed" in day


def test_token_workers_are_counted_apart_from_a_node_of_the_same_id(app, client, pages, make_user):
    token = make_user("alice", ["worker"])
    api = Api(client, token)
    admin = Api(client, make_user("boss", ["admin"]))
    admin.put_project("generic")
    admin.enqueue("generic", values(3))
    jobs = body(api.claim("generic", worker_id="laptop", max_jobs=3))["jobs"]
    results = body(api.complete("generic", jobs, worker_id="laptop"))["results"]
    assert {r["status"] for r in results} == {"applied"}
    page = pages.text("/admin/workers/token/alice/laptop")
    assert "Last hour: 3 done, 0 failed" in page
    assert page.count('<a href="/admin/jobs/') >= 3
    # Another user's worker of the same name did nothing.
    other = Api(client, make_user("bob", ["worker"]))
    other.claim("generic", worker_id="laptop", max_jobs=1)
    assert "Last hour: 0 done, 0 failed" in pages.text("/admin/workers/token/bob/laptop")
