"""Source imports: ``POST /api/v1/admin/projects/{p}/source`` with a
``jobs-jsonl-zstd-v1`` body (DESIGN §4.4, §6) and ``flask fleet enqueue-source``.

As in the v1 contract, a body that cannot be read — bad zstd, a bad line, or
a limit passed while streaming — is 400 ``invalid_job``; only a declared
Content-Length over the compressed limit is refused before reading (413)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
import requests
import zstandard

from tests.conftest import unique
from tests.helpers import Api, body, values
from tests.support.terminal import last_line, run_on_a_terminal
from workers.wire.source import write_source

ZSTD = "application/zstd"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pack(specs) -> bytes:
    out = io.BytesIO()
    write_source(specs, out)
    return out.getvalue()


def pack_lines(lines: list[bytes], **params) -> bytes:
    """Compress raw lines as they are (to build files the writer would refuse)."""
    raw = b"".join(line + b"\n" for line in lines)
    if params:
        cctx = zstandard.ZstdCompressor(
            compression_params=zstandard.ZstdCompressionParameters.from_level(3, **params))
        out = io.BytesIO()
        with cctx.stream_writer(out, closefd=False) as writer:  # no content size: window stays as set
            writer.write(raw)
        return out.getvalue()
    return zstandard.ZstdCompressor().compress(raw)


def line(spec: dict) -> bytes:
    return json.dumps(spec, separators=(",", ":")).encode()


class Source:
    def __init__(self, client, token):
        self.client = client
        self.token = token
        self.api = Api(client, token)

    def post(self, project_id, data, content_type=ZSTD, **kw):
        return self.client.post(f"/api/v1/admin/projects/{project_id}/source", data=data,
                                content_type=content_type,
                                headers={"Authorization": f"Bearer {self.token}"}, **kw)

    def all_jobs(self, project_id) -> list[dict]:
        jobs, after = [], None
        while True:
            query = "limit=200" + (f"&after_job_id={after}" if after else "")
            page = body(self.api.call("GET", f"/api/v1/admin/projects/{project_id}/jobs?{query}"))
            jobs += page["jobs"]
            if not page["jobs"] or len(page["jobs"]) < 200:
                return jobs
            after = page["jobs"][-1]["job_id"]

    def ext_ids(self, project_id) -> list[str]:
        return sorted(j["id"] for j in self.all_jobs(project_id))


@pytest.fixture
def src(client, admin_token):
    return Source(client, admin_token)


@pytest.fixture
def config(app):
    """Change app.config for one test (the app is session-scoped)."""
    saved = {}

    def set_config(**values_):
        for key, value in values_.items():
            saved.setdefault(key, app.config[key])
            app.config[key] = value

    yield set_config
    app.config.update(saved)


@pytest.fixture
def project(src):
    project_id = unique("src")
    src.api.put_project(project_id)
    return project_id


def error(response) -> dict:
    return body(response)["error"]


def rich_specs(n: int) -> list[dict]:
    specs = []
    for i in range(n):
        spec = {"id": f"j{i:04d}", "value": f"https://example.org/paper/{i}", "type": "seed"}
        if i % 3 == 0:
            spec["attr"] = {"n": i, "tag": "ünïcode"}
        if i % 4 == 0:
            spec.update(via="https://example.org/", hops=2)
        if i % 5 == 0:
            spec["type"] = "asset"
        specs.append(spec)
    return specs


# ------------------------------------------------------------------ success


def test_valid_source_imports_every_job(src, project):
    specs = rich_specs(50)
    data = pack(specs)
    response = src.post(project, data)
    assert response.status_code == 200, body(response)
    expanded = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    assert body(response) == {"project_id": project, "jobs": 50, "inserted": 50,
                              "uncompressed_bytes": len(expanded)}
    assert src.api.counts(project)["todo"] == 50

    claimed = body(src.api.claim(project, max_jobs=50, accept_types=["seed", "asset"]))["jobs"]
    got = {j["id"]: {k: v for k, v in j.items() if k not in ("job_id", "attempt_id", "lease_expires_at")}
           for j in claimed}
    assert got == {s["id"]: s for s in specs}


def test_reimport_is_idempotent_in_external_id_mode(src, project):
    data = pack(values(30))
    assert body(src.post(project, data))["inserted"] == 30
    again = src.post(project, data)
    assert again.status_code == 200, body(again)
    assert body(again)["jobs"] == 30
    assert body(again)["inserted"] == 0
    assert src.api.counts(project)["todo"] == 30


def test_overlapping_import_inserts_only_new_jobs(src, project):
    assert body(src.post(project, pack(values(20))))["inserted"] == 20
    result = body(src.post(project, pack(values(35))))
    assert (result["jobs"], result["inserted"]) == (35, 15)
    assert src.api.counts(project)["todo"] == 35


def test_unique_value_project_dedupes_by_value(src):
    project_id = unique("uv")
    src.api.put_project(project_id, identity_mode="unique_value")
    data = pack([{"value": f"https://example.org/{i % 7}"} for i in range(21)])
    assert body(src.post(project_id, data))["inserted"] == 7
    assert body(src.post(project_id, data))["inserted"] == 0
    assert src.api.counts(project_id)["todo"] == 7


def test_none_mode_project_takes_every_line_and_rejects_ids(src):
    project_id = unique("none")
    src.api.put_project(project_id, identity_mode="none")
    data = pack([{"value": "https://example.org/same"}] * 4)
    assert body(src.post(project_id, data))["inserted"] == 4
    assert body(src.post(project_id, data))["inserted"] == 4
    assert src.api.counts(project_id)["todo"] == 8

    response = src.post(project_id, pack_lines([line({"value": "x"}), line({"id": "a", "value": "y"})]))
    assert response.status_code == 400
    assert error(response)["code"] == "invalid_job"
    assert error(response)["details"]["line"] == 2
    assert error(response)["details"]["field"] == "id"


def test_multi_frame_source_and_missing_final_newline(src, project):
    frames = pack(values(3, "a")) + pack(values(2, "b"))
    response = src.post(project, frames)
    assert body(response)["jobs"] == 5, body(response)
    no_newline = zstandard.ZstdCompressor().compress(
        line({"id": "c1", "value": "x"}) + b"\n" + line({"id": "c2", "value": "y"}))
    assert body(src.post(project, no_newline))["inserted"] == 2
    assert src.ext_ids(project) == ["a0", "a1", "a2", "b0", "b1", "c1", "c2"]


# ------------------------------------------------------------ refused bodies


def test_random_bytes_are_invalid_job_with_nothing_committed(src, project):
    response = src.post(project, os.urandom(4096))
    assert response.status_code == 400
    err = error(response)
    assert err["code"] == "invalid_job"
    assert err["details"]["committed"] == 0
    assert src.api.counts(project)["todo"] == 0


def test_truncated_stream_is_refused(src, project):
    # An interrupted upload or copy must not pass for a complete (shorter) file.
    data = pack(values(500))
    response = src.post(project, data[: len(data) // 2])
    assert response.status_code == 400, body(response)
    assert error(response)["code"] == "invalid_job"
    assert src.api.counts(project)["todo"] == 0


def test_truncated_second_frame_is_refused(src, project):
    first, second = pack(values(5, "a")), pack(values(500, "b"))
    response = src.post(project, first + second[: len(second) // 2])
    assert response.status_code == 400, body(response)
    assert error(response)["code"] == "invalid_job"
    assert error(response)["details"]["committed"] == 0
    assert src.api.counts(project)["todo"] == 0


def test_line_longer_than_64_kib_is_refused(src, project):
    lines = [line({"id": "a", "value": "x"}), b'{"id":"b","value":"' + b"y" * (70 * 1024) + b'"}']
    response = src.post(project, pack_lines(lines))
    assert response.status_code == 400
    err = error(response)
    assert err["code"] == "invalid_job"
    assert "longer than" in err["message"]
    assert err["details"]["line"] == 2
    assert err["details"]["committed"] == 0


def test_line_of_exactly_64_kib_is_accepted(src, project):
    head = line({"id": "a", "value": "x"})
    exact = head[:-1] + b" " * (64 * 1024 - len(head)) + b"}"
    assert len(exact) == 64 * 1024
    response = src.post(project, pack_lines([exact, line({"id": "b", "value": "y"})]))
    assert response.status_code == 200, body(response)
    assert body(response)["inserted"] == 2

    over = head[:-1] + b" " * (64 * 1024 + 1 - len(head)) + b"}"
    response = src.post(project, pack_lines([line({"id": "c", "value": "z"}), over]))
    assert response.status_code == 400
    assert error(response)["details"]["line"] == 2


def test_unknown_field_reports_its_line(src, project):
    lines = [line({"id": "a", "value": "x"}), line({"id": "b", "value": "y"}),
             line({"id": "c", "value": "z", "colour": "red"})]
    response = src.post(project, pack_lines(lines))
    assert response.status_code == 400
    err = error(response)
    assert err["code"] == "invalid_job"
    assert err["details"]["line"] == 3
    assert err["details"]["field"] == "colour"
    assert err["details"]["committed"] == 0
    assert src.api.counts(project)["todo"] == 0


def test_random_key_is_not_allowed_in_source_files(src, project):
    response = src.post(project, pack_lines([line({"id": "a", "value": "x", "random_key": 7})]))
    assert response.status_code == 400
    err = error(response)
    assert err["code"] == "invalid_job"
    assert err["details"]["line"] == 1
    assert err["details"]["field"] == "random_key"


def test_line_that_is_not_json_reports_its_line(src, project):
    response = src.post(project, pack_lines([line({"id": "a", "value": "x"}), b"{not json"]))
    assert response.status_code == 400
    assert error(response)["details"]["line"] == 2


def test_job_cap(src, project, config):
    config(SOURCE_MAX_JOBS=10)
    assert body(src.post(project, pack(values(10, "ok"))))["inserted"] == 10
    response = src.post(project, pack(values(11, "over")))
    assert response.status_code == 400
    err = error(response)
    assert err["code"] == "invalid_job"
    assert err["details"]["line"] == 11
    assert src.api.counts(project)["todo"] == 10


def test_expanded_size_cap(src, project, config):
    data = pack(values(200))
    expanded = len(zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read())
    config(SOURCE_MAX_EXPANDED=expanded - 1)
    response = src.post(project, data)
    assert response.status_code == 400
    assert error(response)["code"] == "invalid_job"
    assert src.api.counts(project)["todo"] == 0

    config(SOURCE_MAX_EXPANDED=expanded)
    response = src.post(project, data)
    assert response.status_code == 200, body(response)
    assert body(response)["uncompressed_bytes"] == expanded


def test_decoder_window_over_the_limit_is_refused(src, project, config):
    config(SOURCE_MAX_WINDOW=1024 * 1024)
    specs = [line(s) for s in values(50)]
    within = pack_lines(specs, window_log=20)  # exactly 1 MiB
    response = src.post(project, within)
    assert response.status_code == 200, body(response)

    wide = pack_lines(specs, window_log=22)  # 4 MiB window
    response = src.post(project, wide)
    # The message names the limit of §4.4, not "not a valid zstd stream".
    assert response.status_code == 400, body(response)
    err = error(response)
    assert err["code"] == "invalid_job"
    assert "window" in err["message"]
    assert err["details"]["committed"] == 0


def test_error_after_committed_batches_reports_committed_jobs(src, project, config):
    config(SOURCE_BATCH=10)
    lines = [line(s) for s in values(30)]
    lines[24] = line({"id": "bad", "value": ""})  # line 25: empty value
    response = src.post(project, pack_lines(lines))
    assert response.status_code == 400
    err = error(response)
    assert err["code"] == "invalid_job"
    assert err["details"]["line"] == 25
    assert err["details"]["committed"] == 20
    assert src.ext_ids(project) == sorted(f"v{i}" for i in range(20))
    assert src.api.counts(project)["todo"] == 20


def test_size_error_after_committed_batches_reports_committed_jobs(src, project, config):
    config(SOURCE_BATCH=10, SOURCE_MAX_JOBS=25)
    response = src.post(project, pack(values(40)))
    assert response.status_code == 400
    err = error(response)
    assert err["code"] == "invalid_job"
    assert (err["details"]["line"], err["details"]["committed"]) == (26, 20)
    assert src.api.counts(project)["todo"] == 20


def test_conflict_with_stored_job_in_later_batch(src, project, config):
    config(SOURCE_BATCH=10)
    assert body(src.api.enqueue(project, [{"id": "v22", "value": "something else"}]))["inserted"] == 1
    response = src.post(project, pack(values(30)))
    assert response.status_code == 409
    err = error(response)
    assert err["code"] == "identity_conflict"
    assert err["details"]["committed"] == 20
    assert err["details"]["line"] == 23
    assert src.ext_ids(project) == sorted([f"v{i}" for i in range(20)] + ["v22"])


def test_conflict_inside_a_later_batch(src, project, config):
    config(SOURCE_BATCH=10)
    specs = values(30)
    specs[26] = {"id": "v23", "value": "a different value"}  # line 27 repeats line 24's id
    response = src.post(project, pack(specs))
    assert response.status_code == 409
    err = error(response)
    assert err["code"] == "identity_conflict"
    assert (err["details"]["committed"], err["details"]["line"]) == (20, 27)
    assert src.api.counts(project)["todo"] == 20


def test_identical_duplicate_lines_are_not_a_conflict(src, project):
    specs = values(5) + values(5)
    response = src.post(project, pack(specs))
    assert response.status_code == 200, body(response)
    assert (body(response)["jobs"], body(response)["inserted"]) == (10, 5)


# ------------------------------------------------------- compressed-size cap


class TrackingStream(io.BytesIO):
    reads = 0

    def read(self, *args):
        self.reads += 1
        return super().read(*args)

    def readinto(self, *args):
        self.reads += 1
        return super().readinto(*args)


def test_content_length_over_limit_is_refused_before_reading(src, project, config, client, admin_token):
    data = pack(values(100))
    config(SOURCE_MAX_COMPRESSED=len(data) - 1)
    stream = TrackingStream(data)
    response = client.post(f"/api/v1/admin/projects/{project}/source", input_stream=stream,
                           content_length=len(data), content_type=ZSTD,
                           headers={"Authorization": f"Bearer {admin_token}"})
    assert response.status_code == 413
    err = error(response)
    assert err["code"] == "invalid_request"
    assert err["details"]["committed"] == 0
    assert stream.reads == 0
    assert src.api.counts(project)["todo"] == 0

    config(SOURCE_MAX_COMPRESSED=len(data))
    assert src.post(project, data).status_code == 200


def test_chunked_upload_imports_and_is_capped_while_streaming(live_server, admin_token, config):
    session = requests.Session()
    api = Api(session, admin_token, base=live_server.url)
    project_id = unique("chunked")
    api.put_project(project_id)
    data = pack(values(300))
    url = f"{live_server.url}/api/v1/admin/projects/{project_id}/source"
    headers = {"Authorization": f"Bearer {admin_token}", "Content-Type": ZSTD}

    def chunks():  # a generator body: sent with Transfer-Encoding: chunked, no Content-Length
        for i in range(0, len(data), 100):
            yield data[i:i + 100]

    response = session.post(url, data=chunks(), headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["inserted"] == 300

    config(SOURCE_MAX_COMPRESSED=len(data) // 2)
    response = session.post(url, data=chunks(), headers=headers, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_job"


# ------------------------------------------------------------ access rules


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", "application/x-zstd",
                                          "multipart/form-data", ""])
def test_wrong_content_type_is_415_invalid_request(src, project, content_type):
    response = src.post(project, pack(values(1)), content_type=content_type)
    assert response.status_code == 415
    assert error(response)["code"] == "invalid_request"
    assert src.api.counts(project)["todo"] == 0


@pytest.mark.parametrize("content_type", ["application/zstd", "application/octet-stream",
                                          "application/zstd; charset=binary"])
def test_zstd_and_octet_stream_bodies_are_accepted(src, project, content_type):
    response = src.post(project, pack(values(3)), content_type=content_type)
    assert response.status_code == 200, body(response)
    assert set(body(response)) == {"project_id", "jobs", "inserted", "uncompressed_bytes"}
    assert (body(response)["project_id"], body(response)["inserted"]) == (project, 3)


def test_only_admins_import(src, project, make_user):
    worker = make_user("wk", ["worker"])
    response = Source(src.client, worker).post(project, pack(values(1)))
    assert response.status_code == 403
    response = src.client.post(f"/api/v1/admin/projects/{project}/source", data=pack(values(1)),
                               content_type=ZSTD)
    assert response.status_code == 401
    assert src.api.counts(project)["todo"] == 0


def test_unknown_and_archived_projects(src, project):
    response = src.post("no-such-project", pack(values(1)))
    assert response.status_code == 404
    src.api.call("PATCH", f"/api/v1/fleethq/projects/{project}", {"status": "archived"})
    response = src.post(project, pack(values(1)))
    assert response.status_code == 409
    assert error(response)["code"] == "project_not_active"


# -------------------------------------------------------------------- CLI


def test_cli_enqueue_source(app, src, project, tmp_path):
    path = tmp_path / "jobs.jsonl.zst"
    data = pack(values(25))
    path.write_bytes(data)
    runner = app.test_cli_runner()
    # The `flask` command pushes an app context for every command (FlaskGroup);
    # the test runner invokes app.cli directly and the `fleet` group is a plain
    # click.Group, so push one here as `flask` would.
    with app.app_context():
        result = runner.invoke(args=["fleet", "enqueue-source", project, str(path)])
    assert result.exit_code == 0, result.output
    expanded = len(zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read())
    assert json.loads(result.stdout) == {"project_id": project, "jobs": 25, "inserted": 25,
                                         "uncompressed_bytes": expanded}
    assert src.api.counts(project)["todo"] == 25

    with app.app_context():
        result = runner.invoke(args=["fleet", "enqueue-source", project, str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["inserted"] == 0


def test_cli_enqueue_source_error_reports_committed(app, src, project, tmp_path):
    lines = [line(s) for s in values(30)]
    lines[24] = line({"id": "bad", "value": "x", "extra": 1})
    path = tmp_path / "bad.jsonl.zst"
    path.write_bytes(pack_lines(lines))
    with app.app_context():
        result = app.test_cli_runner().invoke(
            args=["fleet", "enqueue-source", "--batch-size", "10", project, str(path)])
    assert result.exit_code == 1
    assert "invalid_job" in result.stderr
    details = json.loads(result.stderr.strip().splitlines()[-1])
    assert (details["committed"], details["line"], details["field"]) == (20, 25, "extra")
    assert src.ext_ids(project) == sorted(f"v{i}" for i in range(20))


def test_flask_command_line_enqueue_source(src, project, tmp_path, database_url):
    """The real ``flask fleet enqueue-source`` entry point, as an admin types it."""
    path = tmp_path / "jobs.jsonl.zst"
    path.write_bytes(pack(values(12)))
    env = {**os.environ, "DATABASE_URL": database_url, "FLEETHQ_LOG_JSON": "false"}
    flask = os.path.join(os.path.dirname(sys.executable), "flask")
    done = subprocess.run([flask, "--app", "wsgi", "fleet", "enqueue-source", project, str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["inserted"] == 12
    assert src.api.counts(project)["todo"] == 12


def test_flask_enqueue_source_draws_a_bar_on_a_terminal(src, project, tmp_path, database_url):
    """On a terminal (stderr a pty) the import shows how much of the file it
    read; piped (the test above) stderr stays empty."""
    path = tmp_path / "jobs.jsonl.zst"
    path.write_bytes(pack(values(300)))
    env = {**os.environ, "DATABASE_URL": database_url, "FLEETHQ_LOG_JSON": "false"}
    flask = os.path.join(os.path.dirname(sys.executable), "flask")
    done, drawn = run_on_a_terminal([flask, "--app", "wsgi", "fleet", "enqueue-source", project, str(path)],
                                    cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout)["inserted"] == 300
    last = last_line(drawn)
    assert f"enqueue-source {project} [{'#' * 24}] 100% " in last and "MiB read" in last, drawn[-400:]


README_ENQUEUE_SOURCE = """\
tracker enqueue-source \\
  --database-url "$HQ_DATABASE_URL" \\
  --project-id sinavideo \\
  --input sinavideo.jobs.jsonl.zst
