"""``flask fleet import-savewebhq``: a SavewebHQ tracker database becomes
FleetHQ users, tokens, projects, jobs, attempts and worker map."""
from __future__ import annotations

import hashlib
import json

import psycopg
import requests

from tests.conftest import PG_HOST, PG_PORT, PG_USER
from tests.helpers import Api, body, db_rows, sql
from tests.savewebhq_source import BLOCKED, RECEIPTS, TIMEOUT, VERSION, count_by_state
from tests.support.savewebhq_import import (TABLES, at, attempts, counts, job, own_source,  # noqa: F401
                                            refused, run, snapshot, source)


# ------------------------------------------------------------------ counts

def test_every_table_is_carried_and_counted(app, source):
    summary = run(app, source.url)
    jobs = 17 + source.bulk_jobs
    assert summary["changed"] is True and summary["dry_run"] is False
    tables = summary["tables"]
    assert {k: (v["source"], v["new"]) for k, v in tables.items()
            if k != "attempts"} == {
        "users": (5, 5), "machine_tokens": (4, 3), "projects": (3, 3), "jobs": (jobs, jobs),
        "worker_users": (3, 3), "claim_buckets": (2, 2)}
    assert tables["machine_tokens"]["revoked_not_carried"] == 1
    assert db_rows(app, "SELECT worker_id, extract(epoch FROM bucket_started_at)::bigint AS t, "
                        "claim_requests, jobs_dispatched, policy_version FROM worker_claim_buckets "
                        "WHERE project_id = 'archive-web' ORDER BY 1") == [
        {"worker_id": "abc1234", "t": 1760000000, "claim_requests": 3, "jobs_dispatched": 12,
         "policy_version": 4},
        {"worker_id": "def5678", "t": 1760000060, "claim_requests": 1, "jobs_dispatched": 1,
         "policy_version": 4}]
    assert counts(app) == {"users": 5, "machine_tokens": 3, "projects": 3, "project_dispatch": 3,
                           "jobs": jobs, "attempts": tables["attempts"]["new"],
                           "worker_users": 3, "worker_claim_buckets": 2}
    by_state = db_rows(app, "SELECT state, count(*) AS n FROM attempts GROUP BY state")
    assert {r["state"]: r["n"] for r in by_state} == tables["attempts"]["new_by_state"]
    assert any("worker missing from the worker map (first: 22)" in w for w in summary["warnings"])


def test_job_counts_on_the_admin_summary_match_the_source(app, source, client, admin_token):
    run(app, source.url)
    api = Api(client, admin_token)
    for project_id in ("archive-web", "uniq", "plain"):
        expected = {"todo": 0, "wip": 0, "staged": 0, "done": 0, "failed": 0, "reset_exhausted": 0}
        expected.update(count_by_state(source.url, project_id))
        assert api.counts(project_id) == expected, project_id
    assert api.counts("archive-web") == {"todo": 3, "wip": 3, "staged": 0, "done": 2, "failed": 1,
                                         "reset_exhausted": 2}


def test_small_batches_give_the_same_result(app, source):
    run(app, source.url, batch=40)
    few = snapshot(app)
    sql(app, "TRUNCATE attempts, jobs, project_dispatch, projects, machine_tokens, worker_users, "
             "users, job_counts, attempt_totals, savewebhq_marks RESTART IDENTITY CASCADE")
    run(app, source.url)
    many = snapshot(app)
    assert few["jobs"] == many["jobs"] and few["job_counts"] == many["job_counts"]
    assert few["attempt_totals"] == many["attempt_totals"]


# ------------------------------------------------------- field by field

