"""hqctl: admin CLI over the machine API.

Most tests run against a live master (``live_server``/``admin_token`` from
conftest). A few use a tiny stub HTTP server to provoke what a healthy master
never does: redirects, 503s, dropped connections.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.terminal import last_line, run_on_a_terminal
from workers import hqctl
from workers.hqctl import enqueue as hqctl_enqueue
from workers.source import cli as source_cli


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


# --- SavewebHQ's command lines, verbatim (README.md "Remote enqueue CLI", operations.md) ---

HQCTL = os.path.join(os.path.dirname(sys.executable), "hqctl")
SOURCE = os.path.join(os.path.dirname(sys.executable), "fleethq-source")
SETTINGS_ENV = ("HQ_URL", "HQ_MACHINE_TOKEN_FILE", "FLEETHQ_MASTER", "FLEETHQ_TOKEN",
                "FLEETHQ_TOKEN_FILE")


def j1(value: str, job_type: str = "seed") -> str:
    """The v1 default id, written out here rather than taken from the code under test."""
    return "j1_" + hashlib.sha256(f"{job_type}\0{value}".encode()).hexdigest()


@pytest.fixture
def operator(tmp_path, live_server, admin_token):
    """A shell set up as SavewebHQ's README says: ``./admin.token`` (mode 0600)
    and ``HQ_URL``. Commands run with ``./bin/hqctl`` and ``source`` replaced by
    our binaries, nothing else changed."""
    token = tmp_path / "admin.token"
    token.write_text(admin_token + "\n")
    token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV}
    env["HQ_URL"] = live_server.url

    def sh(command: str, stdin: str | None = None):
        command = command.replace("./bin/hqctl", HQCTL).replace("source pack", f"{SOURCE} pack")
        return subprocess.run(command, shell=True, executable="/bin/bash", cwd=tmp_path, env=env,
                              input=stdin, capture_output=True, text=True, timeout=120)
    sh.env = env
    return sh


def all_jobs(hq, project):
    code, out, err = hq("jobs", "list", project, "--all")
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_readme_enqueue_values_from_a_pipe(hq, operator, tmp_path):
    assert hq("project", "put", "sina_bilivideo")[0] == 0
    (tmp_path / "records.jsonl").write_text(
        "".join(json.dumps({"vid": f"BV{i:06d}", "n": i}) + "\n" for i in range(12_000)))
    readme = ("jq -r '.vid' records.jsonl |\n"
              "  ./bin/hqctl enqueue \\\n"
              "    --machine-token-file ./admin.token \\\n"
              "    --project-id sina_bilivideo \\\n"
              "    --batch-size 5000")
    done = operator(readme)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"project_id": "sina_bilivideo",
                                       "identity_mode": "external_id",
                                       "submitted": 12_000, "inserted": 12_000, "batches": 3}
    assert done.stderr == ""  # progress every 100 batches: none yet
    # Rerunning is idempotent for external_id.
    again = operator(readme)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["inserted"] == 0
    jobs = all_jobs(hq, "sina_bilivideo")
    assert len(jobs) == 12_000 and jobs[7]["value"] == "BV000007"
    assert jobs[7]["id"] == j1("BV000007") and jobs[7]["type"] == "seed"


def test_readme_enqueue_jsonl(hq, operator, tmp_path):
    assert hq("project", "put", "sina_bilivideo")[0] == 0
    (tmp_path / "jobs.jsonl").write_text(
        '{"value": "https://example.org/", "random_key": -7}\n'
        '{"id": "own-id", "value": "https://example.org/b", "type": "asset", "attr": {"k": 1}}\n'
        '{"id": "", "value": "https://example.org/a.png", "type": "asset"}\n')
    done = operator("./bin/hqctl enqueue \\\n  --machine-token-file ./admin.token \\\n"
                    "  --project-id sina_bilivideo \\\n  --format jsonl \\\n"
                    "  --input jobs.jsonl \\\n  --batch-size 128")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"project_id": "sina_bilivideo",
                                       "identity_mode": "external_id",
                                       "submitted": 3, "inserted": 3, "batches": 1}
    jobs = {job["value"]: job for job in all_jobs(hq, "sina_bilivideo")}
    # Missing (or empty) ids are filled: these two are SavewebHQ's job-id-v1 vectors.
    assert jobs["https://example.org/"]["id"] == (
        "j1_92f50438a02ab171b6735678275a2f9db233d4c88e301a0243886c2679ce7070")
    assert jobs["https://example.org/"]["random_key"] == -7
    assert jobs["https://example.org/a.png"]["id"] == (
        "j1_3415498e0d810218fb682c5192529b4ec15d74dfbaedf293c3b13d5d5c652998")
    assert jobs["https://example.org/b"]["id"] == "own-id"


def test_readme_pack_then_enqueue_source(hq, operator, tmp_path):
    assert hq("project", "put", "sina_bilivideo")[0] == 0
    (tmp_path / "urls.txt").write_text("".join(f"https://example.org/src/{i}\n" for i in range(300)))
    packed = operator("source pack --input urls.txt --output sina_bilivideo.jobs.jsonl.zst")
    assert packed.returncode == 0, packed.stderr
    readme = ("./bin/hqctl enqueue-source \\\n  --machine-token-file ./admin.token \\\n"
              "  --project-id sina_bilivideo \\\n  --input sina_bilivideo.jobs.jsonl.zst")
    done = operator(readme)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert list(result) == ["project_id", "jobs", "inserted", "uncompressed_bytes"]
    assert result["project_id"] == "sina_bilivideo"
    assert result["jobs"] == result["inserted"] == 300 and result["uncompressed_bytes"] > 0
    # The same values through `enqueue` have the same default ids: nothing new.
    values = operator("./bin/hqctl enqueue --machine-token-file ./admin.token "
                      "--project-id sina_bilivideo --input urls.txt")
    assert json.loads(values.stdout)["inserted"] == 0, values.stderr


@pytest.mark.parametrize("feed", ["< sina_bilivideo.jobs.jsonl.zst",       # a regular file
                                  "cat sina_bilivideo.jobs.jsonl.zst |"])  # a pipe: chunked
def test_enqueue_source_reads_stdin(hq, operator, tmp_path, feed):
    assert hq("project", "put", "sina_bilivideo")[0] == 0
    (tmp_path / "urls.txt").write_text("https://example.org/1\nhttps://example.org/2\n")
    assert operator("source pack --input urls.txt --output sina_bilivideo.jobs.jsonl.zst"
                    ).returncode == 0
    command = ("./bin/hqctl enqueue-source --machine-token-file ./admin.token "
               "--project-id sina_bilivideo --input -")
    done = operator(f"{command} {feed}" if feed.startswith("<") else f"{feed} {command}")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["inserted"] == 2


def test_values_keep_their_spaces_and_their_ids_in_enqueue_and_pack(hq, operator, tmp_path):
    assert hq("project", "put", "p")[0] == 0
    lines = ["https://example.org/", "  padded ", "\ttabbed", "https://例子.测试/路径"]
    (tmp_path / "v.txt").write_text("\r\n".join(lines) + "\n   \n\n", encoding="utf-8")
    done = operator("./bin/hqctl enqueue --machine-token-file ./admin.token --project-id p "
                    "--input v.txt")
    assert done.returncode == 0, done.stderr
    jobs = all_jobs(hq, "p")  # the line of spaces is blank to hqctl, as to SavewebHQ's
    assert [(job["value"], job["id"]) for job in jobs] == [(v, j1(v)) for v in lines]
    assert jobs[0]["id"] == "j1_92f50438a02ab171b6735678275a2f9db233d4c88e301a0243886c2679ce7070"
    assert jobs[3]["id"] == "j1_6f244c2352df6cd3f399df55501a1b77c57f98b85a94a2193849f5532e766528"
    # pack reads the same lines to the same ids (its line of spaces is a value).
    assert operator("source pack --input v.txt --output v.zst").returncode == 0
    imported = json.loads(operator("./bin/hqctl enqueue-source --machine-token-file "
                                   "./admin.token --project-id p --input v.zst").stdout)
    assert imported["jobs"] == 5 and imported["inserted"] == 1


def test_type_asset_for_values(hq, operator, tmp_path):
    assert hq("project", "put", "p")[0] == 0
    done = operator("printf 'https://example.org/a.png\\n' | ./bin/hqctl enqueue "
                    "--machine-token-file ./admin.token --project-id p --type asset")
    assert done.returncode == 0, done.stderr
    job, = all_jobs(hq, "p")
    assert job["type"] == "asset"
    assert job["id"] == "j1_3415498e0d810218fb682c5192529b4ec15d74dfbaedf293c3b13d5d5c652998"
    # --type is for values only, as in SavewebHQ.
    bad = operator("./bin/hqctl enqueue --machine-token-file ./admin.token --project-id p "
                   "--format jsonl --type asset --input /dev/null")
    assert bad.returncode == 1 and "--type" in bad.stderr


def test_progress_line_every_n_batches(hq, operator):
    assert hq("project", "put", "p")[0] == 0
    done = operator("seq 1 5 | ./bin/hqctl enqueue --machine-token-file ./admin.token "
                    "--project-id p --batch-size 2 --progress-every 2")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "batches=2 submitted=4 inserted=4\n"
    assert json.loads(done.stdout)["batches"] == 3
    quiet = operator("seq 1 5 | ./bin/hqctl enqueue --machine-token-file ./admin.token "
                     "--project-id p --batch-size 1 --progress-every 0")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_unique_value_project_rejects_ids_locally(hq, operator, tmp_path):
    assert hq("project", "put", "p", "--identity-mode", "unique_value")[0] == 0
    (tmp_path / "jobs.jsonl").write_text('{"value": "1"}\n{"id": "source-1", "value": "2"}\n')
    done = operator("./bin/hqctl enqueue --machine-token-file ./admin.token --project-id p "
                    "--format jsonl --input jobs.jsonl")
    assert done.returncode == 1 and "jobs.jsonl:2:" in done.stderr and "id" in done.stderr
    assert last_json(done.stderr)["submitted"] == 0
    assert all_jobs(hq, "p") == []
    ok = operator("printf 'x\\nx\\n' | ./bin/hqctl enqueue --machine-token-file ./admin.token "
                  "--project-id p")
    assert json.loads(ok.stdout) == {"project_id": "p", "identity_mode": "unique_value",
                                     "submitted": 2, "inserted": 1, "batches": 1}


def test_max_jobs_and_empty_input(hq, operator, tmp_path):
    assert hq("project", "put", "p")[0] == 0
    (tmp_path / "v.txt").write_text("a\nb\nc\n")
    base = "./bin/hqctl enqueue --machine-token-file ./admin.token --project-id p"
    done = operator(f"{base} --input v.txt --max-jobs 2")
    assert done.returncode == 1 and "--max-jobs 2" in done.stderr
    assert all_jobs(hq, "p") == []  # a regular file is checked before anything is sent
    # From a pipe the batches before the limit are committed, and the error says so.
    piped = operator(f"cat v.txt | {base} --max-jobs 2 --batch-size 1")
    assert piped.returncode == 1 and "after 2 submitted jobs" in piped.stderr
    assert last_json(piped.stderr)["submitted"] == 2 and len(all_jobs(hq, "p")) == 2
    empty = operator(f"printf '\\n  \\n' | {base}")
    assert empty.returncode == 1 and "no jobs" in empty.stderr


def test_token_file_must_be_private(hq, operator, tmp_path):
    assert hq("project", "put", "p")[0] == 0
    token = tmp_path / "admin.token"
    command = "./bin/hqctl enqueue --machine-token-file ./admin.token --project-id p --input -"
    for mode in (0o640, 0o604, 0o644):
        token.chmod(mode)
        done = operator(command, stdin="x\n")
        assert done.returncode == 1 and "chmod 600" in done.stderr, done.stderr
    token.chmod(0o600)
    # HQ_MACHINE_TOKEN_FILE stands for the flag, with the same check.
    env_form = "HQ_MACHINE_TOKEN_FILE=./admin.token ./bin/hqctl enqueue --project-id p"
    assert operator(env_form, stdin="x\n").returncode == 0
    token.chmod(0o660)
    assert operator(env_form, stdin="x\n").returncode == 1
    assert len(all_jobs(hq, "p")) == 1


def test_timeout_takes_go_durations(hq, operator):
    assert hq("project", "put", "p")[0] == 0
    base = "./bin/hqctl enqueue --machine-token-file ./admin.token --project-id p --input -"
    for value in ("10m", "30s", "1h30m", "1.5h", "45"):
        done = operator(f"{base} --timeout {value}", stdin=f"{value}\n")
        assert done.returncode == 0, (value, done.stderr)
    for value in ("0s", "-1m", "ten", "1h30", "1d"):
        done = operator(f"{base} --timeout {value}", stdin="x\n")
        assert done.returncode == 1 and "timeout" in done.stderr, (value, done.stderr)


def test_there_is_no_default_url(operator):
    done = operator("env -u HQ_URL ./bin/hqctl enqueue --machine-token-file ./admin.token "
                    "--project-id p", stdin="x\n")
    assert done.returncode == 1 and "--url" in done.stderr and "HQ_URL" in done.stderr


# --- FleetHQ's own commands and spellings, against a live master ----------------------

def test_whoami(hq):
    code, out, _ = hq("whoami")
    assert code == 0 and json.loads(out)["user_id"] == "admin"


def test_fleethq_enqueue_spelling_in_batches_then_rerun(hq, tmp_path):
    project = name()
    assert hq("project", "put", project)[0] == 0
    values = tmp_path / "values.txt"
    values.write_text("".join(f"https://example.org/item/{i}\n" for i in range(2500)))

    code, out, err = hq("enqueue", project, "--batch-size", "1000", str(values))
    assert code == 0, err
    assert json.loads(out) == {"project_id": project, "identity_mode": "external_id",
                               "submitted": 2500, "inserted": 2500, "batches": 3}
    assert err == ""
    code, out, err = hq("enqueue", project, "--batch-size", "1000", str(values))
    assert code == 0, err
    assert json.loads(out)["inserted"] == 0

    code, out, _ = hq("project", "get", project)
    assert code == 0
    summary = json.loads(out)
    assert summary["identity_mode"] == "external_id" and summary["job_counts"]["todo"] == 2500


def test_conflicting_job_exits_1_and_reports_what_was_submitted(hq, tmp_path):
    project = name()
    assert hq("project", "put", project)[0] == 0
    first = tmp_path / "first.jsonl"
    first.write_text('{"id": "a", "value": "https://example.org/one"}\n')
    assert hq("enqueue", "--project-id", project, "--format", "jsonl", "--input", str(first))[0] == 0
    second = tmp_path / "second.jsonl"
    second.write_text('{"id": "b", "value": "https://example.org/two"}\n'
                      '{"id": "a", "value": "https://example.org/other"}\n'
                      '{"id": "c", "value": "https://example.org/three"}\n')

    code, out, err = hq("enqueue", project, "--jsonl", "--batch-size", "1", str(second))
    assert code == 1 and out == ""
    first_line = err.splitlines()[0]
    assert "batch 2 failed after 1 submitted jobs: identity_conflict: " in first_line
    report = last_json(err)
    assert report["error"]["code"] == "identity_conflict"
    assert report["submitted"] == report["committed"] == 1 and report["batches"] == 1
    assert report["failed_job_at"].endswith("second.jsonl:2")
    counts = json.loads(hq("project", "get", project)[1])["job_counts"]
    assert counts["todo"] == 2  # a and b; c was never sent


def test_local_validation_happens_before_anything_is_sent(hq, tmp_path):
    project = name()
    assert hq("project", "put", project, "--identity-mode", "unique_value")[0] == 0
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"value": "https://example.org/1"}\n{"value": "x", "hops": -1}\n')
    code, _, err = hq("enqueue", project, "--jsonl", str(jobs))
    assert code == 1 and "jobs.jsonl:2:" in err and last_json(err)["submitted"] == 0
    assert json.loads(hq("project", "get", project)[1])["job_counts"]["todo"] == 0
    # --default-ids makes no sense without ids: a usage error, exit 1 as in SavewebHQ.
    assert hq("enqueue", project, "--default-ids", str(jobs))[0] == 1


def test_fleethq_enqueue_source_spelling(hq, tmp_path, capsys):
    project = name()
    assert hq("project", "put", project)[0] == 0
    values = tmp_path / "values.txt"
    values.write_text("".join(f"https://example.org/src/{i}\n" for i in range(30)))
    packed = tmp_path / "jobs.jsonl.zst"
    assert source_cli.main(["pack", "-o", str(packed), str(values)]) == 0
    capsys.readouterr()
    code, out, err = hq("enqueue-source", project, str(packed))
    assert code == 0, err
    assert json.loads(out)["inserted"] == 30
    assert json.loads(hq("enqueue-source", project, str(packed))[1])["inserted"] == 0


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
    code, out, _ = hq("jobs", "list", project, "--after", str(page["next_after_job_id"]))
    assert [job["value"] for job in page["jobs"] + json.loads(out)["jobs"]] == [
        "https://example.org/a", "https://example.org/b", "https://example.org/c"]
    # --all follows the cursor (pages of one here): one job per line.
    code, out, err = hq("jobs", "list", project, "--all", "--limit", "1")
    assert code == 0, err
    assert [json.loads(line)["value"] for line in out.splitlines()] == [
        "https://example.org/a", "https://example.org/b", "https://example.org/c"]
    # Piped into a reader that stops early: quiet, no traceback.
    piped = subprocess.run(
        f"set -o pipefail; {HQCTL} --url {live_server.url} --token {admin_token} "
        f"jobs list {project} --all --limit 1 | head -n 1",
        shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and "Traceback" not in piped.stderr, piped.stderr
    assert json.loads(piped.stdout)["value"] == "https://example.org/a"

    job_id = str(page["jobs"][0]["job_id"])
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
    summary = json.loads(hq("project", "set", project, "--max-worker-attempts", "4")[1])
    assert summary["max_worker_attempts"] == 4
    code, _, err = hq("project", "set", project, "--max-worker-attempts", "21")
    assert code == 1 and err.startswith("invalid_request: ") and "max_worker_attempts" in err
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
    assert code == 0 and "new machine token" in err
    token = out.strip()
    assert token and token not in err
    code, out, _ = hq("token", "show", user)  # viewable again, as SavewebHQ's
    assert code == 0 and json.loads(out) == {"user_id": user, "token": token}

    code, out, _ = hq("whoami", token=token)
    assert code == 0 and json.loads(out)["user_id"] == user
    assert hq("token", "revoke", user)[0] == 0
    code, _, err = hq("whoami", token=token)
    assert code == 1 and err.startswith("invalid_machine_token: ")


def test_unknown_project_is_reported(hq, tmp_path):
    values = tmp_path / "v.txt"
    values.write_text("x\n")
    code, _, err = hq("enqueue", name("missing"), str(values))
    assert code == 1 and "get project: not_found: " in err


# --- settings, and a stub master for failures ---------------------------------------

def test_plain_http_to_a_remote_host_is_refused(capsys):
    code, _, err = run(capsys, "--master", "http://fleet.example.org", "--token", "t", "whoami")
    assert code == 2 and "--allow-http" in err


def test_missing_settings_are_usage_errors(capsys, monkeypatch, tmp_path):
    for variable in SETTINGS_ENV:
        monkeypatch.delenv(variable, raising=False)
    assert run(capsys, "whoami")[0] == 2
    assert run(capsys, "--url", "https://fleet.example.org", "whoami")[0] == 2
    assert run(capsys, "project")[0] == 2
    # FleetHQ's commands keep exit 2 for a token file others can read.
    token = tmp_path / "t"
    token.write_text("fhq_x")
    token.chmod(0o644)
    code, _, err = run(capsys, "--url", "https://fleet.example.org", "--token-file", str(token),
                       "whoami")
    assert code == 2 and "chmod 600" in err
    # Two environment spellings that disagree are refused rather than guessed.
    monkeypatch.setenv("HQ_URL", "https://a.example.org")
    monkeypatch.setenv("FLEETHQ_MASTER", "https://b.example.org")
    code, _, err = run(capsys, "--token", "fhq_x", "whoami")
    assert code == 2 and "HQ_URL and FLEETHQ_MASTER" in err


class Stub:
    """Answers from ``routes[(method, path)]``: a list of (status, body), or of
    functions of the request body returning one, used in turn (the last one
    repeats); a body of None drops the connection."""

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
                answer = answers.pop(0) if len(answers) > 1 else answers[0]
                status, payload = answer(body) if callable(answer) else answer
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
    return run(capsys, "--url", stub.url, "--token", "fhq_test", *argv)


def accept_all(body):
    """A master that takes every job of a batch as new."""
    count = len(json.loads(body)["jobs"])
    return 200, {"project_id": "p", "submitted": count, "inserted": count}


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
    monkeypatch.setattr(hqctl_enqueue.time, "sleep", lambda seconds: None)
    stub.routes[("GET", "/api/v1/admin/projects/p")] = _mode("external_id")
    stub.routes[("POST", "/api/v1/admin/projects/p/jobs")] = [
        (503, BUSY), (200, {"project_id": "p", "submitted": 1, "inserted": 1})]
    values = tmp_path / "v.txt"
    values.write_text("https://example.org/\n")

    code, out, err = stub_run(capsys, stub, "enqueue", "p", str(values))
    assert code == 0, err
    assert json.loads(out) == {"project_id": "p", "identity_mode": "external_id",
                               "submitted": 1, "inserted": 1, "batches": 1}
    bodies = stub.posts("/api/v1/admin/projects/p/jobs")
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    assert json.loads(bodies[0]) == {"jobs": [{
        "value": "https://example.org/", "type": "seed",
        "id": "j1_92f50438a02ab171b6735678275a2f9db233d4c88e301a0243886c2679ce7070"}]}


def test_mode_none_never_resends_after_a_lost_response(capsys, stub, tmp_path, monkeypatch):
    monkeypatch.setattr(hqctl_enqueue.time, "sleep", lambda seconds: None)
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
    stub.routes[("POST", "/api/v1/admin/projects/p/jobs")] = [accept_all]
    values = tmp_path / "v.txt"
    values.write_text("".join(f"https://example.org/{i:04d}/{'x' * 8100}\n" for i in range(1100)))

    code, out, err = stub_run(capsys, stub, "enqueue", "p", "--batch-size", "5000", str(values))
    assert code == 0, err
    bodies = stub.posts("/api/v1/admin/projects/p/jobs")
    assert json.loads(out)["batches"] == len(bodies) == 2
    assert all(len(body) < 8 * 1024 * 1024 for body in bodies)
    assert sum(len(json.loads(body)["jobs"]) for body in bodies) == 1100


def test_enqueue_source_streams_the_file_as_zstd(capsys, stub, tmp_path):
    # An older master's answer without project_id is completed, not refused.
    stub.routes[("POST", "/api/v1/admin/projects/p/source")] = [
        (200, {"jobs": 2, "inserted": 2, "uncompressed_bytes": 10})]
    packed = tmp_path / "jobs.zst"
    packed.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(range(256)) * 1000)

    code, out, err = stub_run(capsys, stub, "enqueue-source", "--project-id", "p",
                              "--input", str(packed))
    assert code == 0, err
    assert json.loads(out) == {"project_id": "p", "jobs": 2, "inserted": 2,
                               "uncompressed_bytes": 10}
    (_, _, headers, body), = stub.seen
    assert headers["Content-Type"] == "application/zstd"
    assert headers["Content-Length"] == str(packed.stat().st_size)
    assert body == packed.read_bytes()


def test_batch_size_has_no_job_count_cap(capsys, stub, tmp_path):
    stub.routes[("GET", "/api/v1/admin/projects/p")] = _mode("external_id")
    stub.routes[("POST", "/api/v1/admin/projects/p/jobs")] = [accept_all]
    values = tmp_path / "v.txt"
    values.write_text("".join(f"{i}\n" for i in range(12_345)))
    code, out, err = stub_run(capsys, stub, "enqueue", "--project-id", "p", "--input",
                              str(values), "--batch-size", "20000")
    assert code == 0, err
    body, = stub.posts("/api/v1/admin/projects/p/jobs")
    assert len(json.loads(body)["jobs"]) == 12_345 and json.loads(out)["batches"] == 1


@pytest.mark.parametrize("answer", [
    {"project_id": "other", "submitted": 1, "inserted": 1},
    {"project_id": "p", "submitted": 2, "inserted": 1},
    {"project_id": "p", "submitted": 1, "inserted": 2},
    {"project_id": "p", "submitted": 1},
])
def test_a_batch_answer_that_does_not_add_up_is_refused(capsys, stub, tmp_path, answer):
    stub.routes[("GET", "/api/v1/admin/projects/p")] = _mode("external_id")
    stub.routes[("POST", "/api/v1/admin/projects/p/jobs")] = [(200, answer)]
    (tmp_path / "v.txt").write_text("a\n")
    code, out, err = stub_run(capsys, stub, "enqueue", "--project-id", "p", "--input",
                              str(tmp_path / "v.txt"))
    assert code == 1 and out == "" and "invalid response" in err


@pytest.mark.parametrize("answer", [
    {"project_id": "other", "jobs": 1, "inserted": 1, "uncompressed_bytes": 5},
    {"project_id": "p", "jobs": 1, "inserted": 2, "uncompressed_bytes": 5},
    {"project_id": "p", "jobs": 1, "inserted": 1},
])
def test_an_import_answer_that_does_not_add_up_is_refused(capsys, stub, tmp_path, answer):
    stub.routes[("POST", "/api/v1/admin/projects/p/source")] = [(200, answer)]
    packed = tmp_path / "jobs.zst"
    packed.write_bytes(b"\x28\xb5\x2f\xfd")
    code, out, err = stub_run(capsys, stub, "enqueue-source", "--project-id", "p", "--input",
                              str(packed))
    assert code == 1 and out == "" and "invalid response" in err


def test_timeout_bounds_the_wait_for_an_answer(capsys, stub):
    def slow(body):
        time.sleep(3)
        return 200, {"user_id": "u"}
    stub.routes[("GET", "/api/v1/whoami")] = [slow]
    started = time.monotonic()
    code, _, err = stub_run(capsys, stub, "--timeout", "300ms", "whoami")
    assert code == 1 and "Timeout" in err and time.monotonic() - started < 2.5
    code, out, _ = stub_run(capsys, stub, "whoami", "--timeout", "1m")
    assert code == 0 and json.loads(out) == {"user_id": "u"}


def test_job_ids_stay_integers(capsys, stub):
    stub.routes[("GET", "/api/v1/fleethq/projects/p/jobs")] = [
        (200, {"jobs": [{"job_id": 41, "value": "a"}], "next_after_job_id": 41}),
        (200, {"jobs": [{"job_id": 42, "value": "b"}], "next_after_job_id": None})]
    code, out, err = stub_run(capsys, stub, "jobs", "list", "p", "--all", "--limit", "1")
    assert code == 0, err
    assert [json.loads(line)["job_id"] for line in out.splitlines()] == [41, 42]
    assert stub.seen[-1][1] == "/api/v1/fleethq/projects/p/jobs?limit=1&after_job_id=41"


def test_a_terminal_gets_a_progress_bar_with_counts(hq, operator, tmp_path):
    """On a terminal (stderr a pty) enqueue draws its bar by default: the
    share of the input read, jobs sent and new, time so far; piped, it keeps
    SavewebHQ's lines (test_progress_line_every_n_batches)."""
    assert hq("project", "put", "p")[0] == 0
    (tmp_path / "urls.txt").write_text("".join(f"https://example.org/t/{i}\n" for i in range(3000)))
    done, drawn = run_on_a_terminal(
        [HQCTL, "enqueue", "--machine-token-file", "./admin.token", "--project-id", "p",
         "--input", "urls.txt", "--batch-size", "500"], cwd=tmp_path, env=operator.env, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout)["inserted"] == 3000
    last = last_line(drawn)
    assert re.match(r"enqueue p \[#{24}\] 100% 3000 jobs, 3000 new \d+s", last), drawn[-300:]


def test_the_bar_gives_an_eta_at_the_pace_so_far(monkeypatch):
    import io

    from workers.cli import http
    now = [1000.0]
    monkeypatch.setattr(http.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    bar = http.Progress("enqueue p", total=1000, enabled=True, stream=out)
    now[0] += 90  # a quarter in a minute and a half: four and a half minutes to go
    bar.update(250, "250 jobs, 250 new", force=True)
    assert out.getvalue().split("\r")[-1].strip() == (
        "enqueue p [######------------------]  25% 250 jobs, 250 new 1m30s ETA 4m30s")
