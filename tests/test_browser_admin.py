"""The admin pages in a real browser: Debian Chromium driven by Playwright
against the master on a live HTTP server, signed in with the development
login (development mode on loopback).

Covers what an admin does by hand: create a project, enqueue by paste and by
``.zst`` upload (a real file input), see a ``<script>`` value as text,
requeue a failed job, approve an enrolled node, drain and revoke it, release
the file a node revoked mid-upload left held, and create an enrollment
credential. Screenshots of the main pages land in
``test-artifacts/screenshots/`` (not committed). Chromium missing is a
failure, not a skip; so is any Content-Security-Policy violation or any
JavaScript dialog (an executed script).
"""
from __future__ import annotations

import re

import requests

from tests.browser import SHOTS, browser  # noqa: F401  (fixture)
from tests.fleet_helpers import Node, papers, pdf_project
from tests.helpers import VERSION
# Spool and object store under tmp_path, test PDFs, a half-sent upload.
from tests.support.uploads import read_response, sha, spool_names, streaming_upload
from workers.wire.source import write_source
from tests.support.browser import api, page, site  # noqa: F401 (fixtures)

XSS = "<script>alert(1)</script>"


def shot(tab, name):
    tab.screenshot(path=str(SHOTS / f"admin-{name}.png"), full_page=True)


def flash(tab) -> str:
    return tab.locator(".flash").last.inner_text()


def test_project_enqueue_paste_and_zst_requeue_and_escaping(page, site, api, tmp_path):
    page.click(".mainnav >> text=Projects")
    page.fill("#new-id", "crawl")
    page.select_option("#new-kind", "generic")
    page.select_option("#new-identity", "external_id")
    page.fill("#new-versions", VERSION)
    page.click("#create-project button[type=submit]")
    page.wait_for_url(f"{site.url}/admin/projects/crawl")
    assert flash(page) == "Project crawl created."

    page.fill("#values", f"https://example.org/one\nhttps://example.org/two\n{XSS}\n")
    page.click("#enqueue-values button[type=submit]")
    assert flash(page) == "3 jobs submitted: 3 new."
    # The value is text on the page, and nothing ran (a dialog would fail the test).
    assert page.locator("#jobs td.value", has_text=XSS).count() == 1
    assert page.locator("#jobs script").count() == 0

    source = tmp_path / "jobs.jsonl.zst"
    with source.open("wb") as out:
        write_source([{"id": f"s{i}", "value": f"https://example.org/s/{i}"} for i in range(20)], out)
    page.set_input_files("#source", str(source))
    page.click("#enqueue-source button[type=submit]")
    assert flash(page) == "Source imported: 20 jobs read, 20 new."
    counts = page.locator("#counts td.num")
    assert counts.first.inner_text() == "23"  # todo
    shot(page, "project")

    claimed = api.call("POST", "/api/v1/projects/crawl/jobs/claim",
                       {"worker_id": "w1", "max_jobs": 2, "lease_seconds": 60}).json()["jobs"]
    assert api.fail("crawl", claimed, retryable=False, code="http_410").status_code == 200
    page.goto(f"{site.url}/admin")
    # Errors grouped by code: one row for the two failures, its counts
    # opening the job search filtered by that code, counted.
    group = page.locator("#recent-errors tbody tr", has_text="http_410")
    assert group.count() == 1
    assert group.locator("td.num").all_inner_texts() == ["2", "2"]
    shot(page, "dashboard")
    group.locator("td.num a").first.click()
    page.wait_for_url("**/admin/projects/crawl/jobs/search?*error_code=http_410*")
    assert "2 jobs match" in page.inner_text("main")
    page.goto(f"{site.url}/admin/projects/crawl")
    assert page.locator("#errors tbody tr", has_text="http_410").locator("td.num").all_inner_texts() == ["2", "2"]

    page.goto(f"{site.url}/admin/projects/crawl")
    page.select_option("#status-filter", "failed")
    page.click("#job-filter button[type=submit]")
    page.wait_for_url("**status=failed")
    assert page.locator("#jobs tbody tr").count() == 2
    page.click("#requeue-page")
    assert flash(page) == "2 jobs requeued."
    assert page.locator("#jobs tbody tr").count() == 0

    job_id = claimed[0]["job_id"]
    page.goto(f"{site.url}/admin/jobs/{job_id}")
    assert "http_410" in page.inner_text("#attempts")
    shot(page, "job")
    page.goto(f"{site.url}/admin/projects")
    shot(page, "projects")


def test_escaped_job_page(page, site, api):
    api.put_project("esc")
    assert api.enqueue("esc", [{"id": "x", "value": XSS, "attr": {"n": XSS}}]).status_code == 200
    page.goto(f"{site.url}/admin/projects/esc")
    page.click("#jobs tbody a")
    assert page.inner_text("#job-value") == XSS
    assert XSS in page.inner_text("#spec pre")