def test_users_tokens_and_worker_map(app, source):
    run(app, source.url)
    users = {u["id"]: u for u in db_rows(app, "SELECT * FROM users")}
    assert {u: (r["status"], r["roles"], r["github_login"]) for u, r in users.items()} == {
        "gh_42": ("active", ["admin"], "alice"), "crawler-1": ("active", ["worker"], None),
        "crawler-2": ("active", ["admin", "worker"], None),
        "old-bot": ("suspended", ["worker"], None), "gh_43": ("pending", ["worker"], "bob")}
    assert users["gh_43"]["created_at"] == at(source.now - 86400 - 1000)
    tokens = {t["user_id"]: t for t in db_rows(app, "SELECT * FROM machine_tokens")}
    # Tokens kept in clear are looked up by FleetHQ's digest, SHA-256 of the token itself.
    assert tokens["crawler-1"]["token_hash"] == hashlib.sha256(
        source.tokens["crawler-1"].encode()).hexdigest()
    assert tokens["gh_42"]["token_hash"] == hashlib.sha256(source.tokens["gh_42"].encode()).hexdigest()
    # SavewebHQ's own digest is SHA-256 of a prefixed token: carried under a tag.
    saveweb = hashlib.sha256(b"saveweb-machine-token-v1\x00" + source.tokens["crawler-2"].encode())
    assert tokens["crawler-2"]["token_hash"] == "savewebhq-v1:" + saveweb.hexdigest()
    assert "old-bot" not in tokens  # revoked in SavewebHQ
    assert tokens["crawler-1"]["created_at"] == at(source.now - 86400 - 900)
    workers = db_rows(app, "SELECT worker_id, user_id FROM worker_users ORDER BY 1")
    assert workers == [{"worker_id": "abc1234", "user_id": "crawler-1"},
                       {"worker_id": "def5678", "user_id": "crawler-2"},
                       {"worker_id": "old0001", "user_id": "old-bot"}]


def test_digest_only_token_is_found_by_the_legacy_key(source):
    from app.accounts.tokens import savewebhq_key
    saveweb = hashlib.sha256(b"saveweb-machine-token-v1\x00" + source.tokens["crawler-2"].encode())
    assert savewebhq_key(source.tokens["crawler-2"]) == "savewebhq-v1:" + saveweb.hexdigest()


def test_clear_text_tokens_stay_viewable_where_fleethq_can_seal_them(app, source):
    from app.accounts import service
    summary = run(app, source.url)
    install = getattr(service, "install_token", None)
    if install is None:
        assert summary["tables"]["machine_tokens"]["sealed"] == 0
        assert any("2 machine tokens were installed by digest only" in w for w in summary["warnings"])
    else:
        assert summary["tables"]["machine_tokens"]["sealed"] == 2
        with app.app_context():
            assert service.view_token("crawler-1") == source.tokens["crawler-1"]
            assert service.view_token("crawler-2") is None


def test_projects_keep_their_policy_with_fleethq_defaults(app, source):
    run(app, source.url)
    projects = {p["id"]: p for p in db_rows(app, "SELECT * FROM projects")}
    web = projects["archive-web"]
    assert {k: web[k] for k in ("kind", "status", "identity_mode", "claim_order", "dispatch_qps",
                                "worker_claim_qps", "max_jobs_per_claim", "max_resets",
                                "recommended_lease_seconds", "client_versions",
                                "policy_version")} == {
        "kind": "generic", "status": "active", "identity_mode": "external_id",
        "claim_order": "fifo", "dispatch_qps": 50.0, "worker_claim_qps": 0.5,
        "max_jobs_per_claim": 64, "max_resets": 5, "recommended_lease_seconds": 600,
        "client_versions": ["saveweb-1.2.0", VERSION], "policy_version": 4}
    assert {k: web[k] for k in ("retry_backoff_seconds", "max_in_flight", "max_worker_in_flight",
                                "prefer_new_worker", "task_timeout_seconds",
                                "attempt_timeout_seconds", "upload_timeout_seconds")} == {
        "retry_backoff_seconds": 0, "max_in_flight": None, "max_worker_in_flight": None,
        "prefer_new_worker": False, "task_timeout_seconds": None, "attempt_timeout_seconds": None,
        "upload_timeout_seconds": 120}
    assert web["created_at"] == at(source.now - 86400 - 500)
    assert (projects["uniq"]["status"], projects["uniq"]["identity_mode"],
            projects["uniq"]["claim_order"], projects["uniq"]["dispatch_qps"]) == (
        "draining", "unique_value", "random", None)
    assert (projects["plain"]["identity_mode"], projects["plain"]["max_resets"],
            projects["plain"]["policy_version"]) == ("none", 0, 2)
    dispatch = db_rows(app, "SELECT project_id, tokens FROM project_dispatch ORDER BY 1")
    assert [d["tokens"] for d in dispatch] == [0.0, 0.0, 0.0]


