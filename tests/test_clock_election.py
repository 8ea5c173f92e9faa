"""A clock that elects itself (issue "Past one master" §3): any number of
``python -m tasks.clock`` processes, one holds the PostgreSQL lease and
ticks, and when it dies another takes over within a bounded time."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tasks import clock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAKEOVER_S = 15  # RETRY_S plus PostgreSQL noticing a killed session, with room for a slow machine


def test_one_lease_at_a_time_and_it_passes_on_release(database_url):
    first, second = clock.Leadership(database_url), clock.Leadership(database_url)
    try:
        assert first.acquire() is True
        assert second.acquire() is False and second.acquire() is False
        assert first.still_held()
        first.release()
        assert second.acquire() is True
        assert first.acquire() is False
    finally:
        first.release()
        second.release()


def test_a_lost_connection_is_a_lost_lease(database_url):
    import psycopg
    holder, other = clock.Leadership(database_url), clock.Leadership(database_url)
    try:
        assert holder.acquire()
        pid = holder._conn.info.backend_pid
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert holder.still_held() is False and holder.held is False
        assert other.acquire() is True  # the database released it with the session
    finally:
        holder.release()
        other.release()


def _clock(env, log_path):
    log = open(log_path, "ab")
    return subprocess.Popen([sys.executable, "-m", "tasks.clock"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _leading(path) -> int:
    with open(path, encoding="utf-8", errors="replace") as log:
        return log.read().count("clock leading")


def test_three_clocks_one_ticks_and_another_takes_over_after_kill_9(database_url, redis_url, tmp_path):
    env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url,
           "FLEETHQ_LOG_JSON": "false", "PYTHONUNBUFFERED": "1"}
    logs = [tmp_path / f"clock-{n}.log" for n in range(3)]
    procs = [_clock(env, path) for path in logs]
    try:
        deadline = time.monotonic() + 30
        while sum(_leading(p) for p in logs) < 1:
            assert time.monotonic() < deadline, [p.read_text() for p in logs]
            assert all(p.poll() is None for p in procs)
            time.sleep(0.2)
        time.sleep(3 * clock.RETRY_S)  # the others had time to try: they stand by
        leaders = [n for n, p in enumerate(logs) if _leading(p)]
        assert len(leaders) == 1, [p.read_text() for p in logs]
        os.killpg(procs[leaders[0]].pid, signal.SIGKILL)
        procs[leaders[0]].wait()
        killed_at = time.monotonic()
        while sum(_leading(p) for n, p in enumerate(logs) if n != leaders[0]) < 1:
            assert time.monotonic() - killed_at < TAKEOVER_S, [p.read_text() for p in logs]
            time.sleep(0.2)
        time.sleep(3 * clock.RETRY_S)
        assert sum(_leading(p) for n, p in enumerate(logs) if n != leaders[0]) == 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def test_a_tasks_process_with_tasks_clock_ticks_without_a_clock_process(app, client, admin_token, database_url,
                                                                        redis_url, tmp_path):
    """FLEETHQ_TASKS_CLOCK: the smallest shape (web and one tasks process) has
    a clock. The tasks process's clock thread takes the lease, ticks, and the
    reap it sends runs: an expired lease goes back to the queue."""
    from tests.helpers import Api, body, sql, values
    api = Api(client, admin_token)
    api.put_project("tasks-clock")
    api.enqueue("tasks-clock", values(1))
    [job] = body(api.claim("tasks-clock", max_jobs=1, lease_seconds=300))["jobs"]
    sql(app, "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = :j", j=job["job_id"])
    env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url, "FLEETHQ_TASKS_CLOCK": "true",
           "FLEETHQ_LOG_JSON": "false", "FLEETHQ_REAP_EVERY_S": "1", "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "tasks.log"
    with open(log_path, "ab") as log:
        tasks = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "dramatiq"), "tasks:setup_broker",
                                  "--processes", "1", "--threads", "2"], cwd=ROOT, env=env, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while sql(app, "SELECT state FROM jobs WHERE id = :j", j=job["job_id"])[0][0] != "todo":
            assert tasks.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.3)
        assert _leading(log_path) == 1
    finally:
        os.killpg(tasks.pid, signal.SIGTERM)
        try:
            tasks.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(tasks.pid, signal.SIGKILL)
    # It handed the lease over as the worker shut down: another clock takes it at once.
    other = clock.Leadership(database_url)
    try:
        assert other.acquire() is True
    finally:
        other.release()