def test_approve_drain_and_revoke_an_enrolled_node(page, site, app):
    node = Node(requests.Session(), app, base=site.url, name="lab-pc", approve=False)
    page.click(".mainnav >> text=Workers")
    row = page.locator("#workers-table tbody tr", has_text="lab-pc")
    assert row.locator(".badge").inner_text() == "pending"
    shot(page, "workers")

    row.locator("a.button", has_text="approve").click()
    assert "Confirm: approve" in page.inner_text("#actions h2")
    page.click("#do-approve")  # without ticking the box: refused
    assert "Tick the box" in flash(page)
    page.check("#confirm-approve")
    page.click("#do-approve")
    page.wait_for_url(f"{site.url}/admin/workers")
    assert flash(page) == f"Node lab-pc ({node.node_id}) is now active."
    assert node.heartbeat().status_code == 200

    page.locator("#workers-table tbody tr", has_text="lab-pc").locator("a.button", has_text="drain").click()
    page.check("#confirm-drain")
    page.click("#do-drain")
    assert "is now draining" in flash(page)

    page.goto(f"{site.url}/admin/workers/node/{node.node_id}")
    shot(page, "worker")
    page.check("#confirm-revoke")
    page.fill("#reason-revoke", "lab machine retired")
    page.click("#do-revoke")
    assert "is now revoked" in flash(page)
    assert node.heartbeat().status_code == 401

    page.click("#create-enrollment")
    credential = page.inner_text("#enrollment-credential")
    assert credential.startswith("fhqe_")
    shot(page, "enrollment")


def test_users_and_hooks_pages(page, site, app, api, admin_token):
    from app.accounts import service as accounts
    from app.extensions import db
    with app.app_context():
        accounts.put_user("gh-7", ["worker"], "pending")
        db.session.remove()
    api.put_project("papers", kind="pdf", identity_mode="unique_value")
    page.click(".mainnav >> text=Users")
    page.click("#pending button")
    assert flash(page) == "User gh-7 is active; they can sign in now."
    shot(page, "users")
    # The admin's own token (from the API fixture) is viewable again, behind a button.
    assert admin_token not in page.content()
    page.locator("#users tr", has=page.locator("code", has_text=re.compile(r"^admin$"))).locator(
        "button", has_text="View token").click()
    assert page.inner_text("#machine-token") == admin_token
    page.go_back()

    page.click(".mainnav >> text=Hooks")
    page.select_option("#consumer-project", "papers")
    page.fill("#consumer-name", "ocr")
    page.fill("#consumer-url", "https://ocr.example.org/in")
    page.click("#add-consumer button[type=submit]")
    assert len(page.inner_text("#hook-secret")) >= 16
    page.goto(f"{site.url}/admin/hooks?project=papers")
    assert "https://ocr.example.org/in" in page.inner_text("#consumers")
    shot(page, "hooks")


def test_revoking_mid_upload_holds_the_file_until_released(page, site, app, api, dirs, files):
    """DESIGN §8.7 by hand: revoke a node while its upload streams, look at
    the held file on the worker's page, release it."""
    node = Node(requests.Session(), app, base=site.url, name="suspect-pc")
    pdf_project(api, "papers")
    assert api.enqueue("papers", papers(1)).status_code in (200, 201)
    assert node.heartbeat().status_code == 200
    (job,) = node.claim("papers").json()["jobs"]
    data = files["good"]
    with streaming_upload(app, site.port, node, job, data) as sock:
        page.goto(f"{site.url}/admin/workers/node/{node.node_id}")
        page.check("#confirm-revoke")
        page.fill("#reason-revoke", "suspected of tampering")
        page.click("#do-revoke")
        assert "is now revoked" in flash(page)
        sock.sendall(data[4096:])
        status, _, _ = read_response(sock)
    assert status == 409

    row = page.locator("#workers-table tbody tr", has_text="suspect-pc")
    row.locator("a", has_text="1 held").click()
    held = page.locator("#held")
    assert "Held files (1," in held.locator("h2").inner_text()
    assert job["attempt_id"] in held.inner_text() and sha(data)[:16] in held.inner_text()
    shot(page, "worker-held")
    page.click("#do-release-held")  # without ticking the box: refused
    assert "Tick the box" in flash(page)
    assert spool_names(dirs) != []
    page.check("#confirm-release-held")
    page.click("#do-release-held")
    assert flash(page) == "Released 1 held file(s): deleted, quota freed."
    assert page.locator("#held").count() == 0
    assert spool_names(dirs) == []
