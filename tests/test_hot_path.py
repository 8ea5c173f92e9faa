"""The hot path (app/api/hot_path.py): a token worker's plain completion or
lease renewal is answered before Flask runs — the same answer, byte for
byte, that the Flask app gives — and everything else reaches the Flask app,
which answers it as before."""
from __future__ import annotations

import json
import logging
import threading
import time

import psycopg
import pytest
from werkzeug.test import Client

from app.api.hot_batches import Batches
from app.api.hot_path import HotPath
from tests.helpers import Api, db_rows, sql, values
from tests.support.metrics import samples, value

COMPLETE_ENDPOINT = "/api/v1/projects/<project_id>/jobs/complete"


@pytest.fixture
def handed_on(app):
    """The paths of the requests the hot path handed on to the Flask app."""
    hot = app.wsgi_app
    assert isinstance(hot, HotPath), "create_app puts the hot path outermost"
    seen: list[str] = []
    full = hot.full

    def flask_app(environ, start_response):
        seen.append(environ["PATH_INFO"])
        return full(environ, start_response)
    hot.full = flask_app
    yield seen
    hot.full = full


@pytest.fixture
def worker(client, make_user, api):
    api.put_project("hp")
    assert api.enqueue("hp", values(4)).status_code == 200
    return Api(client, make_user("hp-worker", ["worker"]))


def _claim(worker: Api, n: int = 2, worker_id: str = "w1") -> list[dict]:
    response = worker.claim("hp", worker_id=worker_id, max_jobs=n)
    assert response.status_code == 200, response.json
    return response.json["jobs"]


def _through_flask(app, call):
    """``call``'s answer from the Flask app: a pushed app context keeps the
    request on the Flask app (as for tests calling in-process)."""
    with app.app_context():
        return call()


def _headers(response) -> dict:
    """All but the request id, and Flask's ``Vary: Cookie``: session
    bookkeeping (flask-login looks at the session after every request) that
    means nothing on a no-store answer to a request that sends no cookie."""
    return {name: value for name, value in response.headers.items() if name not in ("X-Request-ID", "Vary")}


def test_a_completion_is_answered_by_the_hot_path_as_flask_answers_it(app, worker, api, handed_on):
    jobs = _claim(worker)
    handed_on.clear()
    first = worker.complete("hp", jobs[:1])
    assert handed_on == [], "a plain completion never reaches the Flask app"
    assert first.status_code == 200
    assert first.json == {"results": [{"job_id": jobs[0]["job_id"], "attempt_id": jobs[0]["attempt_id"],
                                       "status": "applied", "job_status": "done",
                                       "lease_expires_at": None, "error": None}]}
    assert api.counts("hp")["done"] == 1
    # The same completion again, through the Flask app: a replay, answered
    # applied — the very bytes and headers the hot path sent.
    handed_on.clear()
    again = _through_flask(app, lambda: worker.complete("hp", jobs[:1]))
    assert handed_on == ["/api/v1/projects/hp/jobs/complete"]
    assert again.data == first.data
    assert _headers(again) == _headers(first)
    assert first.headers["Cache-Control"] == "no-store, no-cache, max-age=0"
    assert first.headers["X-Request-ID"] and first.headers["X-Request-ID"] != again.headers["X-Request-ID"]
    # A replay and a stale attempt: the statement moves neither, and the
    # hot path leaves the explaining to the Flask app.
    handed_on.clear()
    mixed = worker.complete("hp", [jobs[0], {"job_id": jobs[1]["job_id"], "attempt_id": "999999"}])
    assert handed_on == ["/api/v1/projects/hp/jobs/complete"]
    results = mixed.json["results"]
    assert [r["status"] for r in results] == ["applied", "rejected"]
    assert results[1]["error"]["code"] == "stale_attempt"
    assert api.counts("hp")["done"] == 1 and api.counts("hp")["wip"] == 1


def test_a_renewal_is_answered_by_the_hot_path_as_flask_answers_it(app, worker, handed_on):
    jobs = _claim(worker)
    handed_on.clear()
    renewed = worker.extend("hp", jobs, seconds=600)
    assert handed_on == [] and renewed.status_code == 200
    flask = _through_flask(app, lambda: worker.extend("hp", jobs, seconds=600))
    assert handed_on == ["/api/v1/projects/hp/jobs/extend-lease"]
    lease = {r["job_id"]: r["lease_expires_at"] for r in renewed.json["results"]}
    stored = {r["id"]: r["lease"] for r in db_rows(
        app, "SELECT id, floor(extract(epoch FROM lease_expires_at))::bigint AS lease FROM jobs")
        if r["id"] in lease}
    assert all(stored[job] >= lease[job] > jobs[0]["lease_expires_at"] for job in lease)
    # Same shape and bytes but for the lease times (a second may pass).
    assert [{**r, "lease_expires_at": 0} for r in renewed.json["results"]] == \
        [{**r, "lease_expires_at": 0} for r in flask.json["results"]]
    assert _headers(renewed) == _headers(flask)


