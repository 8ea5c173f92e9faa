"""Long-polling claims (DESIGN §6 ``wait_ms``): a waiting claim returns as soon
as a job becomes claimable, returns ``jobs: []`` when its wait runs out, and
costs no database work while it waits."""
from __future__ import annotations

import threading
import time

import psycopg
import pytest
import requests
from sqlalchemy import event

from tests.helpers import Api, sql, values

CLAIM_KEYS = ["project_id", "jobs", "retry_after_ms", "policy_version"]


def session_api(live_server, token: str) -> Api:
    return Api(requests.Session(), token, base=live_server.url)


class Waiter:
    """A claim with ``wait_ms`` running in its own thread and HTTP session."""

    def __init__(self, live_server, token, project, wait_ms, worker_id="waiter", **kw):
        self.api = session_api(live_server, token)
        self.args = dict(worker_id=worker_id, wait_ms=wait_ms, **kw)
        self.project = project
        self.response = None
        self.error = None
        self.elapsed = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        started = time.monotonic()
        try:
            self.response = self.api.claim(self.project, **self.args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in result()
            self.error = exc
        self.elapsed = time.monotonic() - started

    def start(self):
        self.started = time.monotonic()
        self.thread.start()
        return self

    def running(self) -> bool:
        return self.thread.is_alive()

    def result(self, timeout=40.0) -> dict:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the waiting claim never returned"
        if self.error is not None:
            raise self.error
        assert self.response.status_code == 200, self.response.text
        out = self.response.json()
        assert list(out) == CLAIM_KEYS
        return out


@pytest.fixture
def admin(live_server, admin_token):
    return session_api(live_server, admin_token)


def test_waiting_claim_returns_as_soon_as_a_job_is_enqueued(admin, live_server, admin_token):
    admin.put_project("p")
    waiter = Waiter(live_server, admin_token, "p", wait_ms=10_000).start()
    time.sleep(0.5)
    assert waiter.running()  # nothing to hand out yet: it waits
    assert admin.enqueue("p", [{"id": "late", "value": "https://example.org/late"}]).status_code == 200
    enqueued_at = time.monotonic()

    out = waiter.result()
    assert [j["id"] for j in out["jobs"]] == ["late"]
    assert out["project_id"] == "p" and out["retry_after_ms"] == 1000
    assert waiter.elapsed >= 0.4
    assert time.monotonic() - enqueued_at < 3.0, "woke long after the job arrived"
    assert waiter.elapsed < 5.0
    assert admin.counts("p")["wip"] == 1


def test_waiting_claim_wakes_when_a_retryable_failure_releases_a_job(admin, live_server, admin_token):
    admin.put_project("p")  # generic: retry_backoff_seconds 0
    admin.enqueue("p", values(1))
    [job] = admin.claim("p", worker_id="first").json()["jobs"]

    waiter = Waiter(live_server, admin_token, "p", wait_ms=10_000, worker_id="second").start()
    time.sleep(0.5)
    assert waiter.running()
    [r] = admin.fail("p", [job], worker_id="first", retryable=True).json()["results"]
    assert r["status"] == "applied" and r["job_status"] == "todo"
    released_at = time.monotonic()

    out = waiter.result()
    assert [j["job_id"] for j in out["jobs"]] == [job["job_id"]]
    assert out["jobs"][0]["attempt_id"] != job["attempt_id"]
    assert time.monotonic() - released_at < 3.0
    assert waiter.elapsed < 5.0


def test_waiting_claim_wakes_when_a_job_is_requeued(admin, live_server, admin_token):
    admin.put_project("p")
    admin.enqueue("p", values(1))
    [job] = admin.claim("p").json()["jobs"]
    admin.fail("p", [job], retryable=False)

    waiter = Waiter(live_server, admin_token, "p", wait_ms=10_000, worker_id="second").start()
    time.sleep(0.5)
    assert waiter.running()
    response = admin.call("POST", f"/api/v1/admin/projects/p/jobs/{job['job_id']}/requeue")
    assert response.status_code == 204
    requeued_at = time.monotonic()

    out = waiter.result()
    assert [j["job_id"] for j in out["jobs"]] == [job["job_id"]]
    assert time.monotonic() - requeued_at < 3.0
    assert waiter.elapsed < 5.0


def test_waiting_claim_wakes_when_the_sweep_reaps_an_expired_lease(app, admin, live_server,
                                                                    admin_token):
    admin.put_project("p")
    admin.enqueue("p", values(1))
    [job] = admin.claim("p", worker_id="first", lease_seconds=600).json()["jobs"]

    waiter = Waiter(live_server, admin_token, "p", wait_ms=10_000, worker_id="second").start()
    time.sleep(0.5)
    assert waiter.running()
    sql(app, "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = :id",
        id=int(job["job_id"]))
    sql(app, "UPDATE attempts SET lease_expires_at = now() - interval '1 second' WHERE id = :id",
        id=int(job["attempt_id"]))
    from app.extensions import db
    from app.projects import leasing
    with app.app_context():
        assert leasing.sweep()["expired"] == 1
        db.session.remove()
    swept_at = time.monotonic()

    out = waiter.result()
    assert [j["job_id"] for j in out["jobs"]] == [job["job_id"]]
    assert time.monotonic() - swept_at < 3.0
    assert waiter.elapsed < 5.0


def test_waiting_claim_takes_a_job_whose_lease_runs_out_during_the_wait(admin, live_server,
                                                                        admin_token):
    """A lease that runs out makes its job claimable (the claim path reaps it
    lazily), so a waiting claim must not sleep through it until wait_ms ends
    just because no sweep happened to run."""
    admin.put_project("p")
    admin.enqueue("p", values(1))
    [job] = admin.claim("p", worker_id="first", lease_seconds=1).json()["jobs"]

    waiter = Waiter(live_server, admin_token, "p", wait_ms=15_000, worker_id="second").start()
    out = waiter.result()
    assert [j["job_id"] for j in out["jobs"]] == [job["job_id"]]
    assert waiter.elapsed < 6.0, f"the expired job was handed out only after {waiter.elapsed:.1f} s"


def test_waiting_claim_takes_a_job_when_its_retry_backoff_ends(admin, live_server, admin_token):
    admin.put_project("p", retry_backoff_seconds=2)
    admin.enqueue("p", values(1))
    [job] = admin.claim("p", worker_id="first").json()["jobs"]
    admin.fail("p", [job], worker_id="first", retryable=True)  # claimable again in 1..2 s

    waiter = Waiter(live_server, admin_token, "p", wait_ms=15_000, worker_id="second").start()
    out = waiter.result()
    assert [j["job_id"] for j in out["jobs"]] == [job["job_id"]]
    assert 0.5 <= waiter.elapsed < 6.0


@pytest.mark.parametrize("ending", ["complete", "permanent failure"])
def test_waiting_claim_wakes_when_a_finished_attempt_frees_in_flight_capacity(
        admin, live_server, admin_token, ending):
    """With max_in_flight reached, jobs are waiting but not claimable; when a
    live attempt ends (done, or failed for good), a slot is free and the
    waiting claim must get the next job then, not when its wait_ms runs out."""
    admin.put_project("p", max_in_flight=1)
    admin.enqueue("p", values(2))
    [first] = admin.claim("p", worker_id="first", max_jobs=5).json()["jobs"]

    waiter = Waiter(live_server, admin_token, "p", wait_ms=10_000, worker_id="second").start()
    time.sleep(0.5)
    assert waiter.running()  # the cap holds the second job back
    if ending == "complete":
        [r] = admin.complete("p", [first], worker_id="first").json()["results"]
    else:
        [r] = admin.fail("p", [first], worker_id="first", retryable=False).json()["results"]
        assert r["job_status"] == "failed"
    assert r["status"] == "applied"
    completed_at = time.monotonic()

    out = waiter.result()
    assert len(out["jobs"]) == 1 and out["jobs"][0]["job_id"] != first["job_id"]
    assert time.monotonic() - completed_at < 3.0, \
        f"the freed slot was used only after {waiter.elapsed:.1f} s"


def test_wait_with_nothing_arriving_returns_empty_after_wait_ms(admin, live_server, admin_token):
    admin.put_project("p")
    out = Waiter(live_server, admin_token, "p", wait_ms=1000).start()
    result = out.result()
    assert result == {"project_id": "p", "jobs": [], "retry_after_ms": 1000, "policy_version": 1}
    assert 0.9 <= out.elapsed < 5.0


def test_a_job_in_another_project_does_not_end_the_wait(admin, live_server, admin_token):
    admin.put_project("p")
    admin.put_project("other")
    waiter = Waiter(live_server, admin_token, "p", wait_ms=2000).start()
    time.sleep(0.4)
    assert admin.enqueue("other", values(3)).status_code == 200
    assert waiter.result()["jobs"] == []
    assert waiter.elapsed >= 1.8
    assert admin.counts("other")["todo"] == 3


def test_every_waiter_woken_by_one_batch_gets_its_own_job(admin, live_server, admin_token):
    admin.put_project("p")
    waiters = [Waiter(live_server, admin_token, "p", wait_ms=10_000, worker_id=f"w{i}", max_jobs=1)
               for i in range(3)]
    for w in waiters:
        w.start()
    time.sleep(0.5)
    assert all(w.running() for w in waiters)
    admin.enqueue("p", values(3))
    got = [w.result()["jobs"] for w in waiters]
    assert all(len(jobs) == 1 for jobs in got)
    assert len({jobs[0]["job_id"] for jobs in got}) == 3
    assert all(w.elapsed < 5.0 for w in waiters)


def test_an_idle_wait_does_not_poll_the_database(app, admin, live_server, admin_token,
                                                 database_url):
    """While a claim waits, the app runs no statements (SQLAlchemy engine events)
    and the database sees next to no transactions (pg_stat_database.xact_commit,
    which includes this test's own probes and any other connection's work), and
    no connection sits idle in a transaction."""
    from app.extensions import db
    admin.put_project("p")
    statements = []
    with app.app_context():
        engine = db.engine

    def count(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    probe = psycopg.connect(database_url, autocommit=True)

    def commits() -> int:
        return probe.execute("SELECT xact_commit FROM pg_stat_database "
                             "WHERE datname = current_database()").fetchone()[0]

    event.listen(engine, "before_cursor_execute", count)
    try:
        waiter = Waiter(live_server, admin_token, "p", wait_ms=4000).start()
        time.sleep(0.8)  # past the first claim: now it only waits
        assert waiter.running()
        before_statements, before_commits = len(statements), commits()
        time.sleep(2.0)
        idle_in_tx = probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state LIKE 'idle in transaction%'").fetchone()[0]
        after_statements, after_commits = len(statements), commits()
        assert waiter.running()
        assert waiter.result()["jobs"] == []
    finally:
        event.remove(engine, "before_cursor_execute", count)
        probe.close()

    assert after_statements - before_statements <= 2, statements[before_statements:after_statements]
    assert after_commits - before_commits < 20
    assert idle_in_tx == 0, "a waiting claim holds a transaction open"


def test_many_waiters_do_not_starve_other_requests(admin, live_server, admin_token):
    """Waiting claims hand their database connection back while they sleep:
    more waiters than the connection pool holds must not block other calls."""
    admin.put_project("idle")
    admin.put_project("busy")
    waiters = [Waiter(live_server, admin_token, "idle", wait_ms=8000, worker_id=f"w{i}")
               for i in range(40)]
    for w in waiters:
        w.start()
    time.sleep(1.0)
    assert all(w.running() for w in waiters)

    started = time.monotonic()
    assert admin.enqueue("busy", values(5)).status_code == 200
    jobs = admin.claim("busy", max_jobs=5).json()["jobs"]
    assert len(jobs) == 5
    assert {r["status"] for r in admin.complete("busy", jobs).json()["results"]} == {"applied"}
    assert time.monotonic() - started < 4.0
    assert any(w.running() for w in waiters)
    for w in waiters:
        assert w.result()["jobs"] == []


@pytest.mark.parametrize("wait_ms", [30_001, 60_000, -1])
def test_wait_ms_out_of_range_is_rejected(admin, wait_ms):
    admin.put_project("p")
    admin.enqueue("p", values(1))
    started = time.monotonic()
    response = admin.claim("p", wait_ms=wait_ms)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["details"]["field"] == "wait_ms"
    assert time.monotonic() - started < 5.0
    assert admin.counts("p")["todo"] == 1  # nothing was claimed


def test_a_job_enqueued_while_the_listener_reconnects_still_wakes_the_waiter(
        admin, live_server, admin_token, database_url):
    """If the LISTEN connection drops (database restart, network blip), a
    notification sent meanwhile is lost; waiters must still find the job
    promptly (re-check on reconnect or poll in short slices), not sleep until
    their wait_ms ends."""
    project = f"relisten-{time.monotonic_ns()}"  # never notified before in this process
    admin.put_project(project)
    waiter = Waiter(live_server, admin_token, project, wait_ms=15_000).start()
    time.sleep(0.5)
    assert waiter.running()

    with psycopg.connect(database_url, autocommit=True) as probe:
        pids = [r[0] for r in probe.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN %'").fetchall()]
        assert len(pids) == 1, pids
        assert probe.execute("SELECT pg_terminate_backend(%s)", (pids[0],)).fetchone()[0]
    assert admin.enqueue(project, values(1)).status_code == 200  # NOTIFY with nobody listening
    enqueued_at = time.monotonic()

    out = waiter.result()
    assert len(out["jobs"]) == 1
    assert time.monotonic() - enqueued_at < 5.0, \
        f"the waiter found the job only after {waiter.elapsed:.1f} s"
