"""Uploads of pdf attempts (DESIGN §7 "Uploads", §8): admit, verify, stage,
archive, receipts.

Real PostgreSQL, the local object store and the spool both under tmp_path, real
HTTP (the ``live_server`` fixture) wherever the transfer itself matters: a body
that never comes, a dropped connection, two clients racing.
"""
from __future__ import annotations

import base64
import json
import os
import socket
import stat
import threading
import time

import pytest
import requests

from tests.fleet_helpers import Node, decide
from tests.helpers import Api, body, values, wait_for
from tests.helpers import db_rows as rows
from tests.support.uploads import (_age_lease, _reap, archive, assert_receipt, attempt_row, error_of, execute,
                                   job_row, object_path, one, read_response, reserved, sha, spool_names,
                                   start, streaming_upload, token_worker_claims_a_paper, upload_head,
                                   upload_rows)


# ----------------------------------------------------------------- fixtures


@pytest.fixture
def api(client, admin_token, dirs):
    return Api(client, admin_token)


# ------------------------------------------------------------------ helpers


# --------------------------------------------------------------- happy path

def test_upload_stages_then_archive_makes_it_done(app, client, api, dirs, files, hints):
    node, (job,) = start(app, client, api)
    data, digest = files["good"], sha(files["good"])

    response = node.upload(job["attempt_id"], data)
    assert response.status_code == 202, body(response)
    first = body(response)
    assert_receipt(first, job_id=job["job_id"], attempt_id=job["attempt_id"], state="staged",
                   digest=digest, size=len(data))
    assert first["asset_key"] is None and first["error"] is None

    # Staged: job, attempt and upload agree; the file is durable in the spool.
    assert job_row(app, job["job_id"])["state"] == "staged"
    assert attempt_row(app, job["attempt_id"])["state"] == "staged"
    (upload,) = upload_rows(app, job["attempt_id"])
    assert upload["state"] == "staged" and upload["generation"] == 1
    assert spool_names(dirs) == [f"{job['attempt_id']}.1.pdf"]
    spooled = dirs.spool / f"{job['attempt_id']}.1.pdf"
    assert upload["spool_file"] == str(spooled)
    assert spooled.read_bytes() == data
    assert stat.S_IMODE(spooled.stat().st_mode) == 0o600
    assert reserved(app) == len(data)
    assert ("archive_commit", int(job["attempt_id"])) in hints

    # The same file again before the archive: the same receipt.
    again = node.upload(job["attempt_id"], data)
    assert again.status_code == 202, body(again)
    assert body(again) == first
    # A different file for the same attempt: refused, whatever differs.
    other = files["other"]
    assert node.upload(job["attempt_id"], other).status_code == 409
    assert node.upload(job["attempt_id"], other, sha256=digest).status_code == 409
    assert len(upload_rows(app, job["attempt_id"])) == 1

    assert archive(app, job["attempt_id"]) == "done"
    key = f"sha256/{digest[:2]}/{digest[2:4]}/{digest}.pdf"
    assert object_path(dirs, digest).read_bytes() == data
    assert spool_names(dirs) == []
    assert job_row(app, job["job_id"])["state"] == "done"
    assert attempt_row(app, job["attempt_id"])["state"] == "done"
    assert reserved(app) == 0
    asset = one(app, "SELECT * FROM assets")
    assert (asset["sha256"], asset["size"], asset["object_key"]) == (digest, len(data), key)
    assert asset["attempt_id"] == int(job["attempt_id"])

    done = node.receipt(job["attempt_id"])
    assert done.status_code == 200
    assert_receipt(body(done), job_id=job["job_id"], attempt_id=job["attempt_id"], state="done",
                   digest=digest, size=len(data))
    assert body(done)["asset_key"] == key and body(done)["error"] is None
    # After done: the same file answers 200 done; a different one 409.
    replay = node.upload(job["attempt_id"], data)
    assert replay.status_code == 200, body(replay)
    assert body(replay) == body(done)
    assert node.upload(job["attempt_id"], other).status_code == 409
    # A second commit of the same attempt changes nothing.
    assert archive(app, job["attempt_id"]) == "skip"
    assert len(rows(app, "SELECT 1 FROM assets")) == 1


