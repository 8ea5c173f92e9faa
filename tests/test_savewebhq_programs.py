"""SavewebHQ's own clients, unchanged, against FleetHQ served as deployed
(gunicorn with the Procfile's settings): its Python SDK with pauses between
calls longer than gunicorn's own keep-alive default, a worker on its Go SDK
through claim, complete, fail and lease renewal, its ``hqctl`` and ``source``
commands. See tests/savewebhq_programs.py for where the programs come from."""
from __future__ import annotations

import json
import subprocess
import time

import psycopg
import pytest

from tests.gunicorn_master import Gunicorn
from tests.savewebhq_programs import (CLIENT_VERSION, Tracker, install_user, program, python_sdk, run,
                                      token_file)
from tests.savewebhq_wire import Wire, admin_path, expect, project_body, receipt, specs
from tests.support.savewebhq_import import run as import_from

PAUSE_S = 3  # longer than gunicorn's default keep-alive (2 s), which once broke the SDK


@pytest.fixture(scope="module")
def master(database_url, tmp_path_factory):
    server = Gunicorn({"DATABASE_URL": database_url, "GUNICORN_CMD_ARGS": "",
                       "FLEETHQ_WEB_WORKERS": "2"},
                      tmp_path_factory.mktemp("gunicorn") / "gunicorn.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


class Deployment:
    def __init__(self, app, master, directory):
        self.url = master.url
        self.admin_file, admin_token = token_file(directory, "admin")
        self.worker_file, self.worker_token = token_file(directory, "worker")
        install_user(app, "hq-admin", ["admin"], admin_token)
        install_user(app, "hq-worker", ["worker"], self.worker_token)
        self.admin = Wire(master.url, admin_token)

    def put_project(self, project_id: str, **fields) -> None:
        answer = self.admin.put(admin_path(project_id), project_body(**fields))
        assert answer.status in (200, 201), f"setup: could not put project: {answer}"

    def counts(self, project_id: str) -> dict:
        return expect(self.admin.get(admin_path(project_id)), 200)["job_counts"]

    def job(self, project_id: str, job_id: int) -> dict:
        return expect(self.admin.get(admin_path(project_id, f"/jobs/{job_id}")), 200)


@pytest.fixture
def hq(app, master, tmp_path):
    return Deployment(app, master, tmp_path)


def test_python_sdk_works_a_project_with_pauses_between_calls(hq):
    sdk = python_sdk()
    config = sdk.Config(hq.url, hq.worker_token, CLIENT_VERSION, allow_http_tracker=True)
    assert sdk.whoami(config) == "hq-worker"
    hq.put_project("py-sdk", recommended_lease_seconds=60)
    assert expect(hq.admin.post(admin_path("py-sdk", "/jobs"), {"jobs": specs(3)}), 200)
    with sdk.open_project_queue(config, "py-sdk") as queue:
        answer = queue.claim(max_jobs=3)
        jobs = sorted(answer["jobs"], key=lambda job: job["job_id"])
        assert [job["id"] for job in jobs] == ["job-0", "job-1", "job-2"], answer
        refs = [{"job_id": job["job_id"], "attempt_id": job["attempt_id"]} for job in jobs]
        connection = queue._tracker._connection
        time.sleep(PAUSE_S)
        extended = queue.extend_lease(120, refs[:1])["results"]
        assert [result["status"] for result in extended] == ["applied"], extended
        time.sleep(PAUSE_S)
        done = queue.complete([{**refs[0], "outcome": {"kind": "success", "code": 200, "uri": None,
                                                       "meta": {}},
                                "artifact_receipts": [receipt(0)]}])["results"]
        assert [(r["status"], r["job_status"]) for r in done] == [("applied", "done")], done
        time.sleep(PAUSE_S)
        failed = queue.fail([{**refs[1], "retryable": False,
                              "error": {"code": "gone", "message": "permanent", "details": {}}}])
        assert [r["job_status"] for r in failed["results"]] == ["failed"], failed
        time.sleep(PAUSE_S)
        again = queue.complete([{**refs[0], "outcome": {"kind": "success"}, "artifact_receipts": []}])
        assert again["results"][0]["status"] != "applied", again
        # Every call went over the one connection the SDK opened: the master
        # kept it through each pause.
        assert queue._tracker._connection is connection
    assert hq.job("py-sdk", jobs[0]["job_id"])["status"] == "done"
    assert hq.job("py-sdk", jobs[1]["job_id"])["status"] == "failed"
    assert hq.job("py-sdk", jobs[2]["job_id"])["status"] == "wip"


def test_python_sdk_reads_api_errors_from_the_envelope(hq):
    sdk = python_sdk()
    config = sdk.Config(hq.url, hq.worker_token, CLIENT_VERSION, allow_http_tracker=True)
    with sdk.open_project_queue(config, "no-such-project") as queue, \
            pytest.raises(sdk.APIError) as refused:
        queue.claim()
    assert (refused.value.status, refused.value.code) == (404, "not_found")
    wrong = sdk.Config(hq.url, "hq_" + "x" * 43, CLIENT_VERSION, allow_http_tracker=True)
    with pytest.raises(sdk.APIError) as unknown:
        sdk.whoami(wrong)
    assert (unknown.value.status, unknown.value.code) == (401, "invalid_machine_token")


def test_go_sdk_worker_finishes_every_job_and_renews_held_leases(hq, tmp_path):
    hq.put_project("go-sdk", recommended_lease_seconds=60)
    values = tmp_path / "values.txt"
    values.write_text("".join(f"https://example.test/go/{i}\n" for i in range(200)))
    enqueued = run([program("hqctl"), "enqueue", "-url", hq.url, "-allow-http",
                    "-machine-token-file", str(hq.admin_file), "-project-id", "go-sdk",
                    "-type", "seed", "-input", str(values), "-batch-size", "64"])
    assert hq.counts("go-sdk")["todo"] == 200, enqueued.stderr
    # A 4 s lease and every tenth job held for 7 s: the SDK must renew
    # those leases (extend-lease) while the rest complete or fail.
    done = run([program("swpworker"), "-url", hq.url, "-token-file", str(hq.worker_file),
                "-project", "go-sdk", "-client-version", CLIENT_VERSION, "-n", "200",
                "-lease", "4s", "-hold", "7s", "-concurrency", "32"], timeout=300)
    report = json.loads(done.stdout[done.stdout.index("{"):])
    assert report["whoami"] == "hq-worker"
    assert (report["other_errors"], report["lease_lost"]) == (0, 0), report
    assert report["held"] > 0 and report["held_survived_renewal"] == report["held"], report
    assert report["second_complete_got_ErrJobFinished"] == report["completed"], report
    counts = hq.counts("go-sdk")
    assert counts["done"] == report["completed"], (counts, report)
    assert counts["failed"] >= report["failed_permanent"] > 0, (counts, report)
    assert counts["wip"] == 0, counts


def test_source_pack_merge_and_hqctl_enqueue_source(hq, tmp_path):
    hq.put_project("source")
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("".join(f"https://example.test/s/{i}\n" for i in range(0, 300)))
    second.write_text("".join(f"https://example.test/s/{i}\n" for i in range(200, 500)))
    source = program("source")
    for name in ("a", "b"):
        run([source, "pack", "-input", str(tmp_path / f"{name}.txt"),
             "-output", str(tmp_path / f"{name}.jsonl.zst")])
    run([source, "merge", "-input", str(tmp_path / "a.jsonl.zst"), "-input", str(tmp_path / "b.jsonl.zst"),
         "-jobs-per-file", "400", "-output-prefix", str(tmp_path / "merged")])
    parts = sorted(tmp_path.glob("merged*"))
    assert len(parts) == 2, parts  # 500 unique values, 400 a file
    hqctl = program("hqctl")
    for part in parts + parts:  # a second send of the same parts adds nothing
        run([hqctl, "enqueue-source", "-url", hq.url, "-allow-http",
             "-machine-token-file", str(hq.admin_file), "-project-id", "source", "-input", str(part)])
    assert hq.counts("source")["todo"] == 500


def test_hqctl_refuses_a_token_file_others_can_read(hq, tmp_path):
    hq.admin_file.chmod(0o644)
    values = tmp_path / "values.txt"
    values.write_text("https://example.test/x\n")
    done = subprocess.run([program("hqctl"), "enqueue", "-url", hq.url, "-allow-http",
                           "-machine-token-file", str(hq.admin_file), "-project-id", "p",
                           "-type", "seed", "-input", str(values)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and "must not allow group or other access" in done.stderr, done


def test_a_live_switch_under_load_loses_and_duplicates_nothing(app, master, tmp_path):
    """Workers on SavewebHQ's tracker; import; the workers move to FleetHQ
    (killed mid-work, their leases left behind); import again; the tracker
    stops; import once more. Every job ends once, every completion the
    tracker acknowledged is here."""
    tracker = Tracker(tmp_path / "tracker.log")
    try:
        admin_file, admin_token = token_file(tmp_path, "admin")
        worker_file, _ = token_file(tmp_path, "worker")
        tracker.bootstrap_user("hq-admin", "admin", admin_file)
        tracker.bootstrap_user("hq-worker", "worker", worker_file)
        old = Wire(tracker.url, admin_token)
        assert old.put(admin_path("switch"), project_body(recommended_lease_seconds=4)).status in (200, 201)
        values = tmp_path / "values.txt"
        values.write_text("".join(f"https://example.test/switch/{i}\n" for i in range(1500)))
        run([program("hqctl"), "enqueue", "-url", tracker.url, "-allow-http", "-machine-token-file",
             str(admin_file), "-project-id", "switch", "-type", "seed", "-input", str(values)])
        worker = [program("swpworker"), "-token-file", str(worker_file), "-project", "switch",
                  "-client-version", CLIENT_VERSION, "-n", "100000"]
        # Slow on the tracker (every tenth job held 2 s, four at a time), so
        # that jobs are still leased there when its workers move.
        on_tracker = subprocess.Popen(worker + ["-url", tracker.url, "-concurrency", "4", "-hold", "2s"],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            time.sleep(2)
            first = import_from(app, tracker.database_url)          # the tracker serving
            more = tmp_path / "more.txt"                            # and still taking jobs
            more.write_text("".join(f"https://example.test/switch/{i}\n" for i in range(1500, 1600)))
            run([program("hqctl"), "enqueue", "-url", tracker.url, "-allow-http", "-machine-token-file",
                 str(admin_file), "-project-id", "switch", "-type", "seed", "-input", str(more)])
            time.sleep(2)
        finally:
            on_tracker.kill()                                       # the workers move
            on_tracker.wait(timeout=30)
        second = import_from(app, tracker.database_url)
        on_fleethq = run(worker + ["-url", master.url, "-concurrency", "16"], timeout=300)
        tracker.proc.terminate()
        tracker.proc.wait(timeout=20)
        third = import_from(app, tracker.database_url)              # after it stopped
        with psycopg.connect(tracker.database_url.replace("?sslmode=disable", "")) as conn:
            done_there = {row[0] for row in conn.execute(
                "SELECT job_id FROM tracker_jobs WHERE status = 'done'")}
            ended_there, leased_there = conn.execute(
                "SELECT count(*) FILTER (WHERE status IN ('done', 'failed', 'reset_exhausted')), "
                "count(*) FILTER (WHERE status = 'wip') FROM tracker_jobs").fetchone()
    finally:
        tracker.stop()
    from tests.helpers import sql
    states = dict(sql(app, "SELECT state, count(*) FROM jobs WHERE project_id = 'switch' GROUP BY 1"))
    done_here = {row[0] for row in sql(app, "SELECT id FROM jobs WHERE project_id = 'switch' "
                                            "AND state = 'done'")}
    twice = sql(app, "SELECT job_id FROM attempts WHERE project_id = 'switch' AND state = 'done' "
                     "GROUP BY job_id HAVING count(*) > 1")
    report = {"jobs": sum(states.values()), "states": states, "ended_on_tracker": ended_there,
              "leased_on_tracker_at_the_switch": leased_there,
              "done_on_tracker": len(done_there), "first_import_jobs": first["tables"]["jobs"]["new"],
              "second_import": {k: second["tables"]["jobs"][k] for k in ("new", "updated", "kept_here")},
              "done_on_fleethq": json.loads(on_fleethq.stdout[on_fleethq.stdout.index("{"):])["completed"],
              "third_import_up_to_date": third["up_to_date"]}
    print("live switch:", json.dumps(report))
    assert sum(states.values()) == 1600, report
    assert set(states) <= {"done", "failed", "reset_exhausted"}, report   # every job ended
    assert done_there <= done_here, report                                # no acknowledged completion lost
    assert twice == [], report                                            # none done twice
    assert second["tables"]["jobs"]["new"] == 100 and second["tables"]["jobs"]["updated"] > 0, report
    assert leased_there > 0, report  # the switch really left leases behind
