"""The task deadline starts at a job's first claim (DESIGN §5, seed row E7):
a backlog of any size waits in PostgreSQL without expiring, a claimed job
still fails once its deadline passes, a retry keeps the first deadline, an
admin requeue starts afresh, and migration 0011 frees waiting jobs of the
deadline their enqueue gave them.

Task timeouts below the policy minimum (60 s) are set in SQL so that these
tests wait seconds, not minutes; every claim, upload and archive is real."""
from __future__ import annotations

from sqlalchemy import text

from tests.conftest import make_app
from tests.fleet_helpers import Node, papers, pdf_project
from tests.helpers import Api, body, sql, values, wait_for
from tests.support.uploads import archive
from tests.support.jobs import (sweep)  # noqa: F401


def shorten_task_timeout(app, project: str, seconds: int) -> None:
    sql(app, "UPDATE projects SET task_timeout_seconds = :s WHERE id = :p", s=seconds, p=project)


def wait_past(app, what: str, moment_sql: str, **params) -> None:
    """Poll until the database clock is past a moment, sweeping meanwhile."""
    def passed():
        sweep(app)
        return sql(app, f"SELECT now() > ({moment_sql})", **params)[0][0]
    wait_for(passed, timeout=60, what=what, interval=0.2)


def states(app, project: str) -> dict:
    return dict(sql(app, "SELECT state, count(*) FROM jobs WHERE project_id = :p GROUP BY state",
                    p=project))


def test_a_backlog_far_larger_than_the_fleet_waits_and_is_worked_off(app, client, admin_token,
                                                                      dirs, files):
    """Seed E7: 40 papers, a fleet that runs two at a time, a 4 s task
    timeout. The whole backlog waits past the timeout before any claim (the
    old rule failed every job here), then is worked off, two at a time, by
    claim → upload → archive: every job ends done, none failed for a deadline."""
    api = Api(client, admin_token)
    timeout_s, n = 4, 40
    pdf_project(api, "backlog", max_in_flight=2, max_worker_in_flight=2)
    shorten_task_timeout(app, "backlog", timeout_s)
    assert api.enqueue("backlog", papers(n)).status_code == 200
    wait_past(app, "the backlog to wait longer than the task timeout",
              f"SELECT max(created_at) + interval '{timeout_s + 1} seconds' FROM jobs")
    assert states(app, "backlog") == {"todo": n}

    node = Node(client, app, name="fleet")
    rounds = 0
    while states(app, "backlog").get("todo"):
        rounds += 1
        assert rounds <= n, states(app, "backlog")
        assert node.heartbeat().status_code == 200
        response = node.claim("backlog", max_jobs=8, lease_seconds=60)
        assert response.status_code == 200, body(response)
        jobs = body(response)["jobs"]
        assert 1 <= len(jobs) <= 2, jobs   # the fleet starts two at a time
        for job in jobs:
            uploaded = node.upload(job["attempt_id"], files["good"])
            assert uploaded.status_code == 202, body(uploaded)
            assert archive(app, job["attempt_id"]) == "done"
        sweep(app)

    assert states(app, "backlog") == {"done": n}
    assert rounds >= n // 2
    # Every job waited longer than the whole task timeout before its first
    # claim, and its deadline was counted from that claim.
    waits = sql(app, """
        SELECT extract(epoch FROM a.created_at - j.created_at),
               extract(epoch FROM j.deadline_at - a.created_at)
        FROM jobs j JOIN attempts a ON a.job_id = j.id WHERE j.project_id = 'backlog'""")
    assert len(waits) == n
    assert all(float(waited) > timeout_s for waited, _ in waits), waits
    assert {float(span) for _, span in waits} == {float(timeout_s)}


def test_a_job_never_claimed_stays_todo_after_sweep_however_old(app, client, admin_token):
    api = Api(client, admin_token)
    pdf_project(api, "papers", task_timeout_seconds=60)
    api.enqueue("papers", papers(3))
    # Enqueued a day ago: long past enqueue + task timeout.
    sql(app, "UPDATE jobs SET created_at = now() - interval '1 day', "
             "updated_at = now() - interval '1 day'")
    assert sweep(app)["overdue"] == 0
    assert states(app, "papers") == {"todo": 3}
    assert sql(app, "SELECT count(*) FROM jobs WHERE deadline_at IS NULL") == [(3,)]
    node = Node(client, app)
    assert node.heartbeat().status_code == 200
    response = node.claim("papers", max_jobs=3)
    assert len(body(response)["jobs"]) == 2   # pdf default: two per worker
    spans = sql(app, "SELECT extract(epoch FROM j.deadline_at - a.created_at) FROM jobs j "
                     "JOIN attempts a ON a.id = j.current_attempt_id")
    assert [float(s) for (s,) in spans] == [60.0, 60.0]


