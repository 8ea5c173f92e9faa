"""The pages an operator lives in, in a real browser and in both languages
(issue "Pages an operator lives in"): every main page walked in English and
in Chinese through the header's navigation and the language switcher, and
the new pages and actions used by hand — the audit log, a worker's recent
tasks, the readers' progress page, job search with a bulk requeue of a
whole filter and its progress, deleting a project. Screenshots land in
``test-artifacts/screenshots/`` (``pages-<lang>-<page>.png``). Chromium
missing is a failure; so is a Content-Security-Policy violation or a
JavaScript dialog."""
from __future__ import annotations

import re

import pytest
import requests

from tests.browser import SHOTS, browser  # noqa: F401  (fixture)
from tests.fleet_helpers import Node
from tests.helpers import body
from tests.support.browser import api, page, site  # noqa: F401  (fixtures)

# Each main page: (path, heading in English, heading in Chinese).
MAIN_PAGES = [
    ("/admin", "Dashboard", "仪表盘"),
    ("/admin/projects", "Projects", "项目"),
    ("/admin/workers", "Workers", "工作节点"),
    ("/admin/users", "Users", "用户"),
    ("/admin/hooks", "Hooks", "钩子"),
    ("/admin/search", "Search papers", "搜索论文"),
    ("/admin/audit", "Audit log", "审计日志"),
    ("/progress", "Progress", "进度"),
    ("/worker", "My worker", "我的工作节点"),
]


@pytest.fixture
def tab(page):  # noqa: F811
    """A signed-in admin's tab (test_browser_admin's: CSP violations and dialogs fail)."""
    return page


def shot(page, lang: str, name: str):
    page.screenshot(path=str(SHOTS / f"pages-{lang}-{name}.png"), full_page=True)


