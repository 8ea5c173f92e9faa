"""Retention (app/ops/retention.py): finished rows pruned by the clock in
bounded batches, what must survive, the settings, the dashboard and /metrics."""
from __future__ import annotations

import re

import pytest

from app import config as app_config
from app.ops import retention
from tests.helpers import body, sql, values
from tests.support.pages import sign_in
from tests.support.metrics import samples


@pytest.fixture
def settings(app, monkeypatch):
    """Change retention settings for one test."""
    def set_(**values_):
        for key, value in values_.items():
            monkeypatch.setitem(app.config, key, value)
    set_(KEEP_ATTEMPTS_PER_JOB=20, KEEP_DONE_OUTBOX_DAYS=14, KEEP_FINISHED_JOBS_DAYS=0,
         PRUNE_BATCH=5000)
    return set_


def tick(app) -> dict:
    """One run of the prune actor's work, as the clock triggers it."""
    from app.extensions import db
    with app.app_context():
        pruned = retention.run(app.config)
        db.session.remove()
    return pruned


def one(app, statement: str, **params):
    return sql(app, statement, **params)[0][0]


def job_with_attempts(app, api, project: str, states: list[str], *, job_state="wip",
                      current="last") -> tuple[int, list[int]]:
    """One enqueued job given attempts in these states (oldest first), finished
    ``i`` hours ago for the i-th newest; the newest is the current attempt."""
    ext = f"j{one(app, 'SELECT count(*) FROM jobs')}"
    assert api.enqueue(project, [{"id": ext, "value": f"https://example.org/{ext}"}]).status_code == 200
    job_id = one(app, "SELECT id FROM jobs WHERE project_id = :p AND ext_id = :e", p=project, e=ext)
    ids = []
    for age, state in zip(range(len(states), 0, -1), states):
        ids.append(one(app, """
            INSERT INTO attempts (job_id, project_id, worker_id, state, created_at, lease_expires_at,
                                  finished_at)
            VALUES (:j, :p, 'w1', :s, now() - make_interval(hours => :h),
                    now() - make_interval(hours => :h) + interval '60 s',
                    CASE WHEN :s NOT IN ('running', 'uploading', 'staged')
                         THEN now() - make_interval(hours => :h) + interval '10 s' END)
            RETURNING id""", j=job_id, p=project, s=state, h=age))
    sql(app, "UPDATE jobs SET state = :s, attempts_count = :n, current_attempt_id = :c WHERE id = :j",
        s=job_state, n=len(ids), c=ids[-1] if current == "last" else current, j=job_id)
    return job_id, ids


def attempt_ids(app, job_id: int) -> list[int]:
    return [r[0] for r in sql(app, "SELECT id FROM attempts WHERE job_id = :j ORDER BY id", j=job_id)]


def add_upload(app, attempt_id: int, job_id: int, state: str, reserved: int = 0) -> None:
    sql(app, "INSERT INTO uploads (attempt_id, job_id, project_id, worker_id, state, sha256, size, "
             "reserved_bytes) VALUES (:a, :j, 'p', 'w1', :s, :h, 10, :r)",
        a=attempt_id, j=job_id, s=state, h="0" * 64, r=reserved)


# ------------------------------------------------------------------ attempts


def test_attempts_beyond_the_newest_n_per_job_are_pruned_and_not_before(app, api, settings):
    settings(KEEP_ATTEMPTS_PER_JOB=3)
    api.put_project("p")
    many, many_ids = job_with_attempts(app, api, "p", ["failed"] * 6 + ["running"])
    few, few_ids = job_with_attempts(app, api, "p", ["expired", "failed", "running"])
    assert tick(app)["attempts"] == 4
    assert attempt_ids(app, many) == many_ids[-3:]
    assert attempt_ids(app, few) == few_ids  # three is the limit, not beyond it
    assert tick(app)["attempts"] == 0
    # The job's own counters and state are untouched: only history went.
    assert sql(app, "SELECT state, attempts_count FROM jobs WHERE id = :j", j=many) == [("wip", 7)]


