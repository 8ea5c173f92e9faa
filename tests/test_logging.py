"""One logging setup for every process (workers/logs.py, issue "The first
day of an operator"): JSON lines with ISO times in UTC, the process's role
and the request id in production; readable text in a terminal; and a
request's id on the lines of the task its outbox hint started, seen across a
real gunicorn and a real Dramatiq process."""
from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys

import pytest
import redis
import requests

from tests.gunicorn_master import ROOT, Gunicorn
from tests.helpers import Api, sql, stop_group, wait_for
from workers import logs

BIN = os.path.dirname(sys.executable)
ISO_UTC = re.compile(r"\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z\Z")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logs.clear()


def test_json_lines_carry_an_iso_utc_time_the_role_and_what_was_bound(restore_logging):
    out = io.StringIO()
    logs.configure("clock", json=True, stream=out)
    logs.bind(request_id="r-42")
    logging.getLogger("fleethq.example").warning("lease %s swept", "j1", extra={"project_id": "papers"})
    line = json.loads(out.getvalue().splitlines()[-1])
    assert ISO_UTC.match(line["ts"]), line["ts"]
    assert (line["level"], line["logger"], line["process"], line["pid"]) == (
        "warning", "fleethq.example", "clock", os.getpid())
    assert (line["msg"], line["request_id"], line["project_id"]) == ("lease j1 swept", "r-42", "papers")


def test_a_process_started_under_a_role_of_its_own_says_so(restore_logging, monkeypatch):
    """The master's fetcher runs the worker program with FLEETHQ_PROCESS=fetcher."""
    monkeypatch.setenv(logs.PROCESS_SETTING, "fetcher")
    out = io.StringIO()
    logs.configure("worker", json=True, stream=out)
    logging.getLogger("fleethq.worker").warning("claimed")
    assert json.loads(out.getvalue().splitlines()[-1])["process"] == "fetcher"


def test_a_terminal_gets_readable_text_and_production_gets_json(restore_logging, monkeypatch):
    monkeypatch.delenv(logs.JSON_SETTING, raising=False)
    assert logs.wants_json(None, Terminal()) is False
    assert logs.wants_json(None, io.StringIO()) is True      # a pipe, a file, a log shipper
    assert logs.wants_json("false", io.StringIO()) is False  # FLEETHQ_LOG_JSON says so
    monkeypatch.setenv(logs.JSON_SETTING, "true")
    assert logs.wants_json(None, Terminal()) is True
    monkeypatch.delenv(logs.JSON_SETTING)
    out = Terminal()
    logs.configure("worker", stream=out)
    logging.getLogger("fleethq.worker").info("claimed %d jobs", 3)
    text = out.getvalue().splitlines()[-1]
    assert not text.startswith("{")
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z \[info\s*\] claimed 3 jobs", text), text
    assert "process=worker" in text


def test_the_request_id_follows_a_request_into_its_task(app, admin_token, database_url, redis_url, tmp_path):
    queues = redis.Redis.from_url(redis_url)
    stale = queues.keys("dramatiq:*")
    if stale:
        queues.delete(*stale)
    env = {"DATABASE_URL": database_url, "REDIS_URL": redis_url, "FLEETHQ_LOG_JSON": "true",
           "FLEETHQ_STUB_BROKER": "false", "FLEETHQ_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": ROOT}
    web = Gunicorn(env, tmp_path / "web.log")
    tasks_env = {**{k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}, **env,
                 "FLEETHQ_LOG_LEVEL": "DEBUG"}
    tasks_log = open(tmp_path / "tasks.log", "wb")
    tasks = subprocess.Popen([os.path.join(BIN, "dramatiq"), "tasks:setup_broker", "--processes", "1",
                              "--threads", "1"], cwd=ROOT, env=tasks_env, stdout=tasks_log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        web.wait_ready()
        api = Api(requests.Session(), admin_token, base=web.url)
        api.put_project("traced", kind="pdf", identity_mode="unique_value")
        sql(app, "INSERT INTO hook_consumers (id, project_id, name, url, secret) VALUES "
                 "(7001, 'traced', 'gone', 'http://127.0.0.1:9/hook', 'sssssssssssssssssss')")
        delivery = sql(app, "INSERT INTO hook_deliveries (consumer_id, project_id, attempt_id, asset_key, "
                            "state, tries) VALUES (7001, 'traced', 1, 'doi/x.pdf', 'failed', 3) RETURNING id")[0][0]
        answer = api.call("POST", f"/api/v1/admin/hooks/deliveries/{delivery}/retry",
                          headers={"X-Request-ID": "trace-web-to-task-1"})
        assert answer.status_code == 200 and answer.headers["X-Request-ID"] == "trace-web-to-task-1"

        def traced() -> list[dict]:
            lines = []
            for raw in (tmp_path / "tasks.log").read_text(errors="replace").splitlines():
                if raw.startswith("{"):
                    lines.append(json.loads(raw))
            return [e for e in lines if e.get("request_id") == "trace-web-to-task-1"]
        seen = wait_for(traced, timeout=60, what="a tasks line with the request's id")
        assert seen[0]["process"] == "tasks" and seen[0]["actor"] == "deliver_hook"
        assert ISO_UTC.match(seen[0]["ts"])
        # The web process speaks the same JSON, gunicorn's own lines included.
        web_lines = [json.loads(raw) for raw in (tmp_path / "web.log").read_text().splitlines()
                     if raw.startswith("{")]
        assert any(e["logger"] == "gunicorn.error" and "Listening at" in e["msg"] for e in web_lines)
        assert all(e["process"] == "web" and ISO_UTC.match(e["ts"]) for e in web_lines)
        assert not [raw for raw in (tmp_path / "web.log").read_text().splitlines()
                    if raw.strip() and not raw.startswith("{")], "every web line is JSON"
    finally:
        web.stop()
        stop_group(tasks)
        tasks_log.close()