def test_upload_metadata_headers_are_stored(app, client, api, dirs, files):
    node, (job,) = start(app, client, api)
    result = {"status": 200, "final_url": "https://example.org/paper.pdf", "hops": ["a", "b"]}
    encoded = base64.urlsafe_b64encode(json.dumps(result).encode()).rstrip(b"=").decode()
    response = node.upload(job["attempt_id"], files["good"], headers={
        "X-Source-URL": "https://example.org/paper.pdf", "X-Download-Strategy": "browser",
        "X-Download-Result": encoded})
    assert response.status_code == 202, body(response)
    (upload,) = upload_rows(app, job["attempt_id"])
    assert upload["download_result"] == result
    assert upload["source_url"] == "https://example.org/paper.pdf"
    assert upload["download_strategy"] == "browser"


def test_download_result_of_exactly_16_kib_is_accepted(app, client, api, dirs, files):
    node, (job,) = start(app, client, api)
    raw = b'{"x": "' + b"a" * (16 * 1024 - 10) + b'"}'
    assert len(raw) == 16 * 1024 - 1
    raw += b" "
    encoded = base64.urlsafe_b64encode(raw).decode()
    response = node.upload(job["attempt_id"], files["good"], headers={"X-Download-Result": encoded})
    assert response.status_code == 202, body(response)
    assert upload_rows(app, job["attempt_id"])[0]["download_result"] == {"x": "a" * (16 * 1024 - 10)}


@pytest.mark.parametrize("value", [
    "%%%not base64%%%",
    base64.urlsafe_b64encode(b"not json at all").decode(),
    base64.urlsafe_b64encode(b"[1, 2, 3]").decode(),
    base64.urlsafe_b64encode(json.dumps({"x": "a" * (16 * 1024)}).encode()).decode(),
], ids=["not-base64", "not-json", "not-an-object", "over-16-KiB"])
def test_bad_download_result_is_400_and_changes_nothing(app, client, api, dirs, files, value):
    node, (job,) = start(app, client, api)
    response = node.upload(job["attempt_id"], files["good"], headers={"X-Download-Result": value})
    assert response.status_code == 400, body(response)
    assert error_of(response)["code"] == "invalid_request"
    assert error_of(response)["details"] == {"field": "X-Download-Result"}
    assert upload_rows(app, job["attempt_id"]) == []
    assert attempt_row(app, job["attempt_id"])["state"] == "running"
    assert spool_names(dirs) == [] and reserved(app) == 0
    assert node.upload(job["attempt_id"], files["good"]).status_code == 202


# --------------------------------------------------------- permanent problems

def _bad(files, kind):
    good = files["good"]
    if kind == "hash_mismatch":      # the header names another file's hash
        return good, sha(files["other"]), {"hash_mismatch"}
    if kind == "not_pdf":
        return files["html"], None, {"not_pdf"}
    if kind == "unparseable":        # cut in half, %%EOF forged: only the parse can tell
        return files["truncated"], None, {"unparseable"}
    if kind == "too_small":
        return files["tiny"], None, {"too_small"}
    if kind == "spinning":           # a deflate bomb: counted, refused before anything buffers it
        return files["spinning"], None, {"too_inflated"}
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["hash_mismatch", "not_pdf", "unparseable", "too_small", "spinning"])
def test_permanent_problem_is_422_and_the_job_goes_back_to_todo(app, client, api, dirs, files, kind):
    node, (job,) = start(app, client, api)
    data, digest, reasons = _bad(files, kind)
    assert len(data) < 10 * 1024 if kind == "too_small" else len(data) >= 10 * 1024
    started = time.monotonic()
    response = node.upload(job["attempt_id"], data, sha256=digest)
    assert time.monotonic() - started < 60  # bounded: the parse limits apply
    assert response.status_code == 422, body(response)
    err = error_of(response)
    assert err["code"] == "invalid_upload"
    assert err["retryable"] is False
    assert err["details"]["reason"] in reasons, err
    # The parser's message, without the master's file or spool paths.
    assert str(dirs.spool) not in err["message"] and ".part" not in err["message"], err

    # The attempt failed retryably: the job is back in the queue for another try.
    after = job_row(app, job["job_id"])
    assert after["state"] == "todo", after
    assert after["resets"] == 1
    assert after["last_error"]["reason"] in reasons
    assert str(dirs.spool) not in json.dumps(after["last_error"])
    attempt = attempt_row(app, job["attempt_id"])
    assert attempt["state"] == "failed"
    assert attempt["error"]["retryable"] is True
    # Nothing left in the spool, nothing reserved.
    assert spool_names(dirs) == []
    assert reserved(app) == 0
    # A permanent answer: the same attempt cannot upload again.
    assert node.upload(job["attempt_id"], files["good"]).status_code == 409