def test_a_failure_report_is_answered_by_the_hot_path_unless_it_pauses_a_site(app, worker, api, handed_on):
    jobs = _claim(worker, 3)
    handed_on.clear()
    failed = worker.fail("hp", jobs[:1], retryable=False, code="gone")
    assert handed_on == [] and failed.status_code == 200
    assert failed.json["results"][0]["job_status"] == "failed"
    retried = worker.fail("hp", jobs[1:2], retryable=True, code="temporary")
    assert handed_on == [] and retried.json["results"][0]["job_status"] == "todo"
    assert _through_flask(app, lambda: worker.fail("hp", jobs[1:2], retryable=True, code="temporary")).data \
        == retried.data, "a replay through Flask: the same bytes"
    # A site's pushback pauses the site (app.sites.pushback): the Flask app's work.
    handed_on.clear()
    assert worker.fail("hp", jobs[2:], retryable=True, code="throttled").status_code == 200
    assert handed_on == ["/api/v1/projects/hp/jobs/fail"]
    assert api.counts("hp")["failed"] == 1 and api.counts("hp")["todo"] == 3


def test_everything_but_the_plain_case_reaches_flask_and_its_errors(app, worker, api, make_user, handed_on):
    jobs = _claim(worker)
    item = {"job_id": jobs[0]["job_id"], "attempt_id": jobs[0]["attempt_id"], "outcome": {"kind": "success"}}
    api.put_project("hp-pdf", kind="pdf")
    cases = {
        "a body the schema refuses": (worker, "hp", {"worker_id": "w1", "items": []}, None, 400),
        "an unknown field": (worker, "hp", {"worker_id": "w1", "items": [{**item, "x": 1}]}, None, 400),
        "broken JSON": (worker, "hp", None, b"{", 400),
        "an unknown project": (worker, "nope", {"worker_id": "w1", "items": [item]}, None, 404),
        "a client version the project does not take":
            (Api(worker.client, worker.headers["Authorization"][7:], version="old-9"), "hp",
             {"worker_id": "w1", "items": [item]}, None, 426),
        "a pdf project": (worker, "hp-pdf", {"worker_id": "w1", "items": [item]}, None, 409),
        "a user without the worker role": (Api(worker.client, make_user("hp-viewer", ["admin"])), "hp",
                                           {"worker_id": "w1", "items": [item]}, None, 403),
        "an unknown token": (Api(worker.client, "fhq_unknown"), "hp",
                             {"worker_id": "w1", "items": [item]}, None, 401),
    }
    for name, (caller, project, payload, raw, status) in cases.items():
        handed_on.clear()
        if raw is None:
            response = caller.call("POST", f"/api/v1/projects/{project}/jobs/complete", payload)
        else:
            response = caller.client.post(f"/api/v1/projects/{project}/jobs/complete", data=raw,
                                          headers={**caller.headers, "Content-Type": "application/json"})
        assert response.status_code == status, (name, response.json)
        assert set(response.json) == {"error"}, name
        assert handed_on == [f"/api/v1/projects/{project}/jobs/complete"], name
    # Nothing of the refused requests was applied.
    assert api.counts("hp")["done"] == 0 and api.counts("hp")["wip"] == 2


def test_what_changes_after_the_look_up_is_checked_by_the_write(app, worker, api, handed_on):
    """The hot path remembers a worker's look-up (token, user, project); the
    write itself checks that it still holds, and the Flask app answers when
    it does not: a change takes effect at the next request."""
    assert api.enqueue("hp", values(2, prefix="more")).status_code == 200
    jobs = _claim(worker, 6)
    changes = {
        "the worker id revoked": ("INSERT INTO token_workers (user_id, worker_id, status) "
                                  "VALUES ('hp-worker', 'w1', 'revoked') ON CONFLICT (user_id, worker_id) "
                                  "DO UPDATE SET status = 'revoked'",
                                  "UPDATE token_workers SET status = 'active' WHERE worker_id = 'w1'", 403),
        "the user suspended": ("UPDATE users SET status = 'suspended' WHERE id = 'hp-worker'",
                               "UPDATE users SET status = 'active' WHERE id = 'hp-worker'", 403),
        "the worker role taken away": ("UPDATE users SET roles = '{}' WHERE id = 'hp-worker'",
                                       "UPDATE users SET roles = '{worker}' WHERE id = 'hp-worker'", 403),
        "the client version dropped": ("UPDATE projects SET client_versions = '{other-1}' WHERE id = 'hp'",
                                       "UPDATE projects SET client_versions = '{test-1}' WHERE id = 'hp'", 426),
    }
    remembered = jobs.pop(0)
    assert worker.complete("hp", [remembered]).status_code == 200   # remembered from here on
    for name, change in changes.items():
        job = jobs.pop()
        handed_on.clear()
        sql(app, change[0])
        refused = worker.complete("hp", [job])
        assert refused.status_code == change[2], (name, refused.json)
        assert handed_on == ["/api/v1/projects/hp/jobs/complete"], name
        sql(app, change[1])
        handed_on.clear()
        assert worker.complete("hp", [job]).json["results"][0]["status"] == "applied", name
        assert handed_on == [], f"{name}: looked up again, then remembered"
    assert api.counts("hp")["done"] == 5
    # The token rotated: the remembered look-up names a token that is gone.
    last = jobs.pop()
    with app.app_context():
        from app.accounts import service as accounts
        from app.extensions import db
        accounts.rotate_token("hp-worker")
        db.session.commit()
    assert worker.complete("hp", [last]).status_code == 401
    assert api.counts("hp")["wip"] == 1


