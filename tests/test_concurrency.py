"""Many workers at once (DESIGN §4.1): every job is handed to one live attempt
at a time, finishes exactly once, and a report racing its own lease expiry is
decided exactly one way."""
from __future__ import annotations

import random
import threading
import time
from collections import Counter

import requests

from tests.helpers import Api, sql, values
from tests.support.jobs import run_threads

ALL_ZERO = {"todo": 0, "wip": 0, "staged": 0, "done": 0, "failed": 0, "reset_exhausted": 0}


def real_counts(app, project: str) -> dict:
    counts = dict(ALL_ZERO)
    for state, n in sql(app, "SELECT state, count(*) FROM jobs WHERE project_id = :p GROUP BY state",
                        p=project):
        counts[state] = n
    return counts


def session_api(live_server, token: str) -> Api:
    return Api(requests.Session(), token, base=live_server.url)


def test_eight_workers_drain_ten_thousand_jobs_exactly_once(app, live_server, admin_token):
    total, workers = 10_000, 8
    admin = session_api(live_server, admin_token)
    admin.put_project("big")
    for start in range(0, total, 1000):
        batch = [{"id": f"j{i}", "value": f"https://example.org/{i}"} for i in range(start, start + 1000)]
        response = admin.enqueue("big", batch)
        assert response.status_code == 200, response.text
        assert response.json()["inserted"] == 1000
    assert admin.counts("big") == {**ALL_ZERO, "todo": total}

    claims: dict[str, list[tuple[str, str]]] = {f"w{i}": [] for i in range(workers)}
    applied = Counter()

    def worker(worker_id):
        def run():
            api = session_api(live_server, admin_token)
            while True:
                response = api.claim("big", worker_id=worker_id, max_jobs=64, lease_seconds=300)
                assert response.status_code == 200, response.text
                jobs = response.json()["jobs"]
                if not jobs:
                    return
                assert len(jobs) <= 64
                claims[worker_id].extend((j["job_id"], j["attempt_id"]) for j in jobs)
                response = api.complete("big", jobs, worker_id=worker_id)
                assert response.status_code == 200, response.text
                out = response.json()["results"]
                assert [(r["job_id"], r["attempt_id"]) for r in out] == \
                    [(j["job_id"], j["attempt_id"]) for j in jobs]
                for r in out:
                    assert r["status"] == "applied", r
                    assert r["job_status"] == "done"
                applied[worker_id] += len(out)
        return run

    run_threads([worker(w) for w in claims])

    assert sum(applied.values()) == total
    pairs = [pair for got in claims.values() for pair in got]
    assert len(pairs) == total
    owner_of: dict[str, str] = {}
    for worker_id, got in claims.items():
        for job_id, _ in got:
            assert job_id not in owner_of, f"job {job_id} claimed by {owner_of[job_id]} and {worker_id}"
            owner_of[job_id] = worker_id
    assert len(owner_of) == total
    assert len({attempt for _, attempt in pairs}) == total
    # Several workers really took part.
    assert sum(1 for got in claims.values() if got) >= 2

    assert sql(app, "SELECT count(*) FROM attempts")[0][0] == total
    assert sql(app, "SELECT count(*) FROM attempts WHERE state = 'done'")[0][0] == total
    db_pairs = {(j, str(a)) for j, a in sql(
        app, "SELECT id, current_attempt_id FROM jobs WHERE project_id = 'big'")}
    assert db_pairs == set(pairs)
    db_workers = dict(sql(app, "SELECT id, worker_id FROM jobs WHERE project_id = 'big'"))
    assert db_workers == owner_of
    expected = {**ALL_ZERO, "done": total}
    assert admin.counts("big") == expected
    assert real_counts(app, "big") == expected


