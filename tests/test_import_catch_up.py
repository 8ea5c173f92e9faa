"""``import-savewebhq`` run again during a live switch: it brings over what
SavewebHQ changed since the last run (new jobs, outcomes, receipts, leases,
users, tokens, policies), never undoes what changed here, finishes here a job
SavewebHQ finished, and says what it did."""
from __future__ import annotations

import json

import psycopg

from tests.helpers import Api, body, db_rows, sql
from tests.savewebhq_source import RECEIPTS, TIMEOUT, VERSION, saveweb_digest
from tests.support.savewebhq_import import attempts, job, own_source, run, snapshot  # noqa: F401

W = "archive-web"


def source_sql(source, statement: str, *args) -> None:
    with psycopg.connect(source.url, autocommit=True) as conn:
        conn.execute(statement, args)


def later(source, seconds: int = 5) -> int:
    return source.now + seconds


def test_a_rerun_brings_over_what_savewebhq_changed_since(app, own_source):
    src = own_source
    first = run(app, src.url)
    assert first["changed"] is True
    t = later(src)
    # While the tracker still serves: a todo job is claimed, a leased one is
    # completed with receipts, another renews its lease, a job is enqueued,
    # an admin changes a user, rotates a token and edits a policy.
    source_sql(src, "UPDATE tracker_jobs SET status = 'wip', attempt_id = 'at_bmV3LWNsYWltLWZvci0x', "
                    "worker_id = 'abc1234', lease_expires_at = %s, updated_at = %s WHERE job_id = 1",
               t + 600, t)
    source_sql(src, "UPDATE tracker_jobs SET status = 'done', outcome = %s, artifact_receipts = %s, "
                    "attempt_id = NULL, worker_id = NULL, lease_expires_at = NULL, completed_at = %s, "
                    "updated_at = %s WHERE job_id = 3",
               json.dumps({"kind": "success", "code": 200, "uri": None, "meta": {}}),
               json.dumps(RECEIPTS[:1]), t, t)
    source_sql(src, "UPDATE tracker_jobs SET lease_expires_at = %s, updated_at = %s WHERE job_id = 22",
               t + 3600, t)
    source_sql(src, "INSERT INTO tracker_jobs (job_id, project_id, external_id, value, random_key, spec, "
                    "status, created_at, updated_at) OVERRIDING SYSTEM VALUE "
                    "VALUES (5000, %s, 'fresh', 'https://example.org/fresh', 7, '{}', 'todo', %s, %s)",
               W, t, t)
    source_sql(src, "UPDATE tracker_users SET roles = '{admin,worker}', updated_at = %s "
                    "WHERE id = 'crawler-1'", t)
    rotated = "hq_rotatedCrawlerOneToken77"
    source_sql(src, "UPDATE tracker_machine_tokens SET token = %s, token_hash = %s WHERE user_id = 'crawler-1'",
               rotated, saveweb_digest(rotated))
    source_sql(src, "UPDATE tracker_projects SET max_jobs_per_claim = 32, policy_version = 5, "
                    "updated_at = %s WHERE id = %s", t, W)

    second = run(app, src.url)
    tables = second["tables"]
    assert second["changed"] is True and second["up_to_date"] is False
    assert (tables["jobs"]["new"], tables["jobs"]["updated"], tables["jobs"]["kept_here"]) == (1, 3, 0)
    assert (tables["users"]["updated"], tables["machine_tokens"]["updated"],
            tables["projects"]["updated"]) == (1, 1, 1)
    assert second["warnings"] == first["warnings"]  # nothing new to warn about

    claimed = job(app, 1)
    assert (claimed["state"], claimed["worker_id"]) == ("wip", "abc1234")
    running = attempts(app, 1)[-1]
    assert (running["state"], running["wire_id"]) == ("running", "at_bmV3LWNsYWltLWZvci0x")
    # The attempt that was running here is the one SavewebHQ finished: it is
    # done, with the outcome and receipts, and no second attempt appears.
    done = attempts(app, 3)
    assert [a["state"] for a in done] == ["done"]
    assert done[0]["outcome"]["artifact_receipts"] == RECEIPTS[:1]
    assert job(app, 3)["state"] == "done"
    assert int(job(app, 22)["lease_expires_at"].timestamp()) == t + 3600
    assert int(attempts(app, 22)[-1]["lease_expires_at"].timestamp()) == t + 3600
    assert job(app, 5000)["ext_id"] == "fresh"
    assert sql(app, "SELECT roles FROM users WHERE id = 'crawler-1'")[0][0] == ["admin", "worker"]
    assert sql(app, "SELECT max_jobs_per_claim, policy_version FROM projects WHERE id = :p", p=W)[0] == (32, 5)
    counts = dict(sql(app, "SELECT state, sum(delta) FROM job_counts WHERE project_id = :p GROUP BY 1", p=W))
    real = dict(sql(app, "SELECT state, count(*) FROM jobs WHERE project_id = :p GROUP BY 1", p=W))
    assert {k: v for k, v in counts.items() if v} == real

    # The rotated token works here; the old one does not.
    client = app.test_client()
    assert client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {rotated}"}).status_code == 200
    old = src.tokens["crawler-1"]
    assert client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {old}"}).status_code == 401

    before = snapshot(app)
    third = run(app, src.url)
    assert third["changed"] is False and third["up_to_date"] is True
    assert snapshot(app) == before