def test_each_workers_newest_attempt_survives_so_the_worker_cap_remembers(app, api, settings):
    """max_worker_attempts and prefer_new_worker count the distinct workers
    that tried a job: pruning keeps the newest attempt of each of them."""
    settings(KEEP_ATTEMPTS_PER_JOB=1)
    api.put_project("p")
    job, ids = job_with_attempts(app, api, "p", ["failed", "failed", "expired", "running"])
    sql(app, "UPDATE attempts SET worker_id = 'w0' WHERE id = :a", a=ids[0])
    assert tick(app)["attempts"] == 2  # w1's older ones; w0's only attempt stays
    assert attempt_ids(app, job) == [ids[0], ids[3]]
    assert one(app, "SELECT count(DISTINCT worker_id) FROM attempts WHERE job_id = :j", j=job) == 2


def test_retried_attempts_through_the_api_keep_the_newest_and_the_current(app, api, client,
                                                                          settings):
    settings(KEEP_ATTEMPTS_PER_JOB=2)
    api.put_project("p", max_resets=10)
    api.enqueue("p", values(1))
    for _ in range(4):
        job = body(api.claim("p", max_jobs=1))["jobs"][0]
        assert api.fail("p", [job], retryable=True).status_code == 200
        sql(app, "UPDATE jobs SET not_before = now()")  # skip the retry backoff
    current = body(api.claim("p", max_jobs=1))["jobs"][0]
    assert tick(app)["attempts"] == 3
    sign_in(app, client)
    page = client.get(f"/admin/jobs/{current['job_id']}").get_data(as_text=True)
    assert "3 older finished attempts pruned by retention" in page
    rows = sql(app, "SELECT id::text, state FROM attempts ORDER BY id")
    assert [state for _, state in rows] == ["failed", "running"]
    assert rows[-1][0] == current["attempt_id"]
    assert api.complete("p", [current]).status_code == 200  # the worker is not disturbed
    assert api.counts("p")["done"] == 1


def test_the_current_done_and_receipt_bearing_attempts_survive(app, api, settings):
    settings(KEEP_ATTEMPTS_PER_JOB=1)
    api.put_project("p")
    # The current attempt is the oldest here (an admin view of a job whose
    # newer attempts ended after it was made current cannot lose it).
    job, ids = job_with_attempts(app, api, "p", ["done", "failed", "expired", "failed", "cancelled",
                                                 "failed", "running"], current=None)
    current = ids[1]
    sql(app, "UPDATE jobs SET current_attempt_id = :c WHERE id = :j", c=current, j=job)
    add_upload(app, ids[2], job, "held")           # kept for investigation
    add_upload(app, ids[3], job, "failed")         # a failed upload's receipt goes with it
    add_upload(app, ids[4], job, "expired", 4096)  # still holds spool quota
    assert tick(app)["attempts"] == 2
    assert attempt_ids(app, job) == [ids[0], ids[1], ids[2], ids[4], ids[6]]
    assert sql(app, "SELECT attempt_id FROM uploads ORDER BY attempt_id") == [(ids[2],), (ids[4],)]


def test_a_done_jobs_artifact_receipts_survive(app, api, client, admin_token, settings):
    settings(KEEP_ATTEMPTS_PER_JOB=1)
    api.put_project("p", max_resets=10)
    api.enqueue("p", values(1))
    for _ in range(3):
        job = body(api.claim("p", max_jobs=1))["jobs"][0]
        api.fail("p", [job], retryable=True)
        sql(app, "UPDATE jobs SET not_before = now()")
    job = body(api.claim("p", max_jobs=1))["jobs"][0]
    receipt = {"id": "r1", "issuer": "archive", "object_id": "obj/1",
               "checksum": "sha256:" + "a" * 64, "size_bytes": 10, "accepted_at": 1_700_000_000}
    assert api.call("POST", "/api/v1/projects/p/jobs/complete", {"worker_id": "w1", "items": [{
        "job_id": job["job_id"], "attempt_id": job["attempt_id"], "outcome": {"kind": "success"},
        "artifact_receipts": [receipt]}]}).status_code == 200
    assert tick(app)["attempts"] == 3
    detail = body(api.call("GET", f"/api/v1/admin/projects/p/jobs/{job['job_id']}"))
    assert detail["status"] == "done" and detail["artifact_receipts"] == [receipt]
    full = body(api.call("GET", f"/api/v1/fleethq/projects/p/jobs/{job['job_id']}"))
    assert [a["state"] for a in full["attempt_history"]] == ["done"]