def test_job_specs_identities_and_times(app, source):
    run(app, source.url)
    t0 = source.now - 86400
    asset = job(app, 2)
    assert {k: asset[k] for k in ("project_id", "ext_id", "value", "type", "via", "hops", "attr",
                                  "random_key", "state", "value_sha256")} == {
        "project_id": "archive-web", "ext_id": "j1_asset", "value": "https://example.org/a.css",
        "type": "asset", "via": "https://example.org/", "hops": 2,
        "attr": {"depth": 1, "tags": ["css"]}, "random_key": (2 * 7919) % 2**31 - 2**30,
        "state": "todo", "value_sha256": None}
    assert (asset["created_at"], asset["updated_at"], asset["not_before"]) == (at(t0 + 1),) * 3
    plain = job(app, 1)
    assert (plain["type"], plain["via"], plain["hops"], plain["attr"]) == ("seed", None, None, None)
    # unique_value: SavewebHQ's unique_value_digest is FleetHQ's value_sha256 (SHA-256 of the value).
    uniq = job(app, 20)
    assert uniq["ext_id"] is None
    assert bytes(uniq["value_sha256"]) == hashlib.sha256(b"https://u.example.org/1").digest()
    assert (job(app, 30)["random_key"], job(app, 31)["random_key"]) == (-2**31, 2**31 - 1)
    assert job(app, 30)["value_sha256"] is None and job(app, 30)["ext_id"] is None
    assert not db_rows(app, "SELECT id FROM jobs WHERE id = 11")


def test_done_jobs_get_a_done_attempt_with_outcome_and_receipts(app, source):
    run(app, source.url)
    t0 = source.now - 86400
    done = job(app, 5)
    [attempt] = attempts(app, 5)
    assert (done["state"], done["current_attempt_id"], done["attempts_count"], done["last_error"],
            done["lease_expires_at"]) == ("done", attempt["id"], 1, None, None)
    assert attempt["state"] == "done" and attempt["finished_at"] == at(t0 + 500)
    assert attempt["outcome"] == {
        "outcome": {"kind": "success", "code": 200, "uri": "https://example.org/done",
                    "meta": {"bytes": 5120}},
        "artifact_receipts": RECEIPTS}
    assert done["updated_at"] == at(t0 + 500)
    [no_receipts] = attempts(app, 6)
    assert no_receipts["outcome"]["artifact_receipts"] == []
    assert no_receipts["outcome"]["outcome"]["kind"] == "http_error"


def test_errors_become_last_error_and_failed_attempts(app, source):
    run(app, source.url)
    t0 = source.now - 86400
    failed = job(app, 7)
    [attempt] = attempts(app, 7)
    assert (failed["state"], failed["last_error"], failed["resets"]) == ("failed", BLOCKED, 0)
    assert (attempt["state"], attempt["error"], attempt["finished_at"]) == (
        "failed", {"retryable": False, "error": BLOCKED}, at(t0 + 700))
    exhausted = job(app, 8)
    [attempt] = attempts(app, 8)
    assert (exhausted["state"], exhausted["resets"], exhausted["last_error"]) == (
        "reset_exhausted", 6, TIMEOUT)
    assert attempt["error"] == {"retryable": True, "error": TIMEOUT}
    # Exhausted by lease expiries: no error, the last attempt ran out.
    by_expiry = job(app, 9)
    [attempt] = attempts(app, 9)
    assert (by_expiry["state"], by_expiry["last_error"], attempt["state"]) == (
        "reset_exhausted", None, "expired")
    # Back in the queue after a retryable failure.
    retry = job(app, 10)
    [attempt] = attempts(app, 10)
    assert (retry["state"], retry["resets"], retry["last_error"], retry["current_attempt_id"]) == (
        "todo", 1, TIMEOUT, attempt["id"])
    assert (attempt["state"], attempt["error"]) == ("failed", {"retryable": True, "error": TIMEOUT})


def test_leases_in_flight_keep_attempt_id_worker_owner_and_expiry(app, source):
    run(app, source.url)
    live = job(app, 3)
    [attempt] = attempts(app, 3)
    assert (live["state"], live["worker_id"], live["worker_owner"], live["lease_expires_at"],
            live["current_attempt_id"]) == (
        "wip", "abc1234", "crawler-1", at(source.now + 900), attempt["id"])
    assert (attempt["state"], attempt["wire_id"], attempt["worker_id"], attempt["worker_owner"],
            attempt["lease_expires_at"], attempt["finished_at"]) == (
        "running", source.in_flight[3][0], "abc1234", "crawler-1", at(source.now + 900), None)
    # A retried job in flight: its earlier failure, then the running attempt.
    earlier, current = attempts(app, 12)
    assert (earlier["state"], current["state"], current["wire_id"]) == (
        "failed", "running", source.in_flight[12][0])
    assert job(app, 12)["current_attempt_id"] == current["id"]
    assert job(app, 12)["attempts_count"] == 2
    # A lease that already ran out in SavewebHQ stays wip until FleetHQ's reaper resets it.
    stale = job(app, 4)
    assert (stale["state"], stale["lease_expires_at"], stale["resets"]) == (
        "wip", at(source.now - 100), 2)


