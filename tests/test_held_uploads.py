"""Unacknowledged files of revoked workers are held for an admin (DESIGN §8.7).

An upload still streaming when its worker is revoked, or a staged upload of a
revoked worker that outlives the staged retention, is kept — file and quota —
until an admin releases it from the CLI or the worker's page. Real
PostgreSQL, real HTTP for the transfers that must be cut half-way.
"""
from __future__ import annotations

import logging
import os

import pytest

from tests.fleet_helpers import decide
from tests.helpers import body, wait_for
from tests.support.pages import Pages, sign_in
from tests.support.cli import assert_cli_error, cli, cli_json
from tests.support.spool import age, sweep
from tests.support.uploads import (archive, attempt_row, execute, job_row, read_response, reserved, sha,
                                   spool_names, start, streaming_upload, token_worker_claims_a_paper,
                                   upload_rows)

# The spool and the object store under tmp_path, for every test here.
pytestmark = pytest.mark.usefixtures("dirs")

FAR_FUTURE = 10 * 365 * 86400  # seconds: the sweeper looks at files this much later


def worker_row(app, worker_id: str) -> dict:
    from app.extensions import db
    from app.fleet import listing
    with app.app_context():
        found = [w for w in listing.workers(60) if w["worker_id"] == worker_id]
        db.session.remove()
    assert len(found) == 1, found
    return found[0]


def revoke_mid_transfer(app, node, job, data, port, *, finish: bool):
    """Start an upload over a raw socket, revoke the node while bytes flow,
    then either send the rest (``finish``) or hang up half-way."""
    with streaming_upload(app, port, node, job, data) as sock:
        assert decide(app, node.node_id, "revoke") == "revoked"
        if not finish:
            return None
        sock.sendall(data[4096:])
        status, _, answer = read_response(sock)
    return status, answer


def test_upload_streaming_at_revocation_is_held_until_released(app, client, api, dirs, files,
                                                               live_server):
    node, (job,) = start(app, client, api)
    data = files["good"]
    status, answer = revoke_mid_transfer(app, node, job, data, live_server.port, finish=True)
    assert status == 409 and answer["error"]["code"] == "stale_attempt", answer

    # The finished file is kept, with its quota, under the attempt's name.
    kept = f"{job['attempt_id']}.1.pdf"
    assert spool_names(dirs) == [kept]
    assert (dirs.spool / kept).read_bytes() == data
    assert reserved(app) == len(data)
    (upload,) = upload_rows(app, job["attempt_id"])
    assert upload["state"] == "held" and upload["held_at"] is not None
    assert upload["spool_file"] == str(dirs.spool / kept)
    assert upload["error"] == {"code": "cancelled", "message": "worker revoked"}
    # The job went back to the queue as for any revocation.
    assert attempt_row(app, job["attempt_id"])["state"] == "cancelled"
    assert job_row(app, job["job_id"])["state"] == "todo"

    # Nothing archives or sweeps it, however old it gets.
    assert archive(app, job["attempt_id"]) == "skip"
    sweep(app, now=os.path.getmtime(dirs.spool / kept) + FAR_FUTURE)
    assert spool_names(dirs) == [kept] and reserved(app) == len(data)

    # Admins see it: the worker list, the receipt, the held listing.
    row = worker_row(app, node.node_id)
    assert (row["held_files"], row["held_bytes"]) == (1, len(data))
    response = client.get("/api/v1/admin/fleet/workers", headers=api.headers)
    assert response.status_code == 200
    listed = [w for w in body(response)["workers"] if w["worker_id"] == node.node_id]
    assert listed[0]["held_files"] == 1
    (held,) = cli_json(cli(app, "fleet", "held", "--worker", node.node_id))
    assert held["attempt_id"] == job["attempt_id"] and held["file_present"] is True
    assert held["sha256"] == sha(data) and held["size"] == len(data)

    # Released from the CLI: file deleted, quota freed, upload failed.
    (released,) = cli_json(cli(app, "fleet", "release-held", job["attempt_id"]))
    assert released == {"attempt_id": job["attempt_id"], "state": "failed"}
    assert spool_names(dirs) == [] and reserved(app) == 0
    (upload,) = upload_rows(app, job["attempt_id"])
    assert upload["state"] == "failed" and "released_at" in upload["error"]
    assert worker_row(app, node.node_id)["held_files"] == 0
    # Releasing twice, or an attempt that never uploaded, is a clear error.
    assert_cli_error(cli(app, "fleet", "release-held", job["attempt_id"]), "invalid_transition")
    assert_cli_error(cli(app, "fleet", "release-held", "999999999"), "not_found")
    assert cli(app, "fleet", "release-held").exit_code != 0  # neither ids nor --worker