def test_rejected_upload_receipt_is_failed_with_the_reason(app, client, api, dirs, files):
    node, (job,) = start(app, client, api)
    assert node.upload(job["attempt_id"], files["html"]).status_code == 422
    receipt = node.receipt(job["attempt_id"])
    assert receipt.status_code == 200
    data = body(receipt)
    assert_receipt(data, job_id=job["job_id"], attempt_id=job["attempt_id"], state="failed",
                   digest=sha(files["html"]), size=len(files["html"]))
    assert data["asset_key"] is None
    assert data["error"]["reason"] == "not_pdf"
    assert upload_rows(app, job["attempt_id"])[0]["state"] == "failed"


def test_size_header_differing_from_content_length_is_400_before_anything(app, client, api, dirs,
                                                                           files):
    node, (job,) = start(app, client, api)
    data = files["good"]
    response = node.upload(job["attempt_id"], data, size=len(data) + 1)
    assert response.status_code == 400, body(response)
    assert error_of(response)["details"] == {"field": "Content-Length"}
    # Refused on the headers: nothing changed, the attempt can still upload.
    assert upload_rows(app, job["attempt_id"]) == []
    assert attempt_row(app, job["attempt_id"])["state"] == "running"
    assert job_row(app, job["job_id"])["state"] == "wip"
    assert spool_names(dirs) == [] and reserved(app) == 0
    assert node.upload(job["attempt_id"], data).status_code == 202


@pytest.mark.parametrize("header", [
    {"X-PDF-SHA256": "abc"},
    {"X-PDF-SHA256": "g" * 64},
    {"X-PDF-Size": "-5"},
    {"X-PDF-Size": "12e4"},
], ids=["short-sha", "non-hex-sha", "negative-size", "not-decimal-size"])
def test_malformed_upload_headers_are_400(app, client, api, dirs, files, header):
    node, (job,) = start(app, client, api)
    response = node.upload(job["attempt_id"], files["good"], headers=header)
    assert response.status_code == 400, body(response)
    assert error_of(response)["details"]["field"] in header
    assert upload_rows(app, job["attempt_id"]) == []


def test_body_shorter_than_declared_is_not_staged_and_can_be_retried(app, client, api, dirs, files,
                                                                     live_server):
    """The client promises N bytes, sends fewer and closes its side: the
    transfer failed (not the file), nothing is staged, the spool holds no
    leftover, and the same attempt can upload the whole file afterwards."""
    node, (job,) = start(app, client, api)
    data = files["good"]
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=30) as sock:
        sock.sendall(upload_head(live_server.port, node, job["attempt_id"], sha(data), len(data)))
        sock.sendall(data[:-1000])
        sock.shutdown(socket.SHUT_WR)
        status, _, answer = read_response(sock)
    assert 400 <= status < 500 and status != 422, (status, answer)
    assert answer["error"]["retryable"] is True, answer
    assert all(u["state"] == "uploading" for u in upload_rows(app, job["attempt_id"]))
    assert job_row(app, job["job_id"])["state"] == "wip"
    assert spool_names(dirs) == []  # the partial file is removed before the answer
    assert reserved(app) == 0, "an upload that ended early gives its spool reservation back at once"
    assert str(dirs.spool) not in json.dumps(answer)

    retry = node.upload(job["attempt_id"], data)
    assert retry.status_code == 202, body(retry)
    (upload,) = upload_rows(app, job["attempt_id"])
    assert upload["state"] == "staged" and upload["generation"] == 2
    assert spool_names(dirs) == [f"{job['attempt_id']}.2.pdf"]
    assert reserved(app) == len(data)


def test_declared_200_mib_is_refused_before_the_body_is_read(app, client, api, dirs, files,
                                                             live_server):
    node, (job,) = start(app, client, api)
    size = 200 * 1024 * 1024
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=30) as sock:
        # Only the headers: not one byte of the body is ever sent.
        sock.sendall(upload_head(live_server.port, node, job["attempt_id"], "ab" * 32, size))
        status, _, answer = read_response(sock)
    assert status == 413, answer
    assert answer["error"]["code"] == "too_large"
    assert answer["error"]["details"] == {"limit": 100 * 1024 * 1024}
    assert upload_rows(app, job["attempt_id"]) == []
    assert attempt_row(app, job["attempt_id"])["state"] == "running"
    assert spool_names(dirs) == [] and reserved(app) == 0