def test_attempt_batches_are_bounded_and_the_rest_waits_for_the_next_tick(app, api, settings):
    settings(KEEP_ATTEMPTS_PER_JOB=1, PRUNE_BATCH=4)
    api.put_project("p")
    jobs = [job_with_attempts(app, api, "p", ["failed"] * 4)[0] for _ in range(3)]
    assert tick(app)["attempts"] == 4
    assert one(app, "SELECT count(*) FROM attempts") == 12 - 4
    assert tick(app)["attempts"] == 4
    assert tick(app)["attempts"] == 1
    assert tick(app)["attempts"] == 0
    assert [len(attempt_ids(app, j)) for j in jobs] == [1, 1, 1]


def test_attempt_scan_walks_job_ids_in_ranges_and_wraps(app, api, settings, monkeypatch):
    settings(KEEP_ATTEMPTS_PER_JOB=1)
    monkeypatch.setattr(retention, "ATTEMPT_SCAN_JOB_IDS", 2)
    api.put_project("p")
    jobs = [job_with_attempts(app, api, "p", ["failed", "failed"])[0] for _ in range(5)]
    assert [tick(app)["attempts"] for _ in range(3)] == [2, 2, 1]  # jobs 1-2, 3-4, 5
    assert one(app, "SELECT scan_cursor FROM retention_stats WHERE kind = 'attempts'") == 0
    more, _ = job_with_attempts(app, api, "p", ["failed", "failed"])
    assert [tick(app)["attempts"] for _ in range(4)] == [0, 0, 1, 0]
    assert [len(attempt_ids(app, j)) for j in jobs + [more]] == [1] * 6


# ------------------------------------------------------- outbox and hooks


def _outbox(app, topic: str, ref: int, done_days_ago: float | None) -> None:
    sql(app, "INSERT INTO outbox (topic, ref, done_at) VALUES (:t, :r, "
             "CASE WHEN CAST(:d AS float) IS NULL THEN NULL "
             "ELSE now() - make_interval(secs => CAST(:d AS float) * 86400) END)",
        t=topic, r=ref, d=done_days_ago)


def test_done_outbox_rows_are_pruned_after_their_days_and_pending_ones_never(app, settings):
    settings(KEEP_DONE_OUTBOX_DAYS=14)
    _outbox(app, "archive_commit", 1, 15)
    _outbox(app, "hook_delivery", 2, 20)
    _outbox(app, "archive_commit", 3, 13.9)   # not yet
    _outbox(app, "archive_commit", 4, None)   # pending
    sql(app, "UPDATE outbox SET created_at = now() - interval '60 days'")  # old but pending
    assert tick(app)["outbox"] == 2
    assert sql(app, "SELECT ref FROM outbox ORDER BY ref") == [(3,), (4,)]


def test_outbox_batches_are_bounded(app, settings):
    settings(KEEP_DONE_OUTBOX_DAYS=1, PRUNE_BATCH=3)
    for ref in range(7):
        _outbox(app, "archive_commit", ref, 2)
    assert [tick(app)["outbox"] for _ in range(4)] == [3, 3, 1, 0]


def _delivery(app, attempt_id: int, state: str, days_ago: float) -> None:
    sql(app, "INSERT INTO hook_deliveries (consumer_id, project_id, attempt_id, asset_key, state, "
             "updated_at) VALUES ((SELECT id FROM hook_consumers LIMIT 1), 'p', :a, 'k', :s, "
             "now() - make_interval(secs => :d * 86400))", a=attempt_id, s=state, d=days_ago)


