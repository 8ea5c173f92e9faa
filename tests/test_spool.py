"""The master's spool (DESIGN §8 steps 2, 7; §12): quota, reservation order,
the sweeper (orphan files, staged retention, abandoned uploads).

Spool and object store live under tmp_path; PostgreSQL is real; transfers
that must stay open half-way go over a real socket to ``live_server``.
"""
from __future__ import annotations

import os
import socket
import stat
import time

import psycopg
import pytest

from app.uploads.spool import Spool
from app.uploads.sweeper import ORPHAN_GRACE_S
from tests.fleet_helpers import Node
from tests.helpers import body, wait_for
from tests.helpers import db_rows as rows
from tests.support.uploads import (_age_lease, _reap, archive, attempt_row, error_of, execute, job_row,
                                   read_response, reserved, sha, spool_names, start, streaming_upload,
                                   upload_head, upload_rows)
from tests.support.spool import (age, sweep)  # noqa: F401

# The spool and the object store under tmp_path, for every test here.
pytestmark = pytest.mark.usefixtures("dirs")


# ------------------------------------------------------------------- quota

def test_spool_full_is_507_with_retry_after_and_changes_nothing(app, client, api, dirs, files):
    node, (job,) = start(app, client, api)
    data = files["good"]
    app.config["SPOOL_MAX_BYTES"] = len(data) - 1

    response = node.upload(job["attempt_id"], data)
    assert response.status_code == 507, body(response)
    err = error_of(response)
    assert err["code"] == "spool_full"
    assert err["retryable"] is True
    assert err["details"] == {"reserved_bytes": 0, "max_bytes": len(data) - 1}
    retry_after = response.headers.get("Retry-After")
    assert retry_after is not None and retry_after.isdigit() and int(retry_after) >= 1
    assert err["retry_after_ms"] == int(retry_after) * 1000

    # Nothing changed: no upload, nothing reserved, no file; the attempt still runs.
    assert upload_rows(app, job["attempt_id"]) == []
    assert reserved(app) == 0
    assert spool_names(dirs) == []
    assert attempt_row(app, job["attempt_id"])["state"] == "running"
    assert job_row(app, job["job_id"])["state"] == "wip"

    # Room for exactly this file: the same upload now succeeds.
    app.config["SPOOL_MAX_BYTES"] = len(data)
    later = node.upload(job["attempt_id"], data)
    assert later.status_code == 202, body(later)
    assert reserved(app) == len(data)


def test_spool_full_until_another_upload_is_archived(app, client, api, dirs, files):
    node, (first, second) = start(app, client, api, n=2)
    good, other = files["good"], files["other"]
    app.config["SPOOL_MAX_BYTES"] = len(good) + len(other) - 1

    assert node.upload(first["attempt_id"], good).status_code == 202
    assert reserved(app) == len(good)
    full = node.upload(second["attempt_id"], other)
    assert full.status_code == 507, body(full)
    assert "Retry-After" in full.headers
    assert error_of(full)["details"]["reserved_bytes"] == len(good)
    assert reserved(app) == len(good)
    assert upload_rows(app, second["attempt_id"]) == []

    assert archive(app, first["attempt_id"]) == "done"
    assert reserved(app) == 0
    assert spool_names(dirs) == []
    response = node.upload(second["attempt_id"], other)
    assert response.status_code == 202, body(response)
    assert reserved(app) == len(other)
    assert spool_names(dirs) == [f"{second['attempt_id']}.1.pdf"]


def test_spool_full_on_a_late_upload_leaves_the_newer_attempt_alone(app, client, api, dirs, files):
    first, (job,) = start(app, client, api, retry_backoff_seconds=0)
    _age_lease(app, job)
    second = Node(client, app, name="second")
    assert second.heartbeat().status_code == 200
    (retry,) = body(second.claim("papers"))["jobs"]
    app.config["SPOOL_MAX_BYTES"] = 1024

    full = first.upload(job["attempt_id"], files["good"])
    assert full.status_code == 507, body(full)
    # The late upload did not happen, so it won nothing.
    assert attempt_row(app, retry["attempt_id"])["state"] == "running"
    after = job_row(app, job["job_id"])
    assert after["state"] == "wip" and after["current_attempt_id"] == int(retry["attempt_id"])
    assert reserved(app) == 0

    app.config["SPOOL_MAX_BYTES"] = 2 * 1024**3
    assert first.upload(job["attempt_id"], files["good"]).status_code == 202
    assert attempt_row(app, retry["attempt_id"])["state"] == "cancelled"