def test_a_worker_id_not_yet_mapped_to_its_user_goes_through_flask(app, worker, make_user, handed_on):
    """Flask maps it (fleet.map_worker); the hot path never writes the map."""
    jobs = _claim(worker, worker_id="w-new")
    sql(app, "DELETE FROM worker_users WHERE worker_id = 'w-new'")
    handed_on.clear()
    assert worker.complete("hp", jobs[:1], worker_id="w-new").json["results"][0]["status"] == "applied"
    assert handed_on == ["/api/v1/projects/hp/jobs/complete"]
    assert db_rows(app, "SELECT user_id FROM worker_users WHERE worker_id = 'w-new'") == [{"user_id": "hp-worker"}]
    handed_on.clear()
    assert worker.complete("hp", jobs[1:], worker_id="w-new").json["results"][0]["status"] == "applied"
    assert handed_on == []


def test_the_hot_path_stamps_the_token_and_counts_the_request(app, client, worker, handed_on):
    jobs = _claim(worker)
    app.extensions["fleethq.caches"]["tokens_touched"].clear()
    sql(app, "UPDATE machine_tokens SET last_used_at = NULL WHERE user_id = 'hp-worker'")
    labels = {"method": "POST", "endpoint": COMPLETE_ENDPOINT, "status": "200"}
    before = value(samples(client.get("/metrics").text), "fleethq_http_request_duration_seconds_count",
                   **labels) or 0
    handed_on.clear()
    for job in jobs:
        assert worker.complete("hp", [job]).status_code == 200
    assert handed_on == []
    after = value(samples(client.get("/metrics").text), "fleethq_http_request_duration_seconds_count", **labels)
    assert after - before == 2
    stamped = db_rows(app, "SELECT last_used_at FROM machine_tokens WHERE user_id = 'hp-worker'")
    assert stamped[0]["last_used_at"] is not None


def test_the_access_log_has_the_hot_paths_requests(app, worker, caplog):
    jobs = _claim(worker)
    hot = HotPath(app, app.wsgi_app.full)
    hot._access_log = True   # as ACCESS_LOG=true makes it at start
    caplog.set_level(logging.INFO, logger="fleethq.access")
    response = Client(hot).post("/api/v1/projects/hp/jobs/complete", headers={**worker.headers,
                                "X-Request-ID": "req-hot-1"}, data=json.dumps(
        {"worker_id": "w1", "items": [{"job_id": jobs[0]["job_id"], "attempt_id": jobs[0]["attempt_id"],
                                       "outcome": {"kind": "success"}}]}), content_type="application/json")
    assert response.status_code == 200 and response.headers["X-Request-ID"] == "req-hot-1"
    lines = [r for r in caplog.records if r.name == "fleethq.access"]
    assert len(lines) == 1 and lines[0].status == 200 and lines[0].duration_ms >= 0


