"""S3 staging (SPOOL_BACKEND=s3): a verified upload is put under ``staging/``
in the object store before it counts as staged, and a tasks process with a
data directory of its own archives it by a copy inside the store.

Real PostgreSQL, real Redis, a real Dramatiq worker, moto's S3 server over
real HTTP. The web app (the test client) and the tasks process never share a
directory: each has its own DATA_DIR and SPOOL_DIR.
"""
from __future__ import annotations

import base64
import os
import time
import uuid

import pytest

from app.storage import content_key
from tasks import actors
from app.uploads import spool as spool_mod
from app.uploads import sweeper
from tests.support.archive import (Pipeline, make_broker, moto, one, rows,  # noqa: F401 (fixtures)
                                run_worker, s3_client, spool_reserved)


@pytest.fixture
def staging(app, moto, monkeypatch, tmp_path):
    """S3 archive and S3 staging; the web app's data directory and the tasks
    process's are different directories."""
    bucket = f"staging-{uuid.uuid4().hex[:12]}"
    s3_client(moto.url).create_bucket(Bucket=bucket)
    shared = {"S3_BUCKET": bucket, "S3_ENDPOINT_URL": moto.url, "S3_REGION": "us-east-1",
              "S3_ACCESS_KEY_ID": "test", "S3_SECRET_ACCESS_KEY": "test",
              "S3_CONNECT_TIMEOUT": "1", "S3_READ_TIMEOUT": "3", "S3_MAX_ATTEMPTS": "1"}
    web, tasks_dir = tmp_path / "web", tmp_path / "tasks"
    secret = f"test-secret-{uuid.uuid4().hex}"
    for key, value in shared.items():
        monkeypatch.setitem(app.config, key, value)
        monkeypatch.setenv(key, value)
    for key, value in {"SPOOL_BACKEND": "s3", "SECRET_KEY": secret, "PUBLIC_URL": ""}.items():
        monkeypatch.setitem(app.config, key, value)
        monkeypatch.setenv(f"FLEETHQ_{key}", value)
    monkeypatch.setitem(app.config, "DATA_DIR", str(web))
    monkeypatch.setitem(app.config, "SPOOL_DIR", str(web / "spool"))
    monkeypatch.setenv("FLEETHQ_DATA_DIR", str(tasks_dir))
    monkeypatch.setenv("FLEETHQ_SPOOL_DIR", str(tasks_dir / "spool"))
    return {"bucket": bucket, "client": s3_client(moto.url), "web": web, "tasks": tasks_dir}


@pytest.fixture
def pipeline(app, client, admin_token, tmp_path, staging):
    return Pipeline(app, client, admin_token, tmp_path)


def keys(staging, prefix: str = "") -> list[str]:
    listed = staging["client"].list_objects_v2(Bucket=staging["bucket"], Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", ()))


def files_under(path) -> list[str]:
    return sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names
                  if not d.startswith(str(path / "prometheus")))


