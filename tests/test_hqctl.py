"""hqctl: admin CLI over the machine API.

Most tests run against a live master (``live_server``/``admin_token`` from
conftest). A few use a tiny stub HTTP server to provoke what a healthy master
never does: redirects, 503s, dropped connections.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from workers import hqctl, source_cli


def run(capsys, *argv):
    code = hqctl.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def name(prefix="cli"):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def hq(capsys, live_server, admin_token):
    """Run hqctl as the admin against the live master: (code, stdout, stderr)."""
    def call(*argv, token=admin_token):
        return run(capsys, "--master", live_server.url, "--token", token, *argv)
    return call


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


# --- against a live master ------------------------------------------------------------

def test_whoami(hq):
    code, out, _ = hq("whoami")
    assert code == 0 and json.loads(out)["user_id"] == "admin"


def test_enqueue_in_batches_then_rerun_is_idempotent(hq, tmp_path):
    project = name()
    assert hq("project", "put", project)[0] == 0
    values = tmp_path / "values.txt"
    values.write_text("".join(f"https://example.org/item/{i}\n" for i in range(2500)))

    code, out, err = hq("enqueue", project, "--batch-size", "1000", str(values))
    assert code == 0, err
    assert json.loads(out) == {"submitted": 2500, "inserted": 2500, "batches": 3}
    assert err == ""  # no progress bar when stderr is not a terminal

    code, out, err = hq("enqueue", project, "--batch-size", "1000", str(values))
    assert code == 0, err
    assert json.loads(out) == {"submitted": 2500, "inserted": 0, "batches": 3}

    code, out, _ = hq("project", "get", project)
    assert code == 0
    summary = json.loads(out)
    assert summary["identity_mode"] == "external_id" and summary["job_counts"]["todo"] == 2500


def test_conflicting_job_exits_1_and_reports_what_was_committed(hq, tmp_path):
    project = name()
    assert hq("project", "put", project)[0] == 0
    first = tmp_path / "first.jsonl"
    first.write_text('{"id": "a", "value": "https://example.org/one"}\n')
    assert hq("enqueue", project, "--jsonl", str(first))[0] == 0
    second = tmp_path / "second.jsonl"
    second.write_text('{"id": "b", "value": "https://example.org/two"}\n'
                      '{"id": "a", "value": "https://example.org/other"}\n'
                      '{"id": "c", "value": "https://example.org/three"}\n')

    code, out, err = hq("enqueue", project, "--jsonl", "--batch-size", "1", str(second))
    assert code == 1 and out == ""
    assert err.startswith("identity_conflict: ")
    report = last_json(err)
    assert report["error"]["code"] == "identity_conflict"
    assert report["committed"] == 1 and report["batches"] == 1
    assert report["failed_job_at"].endswith("second.jsonl:2")
    counts = json.loads(hq("project", "get", project)[1])["job_counts"]
    assert counts["todo"] == 2  # a and b; c was never sent


def test_local_validation_happens_before_anything_is_sent(hq, tmp_path):
    project = name()
    assert hq("project", "put", project, "--identity-mode", "unique_value")[0] == 0
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"value": "https://example.org/1"}\n{"value": "x", "hops": -1}\n')
    code, _, err = hq("enqueue", project, "--jsonl", str(jobs))
    assert code == 1 and "jobs.jsonl:2:" in err and last_json(err)["committed"] == 0
    assert json.loads(hq("project", "get", project)[1])["job_counts"]["todo"] == 0
    # --default-ids makes no sense without ids.
    assert hq("enqueue", project, "--default-ids", str(jobs))[0] == 2


def test_enqueue_source_of_a_packed_file(hq, tmp_path, capsys):
    project = name()
    assert hq("project", "put", project)[0] == 0
    values = tmp_path / "values.txt"
    values.write_text("".join(f"https://example.org/src/{i}\n" for i in range(300)))
    packed = tmp_path / "jobs.jsonl.zst"
    assert source_cli.main(["pack", "--default-ids", "-o", str(packed), str(values)]) == 0
    assert source_cli.main(["stat", str(packed)]) == 0
    stat = last_json(capsys.readouterr()[0])

    code, out, err = hq("enqueue-source", project, str(packed))
    assert code == 0, err
    assert json.loads(out) == {"jobs": 300, "inserted": 300,
                               "uncompressed_bytes": stat["uncompressed_bytes"]}
    assert json.loads(hq("enqueue-source", project, str(packed))[1])["inserted"] == 0
    # The same values through `enqueue` get the same default ids: nothing new.
    assert json.loads(hq("enqueue", project, str(values))[1])["inserted"] == 0


def test_jobs_list_show_and_delete(hq, tmp_path, live_server, admin_token):
    project = name()
    assert hq("project", "put", project)[0] == 0
    values = tmp_path / "values.txt"
    values.write_text("https://example.org/a\nhttps://example.org/b\nhttps://example.org/c\n")
    assert hq("enqueue", project, str(values))[0] == 0

    code, out, err = hq("jobs", "list", project, "--status", "todo", "--limit", "2")
    assert code == 0, err
    page = json.loads(out)
    assert len(page["jobs"]) == 2 and page["next_after_job_id"]
    code, out, _ = hq("jobs", "list", project, "--after", page["next_after_job_id"])
    assert [job["value"] for job in page["jobs"] + json.loads(out)["jobs"]] == [
        "https://example.org/a", "https://example.org/b", "https://example.org/c"]
    # --all follows the cursor (pages of one here): one job per line.
    code, out, err = hq("jobs", "list", project, "--all", "--limit", "1")
    assert code == 0, err
    assert [json.loads(line)["value"] for line in out.splitlines()] == [
        "https://example.org/a", "https://example.org/b", "https://example.org/c"]
    # Piped into a reader that stops early: quiet, no traceback.
    hqctl = os.path.join(os.path.dirname(sys.executable), "hqctl")
    piped = subprocess.run(
        f"set -o pipefail; {hqctl} --master {live_server.url} --token {admin_token} "
        f"jobs list {project} --all --limit 1 | head -n 1",
        shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and "Traceback" not in piped.stderr, piped.stderr
    assert json.loads(piped.stdout)["value"] == "https://example.org/a"

    job_id = page["jobs"][0]["job_id"]
    code, out, _ = hq("jobs", "show", project, job_id)
    assert code == 0 and "https://example.org/a" in out
    assert hq("jobs", "delete", project, job_id)[0] == 0
    code, _, err = hq("jobs", "show", project, job_id)
    assert code == 1 and err.startswith("not_found: ")


def test_project_set_changes_only_the_given_fields(hq):
    project = name()
    assert hq("project", "put", project, "--kind", "generic", "--max-resets", "5")[0] == 0
    code, out, err = hq("project", "set", project, "--dispatch-qps", "2.5",
                        "--client-versions", "v1,v2", "--client_versions=v3",
                        "--prefer-new-worker", "true")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["dispatch_qps"] == 2.5 and summary["max_resets"] == 5
    assert summary["client_versions"] == ["v1", "v2", "v3"] and summary["prefer_new_worker"] is True
    summary = json.loads(hq("project", "set", project, "--dispatch-qps", "null")[1])
    assert summary["dispatch_qps"] is None
    assert hq("project", "set", project)[0] == 2  # nothing to change
    code, _, err = hq("project", "set", project, "--max-resets", "-1")
    assert code == 1 and err.startswith("invalid_request: ")
    assert project in [p["id"] for p in json.loads(hq("project", "list")[1])["projects"]]
    assert hq("project", "delete", project)[0] == 0
    assert hq("project", "get", project)[0] == 1


def test_token_rotate_prints_a_token_that_works_then_revoke(hq):
    user = name("user")
    code, out, err = hq("users", "put", user, "--roles", "worker")
    assert code == 0, err
    code, out, err = hq("token", "rotate", user)
    assert code == 0 and "only this once" in err
    token = out.strip()
    assert token and token not in err

    code, out, _ = hq("whoami", token=token)
    assert code == 0 and json.loads(out)["user_id"] == user
    assert hq("token", "show", user)[0] == 0
    assert hq("token", "revoke", user)[0] == 0
    code, _, err = hq("whoami", token=token)
    assert code == 1 and err.startswith("invalid_machine_token: ")


def test_unknown_project_is_reported(hq, tmp_path):
    values = tmp_path / "v.txt"
    values.write_text("x\n")
    code, _, err = hq("enqueue", name("missing"), str(values))
    assert code == 1 and err.startswith("not_found: ")


# --- settings, and a stub master for failures ---------------------------------------

def test_plain_http_to_a_remote_host_is_refused(capsys):
    code, _, err = run(capsys, "--master", "http://fleet.example.org", "--token", "t", "whoami")
    assert code == 2 and "--allow-http" in err


def test_missing_settings_are_usage_errors(capsys, monkeypatch):
    monkeypatch.delenv("FLEETHQ_MASTER", raising=False)
    monkeypatch.delenv("FLEETHQ_TOKEN", raising=False)
    monkeypatch.delenv("FLEETHQ_TOKEN_FILE", raising=False)
    assert run(capsys, "whoami")[0] == 2
    assert run(capsys, "--master", "https://fleet.example.org", "whoami")[0] == 2
    assert run(capsys, "project")[0] == 2


class Stub:
    """Answers from ``routes[(method, path)]``: a list of (status, body) used in
    turn (the last one repeats); a body of None drops the connection."""

    def __init__(self):
        self.routes: dict = {}
        self.seen: list = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                stub.seen.append((self.command, self.path, dict(self.headers), body))
                answers = stub.routes.get((self.command, self.path.split("?")[0]), [(404, {})])
                status, payload = answers.pop(0) if len(answers) > 1 else answers[0]
                if payload is None:
                    self.close_connection = True
                    return
                data = json.dumps(payload).encode()
                self.send_response(status)
                if status in (301, 302, 307, 308):
                    self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def posts(self, path):
        return [body for method, p, _, body in self.seen if method == "POST" and p == path]


@pytest.fixture
def stub():
    server = Stub()
    yield server
    server.server.shutdown()
    server.server.server_close()


def stub_run(capsys, stub, *argv):
    return run(capsys, "--master", stub.url, "--token", "fhq_test", *argv)


def test_redirects_are_not_followed(capsys, stub):
    stub.routes[("GET", "/api/v1/whoami")] = [(302, {})]
    code, _, err = stub_run(capsys, stub, "whoami")
    assert code == 1 and err.startswith("redirect: ")
    assert len(stub.seen) == 1
    assert stub.seen[0][2]["Authorization"] == "Bearer fhq_test"


def _mode(identity_mode):
    return [(200, {"id": "p", "identity_mode": identity_mode})]


BUSY = {"error": {"code": "spool_full", "message": "busy", "retryable": True,
                  "retry_after_ms": 1, "details": {}}}


def test_enqueue_retries_a_batch_the_master_did_not_apply(capsys, stub, tmp_path, monkeypatch):
    monkeypatch.setattr(hqctl.time, "sleep", lambda seconds: None)
    stub.routes[("GET", "/api/v1/admin/projects/p")] = _mode("external_id")
    stub.routes[("POST", "/api/v1/admin/projects/p/jobs")] = [
        (503, BUSY), (200, {"project_id": "p", "submitted": 1, "inserted": 1})]
    values = tmp_path / "v.txt"
    values.write_text("https://example.org/\n")

    code, out, err = stub_run(capsys, stub, "enqueue", "p", str(values))
    assert code == 0, err
    assert json.loads(out) == {"submitted": 1, "inserted": 1, "batches": 1}
    bodies = stub.posts("/api/v1/admin/projects/p/jobs")
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    assert json.loads(bodies[0]) == {"jobs": [{
        "value": "https://example.org/", "type": "seed",
        "id": "j1_92f50438a02ab171b6735678275a2f9db233d4c88e301a0243886c2679ce7070"}]}


def test_mode_none_never_resends_after_a_lost_response(capsys, stub, tmp_path, monkeypatch):
    monkeypatch.setattr(hqctl.time, "sleep", lambda seconds: None)
    stub.routes[("GET", "/api/v1/admin/projects/p")] = _mode("none")
    stub.routes[("POST", "/api/v1/admin/projects/p/jobs")] = [(200, None)]
    values = tmp_path / "v.txt"
    values.write_text("a\nb\n")

    code, _, err = stub_run(capsys, stub, "enqueue", "p", str(values))
    assert code == 1
    assert len(stub.posts("/api/v1/admin/projects/p/jobs")) == 1
    report = last_json(err)
    assert report["error"]["code"] == "connection_error" and "may have been applied" in report["note"]


def test_batches_are_cut_to_stay_under_8_mib(capsys, stub, tmp_path):
    stub.routes[("GET", "/api/v1/admin/projects/p")] = _mode("unique_value")
    stub.routes[("POST", "/api/v1/admin/projects/p/jobs")] = [(200, {"submitted": 1, "inserted": 1})]
    values = tmp_path / "v.txt"
    values.write_text("".join(f"https://example.org/{i:04d}/{'x' * 8100}\n" for i in range(1100)))

    code, out, err = stub_run(capsys, stub, "enqueue", "p", "--batch-size", "5000", str(values))
    assert code == 0, err
    bodies = stub.posts("/api/v1/admin/projects/p/jobs")
    assert json.loads(out)["batches"] == len(bodies) == 2
    assert all(len(body) < 8 * 1024 * 1024 for body in bodies)
    assert sum(len(json.loads(body)["jobs"]) for body in bodies) == 1100


def test_enqueue_source_streams_the_file_as_zstd(capsys, stub, tmp_path):
    stub.routes[("POST", "/api/v1/admin/projects/p/source")] = [
        (200, {"jobs": 2, "inserted": 2, "uncompressed_bytes": 10})]
    packed = tmp_path / "jobs.zst"
    packed.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(range(256)) * 1000)

    code, out, err = stub_run(capsys, stub, "enqueue-source", "p", str(packed))
    assert code == 0, err
    assert json.loads(out)["inserted"] == 2
    (_, _, headers, body), = stub.seen
    assert headers["Content-Type"] == "application/zstd"
    assert headers["Content-Length"] == str(packed.stat().st_size)
    assert body == packed.read_bytes()
