"""Archive commit (DESIGN §8 steps 6-7, §2): staged uploads become archived
assets with a ``done`` receipt through a real Dramatiq worker on real Redis;
lost hints, a dying worker and an object-store outage delay the archive but
lose nothing; existing objects and assets are re-checked, never trusted; no
transaction is held open across the object-store call.

Real PostgreSQL, real Redis, a real ``dramatiq.Worker`` in-process, the local
object store in ``tmp_path`` and the S3 backend against moto's threaded
server over real HTTP.
"""
from __future__ import annotations

import base64
import os
import threading
import time

import psycopg

from app.storage import LocalObjectStore, content_key
from tasks import actors
from tests.helpers import body
from tests.support.archive import (  # noqa: F401 (fixtures and helpers)
    Pipeline, Staged, commit_directly, idle_in_transaction, local_store, make_broker, moto, one, pipeline,
    rows, run_worker, s3_client, s3_store, sha256, spool_reserved)


# ------------------------------------------------------------------ helpers


# ------------------------------------------------------------------ fixtures


def object_files(store: LocalObjectStore) -> list[str]:
    if not os.path.isdir(store.root):
        return []
    return sorted(os.path.relpath(os.path.join(d, n), store.root)
                  for d, _, names in os.walk(store.root) for n in names)


def assert_archived_once(app, pipeline: Pipeline, staged: Staged, store=None) -> dict:
    """done receipt, job and attempt done, one asset, spool freed, outbox done."""
    receipt = pipeline.receipt(staged)
    key = content_key(staged.sha256)
    assert (receipt["state"], receipt["sha256"], receipt["size"], receipt["asset_key"]) == (
        "done", staged.sha256, staged.size, key)
    job = one(app, "SELECT j.state AS job, a.state AS attempt FROM jobs j "
                   "JOIN attempts a ON a.id = j.current_attempt_id WHERE j.id = :j", j=staged.job_id)
    assert job == {"job": "done", "attempt": "done"}
    assets = rows(app, "SELECT canonical_key, sha256, size, object_key, attempt_id FROM assets "
                       "WHERE attempt_id = :a", a=staged.attempt_id)
    assert len(assets) == 1
    assert (assets[0]["sha256"], assets[0]["size"], assets[0]["object_key"]) == (
        staged.sha256, staged.size, key)
    upload = one(app, "SELECT state, spool_file FROM uploads WHERE attempt_id = :a",
                 a=staged.attempt_id)
    assert upload["state"] == "done"
    assert not os.path.exists(upload["spool_file"])  # deleted after the commit
    assert rows(app, "SELECT id FROM outbox WHERE topic = 'archive_commit' AND ref = :a "
                     "AND done_at IS NULL", a=staged.attempt_id) == []
    if store is not None:
        with store.open(key) as stream:
            assert stream.read() == staged.data
    return assets[0]


# ------------------------------------------------------ through real Redis


def test_staging_sends_a_hint_and_a_real_worker_archives(app, pipeline, make_broker, local_store):
    broker = make_broker()
    staged = pipeline.stage("10.1234/worker", seed=1)
    # The hint was sent after the staging commit and waits in Redis.
    assert broker.recorder.enqueued == [("archive_commit", (staged.attempt_id,))]
    assert broker.do_qsize("archive") == 1
    assert pipeline.receipt(staged)["state"] == "staged"
    assert spool_reserved(app) == staged.size
    outbox = one(app, "SELECT topic, ref, done_at FROM outbox")
    assert (outbox["topic"], outbox["ref"], outbox["done_at"]) == (
        "archive_commit", staged.attempt_id, None)

    run_worker(broker)

    assert [(n, a, e) for n, a, e in broker.recorder.processed] == [
        ("archive_commit", (staged.attempt_id,), None)]
    asset = assert_archived_once(app, pipeline, staged, local_store)
    assert asset["canonical_key"] == "doi:10.1234/worker"
    assert object_files(local_store) == [content_key(staged.sha256)]
    assert spool_reserved(app) == 0
    # A worker waiting on the receipt learns it may delete its copy.
    long_poll = staged.node.receipt(str(staged.attempt_id), wait_ms=1000)
    assert body(long_poll)["state"] == "done"


