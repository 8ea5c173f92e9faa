"""A converter that restarts before it calls back does not lose the job
(issue 10 §2, seed rows F16/F17), with real processes throughout:

- the converter is its own process (tests/hook_converter.py) that answers
  202 and keeps the job in memory; it is SIGKILLed before it calls back and
  started again on the same port;
- the tasks process is the real ``dramatiq tasks`` on the test Redis, killed
  and started again in between; the real ``python -m tasks.clock`` sends the
  periodic reconcile;
- the master is a real HTTP server on the test database, which the
  converter calls back.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import redis

from tests.conftest import free_port
from tests.support.archive import commit_directly, local_store, one  # noqa: F401 (fixtures)
from tests.support.archive import Pipeline
from tests.support.hooks import add_consumer, delivery_ids

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
CONVERTER = os.path.join(ROOT, "tests", "hook_converter.py")


class Process:
    """A child in its own process group, so that SIGKILL takes its children
    (dramatiq's worker processes) with it."""

    def __init__(self, argv: list[str], env: dict, log_path):
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


def wait_for(what: str, check, seconds: float = 90, *, logs=()):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}\n" + "\n".join(p.log() for p in logs))


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def events(path, kind: str) -> list[dict]:
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == kind]


@pytest.fixture
def tasks_env(database_url, redis_url, live_server, local_store):
    """The environment of the tasks and clock processes: this test's
    database, its Redis, the local store of ``local_store`` (FLEETHQ_* set by
    that fixture) and the live master as the public URL for callbacks."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLEETHQ_STUB_BROKER", "PROMETHEUS_MULTIPROC_DIR")}
    env.update({"DATABASE_URL": database_url, "REDIS_URL": redis_url, "FLEETHQ_LOG_JSON": "false",
                "FLEETHQ_PUBLIC_URL": live_server.url, "FLEETHQ_RECONCILE_EVERY_S": "1",
                "FLEETHQ_OUTBOUND_ALLOW": "127.0.0.0/8",  # the test's consumer listens on loopback
                "PYTHONPATH": ROOT})
    queues = redis.Redis.from_url(redis_url)
    stale = queues.keys("dramatiq:*")
    if stale:
        queues.delete(*stale)
    yield env
    stale = queues.keys("dramatiq:*")
    if stale:
        queues.delete(*stale)


def delivery(app, delivery_id: int) -> dict:
    return one(app, "SELECT state, tries, last_status, delivered_at, "
                    "extract(epoch FROM delivered_at) AS delivered_epoch "
                    "FROM hook_deliveries WHERE id = :d", d=delivery_id)


def test_converter_killed_before_its_callback_gets_the_delivery_again_until_it_confirms(
        app, client, admin_token, tmp_path, tasks_env, hints):
    pipeline = Pipeline(app, client, admin_token, tmp_path)
    port = free_port()
    events_path, go = tmp_path / "converter.jsonl", tmp_path / "go.flag"
    converter_argv = [sys.executable, CONVERTER, "--port", str(port), "--log", str(events_path)]
    tasks_argv = [os.path.join(BIN, "dramatiq"), "tasks:setup_broker", "--processes", "1", "--threads", "2"]
    clock_argv = [sys.executable, "-m", "tasks.clock"]
    started: list[Process] = []

    def start(argv, name) -> Process:
        started.append(Process(argv, tasks_env, tmp_path / f"{name}-{len(started)}.log"))
        return started[-1]
    try:
        converter = start(converter_argv, "converter")
        wait_for("the converter to listen", lambda: listening(port), logs=started)
        # The shortest completion timeout the API accepts.
        add_consumer(pipeline, f"http://127.0.0.1:{port}/convert", completion_timeout_seconds=10)
        worker, _clock = start(tasks_argv, "tasks"), start(clock_argv, "clock")

        staged = pipeline.stage("10.1234/converted", seed=50)
        assert commit_directly(app, staged.attempt_id) == "done"
        [delivery_id] = delivery_ids(app)

        # The reconcile sends the delivery; the converter accepts it (202) and
        # holds it only in memory.
        [first] = wait_for("the first POST", lambda: events(events_path, "post"), logs=started)
        assert first["delivery_id"] == str(delivery_id) and first["sha256"] == staged.sha256
        wait_for("the 202 to be recorded",
                 lambda: delivery(app, delivery_id)["state"] == "awaiting_callback", logs=started)
        converter.kill()  # before it called back: the job is gone with it
        worker.kill()  # and the tasks process restarts too
        assert delivery(app, delivery_id)["state"] == "awaiting_callback"
        worker = start(tasks_argv, "tasks")
        converter = start(converter_argv + ["--call-back-when", str(go)], "converter")
        wait_for("the converter to listen again", lambda: listening(port), logs=started)

        # After the completion timeout the delivery comes again: same id, same token.
        posts = wait_for("the re-sent POST", lambda: events(events_path, "post")[1:] and
                         events(events_path, "post"), seconds=120, logs=started)
        again = posts[1]
        assert again["pid"] != first["pid"]
        assert (again["delivery_id"], again["callback_token"]) == (
            first["delivery_id"], first["callback_token"])
        wait_for("the second 202 to be recorded",
                 lambda: delivery(app, delivery_id)["tries"] == 2, logs=started)
        row = delivery(app, delivery_id)
        assert (row["state"], row["last_status"], row["delivered_at"]) == ("awaiting_callback", 202, None)

        # Done exactly when the converter says so.
        before = time.time()
        go.touch()
        [confirmed] = wait_for("the callback", lambda: events(events_path, "callback"), logs=started)
        assert confirmed["status"] == 200
        row = delivery(app, delivery_id)
        assert row["state"] == "delivered"
        assert before - 1 <= float(row["delivered_epoch"]) <= confirmed["at"] + 1
        assert one(app, "SELECT count(*) AS n FROM outbox WHERE topic = 'hook_delivery' "
                        "AND done_at IS NULL")["n"] == 0  # nothing will re-send it
        assert len(events(events_path, "post")) == 2
    finally:
        for process in reversed(started):
            process.kill()