def heading(page) -> str:
    return page.locator("h1").first.inner_text()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_main_page_in_both_languages(tab, site, api, lang):  # noqa: F811
    api.put_project("papers")
    api.enqueue("papers", [{"id": f"p{i}", "value": f"https://example.org/{i}"} for i in range(12)])
    tab.goto(f"{site.url}/admin")
    # The switcher keeps the page and changes its language; links stay in it.
    tab.click(f'.languages a[hreflang="{lang}"]')
    tab.wait_for_url(f"{site.url}/{lang}/admin")
    assert tab.locator("html").get_attribute("lang") == ("zh-Hans" if lang == "zh" else "en")
    for path, english, chinese in MAIN_PAGES:
        tab.goto(f"{site.url}/{lang}{path}")
        assert (chinese if lang == "zh" else english) in heading(tab), (lang, path, heading(tab))
        shot(tab, lang, path.strip("/").replace("/", "-") or "root")
    # Through the navigation bar: the link of the current section is marked.
    tab.goto(f"{site.url}/{lang}/admin")
    tab.click(".mainnav >> text=" + ("工作节点" if lang == "zh" else "Workers"))
    tab.wait_for_url(f"{site.url}/{lang}/admin/workers")
    assert tab.locator('.mainnav a[aria-current="page"]').inner_text() == ("工作节点" if lang == "zh" else "Workers")
    # Times: the date and time in the viewer's zone (this browser's is UTC)
    # in the language's form; test_browser_times covers other zones.
    tab.goto(f"{site.url}/{lang}/admin/projects/papers")
    tab.locator('#jobs a[href*="/admin/jobs/"]').first.click()
    created = tab.locator("#state tr", has_text="创建时间" if lang == "zh" else "created").locator("td")
    shown = r"\d{4}年\d{1,2}月\d{1,2}日 \d\d:\d\d:\d\d UTC" if lang == "zh" else \
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
    assert re.fullmatch(shown, created.first.inner_text()), created.first.inner_text()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_find_jobs_and_requeue_a_whole_filter(tab, site, api, app, lang):  # noqa: F811
    api.put_project("lib", max_resets=0)
    api.enqueue("lib", [{"id": f"j{i}", "value": f"https://example.org/lib/{i}"} for i in range(8)])
    jobs = body(api.claim("lib", max_jobs=8))["jobs"]
    api.fail("lib", jobs[:6], retryable=False, code="http_503")
    api.complete("lib", jobs[6:])
    tab.goto(f"{site.url}/{lang}/admin/projects/lib")
    tab.click("#find-jobs")
    tab.fill("#js-code", "http_503")
    tab.click("#job-search-form button[type=submit]")
    assert tab.locator("#job-search-results tbody tr").count() == 6
    shot(tab, lang, "job-search")
    tab.click("#bulk-requeue")
    assert tab.locator("#bulk-count strong").inner_text() == "6"
    tab.check("#bulk-confirm-box")
    tab.fill("#bulk-reason", "publisher recovered")
    tab.click("#bulk-go")
    tab.wait_for_url("**/admin/projects/lib/bulk/*")
    shot(tab, lang, "bulk-progress")
    # The tasks process is not running in this test: work the action here.
    from app.extensions import db
    from app.projects import bulk
    action_id = int(tab.url.rsplit("/", 1)[1])
    with app.app_context():
        assert bulk.run(action_id) == "done"
        db.session.remove()
    tab.reload()
    state = tab.locator("#bulk-state").inner_text()
    assert "6" in state and ("requeued" in state if lang == "en" else "已重新入队" in state)
    tab.goto(f"{site.url}/{lang}/admin/audit?action=jobs.")
    assert tab.locator("#audit-entries").inner_text().count("publisher recovered") == 1
    shot(tab, lang, "audit")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_workers_recent_tasks_and_the_readers_progress_page(tab, site, api, app, lang):  # noqa: F811
    api.put_project("gen")
    api.enqueue("gen", [{"id": f"g{i}", "value": f"v{i}"} for i in range(4)])
    worker = f"laptop-{lang}"  # the API notes a token worker once per process and 30 s
    jobs = body(api.claim("gen", worker_id=worker, max_jobs=3))["jobs"]
    assert len(jobs) == 3
    api.complete("gen", jobs[:2], worker_id=worker)
    api.fail("gen", jobs[2:], retryable=False, worker_id=worker, code="http_404")
    tab.goto(f"{site.url}/{lang}/admin/workers/token/admin/{worker}")
    tasks = tab.locator("#recent-tasks")
    assert tasks.locator("tbody tr").count() == 3 and "http_404" in tasks.inner_text()
    shot(tab, lang, "worker-recent-tasks")
    tab.goto(f"{site.url}/{lang}/admin/workers")
    hour = tab.locator("#workers-table tr", has_text=worker).locator(".activity-hour").inner_text()
    assert hour.startswith("2")
    tab.goto(f"{site.url}/{lang}/progress?state=failed")
    assert tab.locator("#progress-jobs tbody tr").count() == 1
    tab.select_option("#progress-state", "queued")
    tab.click("#progress-filter button[type=submit]")
    assert tab.locator("#progress-jobs tbody tr").count() == 1
    shot(tab, lang, "progress")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_delete_a_project_from_its_page(tab, site, api, lang):  # noqa: F811
    api.put_project("old-papers")
    api.enqueue("old-papers", [{"id": "x", "value": "https://example.org/x"}])
    tab.goto(f"{site.url}/{lang}/admin/projects/old-papers")
    tab.check("#confirm-delete-project")
    tab.click("#do-delete-project")
    tab.wait_for_url(f"{site.url}/{lang}/admin/projects")
    message = tab.locator(".flash").last.inner_text()
    assert message == ("Project old-papers and its jobs deleted." if lang == "en"
                       else "项目 old-papers 及其任务已删除。")
    assert api.call("GET", "/api/v1/fleethq/projects/old-papers").status_code == 404


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_savewebhq_page_rows_by_hand(tab, site, api, app, make_user, lang):  # noqa: F811
    """D8 create with every policy field, D11 a JSON array, D7 the claim order
    column, D18 delete a user, revoke with a reason — in the browser."""
    pid = f"full-{lang}"
    tab.goto(f"{site.url}/{lang}/admin/projects")
    tab.fill("#new-id", pid)
    tab.locator("#new-policy summary").click()
    tab.select_option("#new-claim_order", "random")
    tab.fill("#new-max_resets", "7")
    tab.fill("#new-max_in_flight", "40")
    tab.select_option("#new-prefer_new_worker", "no")
    tab.click("#create-project button[type=submit]")
    tab.wait_for_url(f"{site.url}/{lang}/admin/projects/{pid}")
    project = api.call("GET", f"/api/v1/fleethq/projects/{pid}").json()
    assert (project["claim_order"], project["max_resets"], project["max_in_flight"],
            project["prefer_new_worker"]) == ("random", 7, 40, False)
    tab.fill("#jobs-json", '[{"id": "a1", "value": "https://example.org/a"}, '
                           '{"id": "a2", "value": "https://example.org/b"}]')
    tab.click("#enqueue-json button[type=submit]")
    assert ("2 jobs submitted: 2 new." if lang == "en" else "已提交 2 个任务：2 个新任务。") in \
        tab.locator(".flash").last.inner_text()
    shot(tab, lang, "project-created")
    tab.goto(f"{site.url}/{lang}/admin/projects")
    assert "random" in tab.locator("tr", has_text=pid).inner_text()

    make_user(f"leaver-{lang}", ["worker"])
    tab.goto(f"{site.url}/{lang}/admin/users")
    row = tab.locator("tr", has_text=f"leaver-{lang}")
    row.locator('input[name="confirm"]').last.check()
    row.locator('button.danger[id^="delete-user-"]').click()
    assert f"leaver-{lang}" in tab.locator(".flash").last.inner_text()
    assert tab.locator("tr", has_text=f"leaver-{lang}").count() == 0

    node = Node(requests.Session(), app, base=site.url, name=f"box-{lang}")
    tab.goto(f"{site.url}/{lang}/admin/workers/node/{node.node_id}")
    tab.check("#confirm-revoke")
    tab.fill("#reason-revoke", "retired")
    tab.click("#do-revoke")
    tab.goto(f"{site.url}/{lang}/admin/audit?action=node.revoke")
    assert "retired" in tab.locator("#audit-entries").inner_text()
    shot(tab, lang, "audit-revoke")