def test_content_length_over_the_limit_is_413_even_with_a_small_size_header(app, client, api, dirs,
                                                                            live_server):
    node, (job,) = start(app, client, api)
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=30) as sock:
        sock.sendall(upload_head(live_server.port, node, job["attempt_id"], "ab" * 32, 64 * 1024,
                                 content_length=200 * 1024 * 1024))
        status, _, answer = read_response(sock)
    assert status == 413, answer
    assert upload_rows(app, job["attempt_id"]) == []


# -------------------------------------------------- stale and foreign attempts

def test_another_node_cannot_upload_my_attempt(app, client, api, dirs, files):
    mine, (job,) = start(app, client, api)
    other = Node(client, app, name="other")
    assert other.heartbeat().status_code == 200
    response = other.upload(job["attempt_id"], files["good"])
    assert response.status_code == 409, body(response)
    assert error_of(response)["code"] == "stale_attempt"
    assert upload_rows(app, job["attempt_id"]) == []
    assert mine.upload(job["attempt_id"], files["good"]).status_code == 202


def test_unknown_attempts_are_refused(app, client, api, dirs, files):
    node, _ = start(app, client, api)
    assert node.upload("987654", files["good"]).status_code == 409
    assert node.upload("not-a-number", files["good"]).status_code == 404
    assert spool_names(dirs) == []


def test_an_attempt_of_a_generic_project_cannot_upload(app, client, api, dirs, files):
    api.put_project("generic")
    assert api.enqueue("generic", values(1)).status_code in (200, 201)
    node = Node(client, app)
    response = node.claim("generic")
    assert response.status_code == 200, body(response)
    (job,) = body(response)["jobs"]
    upload = node.upload(job["attempt_id"], files["good"])
    assert upload.status_code == 409, body(upload)
    assert upload_rows(app, job["attempt_id"]) == []
    assert spool_names(dirs) == [] and reserved(app) == 0


def test_revoked_node_gets_401_but_its_staged_upload_still_finishes(app, client, api, dirs, files):
    node, (staged, running) = start(app, client, api, n=2)
    assert node.upload(staged["attempt_id"], files["good"]).status_code == 202
    assert decide(app, node.node_id, "revoke") == "revoked"

    response = node.upload(running["attempt_id"], files["other"])
    assert response.status_code == 401, body(response)
    assert error_of(response)["code"] == "invalid_machine_token"
    assert node.receipt(staged["attempt_id"]).status_code == 401
    # Revocation cancelled the running attempt and requeued its job...
    assert attempt_row(app, running["attempt_id"])["state"] == "cancelled"
    assert job_row(app, running["job_id"])["state"] == "todo"
    # ...while the already staged upload still archives.
    assert archive(app, staged["attempt_id"]) == "done"
    assert job_row(app, staged["job_id"])["state"] == "done"


def test_draining_node_still_uploads(app, client, api, dirs, files):
    node, (job,) = start(app, client, api)
    assert decide(app, node.node_id, "drain") == "draining"
    response = node.upload(job["attempt_id"], files["good"])
    assert response.status_code == 202, body(response)


def test_pending_node_cannot_upload(app, client, api, dirs, files):
    _, (job,) = start(app, client, api)
    pending = Node(client, app, approve=False)
    response = pending.upload(job["attempt_id"], files["good"])
    assert response.status_code == 403, body(response)


