"""The master behind a real PgBouncer in transaction mode (Debian's package).

With ``DATABASE_POOLER=transaction`` the pooled engines never prepare a
statement (one client's transactions land on different server sessions), and
what needs one server session for good (the long-poll ``LISTEN``, the clock's
advisory lock) goes to ``DIRECT_DATABASE_URL``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import psycopg
import pytest
import requests

from app import config
from tests.conftest import PG_HOST, PG_PORT, PG_USER, free_port
from tests.gunicorn_master import ROOT, Gunicorn
from tests.helpers import Api, body, wait_for

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


class PgBouncer:
    """A PgBouncer of our own on a free port: transaction pooling, two server
    connections per database, so that clients really share sessions."""

    def __init__(self):
        if not os.path.exists(PGBOUNCER):
            pytest.fail("PgBouncer is required (Debian package pgbouncer)", pytrace=False)
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="fleethq-pgbouncer-")
        os.chmod(self.dir, 0o755)
        with open(os.path.join(self.dir, "users.txt"), "w") as f:
            f.write(f'"{PG_USER}" ""\n')
        ini = os.path.join(self.dir, "pgbouncer.ini")
        with open(ini, "w") as f:
            f.write(f"""[databases]
* = host={PG_HOST} port={PG_PORT}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/users.txt
admin_users = {PG_USER}
pool_mode = transaction
default_pool_size = 2
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
""")
        # PgBouncer refuses to run as root.
        command = [PGBOUNCER, ini]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        self.log = open(os.path.join(self.dir, "log"), "wb")
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                psycopg.connect(self.url("pgbouncer"), autocommit=True, connect_timeout=2,
                                prepare_threshold=None).close()
                return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"PgBouncer did not start: {self.read_log()}", pytrace=False)
                time.sleep(0.1)

    def url(self, dbname: str) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{dbname}"

    def server_pids(self) -> set[int]:
        """Backend pids of the server connections PgBouncer holds now."""
        with psycopg.connect(self.url("pgbouncer"), autocommit=True, prepare_threshold=None) as c:
            cur = c.execute("SHOW SERVERS")
            names = [d.name for d in cur.description]
            return {int(row[names.index("remote_pid")]) for row in cur.fetchall()}

    def read_log(self) -> str:
        with open(os.path.join(self.dir, "log"), errors="replace") as f:
            return f.read()[-3000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def pgbouncer():
    bouncer = PgBouncer()
    yield bouncer
    bouncer.stop()


def _dbname(database_url: str) -> str:
    return database_url.rsplit("/", 1)[1]


@pytest.fixture(scope="module")
def pooled_master(app, database_url, pgbouncer, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("pooled")
    server = Gunicorn({"DATABASE_URL": pgbouncer.url(_dbname(database_url)),
                       "FLEETHQ_DATABASE_POOLER": "transaction",
                       "FLEETHQ_DIRECT_DATABASE_URL": database_url},
                      tmp_path / "gunicorn.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _listeners(database_url: str) -> set[int]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return {row[0] for row in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN %'")}


def test_claims_and_completions_from_many_threads_run_through_the_pooler(
        pooled_master, admin_token, database_url, pgbouncer):
    admin = Api(requests.Session(), admin_token, base=pooled_master.url)
    admin.put_project("pooled")
    total = 600
    for start in range(0, total, 200):
        assert admin.enqueue("pooled", [{"id": str(i), "value": f"v{i}"}
                                        for i in range(start, start + 200)]).status_code == 200
    done, errors = [], []

    def work(worker_id):
        api = Api(requests.Session(), admin_token, base=pooled_master.url)
        # Far more than psycopg's five uses before it would prepare a statement.
        while True:
            claimed = api.claim("pooled", worker_id=worker_id, max_jobs=8)
            if claimed.status_code != 200:
                errors.append(claimed.text)
                return
            jobs = body(claimed)["jobs"]
            if not jobs:
                return
            completed = api.complete("pooled", jobs, worker_id=worker_id)
            if completed.status_code != 200:
                errors.append(completed.text)
                return
            done.extend(r for r in body(completed)["results"] if r["status"] == "applied")

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [], errors[:3]
    assert len(done) == total
    assert admin.counts("pooled")["done"] == total
    # Every server session PgBouncer handed out was shared: more clients than two.
    assert len(pgbouncer.server_pids()) <= 2
    assert "prepared statement" not in pooled_master.log()


def test_a_long_poll_wakes_through_a_direct_listen_beside_the_pooler(
        pooled_master, admin_token, database_url, pgbouncer):
    admin = Api(requests.Session(), admin_token, base=pooled_master.url)
    admin.put_project("woken")
    waiter = Api(requests.Session(), admin_token, base=pooled_master.url)
    result = {}

    def wait():
        started = time.monotonic()
        result["response"] = waiter.claim("woken", max_jobs=1, wait_ms=20_000)
        result["elapsed"] = time.monotonic() - started

    thread = threading.Thread(target=wait)
    thread.start()
    listeners = wait_for(lambda: _listeners(database_url), timeout=10)
    # The LISTEN session is the server's own, not one PgBouncer lends out.
    assert not listeners & pgbouncer.server_pids()
    time.sleep(0.5)
    assert admin.enqueue("woken", [{"id": "a", "value": "x"}]).status_code == 200
    thread.join(25)
    assert body(result["response"])["jobs"], result["response"].text
    assert result["elapsed"] < 10, result


def test_the_clock_holds_its_lease_on_a_direct_session(app, database_url, redis_url, pgbouncer,
                                                       tmp_path):
    env = {**os.environ, "DATABASE_URL": pgbouncer.url(_dbname(database_url)),
           "FLEETHQ_DATABASE_POOLER": "transaction", "FLEETHQ_DIRECT_DATABASE_URL": database_url,
           "REDIS_URL": redis_url, "FLEETHQ_LOG_JSON": "false"}
    log = open(tmp_path / "clock.log", "wb")
    clock = subprocess.Popen([sys.executable, "-m", "tasks.clock"], cwd=ROOT, env=env,
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        def holder():
            with psycopg.connect(database_url, autocommit=True) as conn:
                row = conn.execute("SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                                   "WHERE l.locktype = 'advisory' AND l.granted "
                                   "AND d.datname = current_database()").fetchone()
            return row and row[0]
        pid = wait_for(holder, timeout=30)
        assert pid not in pgbouncer.server_pids()
        assert clock.poll() is None, (tmp_path / "clock.log").read_text()
    finally:
        clock.terminate()
        clock.wait(timeout=20)
        log.close()


@pytest.mark.parametrize("settings, message", [
    ({"DATABASE_POOLER": "transaction"}, "needs DIRECT_DATABASE_URL"),
    ({"DATABASE_POOLER": "session"}, "DATABASE_POOLER must be one of none, transaction"),
])
def test_a_pooler_setting_that_cannot_work_is_refused_at_start(settings, message):
    with pytest.raises(ValueError, match=message):
        config.load({"DATABASE_URL": "postgresql://u@127.0.0.1:6432/db", **settings})


def test_behind_a_transaction_pooler_no_engine_prepares_statements():
    cfg = config.load({"DATABASE_URL": "postgresql://u@127.0.0.1:6432/db",
                       "DATABASE_POOLER": "transaction",
                       "DIRECT_DATABASE_URL": "postgresql://u@127.0.0.1:5432/db"})
    assert cfg["SQLALCHEMY_ENGINE_OPTIONS"]["connect_args"]["prepare_threshold"] is None
    assert cfg["SQLALCHEMY_BINDS"]["fleet"]["connect_args"]["prepare_threshold"] is None
    assert cfg["LISTEN_DSN"] == "postgresql://u@127.0.0.1:5432/db"
    plain = config.load({"DATABASE_URL": "postgresql://u@127.0.0.1:5432/db"})
    assert "prepare_threshold" not in plain["SQLALCHEMY_ENGINE_OPTIONS"]["connect_args"]