def test_a_claimed_job_whose_lease_ran_into_the_deadline_fails_with_timeout(app, client,
                                                                             admin_token):
    api = Api(client, admin_token)
    pdf_project(api, "papers", max_resets=10)
    shorten_task_timeout(app, "papers", 2)
    api.enqueue("papers", papers(1))
    node = Node(client, app)
    assert node.heartbeat().status_code == 200
    [job] = body(node.claim("papers", lease_seconds=3600))["jobs"]
    # The lease is cut at the task deadline, two seconds after the claim.
    [(deadline,)] = sql(app, "SELECT floor(extract(epoch FROM deadline_at)) FROM jobs")
    assert job["lease_expires_at"] == deadline
    wait_past(app, "the task deadline", "SELECT deadline_at FROM jobs")
    assert sql(app, "SELECT j.state, j.last_error ->> 'code', a.state FROM jobs j "
                    "JOIN attempts a ON a.id = j.current_attempt_id") == [
        ("failed", "timeout", "expired")]
    assert body(node.claim("papers"))["jobs"] == []


def test_a_retry_keeps_the_first_deadline_and_fails_with_timeout_once_it_passes(
        app, client, admin_token):
    api = Api(client, admin_token)
    pdf_project(api, "papers", retry_backoff_seconds=0, prefer_new_worker=False)
    shorten_task_timeout(app, "papers", 3)
    api.enqueue("papers", papers(1))
    node = Node(client, app)
    assert node.heartbeat().status_code == 200
    [first] = body(node.claim("papers"))["jobs"]
    [(deadline,)] = sql(app, "SELECT deadline_at FROM jobs")
    [failed] = body(node.fail("papers", first, retryable=True))["results"]
    assert failed["job_status"] == "todo"
    [retry] = body(node.claim("papers"))["jobs"]
    assert retry["attempt_id"] != first["attempt_id"]
    assert sql(app, "SELECT deadline_at FROM jobs") == [(deadline,)]   # not restarted

    # A retry waiting in its backoff when the deadline passes fails for it.
    sql(app, "UPDATE projects SET retry_backoff_seconds = 3600")
    assert body(node.fail("papers", retry, retryable=True))["results"][0]["job_status"] == "todo"
    wait_past(app, "the task deadline", "SELECT deadline_at FROM jobs")
    assert sql(app, "SELECT state, last_error FROM jobs") == [
        ("failed", {"code": "timeout", "message": "task deadline passed"})]


def test_requeue_clears_the_deadline_until_the_next_claim(app, client, admin_token):
    api = Api(client, admin_token)
    api.put_project("gen", task_timeout_seconds=600)
    api.enqueue("gen", values(1))
    [job] = body(api.claim("gen"))["jobs"]
    body(api.fail("gen", [job], retryable=False))
    assert sql(app, "SELECT state, deadline_at IS NOT NULL FROM jobs") == [("failed", True)]
    response = api.call("POST", f"/api/v1/admin/projects/gen/jobs/{job['job_id']}/requeue")
    assert response.status_code == 204, response.data
    detail = body(api.call("GET", f"/api/v1/fleethq/projects/gen/jobs/{job['job_id']}"))
    assert (detail["state"], detail["deadline_at"]) == ("todo", None)
    [again] = body(api.claim("gen"))["jobs"]
    assert sql(app, "SELECT extract(epoch FROM j.deadline_at - a.created_at) FROM jobs j "
                    "JOIN attempts a ON a.id = j.current_attempt_id") == [(600,)]
    assert again["job_id"] == job["job_id"]