"""


def test_readme_enqueue_source(src, tmp_path, database_url):
    """SavewebHQ's README command, character for character (``tracker`` =
    ``flask --app wsgi fleet``), with nothing but ``HQ_DATABASE_URL`` set."""
    src.api.put_project("sinavideo")
    data = pack(values(40))
    (tmp_path / "sinavideo.jobs.jsonl.zst").write_bytes(data)
    env = {**os.environ, "HQ_DATABASE_URL": database_url, "FLEETHQ_LOG_JSON": "false",
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "PYTHONPATH": ROOT}
    env.pop("DATABASE_URL", None)
    script = f'tracker() {{ flask --app "{ROOT}/wsgi.py" fleet "$@"; }}\n' + README_ENQUEUE_SOURCE
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    expanded = len(zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read())
    assert json.loads(done.stdout) == {"project_id": "sinavideo", "jobs": 40, "inserted": 40,
                                       "uncompressed_bytes": expanded}
    assert src.ext_ids("sinavideo") == sorted(f"v{i}" for i in range(40))


def test_cli_enqueue_source_max_jobs(app, src, project, tmp_path):
    path = tmp_path / "jobs.jsonl.zst"
    path.write_bytes(pack(values(30)))
    with app.app_context():
        result = app.test_cli_runner().invoke(args=[
            "fleet", "enqueue-source", "--project-id", project, "--input", str(path),
            "--max-jobs", "29", "--batch-size", "10"])
    assert result.exit_code == 1
    assert "invalid_job" in result.stderr and "more than 29 jobs" in result.stderr
    assert src.api.counts(project)["todo"] == 20  # the batches before the limit stay committed
    with app.app_context():
        exact = app.test_cli_runner().invoke(args=[
            "fleet", "enqueue-source", "--project-id", project, "--input", str(path), "--max-jobs", "30"])
        assert app.test_cli_runner().invoke(args=[
            "fleet", "enqueue-source", "--project-id", project, "--input", str(path),
            "--max-jobs", "0"]).exit_code == 2
    assert exact.exit_code == 0, exact.output
    assert json.loads(exact.stdout)["jobs"] == 30


def test_cli_enqueue_source_takes_the_project_and_file_once(app, project, tmp_path):
    path = tmp_path / "jobs.jsonl.zst"
    path.write_bytes(pack(values(1)))
    runner = app.test_cli_runner()
    with app.app_context():
        both = runner.invoke(args=["fleet", "enqueue-source", project, str(path), "--input", str(path)])
        neither = runner.invoke(args=["fleet", "enqueue-source", "--project-id", project])
    assert both.exit_code == 2 and "once" in both.output
    assert neither.exit_code == 2 and "--input" in neither.output