def test_reservation_commits_before_the_file_is_written(app, client, api, dirs, files, live_server,
                                                        database_url, monkeypatch):
    node, (job,) = start(app, client, api)
    data = files["big"]
    seen_at_create = []
    create = Spool.create_exclusive

    def observed(self, attempt_id, generation):
        # What another connection sees at the moment the file is created.
        with psycopg.connect(database_url, autocommit=True) as conn:
            seen_at_create.append(conn.execute(
                "SELECT (SELECT reserved_bytes FROM spool_usage WHERE id = 1), "
                "(SELECT state FROM uploads WHERE attempt_id = %s)", (attempt_id,)).fetchone())
            assert not os.path.exists(self.part_path(attempt_id, generation))
        return create(self, attempt_id, generation)

    monkeypatch.setattr(Spool, "create_exclusive", observed)
    half = len(data) // 2
    part = dirs.spool / f"{job['attempt_id']}.1.part"
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=60) as sock:
        sock.sendall(upload_head(live_server.port, node, job["attempt_id"], sha(data), len(data)))
        sock.sendall(data[:half])
        wait_for(lambda: part.exists() and part.stat().st_size >= half // 2)

        # Mid-transfer: the reservation is committed (visible to everyone).
        assert seen_at_create == [(len(data), "uploading")]
        assert reserved(app) == len(data)
        assert upload_rows(app, job["attempt_id"])[0]["state"] == "uploading"
        assert stat.S_IMODE(part.stat().st_mode) == 0o600
        assert part.stat().st_size < len(data)
        # A slow upload does not block the node's heartbeat, which keeps the lease.
        beat = node.heartbeat(running=[job["attempt_id"]])
        assert beat.status_code == 200
        assert job["attempt_id"] in body(beat)["lease_expires"]

        sock.sendall(data[half:])
        status, _, answer = read_response(sock)
    assert status == 202, answer
    assert answer["state"] == "staged"
    assert spool_names(dirs) == [f"{job['attempt_id']}.1.pdf"]
    assert reserved(app) == len(data)


def test_concurrent_reservations_never_exceed_the_quota(app, client, api, dirs, files, live_server):
    """A transfer in progress holds its reservation: a second upload that does
    not fit next to it is refused while the first is still streaming."""
    node, (first, second) = start(app, client, api, n=2)
    big, good = files["big"], files["good"]
    app.config["SPOOL_MAX_BYTES"] = len(big) + len(good) - 1
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=60) as sock:
        sock.sendall(upload_head(live_server.port, node, first["attempt_id"], sha(big), len(big)))
        sock.sendall(big[:1024])
        wait_for(lambda: reserved(app) == len(big))
        full = node.upload(second["attempt_id"], good)
        assert full.status_code == 507, body(full)
        sock.sendall(big[1024:])
        status, _, answer = read_response(sock)
    assert status == 202, answer
    assert reserved(app) == len(big)


# ------------------------------------------------------------------ sweeper

def test_orphan_files_are_removed_after_the_grace_period(app, client, api, dirs, files):
    node, (job,) = start(app, client, api)
    assert node.upload(job["attempt_id"], files["good"]).status_code == 202
    staged = dirs.spool / f"{job['attempt_id']}.1.pdf"
    age(staged, 3 * ORPHAN_GRACE_S)              # staged files may be old: still kept

    stray_part = dirs.spool / "900.1.part"       # no upload row at all
    stray_pdf = dirs.spool / "900.2.pdf"
    leftover = dirs.spool / f"{job['attempt_id']}.7.part"   # not the staged upload's file
    fresh_part = dirs.spool / "901.1.part"       # may be a transfer admitted a moment ago
    foreign = dirs.spool / "notes.txt"           # not a spool name: not ours to delete
    for path in (stray_part, stray_pdf, leftover, foreign):
        path.write_bytes(b"x" * 100)
        age(path, ORPHAN_GRACE_S + 60)
    fresh_part.write_bytes(b"y" * 100)

    result = sweep(app, now=time.time())
    assert result == {"abandoned": 0, "expired": 0, "orphans_removed": 3, "held_released": 0,
                      "texts_dropped": 0}
    assert spool_names(dirs) == sorted([staged.name, fresh_part.name, foreign.name])
    assert staged.read_bytes() == files["good"]
    assert upload_rows(app, job["attempt_id"])[0]["state"] == "staged"
    assert reserved(app) == len(files["good"])

    # Once the fresh part file is older than the grace period it goes too.
    later = sweep(app, now=time.time() + ORPHAN_GRACE_S + 1)
    assert later["orphans_removed"] == 1
    assert spool_names(dirs) == sorted([staged.name, foreign.name])
    assert archive(app, job["attempt_id"]) == "done"


