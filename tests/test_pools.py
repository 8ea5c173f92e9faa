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
