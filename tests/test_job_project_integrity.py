"""A job always belongs to a project that exists (migration 0026): checked
once per INSERT statement by a trigger instead of a per-row foreign key, with
the foreign key's error code, its lock against a concurrent delete, and its
cascade."""
from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg import errors

from tests.helpers import values

_INSERT = ("INSERT INTO jobs (project_id, value, type, random_key) "
           "SELECT %s, 'https://example.test/' || i, 'seed', i FROM generate_series(1, %s) i")


@pytest.fixture
def connect(app, database_url):
    opened: list[psycopg.Connection] = []

    def open_one() -> psycopg.Connection:
        conn = psycopg.connect(database_url)
        opened.append(conn)
        return conn
    yield open_one
    for conn in opened:
        conn.close()


def jobs_of(conn, project_id: str) -> int:
    return conn.execute("SELECT count(*) FROM jobs WHERE project_id = %s", (project_id,)).fetchone()[0]


def test_a_job_of_a_missing_project_is_refused_whole(api, connect):
    api.put_project("there")
    conn = connect()
    with pytest.raises(errors.ForeignKeyViolation, match="names project gone"):
        conn.execute("INSERT INTO jobs (project_id, value, type, random_key) VALUES "
                     "('there', 'https://example.test/a', 'seed', 1), ('gone', 'https://example.test/b', 'seed', 2)")
    conn.rollback()
    assert jobs_of(conn, "there") == 0
    conn.execute(_INSERT, ("there", 5))
    conn.commit()
    assert jobs_of(conn, "there") == 5


def test_a_jobs_project_cannot_change(api, connect):
    api.put_project("first")
    api.put_project("second")
    api.enqueue("first", values(2))
    conn = connect()
    with pytest.raises(errors.ForeignKeyViolation, match="project cannot change"):
        conn.execute("UPDATE jobs SET project_id = 'second' WHERE project_id = 'first'")
    conn.rollback()
    # Naming the column without changing it is not a change.
    assert conn.execute("UPDATE jobs SET project_id = project_id WHERE project_id = 'first'").rowcount == 2


def test_deleting_a_project_deletes_its_jobs_and_their_attempts(api, connect):
    api.put_project("doomed")
    api.put_project("kept")
    api.enqueue("doomed", values(3))
    api.enqueue("kept", values(2))
    conn = connect()
    conn.execute("INSERT INTO attempts (job_id, project_id, worker_id, state, lease_expires_at) "
                 "SELECT id, project_id, 'w', 'done', now() FROM jobs WHERE project_id = 'doomed'")
    conn.execute("DELETE FROM projects WHERE id = 'doomed'")
    conn.commit()
    assert jobs_of(conn, "doomed") == 0
    assert conn.execute("SELECT count(*) FROM attempts").fetchone()[0] == 0
    assert jobs_of(conn, "kept") == 2


def blocked_behind(holder, waiting, statement: str, params=()) -> list:
    """Run ``statement`` (then commit) on ``waiting`` in a thread, see it wait
    for a lock ``holder``'s open transaction holds, commit ``holder``: what
    the statement came to ("committed", or its exception)."""
    outcome: list = []

    def run():
        try:
            waiting.execute(statement, params)
            waiting.commit()
            outcome.append("committed")
        except Exception as exc:  # noqa: BLE001 — the test reads it
            outcome.append(exc)
    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 10
    with psycopg.connect(holder.info.dsn) as watcher:
        while watcher.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                              (waiting.info.backend_pid,)).fetchone()[0] != "Lock":
            assert outcome == [] and time.monotonic() < deadline, f"it did not wait for the lock: {outcome}"
            time.sleep(0.01)
    holder.commit()
    thread.join(10)
    return outcome


def test_a_delete_waits_for_an_open_insert_then_takes_its_jobs(api, connect):
    api.put_project("raced")
    inserting, deleting = connect(), connect()
    inserting.execute(_INSERT, ("raced", 50))
    assert blocked_behind(inserting, deleting, "DELETE FROM projects WHERE id = 'raced'") == ["committed"]
    assert jobs_of(inserting, "raced") == 0


def test_an_insert_behind_an_open_delete_is_refused(api, connect):
    api.put_project("raced")
    inserting, deleting = connect(), connect()
    deleting.execute("DELETE FROM projects WHERE id = 'raced'")
    outcome = blocked_behind(deleting, inserting, _INSERT, ("raced", 50))
    assert len(outcome) == 1 and isinstance(outcome[0], errors.ForeignKeyViolation), outcome
    inserting.rollback()
    assert jobs_of(inserting, "raced") == 0
