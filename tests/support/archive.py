"""The archive pipeline as the tests drive it: a project with a staged
upload (``Pipeline``, ``Staged``), a Dramatiq broker built as the tasks
process builds it (``make_broker``, ``run_worker``), the local object store
(``local_store``, autouse where imported) and a moto S3 server that can go
down (``MotoServer``, ``moto``, ``s3_store``), with small SQL readers."""
from __future__ import annotations

import hashlib
import os
import threading
import uuid
from dataclasses import dataclass
import dramatiq
import psycopg
import pytest
from dramatiq.common import QueueJoinTimeout
import tasks
from app import config as app_config
from app.storage import LocalObjectStore, from_config
from tasks import actors
from tests.conftest import free_port, unique
from tests.fleet_helpers import Node, pdf_project
from tests.helpers import Api, body, close_broker, db_rows, send_hints_to
from tests.pdfs import make_pdf


PIPELINE_ACTORS = (actors.archive_commit, actors.deliver_hook, actors.reconcile,
                   actors.sweep_spool)


QUEUES = ("maintenance", "archive", "hooks")


class Recorder(dramatiq.Middleware):
    """What was enqueued (actor, args) and how each processed message ended."""

    def __init__(self):
        self.enqueued: list[tuple[str, tuple]] = []
        self.processed: list[tuple[str, tuple, BaseException | None]] = []
        self._lock = threading.Lock()

    def after_enqueue(self, broker, message, delay):
        with self._lock:
            self.enqueued.append((message.actor_name, tuple(message.args)))

    def after_process_message(self, broker, message, *, result=None, exception=None):
        with self._lock:
            self.processed.append((message.actor_name, tuple(message.args), exception))

    def names(self, which="processed") -> list[str]:
        return [entry[0] for entry in getattr(self, which)]


def rows(app, sql: str, **params) -> list[dict]:
    return db_rows(app, sql, **params)


def one(app, sql: str, **params) -> dict:
    found = rows(app, sql, **params)
    assert len(found) == 1, found
    return found[0]


def commit_directly(app, attempt_id: int, store=None) -> str:
    """The archive commit as the actor runs it, in this process."""
    from app.extensions import db
    from app.uploads import archive
    with app.app_context():
        try:
            return archive.commit(attempt_id, store or from_config(app.config))
        finally:
            db.session.remove()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Staged:
    attempt_id: int
    job_id: int
    sha256: str
    size: int
    data: bytes
    node: Node


class Pipeline:
    """A pdf project with an approved node that stages uploads over the API."""

    def __init__(self, app, client, admin_token, tmp_path, *, identity_mode="unique_value"):
        self.app, self.client, self.tmp_path = app, client, tmp_path
        self.api = Api(client, admin_token)
        self.project = unique("arch")
        pdf_project(self.api, self.project, identity_mode=identity_mode,
                    max_in_flight=100, max_worker_in_flight=100)
        self.node = Node(client, app)

    def pdf(self, seed: int, target_bytes: int = 20_000) -> bytes:
        path = self.tmp_path / f"paper-{seed}-{target_bytes}.pdf"
        digest = make_pdf(path, target_bytes=target_bytes, seed=seed)
        data = path.read_bytes()
        assert sha256(data) == digest
        return data

    def stage(self, value: str, *, seed: int = 0, data: bytes | None = None) -> Staged:
        response = self.api.enqueue(self.project, [{"value": value}])
        assert response.status_code in (200, 201), body(response)
        assert self.node.heartbeat().status_code == 200
        claimed = body(self.node.claim(self.project))["jobs"]
        assert len(claimed) == 1, claimed
        job = claimed[0]
        data = self.pdf(seed) if data is None else data
        response = self.node.upload(job["attempt_id"], data)
        assert response.status_code == 202, body(response)
        assert body(response)["state"] == "staged"
        return Staged(int(job["attempt_id"]), int(job["job_id"]), sha256(data), len(data), data,
                      self.node)

    def receipt(self, staged: Staged) -> dict:
        response = staged.node.receipt(str(staged.attempt_id))
        assert response.status_code == 200, body(response)
        return body(response)