def test_migration_0011_frees_waiting_jobs_of_their_enqueue_deadline(scratch_database_url):
    from flask_migrate import upgrade

    from app.extensions import db
    application = make_app(scratch_database_url, check_schema=False)
    try:
        with application.app_context():
            upgrade(revision="0007")
            db.session.execute(text("""
                INSERT INTO projects (id, kind, status, identity_mode, claim_order,
                    max_jobs_per_claim, max_resets, recommended_lease_seconds,
                    retry_backoff_seconds, client_versions, prefer_new_worker,
                    upload_timeout_seconds, task_timeout_seconds)
                VALUES ('pdf', 'pdf', 'active', 'none', 'fifo', 256, 3, 300, 30, '{}', true,
                        120, 900),
                       ('gen', 'generic', 'active', 'none', 'fifo', 256, 3, 300, 0, '{}', false,
                        120, NULL)"""))
            db.session.execute(text("""
                INSERT INTO jobs (project_id, value, type, random_key, state, attempts_count,
                                  deadline_at)
                VALUES ('pdf', 'waiting', 'seed', 1, 'todo', 0, now() + interval '15 minutes'),
                       ('pdf', 'retrying', 'seed', 2, 'todo', 1, now() + interval '5 minutes'),
                       ('pdf', 'running', 'seed', 3, 'wip', 1, now() + interval '5 minutes'),
                       ('pdf', 'expired', 'seed', 4, 'failed', 0, now() - interval '1 minute')"""))
            db.session.commit()
            upgrade()
            rows = dict(db.session.execute(text(
                "SELECT value, deadline_at IS NOT NULL FROM jobs")).all())
            caps = dict(db.session.execute(text(
                "SELECT id, max_worker_attempts FROM projects")).all())
            db.session.remove()
    finally:
        with application.app_context():
            db.session.remove()
            db.engine.dispose()
    assert rows == {"waiting": False, "retrying": True, "running": True, "expired": True}
    assert caps == {"pdf": 3, "gen": None}


def test_a_job_whose_worker_went_away_waits_with_its_budget_paused(app, client, admin_token):
    """A host that sleeps holding a job: its lease runs out, the job goes back
    to the queue with what was left of its task budget, and waiting there,
    longer than the whole budget, never fails it. The next claim starts the
    deadline from what was left."""
    api = Api(client, admin_token)
    pdf_project(api, "papers", retry_backoff_seconds=0, prefer_new_worker=False)
    shorten_task_timeout(app, "papers", 3)
    api.enqueue("papers", papers(1))
    node = Node(client, app)
    assert node.heartbeat().status_code == 200
    [job] = body(node.claim("papers", lease_seconds=1))["jobs"]
    [(claimed_at,)] = sql(app, "SELECT created_at FROM attempts")
    wait_past(app, "the lease", "SELECT lease_expires_at FROM attempts")
    [(state, deadline, left)] = sql(app, "SELECT state, deadline_at, work_left_s FROM jobs")
    assert (state, deadline) == ("todo", None) and 1 < left < 2.5
    # Past the moment the whole budget would have run out: still waiting.
    wait_past(app, "the old task deadline", "SELECT CAST(:t AS timestamptz) + interval '4 seconds'",
              t=claimed_at)
    assert sql(app, "SELECT state FROM jobs") == [("todo",)]
    assert node.heartbeat().status_code == 200
    [again] = body(node.claim("papers"))["jobs"]
    [(span,)] = sql(app, "SELECT extract(epoch FROM j.deadline_at - a.created_at) FROM jobs j "
                         "JOIN attempts a ON a.id = j.current_attempt_id")
    assert 1 < float(span) < 2.5 and again["job_id"] == job["job_id"]


def test_an_ocr_run_gets_more_time_for_more_pages(app, client, admin_token):
    """Jobs naming their page count (OCR runs: attr.pages) get PAGE_SECONDS a
    page on top of the attempt and task budgets; a non-numeric pages counts
    for nothing and breaks no claim."""
    from app.projects.states import PAGE_SECONDS
    api = Api(client, admin_token)
    api.put_project("ocr", task_timeout_seconds=600, attempt_timeout_seconds=360)
    api.enqueue("ocr", [{"id": "big", "value": "a", "attr": {"pages": 40}},
                        {"id": "odd", "value": "b", "attr": {"pages": "many"}},
                        {"id": "plain", "value": "c"}])
    body(api.claim("ocr", max_jobs=3, lease_seconds=3600))
    spans = dict(sql(app, "SELECT j.ext_id, ARRAY[extract(epoch FROM j.deadline_at - a.created_at), "
                          "extract(epoch FROM a.deadline_at - a.created_at)] FROM jobs j "
                          "JOIN attempts a ON a.id = j.current_attempt_id"))
    assert [float(x) for x in spans["big"]] == [600 + 40 * PAGE_SECONDS, 360 + 40 * PAGE_SECONDS]
    assert [float(x) for x in spans["odd"]] == [600, 360]
    assert [float(x) for x in spans["plain"]] == [600, 360]