def test_flushed_redis_delays_until_the_reconciler_resends(app, pipeline, make_broker, local_store):
    broker = make_broker()
    staged = pipeline.stage("10.1234/flushed", seed=2)
    assert broker.do_qsize("archive") == 1
    broker.flush_all()  # Redis lost every message
    assert broker.do_qsize("archive") == 0

    run_worker(broker)  # a worker with nothing to do
    assert broker.recorder.processed == []
    assert pipeline.receipt(staged)["state"] == "staged"
    assert object_files(local_store) == []

    # The tasks process restarts; the clock's periodic reconcile re-sends
    # whatever PostgreSQL says is due.
    restarted = make_broker()
    actors.reconcile.send()
    run_worker(restarted)
    assert sorted(restarted.recorder.names()) == ["archive_commit", "reconcile"]
    assert [e for _, _, e in restarted.recorder.processed] == [None, None]
    assert_archived_once(app, pipeline, staged, local_store)

    # Once done, the reconciler has nothing left to send.
    actors.reconcile.send()
    run_worker(restarted)
    assert restarted.recorder.names().count("archive_commit") == 1


def test_worker_dying_mid_commit_archives_exactly_once_after_restart(
        app, pipeline, make_broker, local_store, monkeypatch):
    from app.uploads import transitions
    broker = make_broker()
    staged = pipeline.stage("10.1234/killed", seed=3)

    # The first worker writes the object, then dies before its final
    # transaction commits (the session is rolled back, as when the
    # connection of a killed process drops).
    real_complete = transitions.complete

    def die(*args, **kwargs):
        raise RuntimeError("tasks process killed")

    monkeypatch.setattr(transitions, "complete", die)
    run_worker(broker)
    [(name, _, exc)] = broker.recorder.processed
    assert name == "archive_commit" and isinstance(exc, RuntimeError)
    assert object_files(local_store) == [content_key(staged.sha256)]
    assert pipeline.receipt(staged)["state"] == "staged"
    assert rows(app, "SELECT * FROM assets") == []
    pending = one(app, "SELECT tries, due_at <= now() AS due FROM outbox "
                       "WHERE topic = 'archive_commit' AND done_at IS NULL")
    assert pending == {"tries": 0, "due": True}

    # A new tasks process: the reconciler re-sends the due row; two stale
    # duplicate hints arrive too, and all three run concurrently.
    monkeypatch.setattr(transitions, "complete", real_complete)
    restarted = make_broker()
    from app.extensions import db
    with app.app_context():
        actors.reconcile.fn()
        db.session.remove()
    assert restarted.recorder.enqueued == [("archive_commit", (staged.attempt_id,))]
    actors.archive_commit.send(staged.attempt_id)
    actors.archive_commit.send(staged.attempt_id)
    run_worker(restarted, threads=3)
    assert [(n, e) for n, _, e in restarted.recorder.processed] == [("archive_commit", None)] * 3

    assert_archived_once(app, pipeline, staged, local_store)
    assert len(rows(app, "SELECT * FROM assets")) == 1
    assert len(rows(app, "SELECT * FROM uploads WHERE state = 'done'")) == 1
    assert object_files(local_store) == [content_key(staged.sha256)]
    assert spool_reserved(app) == 0


# ------------------------------------------------------- object store down