def test_partial_file_of_a_revoked_worker_is_held_too(app, client, api, dirs, files, live_server):
    node, (job,) = start(app, client, api)
    data = files["big"]
    with streaming_upload(app, live_server.port, node, job, data):
        assert decide(app, node.node_id, "revoke") == "revoked"
        # While bytes may still come, the quota is in use: no release yet.
        result = cli(app, "fleet", "release-held", job["attempt_id"])
        assert_cli_error(result, "invalid_transition")
        assert "may still be streaming" in result.output + (result.stderr or "")
        assert reserved(app) == len(data)
    # The master notices the hang-up, finds the upload held and keeps the part file.
    part = dirs.spool / f"{job['attempt_id']}.1.part"
    wait_for(lambda: (upload_rows(app, job["attempt_id"])[0]["spool_file"] or "") == str(part))
    assert part.exists() and 4096 <= part.stat().st_size < len(data)
    age(part, FAR_FUTURE / 2)
    sweep(app)
    assert part.exists() and reserved(app) == len(data)

    (released,) = cli_json(cli(app, "fleet", "release-held", "--worker", node.node_id))
    assert released["attempt_id"] == job["attempt_id"]
    assert spool_names(dirs) == [] and reserved(app) == 0


def test_held_upload_that_left_no_file_is_released_by_the_sweeper(app, client, api, dirs, files,
                                                                  live_server):
    node, (job,) = start(app, client, api)
    with streaming_upload(app, live_server.port, node, job, files["big"]):
        pass
    # The transfer broke off (its part file removed) before the revocation.
    wait_for(lambda: spool_names(dirs) == [])
    assert decide(app, node.node_id, "revoke") == "revoked"
    assert upload_rows(app, job["attempt_id"])[0]["state"] == "held"
    assert sweep(app)["held_released"] == 0  # the upload budget is not over yet
    execute(app, "UPDATE uploads SET upload_deadline_at = now() - interval '1 day' WHERE attempt_id = :a",
            a=int(job["attempt_id"]))
    assert sweep(app)["held_released"] == 1
    assert upload_rows(app, job["attempt_id"])[0]["state"] == "failed"
    assert reserved(app) == 0


def test_staged_upload_of_a_revoked_worker_still_archives(app, client, api, dirs, files):
    node, (job,) = start(app, client, api)
    assert node.upload(job["attempt_id"], files["good"]).status_code == 202
    assert decide(app, node.node_id, "revoke") == "revoked"
    assert archive(app, job["attempt_id"]) == "done"
    assert worker_row(app, node.node_id)["held_files"] == 0


def test_staged_upload_of_a_revoked_worker_outliving_the_retention_is_held(
        app, client, api, dirs, files):
    revoked_node, (kept,) = start(app, client, api)
    good_node, (failed,) = start(app, client, api, project="more")
    good, other = files["good"], files["other"]
    assert revoked_node.upload(kept["attempt_id"], good).status_code == 202
    assert good_node.upload(failed["attempt_id"], other).status_code == 202
    assert decide(app, revoked_node.node_id, "revoke") == "revoked"
    execute(app, "UPDATE uploads SET staged_at = now() - make_interval(secs => :s)",
            s=app.config["STAGED_RETENTION_S"] + 60)

    assert sweep(app)["expired"] == 2
    # Both jobs fail; only the healthy worker's file goes, with its quota.
    assert job_row(app, kept["job_id"])["state"] == "failed"
    assert job_row(app, failed["job_id"])["state"] == "failed"
    assert upload_rows(app, kept["attempt_id"])[0]["state"] == "held"
    assert upload_rows(app, failed["attempt_id"])[0]["state"] == "failed"
    assert spool_names(dirs) == [f"{kept['attempt_id']}.1.pdf"]
    assert reserved(app) == len(good)
    (held,) = cli_json(cli(app, "fleet", "held"))
    assert held["attempt_id"] == kept["attempt_id"]
    assert held["error"]["code"] == "storage_unavailable"


def test_token_worker_revocation_holds_its_upload(app, client, api, dirs, files, make_user,
                                                  live_server):
    worker, job = token_worker_claims_a_paper(client, api, make_user("held-user", ["worker"]),
                                              "laptop")
    headers = worker.headers
    data = files["good"]
    with streaming_upload(app, live_server.port, None, job, data, headers=headers) as sock:
        revoked = cli(app, "fleet", "worker", "revoke", "laptop", "--user", "held-user", "--keep-token")
        assert revoked.exit_code == 0, revoked.output
        sock.sendall(data[4096:])
        status, _, _ = read_response(sock)
    assert status == 409
    assert upload_rows(app, job["attempt_id"])[0]["state"] == "held"
    row = worker_row(app, "laptop")
    assert (row["user_id"], row["held_files"]) == ("held-user", 1)
    # The user's own receipt says so (the worker program then drops its entry).
    receipt = client.get(f"/api/v1/fleet/receipts/{job['attempt_id']}", headers=headers)
    assert body(receipt)["state"] == "held"
    released = cli_json(cli(app, "fleet", "release-held", "--worker", "laptop", "--user", "held-user"))
    assert [r["attempt_id"] for r in released] == [job["attempt_id"]]
    assert spool_names(dirs) == []