def test_expired_staged_upload_fails_and_frees_its_quota(app, client, api, dirs, files):
    node, (old, recent) = start(app, client, api, n=2)
    good, other = files["good"], files["other"]
    assert node.upload(old["attempt_id"], good).status_code == 202
    assert node.upload(recent["attempt_id"], other).status_code == 202
    assert reserved(app) == len(good) + len(other)
    execute(app, "UPDATE uploads SET staged_at = now() - make_interval(secs => :s) WHERE attempt_id = :a",
            s=app.config["STAGED_RETENTION_S"] + 60, a=int(old["attempt_id"]))
    execute(app, "UPDATE uploads SET staged_at = now() - make_interval(secs => :s) WHERE attempt_id = :a",
            s=app.config["STAGED_RETENTION_S"] - 3600, a=int(recent["attempt_id"]))

    result = sweep(app)
    assert result["expired"] == 1
    (upload,) = upload_rows(app, old["attempt_id"])
    assert upload["state"] == "failed"
    assert upload["error"]["code"] == "storage_unavailable"
    assert reserved(app) == len(other)
    assert job_row(app, old["job_id"])["state"] == "failed"
    assert attempt_row(app, old["attempt_id"])["state"] == "failed"
    # Its file is no longer any live upload's: gone with the same sweep.
    assert spool_names(dirs) == [f"{recent['attempt_id']}.1.pdf"]
    receipt = node.receipt(old["attempt_id"])
    assert receipt.status_code == 200 and body(receipt)["state"] == "failed"
    # A late archive commit of the expired upload does nothing.
    assert archive(app, old["attempt_id"]) == "skip"
    assert rows(app, "SELECT 1 FROM assets") == []
    assert not (dirs.objects / "sha256").exists()

    # The one within the retention is untouched and still archives.
    assert upload_rows(app, recent["attempt_id"])[0]["state"] == "staged"
    assert job_row(app, recent["job_id"])["state"] == "staged"
    assert archive(app, recent["attempt_id"]) == "done"
    assert reserved(app) == 0


def test_abandoned_upload_is_expired_and_frees_its_reservation(app, client, api, dirs, files,
                                                               live_server):
    """The client vanished mid-transfer; its lease ran out and was reaped."""
    node, (job,) = start(app, client, api)
    data = files["big"]
    with streaming_upload(app, live_server.port, node, job, data):
        assert reserved(app) == len(data)
    # The connection is gone; the upload row still holds the reservation.
    assert upload_rows(app, job["attempt_id"])[0]["state"] == "uploading"
    assert reserved(app) == len(data)
    assert sweep(app)["abandoned"] == 0  # its attempt is still uploading: not abandoned yet

    _age_lease(app, job)
    assert _reap(app)["expired"] == 1
    assert attempt_row(app, job["attempt_id"])["state"] == "expired"
    assert job_row(app, job["job_id"])["state"] == "todo"

    result = sweep(app, now=time.time() + ORPHAN_GRACE_S + 1)
    assert result["abandoned"] == 1
    (upload,) = upload_rows(app, job["attempt_id"])
    assert upload["state"] == "expired"
    assert reserved(app) == 0
    assert spool_names(dirs) == []
    assert sweep(app)["abandoned"] == 0  # freed once, not twice
    assert reserved(app) == 0