def test_token_worker_uploads_its_own_attempt(app, client, api, dirs, files, make_user):
    """Token workers (user machine token + worker id) claim pdf jobs too
    (issue 3: "only approved nodes (and token workers of active users)
    claim"), so they must be able to upload what they claimed; another user
    cannot."""
    worker, job = token_worker_claims_a_paper(client, api, make_user("alice", ["worker"]), "alice-box")
    data = files["good"]
    upload_headers = {"X-PDF-SHA256": sha(data), "X-PDF-Size": str(len(data)),
                      "Content-Type": "application/pdf"}

    stranger = Api(client, make_user("bob", ["worker"]))
    refused = stranger.client.put(f"/api/v1/fleet/uploads/{job['attempt_id']}", data=data,
                                  headers={**stranger.headers, **upload_headers})
    assert refused.status_code == 409, body(refused)

    response = worker.client.put(f"/api/v1/fleet/uploads/{job['attempt_id']}", data=data,
                                 headers={**worker.headers, **upload_headers})
    assert response.status_code == 202, body(response)
    assert body(response)["state"] == "staged"
    receipt = worker.call("GET", f"/api/v1/fleet/receipts/{job['attempt_id']}")
    assert receipt.status_code == 200 and body(receipt)["state"] == "staged"


# ---------------------------------------------------------------- late uploads


def test_late_upload_after_the_lease_ran_out_is_accepted(app, client, api, dirs, files):
    node, (job,) = start(app, client, api)
    _age_lease(app, job)
    response = node.upload(job["attempt_id"], files["good"])
    assert response.status_code == 202, body(response)
    assert body(response)["state"] == "staged"
    assert job_row(app, job["job_id"])["state"] == "staged"
    assert attempt_row(app, job["attempt_id"])["state"] == "staged"


def test_late_upload_after_the_job_was_reaped_is_accepted(app, client, api, dirs, files):
    node, (job,) = start(app, client, api)
    _age_lease(app, job)
    assert _reap(app)["expired"] == 1
    assert job_row(app, job["job_id"])["state"] == "todo"
    assert attempt_row(app, job["attempt_id"])["state"] == "expired"

    response = node.upload(job["attempt_id"], files["good"])
    assert response.status_code == 202, body(response)
    after = job_row(app, job["job_id"])
    assert after["state"] == "staged" and after["current_attempt_id"] == int(job["attempt_id"])
    assert archive(app, job["attempt_id"]) == "done"
    assert job_row(app, job["job_id"])["state"] == "done"


def test_late_upload_wins_over_a_newer_attempt(app, client, api, dirs, files):
    first, (job,) = start(app, client, api, retry_backoff_seconds=0)
    _age_lease(app, job)
    second = Node(client, app, name="second")
    assert second.heartbeat().status_code == 200
    response = second.claim("papers")
    assert response.status_code == 200, body(response)
    (retry,) = body(response)["jobs"]
    assert retry["job_id"] == job["job_id"] and retry["attempt_id"] != job["attempt_id"]

    late = first.upload(job["attempt_id"], files["good"])
    assert late.status_code == 202, body(late)
    assert attempt_row(app, retry["attempt_id"])["state"] == "cancelled"
    assert attempt_row(app, job["attempt_id"])["state"] == "staged"
    after = job_row(app, job["job_id"])
    assert after["state"] == "staged" and after["current_attempt_id"] == int(job["attempt_id"])

    # The newer attempt has lost: its upload is stale, its lease is not renewed.
    assert second.upload(retry["attempt_id"], files["other"]).status_code == 409
    beat = second.heartbeat(running=[retry["attempt_id"]])
    assert beat.status_code == 200
    assert retry["attempt_id"] not in body(beat)["lease_expires"]
    assert archive(app, job["attempt_id"]) == "done"
    assert reserved(app) == 0


def test_late_upload_wins_over_a_newer_attempt_that_is_uploading(app, client, api, dirs, files,
                                                                 live_server):
    first, (job,) = start(app, client, api, retry_backoff_seconds=0)
    _age_lease(app, job)
    second = Node(client, app, name="second")
    assert second.heartbeat().status_code == 200
    (retry,) = body(second.claim("papers"))["jobs"]
    other = files["other"]
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=60) as sock:
        sock.sendall(upload_head(live_server.port, second, retry["attempt_id"], sha(other), len(other)))
        sock.sendall(other[:1000])
        wait_for(lambda: [u["state"] for u in upload_rows(app, retry["attempt_id"])] == ["uploading"])
        assert reserved(app) == len(other)

        late = first.upload(job["attempt_id"], files["good"])
        assert late.status_code == 202, body(late)
        # The newer upload failed and gave its reservation back.
        assert upload_rows(app, retry["attempt_id"])[0]["state"] == "failed"
        assert reserved(app) == len(files["good"])

        sock.sendall(other[1000:])
        status, _, answer = read_response(sock)
    assert status == 409, answer
    assert upload_rows(app, retry["attempt_id"])[0]["state"] == "failed"
    assert spool_names(dirs) == [f"{job['attempt_id']}.1.pdf"]
    assert reserved(app) == len(files["good"])