def test_only_delivered_hook_deliveries_are_pruned(app, api, settings):
    settings(KEEP_DONE_OUTBOX_DAYS=14)
    api.put_project("p")
    sql(app, "INSERT INTO hook_consumers (project_id, name, url, secret) "
             "VALUES ('p', 'c', 'http://127.0.0.1:9/', 's')")
    _delivery(app, 1, "delivered", 15)
    _delivery(app, 2, "delivered", 10)          # not yet
    _delivery(app, 3, "pending", 30)            # never: still to be sent
    _delivery(app, 4, "awaiting_callback", 30)  # never: the consumer has not confirmed
    _delivery(app, 5, "failed", 30)             # kept for the failures list and a retry
    _delivery(app, 6, "skipped", 30)            # owed to the consumer if it is re-enabled
    assert tick(app)["hook_deliveries"] == 1
    assert sql(app, "SELECT attempt_id FROM hook_deliveries ORDER BY attempt_id") == [
        (2,), (3,), (4,), (5,), (6,)]


def test_zero_days_keeps_outbox_and_deliveries_forever(app, settings):
    settings(KEEP_DONE_OUTBOX_DAYS=0)
    _outbox(app, "archive_commit", 1, 400)
    assert tick(app)["outbox"] == 0 and one(app, "SELECT count(*) FROM outbox") == 1


# ------------------------------------------------ sessions and rate limits


def test_expired_sessions_and_rate_limit_windows_are_pruned(app, settings):
    from app.extensions import db
    from app.pages import sessions
    settings(PRUNE_BATCH=2)
    sql(app, "INSERT INTO users (id) VALUES ('u')")
    with app.app_context():
        live = sessions.start("u", 3600)
        db.session.remove()
    sql(app, "INSERT INTO page_sessions (id_hash, user_id, expires_at) "
             "SELECT 'old' || i, 'u', now() - interval '1 second' FROM generate_series(1, 3) i")
    sql(app, "INSERT INTO rate_limits (key, window_end, hits) VALUES "
             "('login:a', now() - interval '1 s', 3), ('login:b', now() + interval '60 s', 1)")
    first = tick(app)
    assert (first["page_sessions"], first["rate_limits"]) == (2, 1)
    assert tick(app)["page_sessions"] == 1
    assert one(app, "SELECT count(*) FROM page_sessions") == 1
    with app.app_context():
        assert sessions.load(live).id == "u"  # the open session still signs its user in
        db.session.remove()
    assert sql(app, "SELECT key FROM rate_limits") == [("login:b",)]


# --------------------------------------------------------- finished jobs


def test_finished_jobs_are_kept_forever_by_default(app, api, settings):
    api.put_project("p")
    api.enqueue("p", values(2))
    sql(app, "UPDATE jobs SET state = 'done', updated_at = now() - interval '3650 days'")
    assert tick(app)["jobs"] == 0 and one(app, "SELECT count(*) FROM jobs") == 2


def test_finished_jobs_are_pruned_after_their_days_and_re_enqueue_creates_a_new_job(
        app, api, settings):
    settings(KEEP_FINISHED_JOBS_DAYS=30, PRUNE_BATCH=2)
    api.put_project("p")
    api.enqueue("p", values(6))
    ids = [r[0] for r in sql(app, "SELECT id FROM jobs ORDER BY id")]
    job, attempts = job_with_attempts(app, api, "p", ["failed", "done"], job_state="done")
    sql(app, "UPDATE jobs SET state = 'done' WHERE id = ANY(:ids[1:2])", ids=ids)
    sql(app, "UPDATE jobs SET state = 'failed' WHERE id = :j", j=ids[2])
    sql(app, "UPDATE jobs SET state = 'reset_exhausted' WHERE id = :j", j=ids[3])
    sql(app, "UPDATE jobs SET updated_at = now() - interval '31 days' WHERE state <> 'todo' "
             "OR id = :todo", todo=ids[5])
    sql(app, "UPDATE jobs SET state = 'done', updated_at = now() - interval '29 days' WHERE id = :j",
        j=ids[4])
    add_upload(app, attempts[1], job, "done")
    assert api.counts("p")["done"] == 4
    assert body(api.enqueue("p", values(1)))["inserted"] == 0  # a duplicate while the job is kept
    assert [tick(app)["jobs"] for _ in range(3)] == [2, 2, 1]
    left = sql(app, "SELECT id, state FROM jobs ORDER BY id")
    assert left == [(ids[4], "done"), (ids[5], "todo")]  # too recent, and not finished
    assert one(app, "SELECT count(*) FROM attempts") == 0    # cascaded with their jobs
    assert one(app, "SELECT count(*) FROM uploads") == 0     # receipts of pruned jobs
    assert api.counts("p")["done"] == 1 and api.counts("p")["failed"] == 0
    # The identity is forgotten: the same external id is a new job.
    again = body(api.enqueue("p", values(1)))
    assert again["inserted"] == 1 and one(app, "SELECT count(*) FROM jobs WHERE ext_id = 'v0'") == 1