def test_complete_racing_lease_expiry_is_decided_exactly_one_way(app, live_server, admin_token):
    """Each job's lease runs out at its own instant (25 ms apart); the owner
    reports success around that instant while another thread sweeps and a second
    worker claims, both as fast as they can. Every job ends up either done by its
    first attempt, or with that attempt expired and the job back in the queue."""
    n, step = 160, 0.025
    admin = session_api(live_server, admin_token)
    admin.put_project("race", max_resets=5)
    assert admin.enqueue("race", values(n)).status_code == 200

    owned = []
    while len(owned) < n:
        response = admin.claim("race", worker_id="owner", max_jobs=256, lease_seconds=60)
        assert response.status_code == 200, response.text
        owned.extend(response.json()["jobs"])
    assert len(owned) == n
    owned.sort(key=lambda j: int(j["job_id"]))

    # Stagger the expiries: job k expires at t0 + 1 s + 25 ms * k (job row and attempt alike).
    t0 = time.time()
    rows = sql(app, """
        WITH base AS (SELECT now() + interval '1 second' AS at),
        ranked AS (SELECT id, row_number() OVER (ORDER BY id) - 1 AS k FROM jobs WHERE project_id = 'race'),
        upd AS (
            UPDATE jobs j SET lease_expires_at = base.at + make_interval(secs => ranked.k * :step)
            FROM ranked, base WHERE j.id = ranked.id
            RETURNING j.id, j.current_attempt_id, j.lease_expires_at)
        UPDATE attempts a SET lease_expires_at = upd.lease_expires_at FROM upd
        WHERE a.id = upd.current_attempt_id
        RETURNING upd.id, extract(epoch FROM upd.lease_expires_at)""", step=step)
    expiry = {job_id: float(at) for job_id, at in rows}
    assert len(expiry) == n

    outcome: dict[str, dict] = {}
    timing: dict[str, tuple[float, float]] = {}
    stolen: list[tuple[str, str]] = []
    stop = threading.Event()
    rng = random.Random(1234)

    def completer():
        api = session_api(live_server, admin_token)
        # Most reports are aimed within ±20 ms of the expiry; a few clearly
        # before or after it, so both outcomes must occur.
        plan = []
        for k, job in enumerate(owned):
            offset = -0.4 if k % 20 == 0 else 0.4 if k % 20 == 10 else rng.uniform(-0.02, 0.02)
            plan.append((expiry[job["job_id"]] + offset, job))
        plan.sort(key=lambda p: p[0])
        try:
            for target, job in plan:
                delay = target - time.time()
                if delay > 0:
                    time.sleep(delay)
                sent = time.time()
                response = api.complete("race", [job], worker_id="owner")
                received = time.time()
                assert response.status_code == 200, response.text
                [result] = response.json()["results"]
                outcome[job["job_id"]] = result
                timing[job["job_id"]] = (sent, received)
        finally:
            stop.set()

    def sweeper():
        from app.extensions import db
        from app.projects import leasing
        with app.app_context():
            try:
                while not stop.is_set():
                    leasing.sweep()
            finally:
                db.session.remove()

    def thief():
        api = session_api(live_server, admin_token)
        while not stop.is_set():
            response = api.claim("race", worker_id="thief", max_jobs=16, lease_seconds=600)
            assert response.status_code == 200, response.text
            stolen.extend((j["job_id"], j["attempt_id"]) for j in response.json()["jobs"])

    run_threads([completer, sweeper, thief])
    assert time.time() - t0 < 120
    # Whatever lease ran out after the last sweep is reaped now.
    from app.extensions import db
    from app.projects import leasing
    with app.app_context():
        leasing.sweep()
        db.session.remove()

    assert set(outcome) == {j["job_id"] for j in owned}
    won = {job_id for job_id, r in outcome.items() if r["status"] == "applied"}
    lost = {job_id for job_id, r in outcome.items() if r["status"] == "rejected"}
    assert won | lost == set(outcome) and not won & lost
    for job_id in lost:
        assert outcome[job_id]["error"]["code"] == "stale_attempt"
    assert won and lost, (len(won), len(lost))
    # A report answered before its lease ran out must have won; one sent after
    # the lease ran out must have lost (same host, same clock; 10 ms slack).
    for job_id, (sent, received) in timing.items():
        if received < expiry[job_id] - 0.01:
            assert job_id in won, (job_id, outcome[job_id])
        elif sent > expiry[job_id] + 0.01:
            assert job_id in lost, (job_id, outcome[job_id])

    stolen_jobs = Counter(job_id for job_id, _ in stolen)
    assert all(c == 1 for c in stolen_jobs.values()), "a job was handed to the thief twice"
    assert not set(stolen_jobs) & won, "a job completed by its owner was handed out again"

    first_attempt = {j["job_id"]: j["attempt_id"] for j in owned}
    state = {r[0]: r for r in sql(app, """
        SELECT id, state, resets, current_attempt_id::text, worker_id FROM jobs WHERE project_id = 'race'""")}
    attempts: dict[int, list[tuple[str, str]]] = {}
    for job_id, attempt_id, attempt_state in sql(
            app, "SELECT job_id, id::text, state FROM attempts ORDER BY attempts.id"):
        attempts.setdefault(job_id, []).append((attempt_id, attempt_state))

    for job_id in won:
        _, job_state, resets, current, _ = state[job_id]
        assert (job_state, resets, current) == ("done", 0, first_attempt[job_id]), job_id
        assert attempts[job_id] == [(first_attempt[job_id], "done")], job_id
    for job_id in lost:
        _, job_state, resets, current, worker = state[job_id]
        assert attempts[job_id][0] == (first_attempt[job_id], "expired"), (job_id, attempts[job_id])
        assert resets == 1, job_id
        if job_id in stolen_jobs:
            assert (job_state, worker) == ("wip", "thief"), job_id
            assert [s for _, s in attempts[job_id]] == ["expired", "running"], job_id
            assert current == attempts[job_id][1][0]
        else:
            assert job_state == "todo", job_id
            assert len(attempts[job_id]) == 1, job_id

    counts = admin.counts("race")
    assert counts == real_counts(app, "race")
    assert sum(counts.values()) == n
    assert counts["done"] == len(won)
    assert counts["todo"] + counts["wip"] == len(lost)
    assert counts["wip"] == len(stolen_jobs)
    totals = dict(sql(app, "SELECT state, count(*) FROM attempts GROUP BY state"))
    assert totals.get("done", 0) == len(won)
    assert totals.get("expired", 0) == len(lost)