def test_object_store_down_stays_staged_then_recovers(app, pipeline, make_broker, moto, s3_store):
    broker = make_broker()
    moto.stop()
    staged = pipeline.stage("10.1234/outage", seed=4)

    # The worker's commit fails: the upload stays staged, the outbox row is
    # pushed back with the error.
    run_worker(broker)
    assert [(n, e) for n, _, e in broker.recorder.processed] == [("archive_commit", None)]
    assert pipeline.receipt(staged)["state"] == "staged"
    first = one(app, "SELECT tries, last_error, due_at, "
                     "extract(epoch FROM due_at - created_at) AS delay_s "
                     "FROM outbox WHERE topic = 'archive_commit' AND done_at IS NULL")
    assert first["tries"] == 1 and first["delay_s"] >= 5, first  # backed off
    assert "StorageUnavailable" in first["last_error"]

    # Called again while still down: "retry", and the row moves on.
    assert commit_directly(app, staged.attempt_id) == "retry"
    second = one(app, "SELECT tries, last_error, due_at FROM outbox "
                      "WHERE topic = 'archive_commit' AND done_at IS NULL")
    assert second["tries"] == 2 and second["due_at"] > first["due_at"]
    assert "StorageUnavailable" in second["last_error"]
    upload = one(app, "SELECT state, commit_tries, spool_file FROM uploads WHERE attempt_id = :a",
                 a=staged.attempt_id)
    assert (upload["state"], upload["commit_tries"]) == ("staged", 2)
    assert os.path.exists(upload["spool_file"])

    # The spool sweeper keeps a staged file that is waiting for the store.
    broker.recorder.processed.clear()
    actors.sweep_spool.send()
    run_worker(broker)
    assert os.path.exists(upload["spool_file"])
    assert pipeline.receipt(staged)["state"] == "staged"

    moto.start()  # the store is back
    # Not due yet: the reconciler sends nothing.
    broker.recorder.processed.clear()
    actors.reconcile.send()
    run_worker(broker)
    assert broker.recorder.names() == ["reconcile"]
    assert pipeline.receipt(staged)["state"] == "staged"

    # Due now (instead of waiting for the backoff): re-sent and archived.
    rows(app, "UPDATE outbox SET due_at = now() WHERE topic = 'archive_commit' AND done_at IS NULL")
    actors.reconcile.send()
    run_worker(broker)
    assert sorted(broker.recorder.names()) == ["archive_commit", "reconcile", "reconcile"]
    receipt = pipeline.receipt(staged)
    assert (receipt["state"], receipt["sha256"], receipt["size"]) == (
        "done", staged.sha256, staged.size)
    assert not os.path.exists(upload["spool_file"])

    raw = s3_client(moto.url)
    key = content_key(staged.sha256)
    stored = raw.get_object(Bucket=s3_store, Key=key)["Body"].read()
    assert sha256(stored) == staged.sha256 and len(stored) == staged.size
    head = raw.head_object(Bucket=s3_store, Key=key, ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == base64.b64encode(bytes.fromhex(staged.sha256)).decode()
    assert [o["Key"] for o in raw.list_objects_v2(Bucket=s3_store)["Contents"]] == [key]
    assert one(app, "SELECT sha256, size, object_key FROM assets") == {
        "sha256": staged.sha256, "size": staged.size, "object_key": key}


# ------------------------------------------- existing objects and assets


def test_same_pdf_from_two_jobs_is_one_object_rehashed(app, pipeline, local_store, monkeypatch):
    data = pipeline.pdf(seed=5)
    first = pipeline.stage("10.1234/first", data=data)
    second = pipeline.stage("10.1234/second", data=data)
    assert commit_directly(app, first.attempt_id, local_store) == "done"

    rehashed = []
    real = LocalObjectStore.sha256_of

    def spy(self, key):
        rehashed.append(key)
        return real(self, key)

    monkeypatch.setattr(LocalObjectStore, "sha256_of", spy)
    assert commit_directly(app, second.attempt_id, local_store) == "done"
    assert rehashed == [content_key(first.sha256)]  # existing object re-hashed

    for staged in (first, second):
        assert_archived_once(app, pipeline, staged, local_store)
    assets = rows(app, "SELECT canonical_key, object_key FROM assets ORDER BY canonical_key")
    assert assets == [{"canonical_key": "doi:10.1234/first", "object_key": content_key(first.sha256)},
                      {"canonical_key": "doi:10.1234/second", "object_key": content_key(first.sha256)}]
    assert object_files(local_store) == [content_key(first.sha256)]


def test_existing_asset_keeps_its_own_hash_and_size(app, client, admin_token, tmp_path, local_store):
    pipeline = Pipeline(app, client, admin_token, tmp_path, identity_mode="none")
    first = pipeline.stage("10.1234/SAME", data=pipeline.pdf(seed=6, target_bytes=20_000))
    other = pipeline.stage("https://doi.org/10.1234/same", data=pipeline.pdf(seed=7, target_bytes=30_000))
    assert first.job_id != other.job_id and first.sha256 != other.sha256
    assert commit_directly(app, first.attempt_id, local_store) == "done"
    assert commit_directly(app, other.attempt_id, local_store) == "done"

    asset = one(app, "SELECT canonical_key, sha256, size, object_key, attempt_id FROM assets")
    assert asset == {"canonical_key": "doi:10.1234/same", "sha256": first.sha256,
                     "size": first.size, "object_key": content_key(first.sha256),
                     "attempt_id": first.attempt_id}
    # The second upload is done too and its receipt keeps what was uploaded.
    receipt = pipeline.receipt(other)
    assert (receipt["state"], receipt["sha256"], receipt["size"]) == ("done", other.sha256, other.size)
    assert one(app, "SELECT state FROM jobs WHERE id = :j", j=other.job_id)["state"] == "done"
    assert one(app, "SELECT canonical_key FROM uploads WHERE attempt_id = :a",
               a=other.attempt_id)["canonical_key"] == "doi:10.1234/same"


def test_corrupted_existing_object_is_not_trusted_nor_overwritten(app, pipeline, local_store):
    staged = pipeline.stage("10.1234/corrupt", seed=8)
    key = content_key(staged.sha256)
    path = local_store.path_of(key)
    os.makedirs(os.path.dirname(path))
    bogus = b"%PDF-1.7 not the uploaded bytes %%EOF"
    with open(path, "wb") as f:
        f.write(bogus)

    assert commit_directly(app, staged.attempt_id, local_store) == "retry"

    with open(path, "rb") as f:
        assert f.read() == bogus  # left for an operator
    assert pipeline.receipt(staged)["state"] == "staged"
    assert rows(app, "SELECT * FROM assets") == []
    outbox = one(app, "SELECT tries, last_error FROM outbox WHERE topic = 'archive_commit' "
                      "AND done_at IS NULL")
    assert outbox["tries"] == 1
    assert "integrity" in outbox["last_error"].lower()
    assert staged.sha256 in outbox["last_error"]
    upload = one(app, "SELECT state, spool_file FROM uploads WHERE attempt_id = :a",
                 a=staged.attempt_id)
    assert upload["state"] == "staged" and os.path.exists(upload["spool_file"])
    assert spool_reserved(app) == staged.size


def test_spool_file_changed_after_staging_is_re_hashed_and_discarded(app, pipeline, local_store):
    # The archive trusts the digest taken while streaming only while the spool
    # file is the one sealed then; bytes changed behind the master's back
    # (same size) are caught by the store re-hashing them.
    staged = pipeline.stage("10.1234/tampered", seed=9)
    upload = one(app, "SELECT spool_file FROM uploads WHERE attempt_id = :a", a=staged.attempt_id)
    time.sleep(0.05)  # past the filesystem clock's granularity, as any real later write is
    with open(upload["spool_file"], "r+b") as f:
        f.seek(staged.size // 2)
        f.write(b"X")

    # Retrying cannot mend it: the upload fails at once, its quota is freed,
    # and the job goes back to the queue for a fresh download.
    assert commit_directly(app, staged.attempt_id, local_store) == "skip"
    assert not os.path.exists(local_store.path_of(content_key(staged.sha256)))
    assert not os.path.exists(upload["spool_file"])
    assert rows(app, "SELECT * FROM assets") == []
    receipt = pipeline.receipt(staged)
    assert receipt["state"] == "failed" and receipt["error"]["code"] == "spool_damaged"
    assert one(app, "SELECT state FROM jobs WHERE id = :j", j=staged.job_id)["state"] == "todo"
    assert spool_reserved(app) == 0
    assert rows(app, "SELECT * FROM outbox WHERE topic = 'archive_commit' AND done_at IS NULL") == []


# ------------------------------------------------------ transactions


class BlockingStore:
    """Wraps a store; put_file waits until the test lets it go on."""

    def __init__(self, inner, on_enter=None):
        self.inner = inner
        self.entered = threading.Event()
        self.release = threading.Event()
        self.on_enter = on_enter

    def put_file(self, *args, **kwargs):
        self.entered.set()
        if not self.release.wait(30):
            raise RuntimeError("test never released put_file")
        return self.inner.put_file(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_no_transaction_is_open_across_the_object_store_call(app, pipeline, local_store,
                                                             database_url):
    staged = pipeline.stage("10.1234/txn", seed=9)

    # The probe sees a transaction left open by someone else.
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM uploads")
        deadline = time.monotonic() + 5
        while not idle_in_transaction(database_url) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(idle_in_transaction(database_url)) == 1
        holder.rollback()
    assert idle_in_transaction(database_url) == []

    store = BlockingStore(local_store)
    result = {}

    def run():
        result["value"] = commit_directly(app, staged.attempt_id, store)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert store.entered.wait(30)
        # The commit is inside the object-store call now.
        seen = []
        for _ in range(5):
            seen += idle_in_transaction(database_url)
            time.sleep(0.05)
        assert seen == []
    finally:
        store.release.set()
        thread.join(30)
    assert result["value"] == "done"
    assert_archived_once(app, pipeline, staged, local_store)


# ------------------------------------------------------ staged retention


def test_staged_upload_past_retention_fails_and_frees_quota(app, pipeline, local_store):
    staged = pipeline.stage("10.1234/expired", seed=10)
    spool_file = one(app, "SELECT spool_file FROM uploads WHERE attempt_id = :a",
                     a=staged.attempt_id)["spool_file"]
    rows(app, "UPDATE uploads SET staged_at = now() - interval '8 days' WHERE attempt_id = :a",
         a=staged.attempt_id)
    from app.extensions import db
    from app.uploads import sweeper
    with app.app_context():
        swept = sweeper.sweep(app.config)
        db.session.remove()
    assert swept["expired"] == 1
    receipt = pipeline.receipt(staged)
    assert receipt["state"] == "failed"
    assert receipt["error"]["code"] == "storage_unavailable"
    assert one(app, "SELECT state FROM jobs WHERE id = :j", j=staged.job_id)["state"] == "failed"
    assert spool_reserved(app) == 0
    assert not os.path.exists(spool_file)
    # The pending archive commit finds nothing to do and is closed.
    assert commit_directly(app, staged.attempt_id, local_store) == "skip"
    assert rows(app, "SELECT id FROM outbox WHERE done_at IS NULL") == []
    assert object_files(local_store) == []