def test_a_job_whose_upload_a_delivery_still_needs_is_kept(app, api, settings):
    settings(KEEP_FINISHED_JOBS_DAYS=1)
    api.put_project("p")
    sql(app, "INSERT INTO hook_consumers (project_id, name, url, secret) "
             "VALUES ('p', 'c', 'http://127.0.0.1:9/', 's')")
    pending, (a1,) = job_with_attempts(app, api, "p", ["done"], job_state="done")
    delivered, (a2,) = job_with_attempts(app, api, "p", ["done"], job_state="done")
    for job, attempt, state in ((pending, a1, "awaiting_callback"), (delivered, a2, "delivered")):
        add_upload(app, attempt, job, "done")
        _delivery(app, attempt, state, 0)
    sql(app, "UPDATE jobs SET updated_at = now() - interval '2 days'")
    assert tick(app)["jobs"] == 1
    assert sql(app, "SELECT id FROM jobs") == [(pending,)]


# ------------------------------------------- statistics, dashboard, metrics


def test_runs_are_recorded_and_shown_on_the_dashboard_and_in_metrics(app, api, client, settings):
    settings(KEEP_ATTEMPTS_PER_JOB=1)
    api.put_project("p")
    job_with_attempts(app, api, "p", ["failed"] * 5)
    job_with_attempts(app, api, "p", ["failed"] * 3)
    assert tick(app)["attempts"] == 6
    sql(app, "INSERT INTO rate_limits (key, window_end, hits) VALUES ('x', now() - interval '1 s', 1)")
    tick(app)
    stats = {k: (t, last) for k, t, last in sql(
        app, "SELECT kind, pruned_total, last_pruned FROM retention_stats")}
    assert stats["attempts"] == (6, 0) and stats["rate_limits"] == (1, 1)
    sql(app, "ANALYZE attempts")
    sign_in(app, client)
    page = client.get("/admin").get_data(as_text=True)
    section = re.search(r'<section class="card" id="retention">.*?</section>', page, re.S).group(0)
    row = re.search(r"<th>attempts</th>.*?</tr>", section, re.S).group(0)
    assert "beyond the newest 1 per job" in row
    assert re.findall(r'<td class="num">([^<]*)</td>', row) == ["≈2", "0", "6"]
    assert "ago" in row
    jobs_row = re.search(r"<th>jobs</th>.*?</tr>", section, re.S).group(0)
    assert "kept forever" in jobs_row
    parsed = {(name, tuple(sorted(labels.items()))): value
              for name, labels, value in samples(client.get("/metrics").get_data(as_text=True))}
    assert parsed[("fleethq_pruned_rows_total", (("kind", "attempts"),))] == 6
    assert parsed[("fleethq_pruned_rows_total", (("kind", "rate_limits"),))] == 1
    assert parsed[("fleethq_pruned_rows_total", (("kind", "jobs"),))] == 0
    assert parsed[("fleethq_table_rows", (("table", "attempts"),))] == 2


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize("key, raw, message", [
    ("KEEP_ATTEMPTS_PER_JOB", "-1", "KEEP_ATTEMPTS_PER_JOB must be an integer 0..1000000, not -1"),
    ("KEEP_ATTEMPTS_PER_JOB", "many", "KEEP_ATTEMPTS_PER_JOB must be an integer 0..1000000, not 'many'"),
    ("KEEP_DONE_OUTBOX_DAYS", "1.5", "KEEP_DONE_OUTBOX_DAYS must be an integer 0..100000, not 1.5"),
    ("KEEP_FINISHED_JOBS_DAYS", "true", "KEEP_FINISHED_JOBS_DAYS must be an integer 0..100000, not True"),
    ("PRUNE_BATCH", "0", "PRUNE_BATCH must be an integer 1..100000, not 0"),
    ("PRUNE_BATCH", "1000000", "PRUNE_BATCH must be an integer 1..100000, not 1000000"),
])
def test_bad_retention_settings_are_refused_with_a_clear_message(monkeypatch, key, raw, message):
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/unused")
    monkeypatch.setenv(f"FLEETHQ_{key}", raw)
    with pytest.raises(ValueError) as excinfo:
        app_config.load()
    assert str(excinfo.value) == message


