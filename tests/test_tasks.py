"""Dramatiq actors (tasks/actors.py), the broker factory, the app-context
middleware and the clock (DESIGN §2: ``tasks`` and ``clock`` processes)."""
from __future__ import annotations

import threading
from urllib.parse import urlsplit

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import QueueJoinTimeout
from sqlalchemy import text

import tasks
from app import config as app_config
from tasks import actors, clock
from tasks.middleware import AppContext
from tests.conftest import unique
from tests.helpers import Api, body, close_broker, values

ACTORS = (actors.reap_leases, actors.fold_counters, actors.reconcile, actors.sweep_spool,
          actors.prune_claim_buckets,
          actors.prune_retention)


class Recorder(dramatiq.Middleware):
    """Remembers what was enqueued and how each processed message ended."""

    def __init__(self):
        self.enqueued: list[str] = []
        self.processed: list[tuple[str, object, BaseException | None]] = []
        self._lock = threading.Lock()

    def after_enqueue(self, broker, message, delay):
        with self._lock:
            self.enqueued.append(message.actor_name)

    def after_process_message(self, broker, message, *, result=None, exception=None):
        with self._lock:
            self.processed.append((message.actor_name, result, exception))


# ------------------------------------------------------------------ fixtures


def expire_lease(app, job_id: str) -> None:
    from app.extensions import db
    with app.app_context():
        db.session.execute(text(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = :id"),
            {"id": int(job_id)})
        db.session.commit()
        db.session.remove()


def job_row(app, job_id: str) -> dict:
    from app.extensions import db
    with app.app_context():
        job = db.session.execute(text(
            "SELECT state, lease_expires_at, resets, current_attempt_id FROM jobs WHERE id = :id"),
            {"id": int(job_id)}).mappings().one()
        attempt = db.session.execute(text("SELECT state FROM attempts WHERE id = :id"),
                                     {"id": job["current_attempt_id"]}).scalar()
        db.session.remove()
    return {**job, "attempt_state": attempt}


def delta_rows(app) -> int:
    from app.extensions import db
    with app.app_context():
        n = db.session.execute(text(
            "SELECT (SELECT count(*) FROM job_counts) + (SELECT count(*) FROM attempt_totals)")).scalar()
        db.session.remove()
    return n


@pytest.fixture
def two_claimed(client, admin_token):
    """A project with two claimed jobs (lease 300 s) and one waiting."""
    api = Api(client, admin_token)
    project = unique("tasks")
    api.put_project(project)
    api.enqueue(project, values(3))
    jobs = body(api.claim(project, max_jobs=2, lease_seconds=300))["jobs"]
    assert len(jobs) == 2
    return api, project, jobs


@pytest.fixture
def redis_broker(redis_url, database_url, monkeypatch):
    """The broker ``tasks`` builds for the ``tasks`` process, on the test Redis
    (db 15), with the actors pointed at it and its queue flushed."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("DATABASE_URL", database_url)  # read by the middleware's create_app()
    monkeypatch.setenv("FLEETHQ_LOG_JSON", "false")
    broker = tasks.make_broker(app_config.load())
    recorder = Recorder()
    broker.add_middleware(recorder)
    for actor in ACTORS:
        monkeypatch.setattr(actor, "broker", broker)
        broker.declare_actor(actor)
    broker.flush_all()
    broker.recorder = recorder
    yield broker
    broker.flush_all()
    close_broker(broker)


def run_worker(broker, queue_name="maintenance"):
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        try:
            broker.join(queue_name, timeout=30_000)
        except QueueJoinTimeout:
            pytest.fail(f"messages not processed: {broker.recorder.processed}")
        worker.join()
    finally:
        worker.stop()


# ------------------------------------------------------------ direct calls


def test_reap_leases_function_requeues_an_expired_lease(app, ctx, two_claimed):
    api, project, jobs = two_claimed
    expire_lease(app, jobs[0]["job_id"])
    actors.reap_leases.fn()
    expired, live = job_row(app, jobs[0]["job_id"]), job_row(app, jobs[1]["job_id"])
    assert (expired["state"], expired["attempt_state"], expired["resets"]) == ("todo", "expired", 1)
    assert expired["lease_expires_at"] is None
    assert (live["state"], live["attempt_state"]) == ("wip", "running")
    assert api.counts(project)["todo"] == 2
    # The old attempt can no longer complete; the job is claimable again.
    result = body(api.complete(project, jobs[:1]))["results"][0]
    assert result["status"] == "rejected"
    reclaimed = body(api.claim(project, max_jobs=5))["jobs"]
    assert jobs[0]["job_id"] in {j["job_id"] for j in reclaimed}


def test_reap_leases_function_fails_claimed_jobs_past_their_deadline(app, ctx, client,
                                                                     admin_token):
    """The task deadline starts at the first claim: a retry waiting past it
    fails, a job that was never claimed waits however old it is."""
    from app.extensions import db
    api = Api(client, admin_token)
    project = unique("deadline")
    api.put_project(project, task_timeout_seconds=600, retry_backoff_seconds=3600)
    api.enqueue(project, values(2))
    [job] = body(api.claim(project, max_jobs=1))["jobs"]
    assert body(api.fail(project, [job], retryable=True))["results"][0]["job_status"] == "todo"
    db.session.execute(text("UPDATE jobs SET deadline_at = now() - interval '1 second' "
                            "WHERE id = :j"), {"j": job["job_id"]})
    db.session.execute(text("UPDATE jobs SET created_at = now() - interval '1 day' "
                            "WHERE project_id = :p"), {"p": project})
    db.session.commit()
    actors.reap_leases.fn()
    assert api.counts(project)["failed"] == 1
    assert api.counts(project)["todo"] == 1
    failed = db.session.execute(text("SELECT id, last_error ->> 'code' FROM jobs "
                                     "WHERE project_id = :p AND state = 'failed'"),
                                {"p": project}).all()
    assert failed == [(job["job_id"], "timeout")]


def test_reap_leases_respects_max_resets(app, ctx, client, admin_token):
    api = Api(client, admin_token)
    project = unique("resets")
    api.put_project(project, max_resets=0)
    api.enqueue(project, values(1))
    job = body(api.claim(project))["jobs"][0]
    expire_lease(app, job["job_id"])
    actors.reap_leases.fn()
    assert job_row(app, job["job_id"])["state"] == "reset_exhausted"


def test_fold_counters_function(app, ctx, two_claimed):
    api, project, jobs = two_claimed
    api.complete(project, jobs[:1])
    before_counts = api.counts(project)
    before_rows = delta_rows(app)
    actors.fold_counters.fn()
    assert delta_rows(app) < before_rows
    assert api.counts(project) == before_counts == {
        "todo": 1, "wip": 1, "staged": 0, "done": 1, "failed": 0, "reset_exhausted": 0}


# --------------------------------------------------------- broker factory


def test_make_broker_uses_redis_url_and_app_context(monkeypatch, redis_url):
    monkeypatch.setenv("REDIS_URL", redis_url)
    broker = tasks.make_broker(app_config.load())
    try:
        assert isinstance(broker, RedisBroker)
        kwargs = broker.client.connection_pool.connection_kwargs
        wanted = urlsplit(redis_url)
        assert (kwargs.get("host"), kwargs.get("port"), kwargs.get("db")) == (
            wanted.hostname, wanted.port, int(wanted.path.lstrip("/") or 0))
        assert any(isinstance(m, AppContext) for m in broker.middleware)
    finally:
        broker.close()


def test_idle_consumers_poll_often_whatever_the_worker_timeout(redis_url):
    """Dramatiq's idle Redis consumer sleeps up to the worker timeout
    between fetches; ours caps that, so a staged upload's archive commit
    does not wait a second for an idle tasks process to look."""
    broker = tasks.make_broker({"REDIS_URL": redis_url})
    try:
        broker.declare_queue("archive")
        for asked in (1000, 5000):
            consumer = broker.consume("archive", prefetch=2, timeout=asked)
            try:
                assert consumer.timeout == tasks.PromptRedisBroker.IDLE_POLL_MS <= 100
                assert consumer.prefetch == 2
            finally:
                consumer.close()
    finally:
        broker.close()


def test_make_broker_stub_for_tests(monkeypatch):
    monkeypatch.setenv("FLEETHQ_STUB_BROKER", "true")
    broker = tasks.make_broker(app_config.load())
    assert isinstance(broker, StubBroker)
    assert any(isinstance(m, AppContext) for m in broker.middleware)


def test_importing_tasks_configures_no_broker():
    """Until an entry point calls setup_broker, the actors only have their
    declarations: a send fails loudly instead of reaching a default Redis."""
    assert dramatiq.get_broker() is tasks.declarations
    assert set(tasks.declarations.actors) >= {a.actor_name for a in ACTORS}
    with pytest.raises(tasks.BrokerNotConfigured, match="tasks:setup_broker"):
        tasks.declarations.enqueue(actors.reap_leases.message())
    with pytest.raises(tasks.BrokerNotConfigured):
        tasks.declarations.consume("maintenance")


def test_setup_broker_binds_every_actor_to_the_configured_broker(monkeypatch, redis_url):
    for actor in tasks.declarations.actors.values():
        monkeypatch.setattr(actor, "broker", actor.broker)  # restored afterwards
    monkeypatch.setattr(dramatiq.broker, "global_broker", dramatiq.get_broker())
    broker = tasks.setup_broker({"REDIS_URL": redis_url})
    try:
        assert isinstance(broker, RedisBroker) and dramatiq.get_broker() is broker
        for name, actor in tasks.declarations.actors.items():
            assert broker.get_actor(name) is actor and actor.broker is broker
        assert {a.queue_name for a in ACTORS} == {"maintenance"}
        assert broker.get_declared_queues() >= {"maintenance", "archive", "hooks"}
    finally:
        broker.close()


# ------------------------------------------------------- through real Redis


def test_reap_leases_through_redis(app, two_claimed, redis_broker):
    api, project, jobs = two_claimed
    expire_lease(app, jobs[0]["job_id"])
    actors.reap_leases.send()
    assert redis_broker.do_qsize("maintenance") == 1  # waiting in Redis until a worker runs
    assert job_row(app, jobs[0]["job_id"])["state"] == "wip"
    run_worker(redis_broker)
    assert redis_broker.do_qsize("maintenance") == 0
    assert [(name, exc) for name, _, exc in redis_broker.recorder.processed] == [("reap_leases", None)]
    assert job_row(app, jobs[0]["job_id"])["state"] == "todo"
    assert job_row(app, jobs[0]["job_id"])["attempt_state"] == "expired"
    assert job_row(app, jobs[1]["job_id"])["state"] == "wip"
    assert api.counts(project)["todo"] == 2


def test_fold_counters_through_redis(app, two_claimed, redis_broker):
    api, project, jobs = two_claimed
    api.complete(project, jobs[:1])
    api.fail(project, jobs[1:], retryable=False)
    before_counts, before_rows = api.counts(project), delta_rows(app)
    actors.fold_counters.send()
    run_worker(redis_broker)
    assert [(name, exc) for name, _, exc in redis_broker.recorder.processed] == [("fold_counters", None)]
    assert delta_rows(app) < before_rows
    assert api.counts(project) == before_counts == {
        "todo": 1, "wip": 0, "staged": 0, "done": 1, "failed": 1, "reset_exhausted": 0}


def test_worker_runs_many_messages_with_one_app(app, two_claimed, redis_broker):
    """Each message gets an app context; sessions are returned between messages."""
    api, project, jobs = two_claimed
    expire_lease(app, jobs[0]["job_id"])
    for _ in range(3):
        actors.reap_leases.send()
        actors.fold_counters.send()
    run_worker(redis_broker)
    processed = redis_broker.recorder.processed
    assert len(processed) == 6
    assert [e for _, _, e in processed] == [None] * 6
    assert sorted(name for name, _, _ in processed) == ["fold_counters"] * 3 + ["reap_leases"] * 3
    assert job_row(app, jobs[0]["job_id"])["resets"] == 1  # reaped once, not three times
    assert api.counts(project)["todo"] == 2
    apps = [m._app for m in redis_broker.middleware if isinstance(m, AppContext)]
    assert len(apps) == 1 and apps[0] is not None


# -------------------------------------------------------------------- clock


class FakeTime:
    """Virtual monotonic clock: sleep() advances it at once."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def stub_broker(monkeypatch):
    broker = StubBroker()
    recorder = Recorder()
    broker.add_middleware(recorder)
    for actor in ACTORS:
        monkeypatch.setattr(actor, "broker", broker)
        broker.declare_actor(actor)
    broker.recorder = recorder
    return broker


def test_clock_sends_each_actor_once_per_period(stub_broker, monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(clock, "time", fake)
    start = fake.now
    schedule = ((actors.reap_leases, 5.0), (actors.fold_counters, 30.0))
    clock.run(schedule, stop=lambda: fake.now - start >= 62)
    sent = stub_broker.recorder.enqueued
    # t = 0, 5, ..., 60 and t = 0, 30, 60
    assert sent.count("reap_leases") == 13
    assert sent.count("fold_counters") == 3
    assert sent[:2] == ["reap_leases", "fold_counters"]  # both at once on start
    assert stub_broker.queues["maintenance"].qsize() == 16
    # It sleeps until the next due message rather than spinning.
    assert len(fake.sleeps) <= 14


def test_clock_default_schedule(stub_broker, monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(clock, "time", fake)
    start = fake.now
    assert {a.actor_name for a, _ in clock.SCHEDULE} == {"reap_leases", "fold_counters", "reconcile",
                                                         "sweep_spool", "prune_claim_buckets",
                                                         "prune_retention"}
    clock.run(stop=lambda: fake.now - start >= 59)
    periods = dict((a.actor_name, p) for a, p in clock.SCHEDULE)
    sent = stub_broker.recorder.enqueued
    for name, period in periods.items():
        assert sent.count(name) == int(59 // period) + 1, (name, period, sent)


def test_clock_periods_are_settings_checked_at_start(monkeypatch):
    from app import config
    monkeypatch.setenv("FLEETHQ_RECONCILE_EVERY_S", "2")
    periods = {a.actor_name: p for a, p in clock.schedule(config.load({"DATABASE_URL": "postgresql://x/y"}))}
    assert periods["reconcile"] == 2.0 and periods["reap_leases"] == 5.0
    monkeypatch.setenv("FLEETHQ_RECONCILE_EVERY_S", "0")
    with pytest.raises(config.ConfigError, match="RECONCILE_EVERY_S"):
        config.load({"DATABASE_URL": "postgresql://x/y"})
    monkeypatch.setenv("FLEETHQ_RECONCILE_EVERY_S", "often")
    with pytest.raises(config.ConfigError, match="RECONCILE_EVERY_S"):
        config.load({"DATABASE_URL": "postgresql://x/y"})


def test_clock_survives_a_broker_outage(stub_broker, monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(clock, "time", fake)
    start = fake.now
    real_enqueue = stub_broker.enqueue
    down_until = start + 12

    def flaky_enqueue(message, *, delay=None):
        if fake.now < down_until:
            raise redis.ConnectionError("redis is down")
        return real_enqueue(message, delay=delay)

    monkeypatch.setattr(stub_broker, "enqueue", flaky_enqueue)
    clock.run(((actors.reap_leases, 5.0),), stop=lambda: fake.now - start >= 27)
    # Sends at t = 0, 5, 10 fail; t = 15, 20, 25 go through.
    assert stub_broker.recorder.enqueued == ["reap_leases"] * 3


def test_clock_to_redis_to_worker(app, two_claimed, redis_broker, monkeypatch):
    """The production chain: the clock sends, a worker runs the actor, the job is back."""
    api, project, jobs = two_claimed
    expire_lease(app, jobs[1]["job_id"])
    fake = FakeTime()
    monkeypatch.setattr(clock, "time", fake)
    start = fake.now
    clock.run(((actors.reap_leases, 5.0), (actors.fold_counters, 30.0)),
              stop=lambda: fake.now - start >= 1)
    assert redis_broker.recorder.enqueued == ["reap_leases", "fold_counters"]
    run_worker(redis_broker)
    assert sorted(name for name, _, _ in redis_broker.recorder.processed) == [
        "fold_counters", "reap_leases"]
    assert job_row(app, jobs[1]["job_id"])["state"] == "todo"
    assert api.counts(project) == {"todo": 2, "wip": 1, "staged": 0, "done": 0, "failed": 0,
                                   "reset_exhausted": 0}


def test_prune_retention_through_redis(app, two_claimed, redis_broker, monkeypatch):
    """The clock's prune message runs in a worker: an attempt beyond the
    newest one of its job is pruned, the counts are recorded in PostgreSQL."""
    from tests.helpers import sql
    api, project, jobs = two_claimed
    monkeypatch.setenv("FLEETHQ_KEEP_ATTEMPTS_PER_JOB", "1")  # read by the worker's create_app()
    assert api.fail(project, jobs[:1], retryable=True).status_code == 200
    sql(app, "UPDATE jobs SET not_before = now()")
    again = body(api.claim(project, max_jobs=2, lease_seconds=300))["jobs"]
    assert jobs[0]["job_id"] in [j["job_id"] for j in again]
    actors.prune_retention.send()
    run_worker(redis_broker)
    assert [(name, exc) for name, _, exc in redis_broker.recorder.processed] == [
        ("prune_retention", None)]
    assert sql(app, "SELECT count(*) FROM attempts WHERE job_id = :j",
               j=int(jobs[0]["job_id"])) == [(1,)]
    assert sql(app, "SELECT pruned_total FROM retention_stats WHERE kind = 'attempts'") == [(1,)]
    assert job_row(app, jobs[0]["job_id"])["attempt_state"] == "running"