def test_expired_imported_lease_is_reaped_like_any_other(app, source):
    from app.projects import leasing
    run(app, source.url)
    with app.app_context():
        assert leasing.sweep()["expired"] == 1
    stale = job(app, 4)
    assert (stale["state"], stale["resets"], stale["lease_expires_at"]) == ("todo", 3, None)
    assert attempts(app, 4)[0]["state"] == "expired"


# --------------------------------------------------- ids and sequences

def test_job_ids_are_kept_and_new_jobs_get_higher_ids(app, source, client, admin_token):
    run(app, source.url)
    imported = [r["id"] for r in db_rows(app, "SELECT id FROM jobs ORDER BY id")]
    with psycopg.connect(source.url) as conn:
        assert imported == [r[0] for r in conn.execute("SELECT job_id FROM tracker_jobs ORDER BY 1")]
    api = Api(client, admin_token)
    response = api.enqueue("archive-web", [{"id": "new-one", "value": "https://example.org/new"}])
    assert response.status_code == 200, body(response)
    [new] = db_rows(app, "SELECT id FROM jobs WHERE ext_id = 'new-one'")
    assert new["id"] == max(imported) + 1


# ------------------------------------------------- rerun and dry run

def test_second_run_changes_nothing_and_says_so(app, source):
    run(app, source.url)
    before = snapshot(app)
    summary = run(app, source.url)
    assert summary["changed"] is False and summary["up_to_date"] is True
    assert all(t["new"] == 0 for t in summary["tables"].values())
    assert summary["tables"]["jobs"]["unchanged"] == 17 + source.bulk_jobs
    assert summary["jobs_id_sequence"]["next_before"] == summary["jobs_id_sequence"]["next_after"]
    assert snapshot(app) == before


def test_dry_run_reads_and_checks_but_writes_nothing(app, source):
    before = snapshot(app)
    dry = run(app, source.url, dry_run=True)
    assert snapshot(app) == before
    assert dry["dry_run"] is True and dry["changed"] is False and dry["up_to_date"] is False
    assert dry["jobs_id_sequence"] == {"next_before": 1, "next_after": 1000 + source.bulk_jobs}
    real = run(app, source.url)
    for table in TABLES[:2] + ("projects", "jobs", "worker_users"):
        assert dry["tables"][table]["new"] == real["tables"][table]["new"], table
    assert dry["tables"]["attempts"] == real["tables"]["attempts"]


# ---------------------------------------------------------- conflicts

def test_a_user_with_other_content_is_refused_and_nothing_is_written(app, source):
    from app.accounts import service
    with app.app_context():
        service.put_user("crawler-1", ["admin"])
    before = snapshot(app)
    error = refused(app, source.url)
    assert error.code == "import_conflict"
    assert "nothing was written" in error.message and "users: 1 (first 1: crawler-1)" in error.message
    assert snapshot(app) == before


def test_a_job_id_in_use_by_another_job_is_refused(app, source, client, admin_token):
    api = Api(client, admin_token)
    api.put_project("mine", identity_mode="external_id")
    assert api.enqueue("mine", [{"id": f"m{i}", "value": f"https://m.example/{i}"}
                                for i in range(3)]).status_code == 200
    before = snapshot(app)
    error = refused(app, source.url)
    assert error.code == "import_conflict"
    assert "jobs (id in use by another job): 3 (first 3: 1, 2, 3)" in error.message
    assert error.details["jobs (id in use by another job)"] == [1, 2, 3]
    assert snapshot(app) == before


def test_a_project_with_another_policy_is_refused(app, source, client, admin_token):
    Api(client, admin_token).put_project("uniq", identity_mode="external_id")
    error = refused(app, source.url)
    assert "projects: 1 (first 1: uniq)" in error.message
    assert counts(app)["jobs"] == 0 and counts(app)["projects"] == 1


def test_a_token_held_by_another_user_is_refused(app, source):
    from app.accounts import service
    with app.app_context():
        service.put_user("crawler-1", ["worker"])
        service.rotate_token("crawler-1")  # another token than SavewebHQ's
    error = refused(app, source.url)
    assert "machine_tokens: 1 (first 1: crawler-1)" in error.message
    assert counts(app)["projects"] == 0