def test_late_upload_after_the_task_deadline_is_stale(app, client, api, dirs, files):
    node, (job,) = start(app, client, api)
    _age_lease(app, job)
    execute(app, "UPDATE jobs SET deadline_at = now() - interval '1 second' WHERE id = :j",
            j=int(job["job_id"]))
    response = node.upload(job["attempt_id"], files["good"])
    assert response.status_code == 409, body(response)
    assert upload_rows(app, job["attempt_id"]) == []
    assert reserved(app) == 0


# ------------------------------------------------------------ real transfers

def test_an_upload_superseded_while_it_is_verified_is_stale_not_a_bad_file(
        app, client, api, dirs, files, live_server, monkeypatch):
    """A worker retries an upload while the master still verifies the first
    transfer: the retry's admission drops the first transfer's file. The
    retry wins, and the first transfer ends as stale_attempt (409), never as
    a bad PDF with the spool path in its message: losing its file to a newer
    upload is no fault of the file."""
    from workers.wire import pdfcheck
    node, (job,) = start(app, client, api)
    data = files["big"]
    url = f"{live_server.url}/api/v1/fleet/uploads/{job['attempt_id']}"
    headers = {**node.headers, "X-PDF-SHA256": sha(data), "X-PDF-Size": str(len(data)),
               "Content-Type": "application/pdf"}
    parse, retried = pdfcheck._parse_in_child, {}

    def retry_during_the_first_parse(path, limits):
        if not retried:  # the first transfer's parse (the retry's own parse comes here too)
            retried["answer"] = None
            retried["answer"] = requests.put(url, data=data, headers=headers, timeout=60)
        return parse(path, limits)

    monkeypatch.setattr(pdfcheck, "_parse_in_child", retry_during_the_first_parse)
    first = requests.put(url, data=data, headers=headers, timeout=60)
    assert retried["answer"].status_code == 202, retried["answer"].text
    error = first.json()["error"]
    assert (first.status_code, error["code"]) == (409, "stale_attempt"), error
    assert "superseded" in error["message"] and str(dirs.spool) not in error["message"]
    assert upload_rows(app, job["attempt_id"])[0]["state"] == "staged"