def test_admin_releases_held_files_from_the_workers_page(app, client, api, dirs, files,
                                                         live_server, caplog):
    caplog.set_level(logging.INFO, logger="app.uploads.held")
    node, (job,) = start(app, client, api)
    revoke_mid_transfer(app, node, job, files["good"], live_server.port, finish=True)
    sign_in(app, client)
    pages = Pages(client, "page-admin")
    assert "1 held" in pages.text("/admin/workers")
    page = pages.text(f"/admin/workers/node/{node.node_id}")
    assert 'id="held"' in page and job["attempt_id"] in page and 'id="do-release-held"' in page

    # The file can be downloaded for investigation: an attachment, never rendered.
    download = pages.get(f"/admin/workers/held/{job['attempt_id']}/file")
    assert download.status_code == 200 and download.data == files["good"]
    assert download.headers["Content-Type"] == "application/octet-stream"
    assert download.headers["Content-Disposition"].startswith("attachment;")
    assert pages.get("/admin/workers/held/999999/file").status_code == 404

    url = f"/admin/workers/node/{node.node_id}/held/release"
    message, _ = pages.act(url, {}, expect="error")
    assert "Tick the box" in message
    assert spool_names(dirs) != []
    message, page = pages.act(url, {"confirm": "yes"})
    assert message == "Released 1 held file(s): deleted, quota freed."
    assert 'id="held"' not in page
    assert spool_names(dirs) == [] and reserved(app) == 0
    assert upload_rows(app, job["attempt_id"])[0]["state"] == "failed"
    assert pages.get(f"/admin/workers/held/{job['attempt_id']}/file").status_code == 404
    assert [r.released_by for r in caplog.records if r.getMessage() == "held upload released"] \
        == ["page-admin"]


def test_only_signed_in_admins_release_held_files(app, client, api, dirs, files, live_server):
    node, (job,) = start(app, client, api)
    revoke_mid_transfer(app, node, job, files["good"], live_server.port, finish=True)
    url = f"/admin/workers/node/{node.node_id}/held/release"
    # A machine token (even an admin's) or another node's secret is no session.
    other, _ = start(app, client, api, project="more")
    for headers in (api.headers, other.headers):
        response = client.post(url, headers=headers, data={"confirm": "yes"})
        assert response.status_code == 400, response.status_code  # no session, no CSRF token
    # A signed-in user without the admin role, with a valid CSRF token.
    sign_in(app, client, "plain-worker", roles=("worker",))
    token = client.get("/worker").get_data(as_text=True).split('name="csrf_token" value="')[1].split('"')[0]
    response = client.post(url, data={"confirm": "yes", "csrf_token": token})
    assert response.status_code == 403, response.status_code
    assert client.get(f"/admin/workers/held/{job['attempt_id']}/file").status_code == 403
    assert upload_rows(app, job["attempt_id"])[0]["state"] == "held"
    assert spool_names(dirs) != []


def test_held_listing_stops_at_500_rows_and_release_goes_past_it(app, client, api, dirs):
    # DESIGN §12: admin snapshots are at most 500 rows. 501 held uploads of one
    # (revoked) node, made directly: no file, their transfers long over.
    execute(app, """
        INSERT INTO uploads (attempt_id, job_id, project_id, worker_id, state, sha256, size,
                             reserved_bytes, held_at, upload_deadline_at)
        SELECT 900000 + i, 900000 + i, 'papers', 'gone-node-0123456789', 'held', repeat('a', 64),
               1000, 1000, now(), now() - interval '1 hour'
        FROM generate_series(1, 501) AS i""")
    execute(app, "INSERT INTO spool_usage (id, reserved_bytes) VALUES (1, 501000) "
                 "ON CONFLICT (id) DO UPDATE SET reserved_bytes = 501000")
    listed = cli_json(cli(app, "fleet", "held", "--worker", "gone-node-0123456789"))
    assert len(listed) == 500 and listed[0]["attempt_id"] == "900001"

    released = cli_json(cli(app, "fleet", "release-held", "--worker", "gone-node-0123456789"))
    assert len(released) == 501
    assert reserved(app) == 0
    assert cli_json(cli(app, "fleet", "held")) == []