def test_rows_fleethq_cannot_hold_are_refused(app, own_source):
    with psycopg.connect(own_source.url) as conn:
        conn.execute("UPDATE tracker_jobs SET spec = '{\"hops\": 9999999999}' WHERE job_id = 1")
        conn.execute("UPDATE tracker_jobs SET spec = '{\"type\": \"video\"}' WHERE job_id = 2")
        conn.execute("UPDATE tracker_jobs SET unique_value_digest = '\\x00' WHERE job_id = 20")
    error = refused(app, own_source.url)
    assert error.code == "invalid_source"
    assert "job type is neither seed nor asset: 1 (first 1: 2)" in error.message
    assert "hops is not an integer 0..2147483647: 1 (first 1: 1)" in error.message
    assert "unique_value_digest is not the SHA-256 of the value: 1 (first 1: 20)" in error.message
    assert counts(app)["users"] == 0


def test_a_database_that_is_not_savewebhq_is_refused(app, scratch_database_url):
    error = refused(app, scratch_database_url)
    assert error.code == "invalid_source"
    assert "not a SavewebHQ tracker database" in error.message
    assert "tracker_users.id" in error.message


def test_an_unreachable_source_is_refused(app):
    error = refused(app, f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/no_such_savewebhq_db")
    assert error.code == "invalid_source" and "cannot connect" in error.message


# ---------------------------------------------------------------- CLI

def test_cli_shows_progress_and_one_json_summary(app, source):
    result = app.test_cli_runner().invoke(
        args=["fleet", "import-savewebhq", "--from-database-url", source.url])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["tables"]["jobs"]["new"] == 17 + source.bulk_jobs
    assert "import-savewebhq: read 317/317 jobs (" in result.stderr
    assert "import-savewebhq: committed (" in result.stderr
    again = app.test_cli_runner().invoke(
        args=["fleet", "import-savewebhq", "--from-database-url", source.url, "--dry-run"])
    assert again.exit_code == 0 and json.loads(again.stdout)["up_to_date"] is True
    assert "nothing to import" in again.stderr


def test_cli_refusal_exits_1_with_the_reason(app, source):
    from app.accounts import service
    with app.app_context():
        service.put_user("gh_42", ["worker"])
    result = app.test_cli_runner().invoke(
        args=["fleet", "import-savewebhq", "--from-database-url", source.url])
    assert result.exit_code == 1
    assert "error: import_conflict: the target already holds other data" in result.stderr
    assert result.stdout == ""


# -------------------------------------------------------- end to end

def test_worker_finishes_its_in_flight_attempt_over_http(app, source, live_server):
    """A SavewebHQ worker keeps its token, worker id, job id and attempt id."""
    run(app, source.url)
    attempt_id, worker_id = source.in_flight[3]
    session = requests.Session()
    session.headers.update({"Authorization": f"Bearer {source.tokens['crawler-1']}",
                            "X-SavewebHQ-Client-Version": VERSION})
    base = f"{live_server.url}/api/v1/projects/archive-web/jobs"
    outcome = {"kind": "success", "code": 200, "uri": "https://example.org/live", "meta": {}}
    stale = session.post(f"{base}/complete", json={"worker_id": worker_id, "items": [
        {"job_id": 3, "attempt_id": "at_notTheAttemptOfThisJob0", "outcome": outcome}]})
    assert stale.status_code == 200, stale.text
    assert stale.json()["results"][0]["status"] == "rejected"
    extended = session.post(f"{base}/extend-lease", json={
        "worker_id": worker_id, "extend_seconds": 1800,
        "items": [{"job_id": 12, "attempt_id": source.in_flight[12][0]}]})
    assert extended.status_code == 200, extended.text
    assert extended.json()["results"][0]["status"] == "applied"
    done = session.post(f"{base}/complete", json={"worker_id": worker_id, "items": [
        {"job_id": 3, "attempt_id": attempt_id, "outcome": outcome,
         "artifact_receipts": [RECEIPTS[0]]}]})
    assert done.status_code == 200, done.text
    [result] = done.json()["results"]
    assert (result["job_id"], result["attempt_id"], result["status"], result["job_status"]) == (
        3, attempt_id, "applied", "done")
    [attempt] = attempts(app, 3)
    assert (attempt["state"], attempt["wire_id"]) == ("done", attempt_id)
    assert attempt["outcome"] == {"outcome": outcome, "artifact_receipts": [RECEIPTS[0]]}
    assert job(app, 3)["state"] == "done"
