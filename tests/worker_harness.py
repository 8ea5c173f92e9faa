"""Fixtures for the fleethq-worker tests (no tests here).

A real master: the test app behind a werkzeug server on a fixed port
(worker_gate.py), a real Dramatiq worker on
the test Redis doing the archive commits, the local store in tmp_path, the
local test publisher, and ``fleethq-worker`` itself as a subprocess
(``python -m workers.runner.cli run``), so that kill -9 is a real crash.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import dramatiq
import pytest

import tasks
from app import config as app_config
from tasks import actors
from tests.conftest import unique
from tests.fleet_helpers import decide, enrollment_credential, pdf_project
from tests.helpers import VERSION, Api, close_broker, db_rows, send_hints_to, wait_for
from tests.worker_gate import Master

ROOT = Path(__file__).resolve().parent.parent
PIPELINE_ACTORS = (actors.archive_commit, actors.deliver_hook, actors.reconcile, actors.sweep_spool)


def sql(app, statement: str, **params) -> list[dict]:
    return db_rows(app, statement, **params)


class WorkerProcess:
    """``python -m workers.runner.cli run`` with the test settings."""

    def __init__(self, master: Master, volume: Path, projects: list[str], log: Path, *,
                 publisher_networks: str, enroll: str | None = None, extra_env: dict | None = None):
        self.master, self.volume, self.projects, self.log = master, volume, projects, log
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLEETHQ_")},
                    "FLEETHQ_MASTER": master.url, "FLEETHQ_VOLUME": str(volume),
                    "FLEETHQ_PROJECTS": ",".join(projects), "FLEETHQ_CLIENT_VERSION": VERSION,
                    "FLEETHQ_ALLOW_HTTP": "1", "FLEETHQ_HEARTBEAT_SECONDS": "2",
                    "FLEETHQ_CONCURRENCY": "2", "FLEETHQ_MIN_FREE_BYTES": "0",
                    "FLEETHQ_FETCH_ALLOW_NETWORKS": publisher_networks,
                    "FLEETHQ_FETCH_TIMEOUT": "20", "PYTHONUNBUFFERED": "1",
                    **({"FLEETHQ_ENROLL": enroll} if enroll else {}), **(extra_env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self) -> "WorkerProcess":
        out = open(self.log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "workers.runner.cli", "run"],
                                     cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        out.close()
        return self

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)  # no handler, no cleanup: a real crash
        self.proc.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def identity(self) -> dict | None:
        try:
            return json.loads((self.volume / "identity.json").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def journal(self) -> dict:
        try:
            return json.loads((self.volume / "journal.json").read_text())["entries"]
        except (FileNotFoundError, ValueError, KeyError):
            return {}

    def states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in self.journal().values():
            counts[entry["state"]] = counts.get(entry["state"], 0) + 1
        return counts

    def files(self) -> list[str]:
        return sorted(p.name for sub in ("ready", "tmp") for p in (self.volume / sub).glob("**/*")
                      if p.is_file())


@pytest.fixture
def archiver(app, redis_url, database_url, monkeypatch, tmp_path):
    """A real Dramatiq worker on the test Redis (own namespace) that archives
    staged uploads into a local store in tmp_path, as the ``tasks`` process does."""
    data_dir, objects = tmp_path / "master-data", tmp_path / "objects"
    for key in [k for k in app.config if k.startswith("S3_")]:
        monkeypatch.delitem(app.config, key)
    for key in [k for k in os.environ if k.startswith("S3_")]:
        monkeypatch.delenv(key)
    settings = {"DATA_DIR": str(data_dir), "SPOOL_DIR": str(data_dir / "spool"),
                "OBJECT_STORE_DIR": str(objects), "SECRET_KEY": f"test-{uuid.uuid4().hex}",
                "PUBLIC_URL": ""}
    for key, value in settings.items():
        monkeypatch.setitem(app.config, key, value)
        monkeypatch.setenv(f"FLEETHQ_{key}", value)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("FLEETHQ_LOG_JSON", "false")
    broker = tasks.make_broker(app_config.load())
    broker.namespace = f"fhq-worker-test-{uuid.uuid4().hex[:10]}"
    for actor in PIPELINE_ACTORS:
        monkeypatch.setattr(actor, "broker", broker)
        broker.declare_actor(actor)
    send_hints_to(monkeypatch, app, broker)
    worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    yield objects
    worker.stop()
    broker.flush_all()
    close_broker(broker)


@pytest.fixture
def master(app, archiver):
    server = Master(app).start()
    yield server
    server.stop()


@pytest.fixture
def publisher():
    from tests.publisher import Publisher
    pub = Publisher()
    pub.start()
    yield pub
    pub.stop()


@pytest.fixture
def fleet(app, client, admin_token, master, publisher, tmp_path):
    """Build pdf projects and worker processes against the live master."""
    built = Fleet(app, Api(client, admin_token), master, publisher, tmp_path)
    yield built
    built.cleanup()


class Fleet:
    def __init__(self, app, api, master, publisher, tmp_path):
        self.app, self.api, self.master, self.publisher = app, api, master, publisher
        self.tmp_path = tmp_path
        self.workers: list[WorkerProcess] = []

    def project(self, **policy) -> str:
        project = unique("wk")
        policy = {"client_versions": [VERSION], "max_in_flight": 64, "max_worker_in_flight": 32,
                  "retry_backoff_seconds": 0, **policy}
        pdf_project(self.api, project, **policy)
        return project

    def enqueue(self, project: str, values: list[str]) -> None:
        response = self.api.enqueue(project, [{"value": v} for v in values])
        assert response.status_code in (200, 201), response.json

    def worker(self, project: str | list[str], volume: Path | None = None, *, approve: bool = True,
               **extra_env) -> WorkerProcess:
        volume = volume or self.tmp_path / f"volume-{len(self.workers)}"
        projects = [project] if isinstance(project, str) else project
        proc = WorkerProcess(self.master, volume, projects, self.tmp_path / f"worker-{len(self.workers)}.log",
                             publisher_networks=self.publisher_networks(),
                             enroll=enrollment_credential(self.app),
                             extra_env={k: str(v) for k, v in extra_env.items()})
        self.workers.append(proc)
        proc.start()
        if approve:
            self.approve(proc)
        return proc

    def approve(self, proc: WorkerProcess) -> str:
        ident = wait_for(lambda: (proc.identity() or {}).get("registered") and proc.identity(),
                         30, f"registration\n{proc.output()}")
        assert decide(self.app, ident["worker_id"], "approve") == "active"
        return ident["worker_id"]

    def publisher_networks(self) -> str:
        return f"{self.publisher.host}/32"

    def counts(self, project: str) -> dict:
        return self.api.counts(project)

    def wait_settled(self, project: str, n: int, timeout: float = 120, proc=None) -> dict:
        def settled():
            c = self.counts(project)
            return c if c["done"] + c["failed"] + c["reset_exhausted"] >= n else None
        return wait_for(settled, timeout, f"{n} jobs to settle in {project}: {self.counts(project)}\n"
                        + (proc.output()[-4000:] if proc else ""))

    def archived_once(self, project: str) -> list[dict]:
        """Every done job has exactly one done upload and one asset."""
        rows = sql(self.app, "SELECT j.id, j.state, "
                   "(SELECT count(*) FROM uploads u WHERE u.job_id = j.id AND u.state = 'done') AS done_uploads, "
                   "(SELECT count(*) FROM assets a JOIN attempts t ON t.id = a.attempt_id "
                   " WHERE t.job_id = j.id) AS assets FROM jobs j WHERE j.project_id = :p", p=project)
        for row in rows:
            if row["state"] == "done":
                assert (row["done_uploads"], row["assets"]) == (1, 1), row
        return rows

    def cleanup(self) -> None:
        for proc in self.workers:
            if proc.proc and proc.proc.poll() is None:
                proc.proc.kill()
                proc.proc.wait(10)