def test_abandoned_uploads_are_found_behind_live_ones(app, client, api, dirs, files, live_server):
    """A sweep batch takes abandoned uploads: live transfers ahead of them in
    the table must not use up the batch (else a busy spool never frees them)."""
    from app.extensions import db
    from app.uploads import transitions
    node, (live, gone) = start(app, client, api, n=2)
    big, good = files["big"], files["good"]
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=60) as streaming:
        streaming.sendall(upload_head(live_server.port, node, live["attempt_id"], sha(big), len(big)))
        streaming.sendall(big[:4096])
        wait_for(lambda: reserved(app) == len(big))
        with socket.create_connection(("127.0.0.1", live_server.port), timeout=60) as sock:
            sock.sendall(upload_head(live_server.port, node, gone["attempt_id"], sha(good), len(good)))
            sock.sendall(good[:4096])
            wait_for(lambda: reserved(app) == len(big) + len(good))
        _age_lease(app, gone)
        assert _reap(app)["expired"] == 1
        assert attempt_row(app, live["attempt_id"])["state"] == "uploading"

        with app.app_context():
            expired = transitions.expire_abandoned(limit=1)
            db.session.remove()
        assert expired == 1
        assert upload_rows(app, gone["attempt_id"])[0]["state"] == "expired"
        assert upload_rows(app, live["attempt_id"])[0]["state"] == "uploading"
        assert reserved(app) == len(big)

        streaming.sendall(big[4096:])
        status, _, answer = read_response(streaming)
    assert status == 202, answer


def test_upload_abandoned_while_streaming_cannot_stage_but_a_retry_wins(app, client, api, dirs,
                                                                         files, live_server):
    node, (job,) = start(app, client, api)
    data = files["big"]
    with streaming_upload(app, live_server.port, node, job, data) as sock:
        assert reserved(app) == len(data)
        _age_lease(app, job)
        assert _reap(app)["expired"] == 1
        assert sweep(app)["abandoned"] == 1
        assert reserved(app) == 0
        assert upload_rows(app, job["attempt_id"])[0]["state"] == "expired"
        # The part file being written is young: the sweeper does not race it.
        assert spool_names(dirs) == [f"{job['attempt_id']}.1.part"]

        sock.sendall(data[4096:])
        status, _, answer = read_response(sock)
    assert status == 409, answer
    assert upload_rows(app, job["attempt_id"])[0]["state"] == "expired"
    assert spool_names(dirs) == []
    assert reserved(app) == 0

    # The download is finished: uploading it again is a late upload and wins.
    retry = node.upload(job["attempt_id"], data)
    assert retry.status_code == 202, body(retry)
    (upload,) = upload_rows(app, job["attempt_id"])
    assert upload["state"] == "staged" and upload["generation"] == 2
    assert reserved(app) == len(data)
    assert job_row(app, job["job_id"])["state"] == "staged"


def test_reserved_bytes_return_to_zero_whatever_the_outcome(app, client, api, dirs, files,
                                                            live_server):
    node, jobs = start(app, client, api, n=4, max_in_flight=10, max_worker_in_flight=10)
    done, rejected, expired, abandoned = jobs
    good, other, html, big = files["good"], files["other"], files["html"], files["big"]

    assert node.upload(done["attempt_id"], good).status_code == 202
    assert node.upload(expired["attempt_id"], other).status_code == 202
    assert reserved(app) == len(good) + len(other)
    assert node.upload(rejected["attempt_id"], html).status_code == 422
    assert reserved(app) == len(good) + len(other)
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=60) as sock:
        sock.sendall(upload_head(live_server.port, node, abandoned["attempt_id"], sha(big), len(big)))
        sock.sendall(big[:4096])
        wait_for(lambda: reserved(app) == len(good) + len(other) + len(big))
    # The abandoned transfer's connection closed: its reservation comes back
    # at once, not when the sweeper finds the upload expired.
    wait_for(lambda: reserved(app) == len(good) + len(other), what="the abandoned reservation freed")

    assert archive(app, done["attempt_id"]) == "done"
    assert reserved(app) == len(other)
    execute(app, "UPDATE uploads SET staged_at = now() - make_interval(secs => :s) WHERE attempt_id = :a",
            s=app.config["STAGED_RETENTION_S"] + 60, a=int(expired["attempt_id"]))
    _age_lease(app, abandoned)
    assert _reap(app)["expired"] == 1
    result = sweep(app, now=time.time() + ORPHAN_GRACE_S + 1)
    assert (result["abandoned"], result["expired"]) == (1, 1)
    assert reserved(app) == 0
    assert spool_names(dirs) == []
    states = {r["attempt_id"]: r["state"] for r in rows(app, "SELECT attempt_id, state FROM uploads")}
    assert states == {int(done["attempt_id"]): "done", int(rejected["attempt_id"]): "failed",
                      int(expired["attempt_id"]): "failed", int(abandoned["attempt_id"]): "expired"}