def test_a_connection_back_in_the_pool_in_autocommit_serves_the_next_request_transactionally(app):
    """Whatever put a pooled connection in autocommit (the hot path and the
    completion route do on purpose, and restore it), the next request's
    session runs in a transaction: a SAVEPOINT works and a rollback undoes
    its statements. (Once seen under load: a skipped OCR attempt committed
    half-way, "SAVEPOINT can only be used in transaction blocks".)"""
    from sqlalchemy import text

    from app.extensions import FLEET_BIND, db, use_fleet_pool
    with app.app_context():
        engine = db.engines[FLEET_BIND]
        # Every idle one (the hot path keeps a few of its own checked out).
        leaked = [engine.raw_connection() for _ in range(max(1, engine.pool.checkedin()))]
        for pooled in leaked:
            pooled.driver_connection.autocommit = True
            pooled.close()
    with app.test_request_context("/api/v1/fleet/attempts/1/skip", method="POST"):
        use_fleet_pool()
        db.session.execute(text("CREATE TEMP TABLE IF NOT EXISTS leak_probe (n int)"))
        with db.session.begin_nested():   # SAVEPOINT: refused outside a transaction
            db.session.execute(text("INSERT INTO leak_probe VALUES (1)"))
        assert db.session.connection().connection.driver_connection.autocommit is False
        db.session.rollback()
        db.session.execute(text("CREATE TEMP TABLE IF NOT EXISTS leak_probe (n int)"))
        assert db.session.execute(text("SELECT count(*) FROM leak_probe")).scalar() == 0
        db.session.remove()


def _behind_a_held_completion(app, worker: Api, database_url: str, held: dict,
                              later: list[tuple[dict, str]]) -> tuple[object, list]:
    """The Go SDK's rhythm: one request per job, several at once. The
    completion of ``held`` is held in its statement (another transaction
    locks its job) while the ``later`` completions ((job, outcome kind)
    each) arrive and wait; then it is let go. All the answers."""
    token = worker.headers["Authorization"].removeprefix("Bearer ")
    line = app.wsgi_app._batches["complete"]
    assert isinstance(line, Batches)
    answers: dict[int, object] = {}

    def complete(index: int, job: dict, kind: str) -> None:
        answers[index] = Api(app.test_client(), token).complete("hp", [job], kind=kind)
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (held["job_id"],))
        first = threading.Thread(target=complete, args=(-1, held, "success"))
        first.start()
        deadline = time.monotonic() + 10
        while not holder.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                 "AND datname = current_database()").fetchone()[0]:
            assert time.monotonic() < deadline, "the first completion never reached the locked job"
            time.sleep(0.01)
        threads = [threading.Thread(target=complete, args=(i, job, kind)) for i, (job, kind) in enumerate(later)]
        for thread in threads:
            thread.start()
        while sum(len(waiting.waiting) for waiting in line._lines.values()) < len(later):
            assert time.monotonic() < deadline, "the later completions did not wait for the first"
            time.sleep(0.01)
        holder.rollback()
    for thread in [first, *threads]:
        thread.join(10)
    return answers[-1], [answers[i] for i in range(len(later))]


def _statements_of(client, bound: str) -> float:
    parsed = samples(client.get("/metrics").text)
    return value(parsed, "fleethq_hot_path_requests_per_statement_bucket", route="complete", le=bound) or 0


def test_completions_arriving_while_the_workers_statement_runs_share_the_next_one(
        app, client, worker, api, database_url, handed_on):
    """The four completions that arrive while the first one's statement runs
    go in one statement, each answered its own."""
    api.enqueue("hp", values(2, prefix="more"))
    jobs = _claim(worker, 5)
    before = {bound: _statements_of(client, bound) for bound in ("1.0", "2.0", "4.0")}
    handed_on.clear()
    first, later = _behind_a_held_completion(app, worker, database_url, jobs[0],
                                             [(job, "success") for job in jobs[1:]])
    assert handed_on == [], "all five were answered by the hot path"
    for job, answer in zip(jobs, [first, *later]):
        assert answer.status_code == 200
        assert answer.json == {"results": [{"job_id": job["job_id"], "attempt_id": job["attempt_id"],
                                            "status": "applied", "job_status": "done",
                                            "lease_expires_at": None, "error": None}]}
    assert api.counts("hp")["done"] == 5
    after = {bound: _statements_of(client, bound) for bound in ("1.0", "2.0", "4.0")}
    assert after["1.0"] - before["1.0"] == 1, "the first ran alone"
    assert (after["4.0"] - before["4.0"]) - (after["2.0"] - before["2.0"]) == 1, "the other four ran together"


def test_two_waiting_requests_naming_one_item_differently_are_answered_in_turn(
        app, worker, api, database_url, handed_on):
    """One statement would apply the first outcome and call both applied:
    the Flask app answers them one after the other, as if they had not met."""
    jobs = _claim(worker, 2)
    handed_on.clear()
    _, later = _behind_a_held_completion(app, worker, database_url, jobs[0],
                                         [(jobs[1], "success"), (jobs[1], "skipped")])
    assert sorted(handed_on) == ["/api/v1/projects/hp/jobs/complete"] * 2
    results = sorted((answer.json["results"][0] for answer in later), key=lambda r: r["status"])
    assert [r["status"] for r in results] == ["applied", "rejected"], results
    assert results[1]["error"]["code"] == "stale_attempt"
    assert results[1]["error"]["message"] == "attempt already done"
