"""Worker traffic and admin traffic use separate connection pools (DESIGN §12)."""
from __future__ import annotations

import pytest

from tests.helpers import Api, body


def _connections(app, bind) -> int:
    """Connections this app's pool holds (idle in the pool or in use)."""
    from app.extensions import db
    with app.app_context():
        pool = db.engines[bind].pool
        return pool.checkedin() + pool.checkedout()


def _dispose(app, bind) -> None:
    from app.extensions import db
    with app.app_context():
        db.engines[bind].dispose()


def test_worker_routes_run_on_the_fleet_pool(app, client, admin_token):
    api = Api(client, admin_token)
    api.put_project("pools")
    api.enqueue("pools", [{"id": "a", "value": "x"}])
    _dispose(app, "fleet")
    _dispose(app, None)
    # Admin routes do not touch the fleet pool...
    assert api.call("GET", "/api/v1/admin/projects/pools").status_code == 200
    assert _connections(app, "fleet") == 0
    assert _connections(app, None) == 1
    _dispose(app, None)
    # ...worker routes use nothing else.
    assert body(api.claim("pools", max_jobs=1))["jobs"]
    assert _connections(app, "fleet") == 1
    assert _connections(app, None) == 0


def test_fleet_connections_are_named_apart(app, client, admin_token):
    from app.extensions import db
    api = Api(client, admin_token)
    api.put_project("named")
    assert api.claim("named", max_jobs=1).status_code == 200
    with app.app_context():
        with db.engines["fleet"].connect() as conn:
            assert conn.exec_driver_sql("SHOW application_name").scalar() == "fleethq-fleet"
        assert db.session.execute(db.text("SHOW application_name")).scalar() == "fleethq-web"
        db.session.remove()


def test_the_fleet_pool_size_is_bounded():
    from app import config
    for bad in (15, 65, "20", True):
        with pytest.raises(ValueError):
            config.load({"FLEET_POOL_SIZE": bad})
    binds = config.load({"FLEET_POOL_SIZE": 32})["SQLALCHEMY_BINDS"]["fleet"]
    assert binds["pool_size"] == 32 and binds["max_overflow"] == 0


def _kill_backends(database_url: str, application_name: str) -> int:
    import psycopg
    with psycopg.connect(database_url, autocommit=True) as conn:
        return sum(row[0] for row in conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s", (application_name,)))


def test_a_connection_that_died_while_idle_is_replaced_before_use(app, client, admin_token,
                                                                   database_url, monkeypatch):
    """A database restart kills pooled connections; the first worker call
    after it must not fail on one of them (idle ones are pinged)."""
    from app import extensions
    api = Api(client, admin_token)
    api.put_project("revived")
    api.enqueue("revived", [{"id": "a", "value": "x"}, {"id": "b", "value": "y"}])
    assert body(api.claim("revived", max_jobs=1))["jobs"]
    assert _kill_backends(database_url, "fleethq-fleet") >= 1
    monkeypatch.setattr(extensions, "PING_AFTER_IDLE_S", 0.0)
    response = api.claim("revived", max_jobs=1)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert [j["id"] for j in body(response)["jobs"]] == ["b"]


def test_a_connection_used_a_moment_ago_is_not_pinged(app, client, admin_token, monkeypatch):
    from app import extensions
    pings = []
    with app.app_context():
        dialect = extensions.db.engines["fleet"].dialect
    monkeypatch.setattr(dialect, "do_ping", lambda conn: pings.append(conn) or True)
    api = Api(client, admin_token)
    api.put_project("busy")
    api.enqueue("busy", [{"id": str(i), "value": str(i)} for i in range(3)])
    for _ in range(3):
        assert api.claim("busy", max_jobs=1).status_code == 200
    assert pings == []
    monkeypatch.setattr(extensions, "PING_AFTER_IDLE_S", 0.0)
    assert api.claim("busy", max_jobs=1).status_code == 200
    assert len(pings) == 1