def test_an_upload_is_staged_in_the_store_and_archived_by_a_process_sharing_no_disk(
        app, pipeline, make_broker, staging):
    broker = make_broker()
    staged = pipeline.stage("10.1234/staged-in-s3", seed=1)
    upload = one(app, "SELECT state, generation, spool_file, spool_stamp FROM uploads "
                      "WHERE attempt_id = :a", a=staged.attempt_id)
    key = f"staging/{staged.attempt_id}.{upload['generation']}.pdf"
    assert (upload["state"], upload["spool_file"], upload["spool_stamp"]) == ("staged", key, None)
    assert keys(staging, "staging/") == [key]
    head = staging["client"].head_object(Bucket=staging["bucket"], Key=key, ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == base64.b64encode(bytes.fromhex(staged.sha256)).decode()
    assert files_under(staging["web"] / "spool") == []  # nothing left on the web host

    run_worker(broker)
    receipt = pipeline.receipt(staged)
    assert (receipt["state"], receipt["sha256"]) == ("done", staged.sha256)
    assert keys(staging) == [content_key(staged.sha256)]  # staging object gone
    stored = staging["client"].get_object(Bucket=staging["bucket"],
                                          Key=content_key(staged.sha256))["Body"].read()
    assert stored == staged.data
    assert files_under(staging["tasks"] / "spool") == []
    assert spool_reserved(app) == 0


def test_the_store_down_while_staging_answers_503_and_the_retry_is_archived_once(
        app, pipeline, make_broker, moto, staging):
    broker = make_broker()
    pipeline.api.enqueue(pipeline.project, [{"value": "10.1234/outage-staging"}])
    assert pipeline.node.heartbeat().status_code == 200
    job = pipeline.node.claim(pipeline.project).get_json()["jobs"][0]
    data = pipeline.pdf(7)
    moto.stop()
    refused = pipeline.node.upload(job["attempt_id"], data)
    assert refused.status_code == 503, refused.get_json()
    error = refused.get_json()["error"]
    assert (error["code"], error["retryable"]) == ("storage_unavailable", True)
    upload = one(app, "SELECT state, spool_file FROM uploads WHERE attempt_id = :a",
                 a=int(job["attempt_id"]))
    assert upload == {"state": "uploading", "spool_file": None}
    assert one(app, "SELECT state FROM jobs WHERE id = :j", j=job["job_id"])["state"] == "wip"
    assert files_under(staging["web"] / "spool") == []

    moto.start()
    accepted = pipeline.node.upload(job["attempt_id"], data)
    assert accepted.status_code == 202, accepted.get_json()
    run_worker(broker)
    assert pipeline.node.receipt(job["attempt_id"]).get_json()["state"] == "done"
    assert len(rows(app, "SELECT 1 FROM assets WHERE job_id = :j", j=job["job_id"])) == 1
    assert keys(staging) == [content_key(one(app, "SELECT sha256 FROM uploads WHERE attempt_id = :a",
                                                 a=int(job["attempt_id"]))["sha256"])]
    assert spool_reserved(app) == 0


def test_identical_uploads_archived_together_make_one_object(app, pipeline, make_broker, staging):
    broker = make_broker()
    data = pipeline.pdf(3)
    first = pipeline.stage("10.1234/same-a", data=data)
    second = pipeline.stage("10.1234/same-b", data=data)
    run_worker(broker, threads=2)
    # Two copies racing for one key may be refused by the store (moto answers
    # one of them 500): that commit is retried later. Make it due, as the
    # clock's reconcile would in time.
    for _ in range(3):
        if all(pipeline.receipt(s)["state"] == "done" for s in (first, second)):
            break
        rows(app, "UPDATE outbox SET due_at = now() WHERE topic = 'archive_commit' "
                  "AND done_at IS NULL")
        actors.reconcile.send()
        run_worker(broker, threads=2)
    for staged in (first, second):
        assert pipeline.receipt(staged)["state"] == "done"
    assert keys(staging) == [content_key(first.sha256)]
    assets = rows(app, "SELECT canonical_key, object_key FROM assets ORDER BY canonical_key")
    assert [a["object_key"] for a in assets] == [content_key(first.sha256)] * 2


def test_the_sweeper_removes_staged_objects_no_upload_owns_once_they_are_old(
        app, pipeline, staging):
    live = pipeline.stage("10.1234/kept", seed=2)
    client, bucket = staging["client"], staging["bucket"]
    client.put_object(Bucket=bucket, Key="staging/999999.1.pdf", Body=b"orphan")
    client.put_object(Bucket=bucket, Key="staging/999998.1.held", Body=b"orphan held")
    client.put_object(Bucket=bucket, Key="staging/not-ours.txt", Body=b"left alone")
    from app.extensions import db
    with app.app_context():
        spool = spool_mod.Spool.from_config(app.config)
        # Young: an object put by another instance whose row is not visible yet.
        assert sweeper.remove_orphans(spool) == 1  # the held copy no upload owns
        assert "staging/999999.1.pdf" in keys(staging, "staging/")
        later = time.time() + sweeper.ORPHAN_GRACE_S + 1
        assert sweeper.remove_orphans(spool, now=later) == 1
        db.session.remove()
    live_key = one(app, "SELECT spool_file FROM uploads WHERE attempt_id = :a",
                   a=live.attempt_id)["spool_file"]
    assert keys(staging, "staging/") == sorted([live_key, "staging/not-ours.txt"])


def test_a_staged_object_of_a_finished_upload_is_removed_at_once(app, pipeline, make_broker, staging):
    """A tasks process that died between the done receipt and its clean-up
    leaves the staged object: the next sweep removes it, with no grace (the
    row says that generation is over); a newer generation's object waits."""
    broker = make_broker()
    staged = pipeline.stage("10.1234/finished", seed=6)
    key = one(app, "SELECT spool_file FROM uploads WHERE attempt_id = :a",
              a=staged.attempt_id)["spool_file"]
    run_worker(broker)
    assert one(app, "SELECT state FROM uploads WHERE attempt_id = :a", a=staged.attempt_id)["state"] == "done"
    client, bucket = staging["client"], staging["bucket"]
    generation = int(key.rsplit(".", 2)[1])
    newer = f"staging/{staged.attempt_id}.{generation + 1}.pdf"
    client.put_object(Bucket=bucket, Key=key, Body=b"left by a killed archive")
    client.put_object(Bucket=bucket, Key=newer, Body=b"a retry being admitted")
    from app.extensions import db
    with app.app_context():
        assert sweeper.remove_orphans(spool_mod.Spool.from_config(app.config)) == 1
        db.session.remove()
    assert keys(staging, "staging/") == [newer]


def test_a_staged_object_gone_from_the_store_sends_the_job_back_to_the_queue(
        app, pipeline, make_broker, staging):
    broker = make_broker()
    staged = pipeline.stage("10.1234/lost", seed=5)
    key = one(app, "SELECT spool_file FROM uploads WHERE attempt_id = :a",
              a=staged.attempt_id)["spool_file"]
    staging["client"].delete_object(Bucket=staging["bucket"], Key=key)
    run_worker(broker)
    upload = one(app, "SELECT state, error->>'code' AS code FROM uploads WHERE attempt_id = :a",
                 a=staged.attempt_id)
    assert upload == {"state": "failed", "code": "spool_damaged"}
    assert one(app, "SELECT state FROM jobs WHERE id = :j", j=staged.job_id)["state"] == "todo"
    assert rows(app, "SELECT 1 FROM assets") == []
    assert spool_reserved(app) == 0


def test_s3_staging_without_an_s3_store_is_refused_at_start():
    from app import config
    with pytest.raises(ValueError, match="set S3_BUCKET"):
        config.load({"DATABASE_URL": "postgresql://u@127.0.0.1/db", "SPOOL_BACKEND": "s3"})
    with pytest.raises(ValueError, match="SPOOL_BACKEND must be local or s3"):
        config.load({"DATABASE_URL": "postgresql://u@127.0.0.1/db", "SPOOL_BACKEND": "nfs"})


def _claimed_by_a_node(app, client, admin_token, project: str):
    from tests.fleet_helpers import Node, pdf_project
    from tests.helpers import Api
    api = Api(client, admin_token)
    pdf_project(api, project)
    api.enqueue(project, [{"value": f"10.1234/{project}"}])
    node = Node(client, app)
    assert node.heartbeat().status_code == 200
    [job] = node.claim(project).get_json()["jobs"]
    return node, job


def test_a_held_upload_is_kept_in_the_store_where_any_instance_can_serve_it(
        app, client, admin_token, staging, live_server, tmp_path):
    """A worker revoked mid-upload: the file is held in the store (the staged
    object if it got that far, else a copy under staging/…held), nothing stays
    on the web host, an admin downloads it, and releasing deletes it."""
    from tests.fleet_helpers import decide
    from tests.support.pages import sign_in
    from tests.support.uploads import read_response, streaming_upload
    node, job = _claimed_by_a_node(app, client, admin_token, "held-s3")
    data = Pipeline(app, client, admin_token, tmp_path).pdf(9)
    with streaming_upload(app, live_server.port, node, job, data) as sock:
        assert decide(app, node.node_id, "revoke") == "revoked"
        sock.sendall(data[4096:])
        status, _, answer = read_response(sock)
    assert status == 409 and answer["error"]["code"] == "stale_attempt", answer
    upload = one(app, "SELECT state, spool_file FROM uploads WHERE attempt_id = :a",
                 a=int(job["attempt_id"]))
    held_key = upload["spool_file"]
    assert upload["state"] == "held"
    assert held_key in (f"staging/{job['attempt_id']}.1.pdf", f"staging/{job['attempt_id']}.1.held")
    assert keys(staging, "staging/") == [held_key]
    assert files_under(staging["web"] / "spool") == []

    sign_in(app, client)
    response = client.get(f"/admin/workers/held/{job['attempt_id']}/file")
    assert response.status_code == 200 and response.data == data
    assert response.headers["Content-Security-Policy"] == "sandbox"

    from app.extensions import db
    from app.uploads import held
    with app.app_context():
        held.release(int(job["attempt_id"]), spool_mod.Spool.from_config(app.config), "test")
        db.session.remove()
    assert keys(staging, "staging/") == []
    assert spool_reserved(app) == 0


def test_a_partial_upload_held_at_revocation_is_copied_into_the_store(
        app, client, admin_token, staging, live_server):
    from tests.fleet_helpers import decide
    from tests.helpers import wait_for
    from tests.support.uploads import streaming_upload
    node, job = _claimed_by_a_node(app, client, admin_token, "held-part")
    data = bytes(300_000)
    with streaming_upload(app, live_server.port, node, job, data):
        assert decide(app, node.node_id, "revoke") == "revoked"
    # The master notices the hang-up and keeps what arrived, in the store.
    held_key = f"staging/{job['attempt_id']}.1.held"
    wait_for(lambda: one(app, "SELECT spool_file FROM uploads WHERE attempt_id = :a",
                         a=int(job["attempt_id"]))["spool_file"] == held_key, what="the held copy")
    assert keys(staging, "staging/") == [held_key]
    assert files_under(staging["web"] / "spool") == []


def test_a_web_process_sweeps_its_own_scratch_spool_at_start(app, database_url, tmp_path):
    """A web process killed mid-upload leaves part files on its own disk, which
    no tasks process sees: the next start removes those nobody owns."""
    from tests.gunicorn_master import Gunicorn
    from tests.helpers import wait_for
    spool = tmp_path / "data" / "spool"
    spool.mkdir(parents=True)
    stale, fresh = spool / "424242.1.part", spool / "424243.1.part"
    stale.write_bytes(b"%PDF-1.7 half an upload")
    fresh.write_bytes(b"%PDF-1.7 streaming elsewhere")
    an_hour_ago = time.time() - 3600
    os.utime(stale, (an_hour_ago, an_hour_ago))
    web = Gunicorn({"DATABASE_URL": database_url, "FLEETHQ_DATA_DIR": str(tmp_path / "data"),
                    "FLEETHQ_SECRET_KEY": "test"}, tmp_path / "web.log")
    try:
        web.wait_ready()
        wait_for(lambda: not stale.exists(), timeout=30, what="the stale part file removed")
        assert fresh.exists()      # within the grace: it may be a transfer still streaming
        assert "removed 1 leftover spool file(s)" in web.log()
    finally:
        web.stop()