def test_two_concurrent_uploads_of_one_attempt(app, client, api, dirs, files, live_server):
    node, (job,) = start(app, client, api)
    data = files["big"]
    digest = sha(data)
    url = f"{live_server.url}/api/v1/fleet/uploads/{job['attempt_id']}"
    headers = {**node.headers, "X-PDF-SHA256": digest, "X-PDF-Size": str(len(data)),
               "Content-Type": "application/pdf"}
    barrier = threading.Barrier(2)
    results: list = [None, None]

    def put(i):
        with requests.Session() as session:
            barrier.wait()
            response = session.put(url, data=data, headers=headers, timeout=120)
            results[i] = (response.status_code, response.json())

    threads = [threading.Thread(target=put, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert all(r is not None for r in results), results
    statuses = sorted(r[0] for r in results)
    assert set(statuses) <= {202, 409}, results
    assert 202 in statuses, results
    for status, answer in results:
        if status == 202:
            assert_receipt(answer, job_id=job["job_id"], attempt_id=job["attempt_id"],
                           state="staged", digest=digest, size=len(data))
        else:
            assert answer["error"]["code"] == "stale_attempt"

    (upload,) = upload_rows(app, job["attempt_id"])
    assert upload["state"] == "staged"
    assert spool_names(dirs) == [os.path.basename(upload["spool_file"])]
    assert reserved(app) == len(data)
    assert rows(app, "SELECT count(*) AS n FROM outbox WHERE topic = 'archive_commit' AND ref = :a",
                a=int(job["attempt_id"]))[0]["n"] == 1
    assert job_row(app, job["job_id"])["state"] == "staged"

    assert archive(app, job["attempt_id"]) == "done"
    assert len(rows(app, "SELECT 1 FROM assets")) == 1
    assert object_path(dirs, digest).read_bytes() == data
    assert spool_names(dirs) == []
    assert reserved(app) == 0


def test_slow_upload_survives_the_attempt_deadline(app, client, api, dirs, files, live_server):
    """Issue 3: a slow upload neither blocks heartbeats nor dies at the
    execution deadline; the upload budget, not the attempt's, bounds it."""
    node, (job,) = start(app, client, api)
    data = files["big"]
    with streaming_upload(app, live_server.port, node, job, data) as sock:
        # The attempt's execution deadline passes while the bytes flow.
        execute(app, "UPDATE attempts SET deadline_at = now() - interval '1 second' WHERE id = :a",
                a=int(job["attempt_id"]))
        assert _reap(app)["expired"] == 0
        beat = node.heartbeat(running=[job["attempt_id"]])
        assert beat.status_code == 200 and job["attempt_id"] in body(beat)["lease_expires"]
        sock.sendall(data[4096:])
        status, _, answer = read_response(sock)
    assert status == 202, answer
    assert job_row(app, job["job_id"])["state"] == "staged"


def test_stalled_upload_is_cut_at_the_upload_budget(app, client, api, dirs, files, live_server):
    """Read deadline = upload budget (DESIGN §8.3): a transfer that stops
    sending is answered with a retryable error; the partial file is removed."""
    node, (job,) = start(app, client, api, upload_timeout_seconds=10)
    data = files["good"]
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=60) as sock:
        sock.sendall(upload_head(live_server.port, node, job["attempt_id"], sha(data), len(data)))
        sock.sendall(data[:4096])  # ...and nothing more
        status, _, answer = read_response(sock)
    assert 400 <= status < 500 and status != 422, answer
    assert answer["error"]["retryable"] is True
    assert spool_names(dirs) == []
    assert upload_rows(app, job["attempt_id"])[0]["state"] == "uploading"
    assert job_row(app, job["job_id"])["state"] == "wip"
    assert reserved(app) == 0


def test_retry_arriving_during_the_first_admission_gets_a_new_generation(
        app, client, api, dirs, files, live_server, database_url, monkeypatch):
    """DESIGN §8.1: an attempt that is uploading with the same SHA/size admits
    a retry with a new generation. Here the retry arrives while the first
    request's admission still holds the job lock; the first client then gives
    up (closes its connection). The retry must still be admitted and staged,
    not be told that its attempt is stale."""
    import psycopg

    from app.uploads import spool as spool_mod
    node, (job,) = start(app, client, api)
    data, digest = files["good"], sha(files["good"])
    original = spool_mod.reserve
    first_inside = threading.Event()

    def reserve_waiting_for_a_blocked_peer(spool, size):
        if not first_inside.is_set():
            first_inside.set()
            # Hold the job lock until the retry's admission is queued behind it.
            deadline = time.monotonic() + 15
            with psycopg.connect(database_url, autocommit=True) as conn:
                while time.monotonic() < deadline:
                    waiting = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'").fetchone()[0]
                    if waiting:
                        break
                    time.sleep(0.02)
        return original(spool, size)

    monkeypatch.setattr(spool_mod, "reserve", reserve_waiting_for_a_blocked_peer)
    head = upload_head(live_server.port, node, job["attempt_id"], digest, len(data))
    first = socket.create_connection(("127.0.0.1", live_server.port), timeout=30)
    try:
        first.sendall(head)  # admitted, then waits for a body that never comes
        assert first_inside.wait(15)
        result = {}

        def retry():
            with socket.create_connection(("127.0.0.1", live_server.port), timeout=60) as sock:
                sock.sendall(head + data)
                result["answer"] = read_response(sock)

        retry_thread = threading.Thread(target=retry)
        retry_thread.start()
        retry_thread.join(60)
    finally:
        first.close()  # the first client gave up
    status, _, answer = result["answer"]
    assert status == 202, answer
    assert answer["state"] == "staged"
    (upload,) = upload_rows(app, job["attempt_id"])
    assert upload["state"] == "staged" and upload["generation"] == 2
    assert reserved(app) == len(data)


def test_lost_receipt_response_retry_gets_the_same_receipt(app, client, api, dirs, files,
                                                            live_server):
    node, (job,) = start(app, client, api)
    data, digest = files["good"], sha(files["good"])
    sock = socket.create_connection(("127.0.0.1", live_server.port), timeout=30)
    sock.sendall(upload_head(live_server.port, node, job["attempt_id"], digest, len(data)) + data)
    sock.close()  # the response is never read

    wait_for(lambda: [u["state"] for u in upload_rows(app, job["attempt_id"])] == ["staged"])
    retry = node.upload(job["attempt_id"], data)
    assert retry.status_code == 202, body(retry)
    assert_receipt(body(retry), job_id=job["job_id"], attempt_id=job["attempt_id"], state="staged",
                   digest=digest, size=len(data))
    assert body(retry) == body(node.receipt(job["attempt_id"]))
    (upload,) = upload_rows(app, job["attempt_id"])
    assert upload["generation"] == 1 and upload["state"] == "staged"
    assert spool_names(dirs) == [f"{job['attempt_id']}.1.pdf"]
    assert reserved(app) == len(data)

    assert archive(app, job["attempt_id"]) == "done"
    done = node.upload(job["attempt_id"], data)
    assert done.status_code == 200, body(done)
    assert body(done)["state"] == "done" and body(done)["asset_key"]
    assert len(upload_rows(app, job["attempt_id"])) == 1


# ------------------------------------------------------------------ receipts

def test_receipt_is_read_only_and_private_to_the_uploader(app, client, api, dirs, files):
    node, (job, no_upload) = start(app, client, api, n=2)
    assert node.upload(job["attempt_id"], files["good"]).status_code == 202
    mine = node.receipt(job["attempt_id"])
    assert mine.status_code == 200
    assert_receipt(body(mine), job_id=job["job_id"], attempt_id=job["attempt_id"], state="staged",
                   digest=sha(files["good"]), size=len(files["good"]))
    assert body(node.receipt(job["attempt_id"])) == body(mine)  # reading changes nothing

    other = Node(client, app, name="other")
    assert other.receipt(job["attempt_id"]).status_code == 404
    assert node.receipt(no_upload["attempt_id"]).status_code == 404
    assert node.receipt("123456789").status_code == 404
    assert node.receipt("x1").status_code == 404
    assert client.get(f"/api/v1/fleet/receipts/{job['attempt_id']}").status_code == 401


def test_receipt_long_poll_returns_when_the_archive_commits(app, client, api, dirs, files):
    node, (job,) = start(app, client, api)
    assert node.upload(job["attempt_id"], files["good"]).status_code == 202
    outcome = {}

    def commit_later():
        time.sleep(0.5)
        outcome["archive"] = archive(app, job["attempt_id"])

    worker = threading.Thread(target=commit_later)
    started = time.monotonic()
    worker.start()
    try:
        response = node.receipt(job["attempt_id"], wait_ms=25_000)
        elapsed = time.monotonic() - started
    finally:
        worker.join(30)
    assert outcome["archive"] == "done"
    assert response.status_code == 200
    assert body(response)["state"] == "done"
    assert body(response)["asset_key"] == f"sha256/{sha(files['good'])[:2]}/" \
        f"{sha(files['good'])[2:4]}/{sha(files['good'])}.pdf"
    # Woken by the commit, not by the end of the wait.
    assert 0.4 <= elapsed < 20


def test_receipt_long_poll_on_a_staged_upload_ends_with_the_wait(app, client, api, dirs, files):
    node, (job,) = start(app, client, api)
    assert node.upload(job["attempt_id"], files["good"]).status_code == 202
    response = node.receipt(job["attempt_id"], wait_ms=300)
    assert response.status_code == 200
    assert body(response)["state"] == "staged"


@pytest.mark.parametrize("wait", ["30001", "-1", "abc", "1.5"])
def test_receipt_wait_ms_out_of_range_is_400(app, client, api, dirs, files, wait):
    node, (job,) = start(app, client, api)
    assert node.upload(job["attempt_id"], files["good"]).status_code == 202
    response = client.get(f"/api/v1/fleet/receipts/{job['attempt_id']}?wait_ms={wait}",
                          headers=node.headers)
    assert response.status_code == 400, body(response)
    assert error_of(response)["details"] == {"field": "wait_ms"}


def test_receipt_wait_of_30000_is_allowed(app, client, api, dirs, files):
    node, (job,) = start(app, client, api)
    assert node.upload(job["attempt_id"], files["good"]).status_code == 202
    assert archive(app, job["attempt_id"]) == "done"
    response = node.receipt(job["attempt_id"], wait_ms=30_000)  # done: answers at once
    assert response.status_code == 200 and body(response)["state"] == "done"
