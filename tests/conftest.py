"""Shared fixtures: a real PostgreSQL database (migrated once per session,
emptied before each test), a real Redis, and real HTTP servers.

PostgreSQL comes from ``FLEETHQ_TEST_PG`` (default the local server on
127.0.0.1:5432, user postgres). Without it the run fails: tests that need a
service never skip.
"""
from __future__ import annotations

import os
import random
import socket
import threading
import uuid

import psycopg
import pytest
from pytest_postgresql.janitor import DatabaseJanitor
from werkzeug.serving import make_server

# Fixtures several modules use, defined beside their helpers in tests/support/.
from tests.support.pages import pages  # noqa: F401
from tests.support.uploads import dirs, files  # noqa: F401

PG_HOST = os.environ.get("FLEETHQ_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("FLEETHQ_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("FLEETHQ_TEST_PG_USER", "postgres")
# Parallel runs (pytest-xdist): each test process has a PostgreSQL database
# of its own (named by its pid) and three Redis databases of its own, counted
# down from 15 (the suite's, and two for the processes tests start).
_XDIST_INDEX = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
REDIS_URL = os.environ.get("FLEETHQ_TEST_REDIS_URL", f"redis://127.0.0.1:6379/{15 - 3 * _XDIST_INDEX}")


@pytest.fixture(scope="session")
def database_url():
    dbname = f"fleethq_test_{os.getpid()}"
    try:
        psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres",
                        connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is required at {PG_HOST}:{PG_PORT}: {exc}", pytrace=False)
    janitor = DatabaseJanitor(user=PG_USER, host=PG_HOST, port=PG_PORT, dbname=dbname)
    janitor.init()
    url = f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{dbname}"
    try:
        yield url
    finally:
        from app.projects import wakeups
        wakeups.stop()  # its LISTEN connection is about to be cut by the drop
        janitor.drop()


@pytest.fixture(scope="session")
def app(database_url):
    from flask_migrate import upgrade

    from app import create_app
    # A configured secret key, as in production: machine tokens are sealed
    # under it and stay viewable.
    # OUTBOUND_ALLOW: the tests' hook consumers listen on loopback.
    application = create_app({"DATABASE_URL": database_url, "TESTING": True, "LOG_JSON": False,
                              "SECRET_KEY": "test-secret-key", "OUTBOX_SENDER": "recording",
                              "OUTBOUND_ALLOW": "127.0.0.0/8,::1"},
                             check_schema=False)
    with application.app_context():
        upgrade()
    return application


@pytest.fixture(autouse=True)
def _clean_database(request):
    if "app" not in request.fixturenames:
        yield
        return
    application = request.getfixturevalue("app")
    from app.extensions import db
    with application.app_context():
        connection = db.session.connection().connection.driver_connection
        connection.execute(_emptying_sql(connection))
        db.session.commit()
        db.session.remove()
    yield


_EMPTYING: list[str] = []


def _emptying_sql(connection) -> str:
    """Empty every table and restart every sequence, as ``TRUNCATE … RESTART
    IDENTITY`` would, in about 5 ms instead of 135: the tables a test leaves
    are small, and TRUNCATE pays for new files per table whatever their size.
    Triggers and foreign keys are off for it (``session_replication_role``,
    the test server's superuser may set it), so the order does not matter and
    the counter triggers record nothing."""
    if not _EMPTYING:
        # Every table of the schema but alembic's own: a new table is emptied
        # without being listed anywhere.
        tables = [row[0] for row in connection.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tablename <> 'alembic_version' ORDER BY 1")]
        sequences = [row[0] for row in connection.execute(
            "SELECT schemaname || '.' || sequencename FROM pg_sequences WHERE schemaname = 'public'")]
        _EMPTYING.append(" ".join(
            ["SET LOCAL session_replication_role = replica;"]
            + [f"DELETE FROM {table};" for table in tables]
            + [f"SELECT setval('{name}', 1, false);" for name in sequences]))
    return _EMPTYING[0]


@pytest.fixture
def hints(app):
    """The outbox hints sent after this test's commits, as (topic, ref) pairs:
    the test app records them (OUTBOX_SENDER recording) and sends none."""
    from app import outbox
    sent = outbox.sender_of(app).sent
    sent.clear()
    return sent


@pytest.fixture
def ctx(app):
    """An app context for calling domain services directly."""
    from app.extensions import db
    with app.app_context():
        yield
        db.session.remove()


@pytest.fixture
def client(app):
    return app.test_client()


def _make_user(app, user_id: str, roles: list[str]) -> str:
    from app.accounts import service as accounts
    from app.extensions import db
    with app.app_context():
        accounts.put_user(user_id, roles)
        token = accounts.rotate_token(user_id)
        db.session.remove()
    return token


@pytest.fixture
def admin_token(app):
    return _make_user(app, "admin", ["admin", "worker"])


@pytest.fixture
def api(admin_token, client):
    """FleetHQ's and SavewebHQ's admin API as the admin, through the test client."""
    from tests.helpers import Api
    return Api(client, admin_token)


@pytest.fixture
def make_user(app):
    return lambda user_id, roles: _make_user(app, user_id, roles)


class LiveServer:
    def __init__(self, app):
        self._server = make_server("127.0.0.1", 0, app, threaded=True)
        self.port = self._server.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._server.shutdown()


@pytest.fixture
def live_server(app):
    server = LiveServer(app).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pub():
    """The local test publisher (papers, landing pages, traps) for one module."""
    from tests.publisher import Publisher
    with Publisher() as publisher:
        yield publisher


@pytest.fixture(scope="module")
def standin():
    """The GitHub stand-in (OAuth, user and team API over real HTTP) for one module."""
    from tests.github_standin import GitHubStandIn
    server = GitHubStandIn().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url():
    import redis
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is required at {REDIS_URL}: {exc}", pytrace=False)
    return REDIS_URL


def _outgoing_ports_start() -> int:
    """The first port the kernel gives outgoing connections (Linux's range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_PORTS = random.Random()   # seeded afresh in each test process


def free_port() -> int:
    """A loopback port nothing listens on, for a server a test starts.

    Taken below the kernel's range for outgoing connections: a port the
    kernel hands out (a bind to port 0) can become, moments later, the local
    end of some process's connection to PostgreSQL, Redis or a proxy's
    upstream, and the server then cannot bind it for as long as that
    connection lives (seen: the docs' dev stack lost its port for minutes).
    """
    start = _outgoing_ports_start()
    if start > 20000:
        for _ in range(200):
            port = _PORTS.randrange(20000, start)
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def unique(prefix: str = "p") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def scratch_database_url():
    """An empty database of its own (not the session one), dropped afterwards."""
    dbname = f"fleethq_scratch_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    janitor = DatabaseJanitor(user=PG_USER, host=PG_HOST, port=PG_PORT, dbname=dbname)
    janitor.init()
    try:
        yield f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{dbname}"
    finally:
        janitor.drop()


def closed_port_url() -> str:
    """A database URL nothing listens on."""
    return f"postgresql://{PG_USER}@127.0.0.1:{free_port()}/nowhere"


def make_app(url: str, **kw):
    """A separate app on ``url`` (quiet logs, testing mode)."""
    from app import create_app
    return create_app({"DATABASE_URL": url, "TESTING": True, "LOG_JSON": False,
                       "OUTBOX_SENDER": "recording"}, **kw)


# ------------------------------------------------------------------ tiers
#
# Every test is in one tier, by what it needs (make test-fast runs the first):
#   unit       nothing running: code, files, child processes of the code
#              under test (a PDF check, an OCR run, a CLI's argument errors);
#   services   PostgreSQL and Redis, the app in this process (test client);
#   processes  whole programs beside the test: the master, workers, the
#              publisher, a browser, gunicorn, PgBouncer, SavewebHQ's own.
# The tier follows from the fixtures a test uses, so a new test is placed
# without being listed anywhere; a module whose tests start programs
# themselves says so with ``pytestmark = pytest.mark.processes``.
SERVICE_FIXTURES = frozenset({"app", "database_url", "redis_url", "scratch_database_url"})
PROCESS_FIXTURES = frozenset({
    "archiver", "browser", "cluster", "consumer", "fleet", "gunicorn_project", "hq", "hq_server",
    "live_server", "master", "moto", "page", "pgbouncer", "pooled_master", "pub", "publisher", "s3",
    "s3_endpoint", "site", "stand_in", "standin", "web", "world"})
TIERS = ("unit", "services", "processes")


def pytest_configure(config):
    for tier, what in zip(TIERS, ("needs nothing running", "PostgreSQL and Redis, the app in-process",
                                  "whole programs beside the test"), strict=True):
        config.addinivalue_line("markers", f"{tier}: {what} (tier, set by tests/conftest.py)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("processes"):
            continue
        used = set(getattr(item, "fixturenames", ()))
        tier = ("processes" if used & PROCESS_FIXTURES
                else "services" if used & SERVICE_FIXTURES else "unit")
        item.add_marker(tier)
