"""The SavewebHQ page rows of the parity table (issue "Pages an operator
lives in" §5): delete a project (D13) and a user (D18) from the web, create
a project with every policy field in one form (D8), enqueue a JSON array
(D11), the job page's worker link and archived file (D14), times as UNIX
seconds with UTC (D21) and the claim order column (D7). SavewebHQ's OAuth
paths (D3) are walked in test_auth_pages.py."""
from __future__ import annotations

import hashlib
import json
import re

import requests

from tests import scans
from tests.fleet_helpers import Node, papers, pdf_project
from tests.helpers import Api, body, sql, values
from tests.support.pages import Pages, sign_in
from tests.support.uploads import archive

import pytest


@pytest.fixture
def pages(app, client):
    sign_in(app, client)
    return Pages(client, "page-admin")


def test_create_a_project_with_every_policy_field_in_one_form(pages, app):
    pages.act("/admin/projects", {
        "id": "full", "kind": "pdf", "identity_mode": "unique_value", "client_versions": "1.0\n",
        "claim_order": "random", "dispatch_qps": "2.5", "max_jobs_per_claim": "16", "max_resets": "7",
        "recommended_lease_seconds": "120", "max_in_flight": "40", "max_worker_attempts": "3",
        "task_timeout_seconds": "", "prefer_new_worker": "no", "fallback_after_seconds": "90"})
    (row,) = sql(app, "SELECT kind, claim_order, dispatch_qps, max_jobs_per_claim, max_resets, "
                      "recommended_lease_seconds, max_in_flight, max_worker_attempts, prefer_new_worker, "
                      "fallback_after_seconds, client_versions, retry_backoff_seconds FROM projects "
                      "WHERE id = 'full'")
    # Filled fields as typed; empty ones take the pdf kind's defaults.
    assert tuple(row) == ("pdf", "random", 2.5, 16, 7, 120, 40, 3, False, 90, ["1.0"], 30)
    listing = pages.text("/admin/projects")
    assert re.search(r'>full</a></td>\s*<td>pdf</td><td>unique_value</td><td>random</td>', listing)
    assert 'id="new-max_in_flight"' in listing and 'id="new-prefer_new_worker"' in listing
    message, _ = pages.act("/admin/projects", {"id": "bad", "kind": "generic", "identity_mode": "none",
                                               "max_resets": "many"}, expect="error")
    assert "max_resets must be a whole number" in message
    assert sql(app, "SELECT count(*) FROM projects WHERE id = 'bad'")[0][0] == 0


def test_delete_a_project_and_a_user_from_the_web(pages, app, client, admin_token, make_user):
    api = Api(client, admin_token)
    api.put_project("gone")
    api.enqueue("gone", values(3))
    message, _ = pages.act("/admin/projects/gone/delete", {}, expect="error")
    assert "Tick the box" in message and sql(app, "SELECT count(*) FROM jobs")[0][0] == 3
    claimed = body(api.claim("gone", max_jobs=1))["jobs"]
    message, _ = pages.act("/admin/projects/gone/delete", {"confirm": "yes"}, expect="error")
    assert "in flight" in message
    api.put_project("other")
    api.complete("gone", claimed)
    message, page = pages.act("/admin/projects/gone/delete", {"confirm": "yes"})
    assert message == "Project gone and its jobs deleted." and "<h1>Projects</h1>" in page
    assert sql(app, "SELECT count(*) FROM jobs")[0][0] == 0
    assert sql(app, "SELECT action FROM audit_log WHERE object_id = 'gone' ORDER BY id")[-1][0] == "project.delete"

    token = make_user("leaver", ["worker"])
    message, _ = pages.act("/admin/users/leaver/delete", {}, expect="error")
    assert "Tick the confirmation box" in message
    pages.act("/admin/users/leaver/delete", {"confirm": "yes"})
    assert sql(app, "SELECT count(*) FROM users WHERE id = 'leaver'")[0][0] == 0
    assert Api(client, token).claim("other").status_code == 401  # its token went with it
    message, _ = pages.act("/admin/users/page-admin/delete", {"confirm": "yes"}, expect="error")
    assert "cannot delete yourself" in message


def test_enqueue_a_json_array_as_savewebhq_does(pages, app, client, admin_token):
    Api(client, admin_token).put_project("arr")
    jobs = [{"id": f"a{n}", "value": f"https://example.org/{n}", "type": "seed"} for n in range(3)]
    message, _ = pages.act("/admin/projects/arr/enqueue/json", {"jobs": json.dumps(jobs)})
    assert message == "3 jobs submitted: 3 new."
    for bad, said in ((json.dumps({"id": "x"}), "JSON array of 1 to 256"), ("[]", "JSON array of 1 to 256"),
                      (json.dumps([{"id": str(n), "value": "v"} for n in range(257)]), "1 to 256"),
                      ('[{"id": "z", "value": 5}]', "job 0:"), ("[", "not valid JSON")):
        message, _ = pages.act("/admin/projects/arr/enqueue/json", {"jobs": bad}, expect="error")
        assert said in message, (bad[:40], message)
    assert sql(app, "SELECT count(*) FROM jobs")[0][0] == 3


def test_job_page_links_the_worker_and_opens_the_archived_file(pages, app, client, admin_token,
                                                                dirs, tmp_path, live_server):  # noqa: F811
    api = Api(client, admin_token)
    pdf_project(api, "papers")
    api.enqueue("papers", papers(1))
    node = Node(client, app, name="fetcher-1")
    assert node.heartbeat().status_code == 200
    (job,) = body(node.claim("papers"))["jobs"]
    scan = scans.scanned_pdf(tmp_path / "s.pdf", [["lantern falcon"], ["orchid sailor"]]).read_bytes()
    assert node.upload(job["attempt_id"], scan).status_code == 202
    assert archive(app, job["attempt_id"]) == "done"
    page = pages.text(f"/admin/jobs/{job['job_id']}")
    assert f'href="/admin/workers/node/{node.node_id}" id="job-worker"' in page
    link = re.search(rf'href="(/admin/jobs/{job["job_id"]}/file/{job["attempt_id"]})"', page).group(1)
    opened = pages.get(link)
    assert opened.status_code == 303
    target = opened.headers["Location"]
    assert target.startswith("/api/v1/assets/") and "sig=" in target
    got = requests.get(live_server.url + target, timeout=10)  # the store, not this page, serves it
    assert got.status_code == 200 and hashlib.sha256(got.content).hexdigest() == hashlib.sha256(scan).hexdigest()
    assert pages.get(f"/admin/jobs/{job['job_id']}/file/999").status_code == 404
    # Times: UTC (the viewer's zone once local-time.js runs), the UNIX seconds on hover.
    assert re.search(r'<th>created</th><td><time datetime="[0-9T:-]+Z" title="[^"]+ UTC · \d{10}" '
                     r'data-local="text">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</time></td>', page)