def test_what_changed_here_is_kept_and_a_job_savewebhq_finished_is_finished_here(app, own_source, client,
                                                                                make_user):
    src = own_source
    run(app, src.url)
    admin = Api(client, make_user("here-admin", ["admin"]), version=VERSION)
    # Here: an admin requeues failed job 7 and deletes todo job 1; a worker
    # renews the lease of job 12 (FleetHQ's copy of it changes).
    assert admin.call("POST", f"/api/v1/admin/projects/{W}/jobs/7/requeue").status_code == 204
    assert admin.call("DELETE", f"/api/v1/admin/projects/{W}/jobs/1").status_code == 204
    worker = Api(client, src.tokens["crawler-1"], version=VERSION)
    extended = worker.call("POST", f"/api/v1/projects/{W}/jobs/extend-lease", {
        "worker_id": "abc1234", "extend_seconds": 1800,
        "items": [{"job_id": 12, "attempt_id": src.in_flight[12][0]}]})
    assert body(extended)["results"][0]["status"] == "applied", body(extended)
    t = later(src)
    # There, meanwhile: job 7 is requeued and failed again, job 1 is edited,
    # and job 12's worker (still on the tracker) fails it for good.
    source_sql(src, "UPDATE tracker_jobs SET status = 'todo', reset_count = 0, updated_at = %s "
                    "WHERE job_id IN (1, 7)", t)
    source_sql(src, "UPDATE tracker_jobs SET status = 'failed', execution_error = %s, "
                    "attempt_id = NULL, worker_id = NULL, lease_expires_at = NULL, completed_at = %s, "
                    "updated_at = %s WHERE job_id = 12",
               json.dumps(TIMEOUT), t, t)

    summary = run(app, src.url)
    jobs = summary["tables"]["jobs"]
    assert (jobs["updated"], jobs["finished_there"], jobs["kept_here"]) == (1, 1, 2)
    assert any("2 jobs changed both in SavewebHQ and here" in w and "first: 1, 7" in w
               for w in summary["warnings"]), summary["warnings"]
    assert job(app, 7)["state"] == "todo"                     # FleetHQ's requeue stands
    assert sql(app, "SELECT count(*) FROM jobs WHERE id = 1")[0][0] == 0  # its delete too
    ended = job(app, 12)
    assert (ended["state"], ended["last_error"]) == ("failed", TIMEOUT)
    assert [a["state"] for a in attempts(app, 12)][-1] == "failed"
    # Decided once: a run with nothing new changes nothing.
    before = snapshot(app)
    again = run(app, src.url)
    assert again["up_to_date"] is True and snapshot(app) == before


def test_rows_carried_before_marks_are_adopted_when_equal(app, own_source):
    src = own_source
    run(app, src.url)
    sql(app, "DELETE FROM savewebhq_marks")  # as an import by an earlier FleetHQ left it
    before = snapshot(app)
    adopted = run(app, src.url)
    assert adopted["up_to_date"] is True and snapshot(app) == before
    assert sql(app, "SELECT count(*) FROM savewebhq_marks WHERE kind = 'jobs'")[0][0] == 17 + src.bulk_jobs
    source_sql(src, "UPDATE tracker_jobs SET status = 'done', outcome = '{\"kind\":\"skipped\"}', "
                    "completed_at = %s, updated_at = %s WHERE job_id = 1", later(src), later(src))
    assert run(app, src.url)["tables"]["jobs"]["updated"] == 1
    assert job(app, 1)["state"] == "done"


def test_a_dry_run_of_a_catch_up_says_what_it_would_bring_and_writes_nothing(app, own_source):
    src = own_source
    run(app, src.url)
    source_sql(src, "UPDATE tracker_jobs SET status = 'todo', attempt_id = NULL, worker_id = NULL, "
                    "lease_expires_at = NULL, updated_at = %s WHERE job_id = 3", later(src))
    before = snapshot(app)
    dry = run(app, src.url, dry_run=True)
    assert dry["tables"]["jobs"]["updated"] == 1 and snapshot(app) == before
    real = run(app, src.url)
    assert real["tables"]["jobs"]["updated"] == 1
    assert job(app, 3)["state"] == "todo"
    assert [a["state"] for a in attempts(app, 3)] == ["expired"]
    assert db_rows(app, "SELECT state, sum(delta) AS n FROM attempt_totals WHERE project_id = :p "
                        "AND state = 'expired' GROUP BY 1", p=W)[0]["n"] >= 1