def run_worker(broker, *, threads: int = 1, timeout_ms: int = 60_000) -> None:
    """Start a real dramatiq.Worker, wait until every queue is empty, stop it."""
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=100)
    worker.start()
    try:
        for _ in range(10):  # a processed message may enqueue into another queue
            for queue in QUEUES:
                try:
                    broker.join(queue, timeout=timeout_ms)
                except QueueJoinTimeout:
                    pytest.fail(f"{queue} not drained: {broker.recorder.processed}")
            worker.join()
            if all(broker.do_qsize(q) == 0 for q in QUEUES):
                break
    finally:
        worker.stop()


def idle_in_transaction(database_url: str) -> list[tuple]:
    """Backends of the test database holding a transaction open while idle."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(
            "SELECT pid, state, left(query, 200) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND state LIKE 'idle in transaction%'").fetchall()


@pytest.fixture(autouse=True)
def local_store(app, tmp_path, monkeypatch):
    """Spool and local object store in tmp_path, for this app and for the
    app a Dramatiq worker builds from the environment; no S3."""
    data_dir, objects = tmp_path / "data", tmp_path / "objects"
    secret = f"test-secret-{uuid.uuid4().hex}"
    for key in [k for k in app.config if k.startswith("S3_")]:
        monkeypatch.delitem(app.config, key)
    for key in [k for k in os.environ if k.startswith("S3_")]:
        monkeypatch.delenv(key)
    settings = {"DATA_DIR": str(data_dir), "SPOOL_DIR": str(data_dir / "spool"),
                "OBJECT_STORE_DIR": str(objects), "SECRET_KEY": secret, "PUBLIC_URL": ""}
    for key, value in settings.items():
        monkeypatch.setitem(app.config, key, value)
        monkeypatch.setenv(f"FLEETHQ_{key}", value)
    return LocalObjectStore(str(objects))


@pytest.fixture
def make_broker(app, redis_url, database_url, monkeypatch):
    """Build the broker exactly as the ``tasks`` process does (tasks.make_broker)
    on the test Redis, in a namespace of this test only. Each call is a fresh
    "tasks process" (its own AppContext and app). The actors and the test
    app's outbox hints point at the newest broker."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("FLEETHQ_LOG_JSON", "false")
    monkeypatch.setenv("FLEETHQ_OUTBOUND_ALLOW", "127.0.0.0/8")   # the tests' hook consumers
    namespace = f"fhq-test-{uuid.uuid4().hex[:10]}"
    made = []

    def build():
        broker = tasks.make_broker(app_config.load())
        broker.namespace = namespace
        broker.recorder = Recorder()
        broker.add_middleware(broker.recorder)
        for actor in PIPELINE_ACTORS:
            monkeypatch.setattr(actor, "broker", broker)
            broker.declare_actor(actor)
        send_hints_to(monkeypatch, app, broker)
        made.append(broker)
        return broker

    yield build
    if made:
        made[-1].flush_all()
        stale = made[-1].client.keys(f"{namespace}*")  # dead letters too
        if stale:
            made[-1].client.delete(*stale)
    for broker in made:
        close_broker(broker)


@pytest.fixture
def pipeline(app, client, admin_token, tmp_path):
    return Pipeline(app, client, admin_token, tmp_path)


def spool_reserved(app) -> int:
    return one(app, "SELECT reserved_bytes FROM spool_usage WHERE id = 1")["reserved_bytes"]


class MotoServer:
    """moto's threaded S3 server on a fixed port that can go down and come back."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = None

    def start(self):
        from moto.server import ThreadedMotoServer
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def stop(self):
        if self._server is not None:
            self._server.stop()
            self._server._server.server_close()  # refuse connections, not just stop serving
            self._server = None


@pytest.fixture
def moto():
    server = MotoServer()
    server.start()
    yield server
    server.stop()


def s3_client(endpoint: str):
    import boto3
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


@pytest.fixture
def s3_store(app, moto, monkeypatch):
    bucket = f"archive-{uuid.uuid4().hex[:12]}"
    s3_client(moto.url).create_bucket(Bucket=bucket)
    settings = {"S3_BUCKET": bucket, "S3_ENDPOINT_URL": moto.url, "S3_REGION": "us-east-1",
                "S3_ACCESS_KEY_ID": "test", "S3_SECRET_ACCESS_KEY": "test",
                "S3_CONNECT_TIMEOUT": "1", "S3_READ_TIMEOUT": "3", "S3_MAX_ATTEMPTS": "1"}
    for key, value in settings.items():
        monkeypatch.setitem(app.config, key, value)
        monkeypatch.setenv(key, value)  # the worker's app reads S3_* from the environment
    return bucket