def test_retention_settings_defaults_and_environment(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/unused")
    cfg = app_config.load()
    assert (cfg["KEEP_ATTEMPTS_PER_JOB"], cfg["KEEP_DONE_OUTBOX_DAYS"],
            cfg["KEEP_FINISHED_JOBS_DAYS"], cfg["PRUNE_BATCH"]) == (20, 14, 0, 5000)
    monkeypatch.setenv("FLEETHQ_KEEP_FINISHED_JOBS_DAYS", "365")
    monkeypatch.setenv("FLEETHQ_KEEP_ATTEMPTS_PER_JOB", "0")
    cfg = app_config.load()
    assert (cfg["KEEP_FINISHED_JOBS_DAYS"], cfg["KEEP_ATTEMPTS_PER_JOB"]) == (365, 0)


def test_claim_bucket_prunes_are_counted_with_the_others(app, api, client, settings):
    from tasks import actors
    api.put_project("p")
    sql(app, "INSERT INTO worker_claim_buckets (project_id, worker_id, bucket_started_at) VALUES "
             "('p', 'w1', now() - interval '31 days'), ('p', 'w1', now())")
    with app.app_context():
        actors.prune_claim_buckets.fn()
    assert sql(app, "SELECT pruned_total, last_pruned FROM retention_stats "
                    "WHERE kind = 'worker_claim_buckets'") == [(1, 1)]
    assert one(app, "SELECT count(*) FROM worker_claim_buckets") == 1
    assert 'fleethq_pruned_rows_total{kind="worker_claim_buckets"} 1' in client.get(
        "/metrics").get_data(as_text=True)


def test_a_prune_skips_rows_a_writer_holds_instead_of_waiting(app, api, database_url, settings):
    """Pruning never queues behind a claim, an outcome or a delivery: rows
    locked by another transaction are left for a later run."""
    import threading

    import psycopg
    settings(KEEP_ATTEMPTS_PER_JOB=1, KEEP_DONE_OUTBOX_DAYS=1)
    api.put_project("p")
    job, ids = job_with_attempts(app, api, "p", ["failed", "failed", "failed", "running"])
    for ref in range(3):
        _outbox(app, "archive_commit", ref, 5)
    with psycopg.connect(database_url) as writer:
        writer.execute("SELECT 1 FROM attempts WHERE id = %s FOR UPDATE", (ids[0],))
        writer.execute("SELECT 1 FROM outbox WHERE ref = 0 FOR UPDATE")
        result = {}
        runner = threading.Thread(target=lambda: result.update(tick(app)))
        runner.start()
        runner.join(30)
        assert not runner.is_alive(), "the prune waited for the writer's locks"
        assert (result["attempts"], result["outbox"]) == (2, 2)
        writer.rollback()
    assert attempt_ids(app, job) == [ids[0], ids[3]]
    assert tick(app)["outbox"] == 1
