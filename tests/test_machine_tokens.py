"""User machine tokens as SavewebHQ has them: any well-formed token can be
installed and authenticates (T3)."""
from __future__ import annotations

import contextlib
import hashlib

import pytest
import requests

from app.accounts import service as accounts
from app.errors import InvalidRequest
from tests.helpers import Api, body


def _whoami(url: str, authorization: bytes | str) -> requests.Response:
    return requests.get(f"{url}/api/v1/whoami", headers={"Authorization": authorization},
                        timeout=10)


@pytest.mark.parametrize("token", [
    "hq_Yk2p9Vq3xL0aZ8mN4rT6uW1eB5cD7fG9hJ2kL4nP6sQ",  # a SavewebHQ-issued token
    "x",                                                # as short as SavewebHQ allows
    "a" * 1024,                                         # as long
    "operator-chosen:token/with+symbols=",
    "tökén-ünïcode",
])
def test_any_well_formed_token_installs_and_authenticates(app, ctx, live_server, token):
    accounts.put_user("carried", ["worker"])
    accounts.install_token("carried", token)
    response = _whoami(live_server.url, b"Bearer " + token.encode())
    assert response.status_code == 200, response.text
    assert response.json() == {"user_id": "carried"}


def test_scheme_is_case_insensitive_and_one_space_separates(ctx, live_server):
    accounts.put_user("carried", ["worker"])
    accounts.install_token("carried", "hq_spacing")
    assert _whoami(live_server.url, "bearer hq_spacing").status_code == 200
    assert _whoami(live_server.url, "BEARER hq_spacing").status_code == 200
    for refused in ("Bearer  hq_spacing", "Bearer\thq_spacing", "hq_spacing", "Bearer hq_spacing x"):
        response = _whoami(live_server.url, refused)
        assert response.status_code == 401, refused
        assert response.json()["error"]["code"] == "invalid_machine_token"


@pytest.mark.parametrize("token, why", [
    ("", "1..1024 bytes"),
    ("a" * 1025, "1..1024 bytes"),
    ("é" * 513, "1..1024 bytes"),  # 1026 bytes in UTF-8
    ("with space", "without spaces"),
    ("line\nbreak", "without spaces"),
    ("tab\there", "without spaces"),
    ("bell\x07", "control characters"),
    ("fhqn_" + "a" * 43, "enrolled-node secrets"),
])
def test_tokens_that_could_never_authenticate_are_refused(ctx, token, why):
    accounts.put_user("carried", ["worker"])
    with pytest.raises(InvalidRequest, match=why):
        accounts.install_token("carried", token)


def test_a_token_belongs_to_one_user(ctx):
    accounts.put_user("first", ["worker"])
    accounts.put_user("second", ["worker"])
    accounts.install_token("first", "hq_shared")
    with pytest.raises(InvalidRequest, match="another user"):
        accounts.install_token("second", "hq_shared")
    accounts.install_token("first", "hq_shared")  # the same user again: fine


def test_installing_replaces_the_previous_token(app, client, make_user):
    old = make_user("wk", ["worker"])
    with app.app_context():
        accounts.install_token("wk", "hq_replacement")
    assert Api(client, old).call("GET", "/api/v1/whoami").status_code == 401
    assert body(Api(client, "hq_replacement").call("GET", "/api/v1/whoami")) == {"user_id": "wk"}


def test_new_tokens_keep_the_fhq_prefix(ctx):
    accounts.put_user("wk", ["worker"])
    assert accounts.rotate_token("wk").startswith("fhq_")


# ------------------------------------------------------------ viewable, sealed (T2)

@contextlib.contextmanager
def _app_on(database_url: str, **config):
    """Another master process on the same database, with other settings."""
    from app import create_app
    from app.extensions import db
    other = create_app({"DATABASE_URL": database_url, "TESTING": True, "LOG_JSON": False,
                        **config}, check_schema=False)
    with other.app_context():
        try:
            yield other
        finally:
            db.session.remove()
            for engine in db.engines.values():
                engine.dispose()


def test_a_token_can_be_viewed_again(ctx):
    accounts.put_user("wk", ["worker"])
    accounts.install_token("wk", "hq_carried-over")
    assert accounts.view_token("wk") == "hq_carried-over"
    assert accounts.view_token("wk") == "hq_carried-over"  # repeatable
    rotated = accounts.rotate_token("wk")
    assert accounts.view_token("wk") == rotated
    accounts.revoke_token("wk")
    assert accounts.view_token("wk") is None
    assert accounts.view_token("nobody") is None


def test_a_database_dump_reveals_no_token(app, ctx):
    from tests.helpers import db_rows
    accounts.put_user("wk", ["worker"])
    accounts.put_user("op", ["admin"])
    issued = accounts.rotate_token("wk")
    accounts.install_token("op", "hq_operator-chosen-secret")
    dump = " ".join(r["row"] for r in db_rows(app, "SELECT t::text AS row FROM machine_tokens t"))
    assert "\\x" in dump  # the sealed copies are there, as bytea
    for token in (issued, "hq_operator-chosen-secret"):
        assert token not in dump
        assert token[4:16] not in dump
        assert token.encode().hex() not in dump
        assert token.encode().hex()[8:32] not in dump
    assert {r["sealed"] for r in db_rows(app, "SELECT sealed IS NOT NULL AS sealed "
                                              "FROM machine_tokens")} == {True}


def test_a_changed_secret_key_makes_tokens_unviewable_not_unusable(app, database_url):
    with app.app_context():
        accounts.put_user("wk", ["worker"])
        accounts.install_token("wk", "hq_before-the-key-changed")
    with _app_on(database_url, SECRET_KEY="another-secret-key"):
        assert accounts.view_token("wk") is None
        assert accounts.token_metadata("wk")["viewable"] is False
        assert accounts.authenticate("hq_before-the-key-changed").user_id == "wk"
        # A token installed under the new key is viewable under it.
        accounts.install_token("wk", "hq_after")
        assert accounts.view_token("wk") == "hq_after"
    with app.app_context():
        assert accounts.view_token("wk") is None


def test_not_viewable_keeps_digests_only(app, database_url):
    from tests.helpers import db_rows
    with _app_on(database_url, SECRET_KEY="test-secret-key", MACHINE_TOKENS_VIEWABLE=False):
        accounts.put_user("wk", ["worker"])
        token = accounts.rotate_token("wk")
        assert accounts.view_token("wk") is None
        assert accounts.authenticate(token).user_id == "wk"
    assert db_rows(app, "SELECT sealed FROM machine_tokens") == [{"sealed": None}]
    with app.app_context():  # viewable again, but nothing was kept to view
        assert accounts.view_token("wk") is None


def test_without_a_configured_secret_key_nothing_is_sealed(app, database_url):
    from tests.helpers import db_rows
    with _app_on(database_url, SECRET_KEY=None):
        accounts.put_user("wk", ["worker"])
        accounts.rotate_token("wk")
        assert accounts.view_token("wk") is None
    assert db_rows(app, "SELECT sealed FROM machine_tokens") == [{"sealed": None}]


def test_a_sealed_copy_opens_only_on_its_own_row(app, ctx):
    from tests.helpers import sql
    accounts.put_user("a", ["worker"])
    accounts.put_user("b", ["worker"])
    accounts.install_token("a", "hq_token-of-a")
    accounts.install_token("b", "hq_token-of-b")
    sql(app, "UPDATE machine_tokens SET sealed = (SELECT sealed FROM machine_tokens "
             "WHERE user_id = 'a') WHERE user_id = 'b'")
    assert accounts.view_token("b") is None
    assert accounts.view_token("a") == "hq_token-of-a"


def test_viewable_setting_must_be_a_boolean(monkeypatch):
    from app import config
    monkeypatch.setenv("FLEETHQ_MACHINE_TOKENS_VIEWABLE", "false")
    assert config.load()["MACHINE_TOKENS_VIEWABLE"] is False
    monkeypatch.setenv("FLEETHQ_MACHINE_TOKENS_VIEWABLE", "no")
    with pytest.raises(ValueError, match="MACHINE_TOKENS_VIEWABLE"):
        config.load()


# ------------------------------------------------------------ users API (A11–A16)

class Http:
    """The machine API over real HTTP with one bearer token."""

    def __init__(self, url: str, token: str):
        self.url, self.token = url, token

    def __call__(self, method: str, path: str, payload=None) -> requests.Response:
        return requests.request(method, f"{self.url}/api/v1{path}", json=payload, timeout=10,
                                headers={"Authorization": f"Bearer {self.token}"})


def _refused(response, status: int, code: str) -> None:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.json()["error"]["code"] == code


@pytest.fixture
def admin(live_server, admin_token):
    return Http(live_server.url, admin_token)


def test_user_list_is_savewebhq_admin_user_summary(app, admin, make_user):
    from tests.helpers import sql
    make_user("wk", ["worker", "reader"])
    sql(app, "INSERT INTO users (id, status, roles, github_login) "
             "VALUES ('gh-7', 'pending', '{}', 'octocat')")
    response = admin("GET", "/admin/users")
    assert response.status_code == 200
    users = response.json()["users"]
    assert [u["id"] for u in users] == ["admin", "gh-7", "wk"]
    by_id = {u["id"]: u for u in users}
    keys = ["id", "status", "roles", "machine_token_active", "machine_token_viewable",
            "created_at", "updated_at"]
    assert list(by_id["wk"]) == keys
    assert list(by_id["gh-7"]) == keys[:1] + ["github_login"] + keys[1:]
    assert by_id["gh-7"]["github_login"] == "octocat"
    assert by_id["wk"]["roles"] == ["worker"]  # FleetHQ's reader role is not shown here
    assert by_id["wk"]["machine_token_active"] is True
    assert by_id["wk"]["machine_token_viewable"] is True
    assert by_id["gh-7"]["machine_token_active"] is False
    assert by_id["gh-7"]["machine_token_viewable"] is False
    assert isinstance(by_id["wk"]["created_at"], int) and isinstance(by_id["wk"]["updated_at"], int)


def test_put_user_creates_and_updates_with_204(app, admin):
    from tests.helpers import sql
    created = admin("PUT", "/admin/users/robot", {"status": "pending", "roles": ["worker"]})
    assert created.status_code == 204 and created.content == b""
    updated = admin("PUT", "/admin/users/robot", {"status": "active", "roles": ["admin", "worker"]})
    assert updated.status_code == 204
    assert sql(app, "SELECT status, roles FROM users WHERE id = 'robot'") == \
        [("active", ["admin", "worker"])]
    assert admin("PUT", "/admin/users/robot", {"status": "active", "roles": []}).status_code == 204
    assert sql(app, "SELECT roles FROM users WHERE id = 'robot'") == [([],)]


@pytest.mark.parametrize("payload", [
    {"roles": ["worker"]},                                      # status is required
    {"status": "active"},                                       # roles too
    {"status": "frozen", "roles": ["worker"]},
    {"status": "active", "roles": ["reader"]},                  # FleetHQ's route only
    {"status": "active", "roles": ["worker", "worker"]},
    {"status": "active", "roles": "worker"},
    {"status": "active", "roles": ["worker"], "extra": True},
])
def test_put_user_refuses_a_bad_body(admin, payload):
    _refused(admin("PUT", "/admin/users/robot", payload), 400, "invalid_request")
    assert [u["id"] for u in admin("GET", "/admin/users").json()["users"]] == ["admin"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_put_user_refuses_a_non_json_body_as_savewebhq(admin, content_type):
    response = requests.put(f"{admin.url}/api/v1/admin/users/robot", data='{"status": "active"}',
                            headers={"Authorization": f"Bearer {admin.token}",
                                     "Content-Type": content_type}, timeout=10)
    _refused(response, 400, "invalid_request")
    unauthenticated = requests.put(f"{admin.url}/api/v1/admin/users/robot", data="x",
                                   headers={"Content-Type": content_type}, timeout=10)
    _refused(unauthenticated, 401, "invalid_machine_token")  # the token is checked first


def test_put_user_refuses_a_bad_user_id(admin):
    _refused(admin("PUT", "/admin/users/bad%20id", {"status": "active", "roles": []}),
             400, "invalid_request")
    for method in ("DELETE", "GET", "POST"):
        suffix = "" if method == "DELETE" else "/machine-token"
        _refused(admin(method, f"/admin/users/bad%20id{suffix}"), 400, "invalid_request")


def test_reader_is_managed_on_fleethqs_own_route(app, admin):
    from tests.helpers import sql
    created = admin("PUT", "/fleethq/users/analyst", {"status": "active", "roles": ["reader"]})
    assert created.status_code == 201
    assert created.json()["roles"] == ["reader"] and created.json()["user_id"] == "analyst"
    again = admin("PUT", "/fleethq/users/analyst", {"status": "active",
                                                    "roles": ["reader", "worker"]})
    assert again.status_code == 200 and again.json()["roles"] == ["reader", "worker"]
    # A SavewebHQ client cannot name reader, so it cannot take it away either.
    assert admin("PUT", "/admin/users/analyst", {"status": "active", "roles": ["admin"]}) \
        .status_code == 204
    assert sql(app, "SELECT roles FROM users WHERE id = 'analyst'") == [(["admin", "reader"],)]
    assert admin("PUT", "/fleethq/users/analyst", {"status": "active", "roles": []}).json()["roles"] == []
    _refused(admin("PUT", "/fleethq/users/analyst", {"roles": ["reader"]}), 400, "invalid_request")


def test_delete_user_is_204_then_404(admin, make_user):
    token = make_user("wk", ["worker"])
    response = admin("DELETE", "/admin/users/wk")
    assert response.status_code == 204 and response.content == b""
    _refused(admin("DELETE", "/admin/users/wk"), 404, "not_found")
    _refused(Http(admin.url, token)("GET", "/whoami"), 401, "invalid_machine_token")


def test_machine_token_routes(admin, make_user):
    first = make_user("wk", ["worker"])
    viewed = admin("GET", "/admin/users/wk/machine-token")
    assert viewed.status_code == 200 and viewed.json() == {"user_id": "wk", "token": first}
    assert admin("GET", "/admin/users/wk/machine-token").json()["token"] == first  # repeatable

    rotated = admin("POST", "/admin/users/wk/machine-token")
    assert rotated.status_code == 201
    assert list(rotated.json()) == ["user_id", "token"] and rotated.json()["user_id"] == "wk"
    second = rotated.json()["token"]
    assert second.startswith("fhq_") and second != first
    assert admin("GET", "/admin/users/wk/machine-token").json()["token"] == second

    revoked = admin("DELETE", "/admin/users/wk/machine-token")
    assert revoked.status_code == 204 and revoked.content == b""
    _refused(admin("DELETE", "/admin/users/wk/machine-token"), 404, "not_found")
    _refused(admin("GET", "/admin/users/wk/machine-token"), 404, "not_found")
    _refused(Http(admin.url, second)("GET", "/whoami"), 401, "invalid_machine_token")

    for method in ("GET", "POST", "DELETE"):
        _refused(admin(method, "/admin/users/ghost/machine-token"), 404, "not_found")


def test_users_routes_need_an_active_admin(admin, make_user):
    worker = Http(admin.url, make_user("wk", ["worker", "reader"]))
    for method, path, payload in [
            ("GET", "/admin/users", None),
            ("PUT", "/admin/users/x", {"status": "active", "roles": []}),
            ("PUT", "/fleethq/users/x", {"status": "active", "roles": []}),
            ("DELETE", "/admin/users/admin", None),
            ("GET", "/admin/users/admin/machine-token", None),
            ("POST", "/admin/users/admin/machine-token", None),
            ("DELETE", "/admin/users/admin/machine-token", None)]:
        _refused(worker(method, path, payload), 403, "permission_denied")
        _refused(Http(admin.url, "hq_unknown")(method, path, payload), 401,
                 "invalid_machine_token")


# ------------------------------------------------------------ standing (W4, W22)

def test_whoami_names_a_pending_user(admin, make_user):
    token = make_user("newcomer", ["worker"])
    assert admin("PUT", "/admin/users/newcomer", {"status": "pending", "roles": ["worker"]}) \
        .status_code == 204
    response = Http(admin.url, token)("GET", "/whoami")
    assert response.status_code == 200 and response.json() == {"user_id": "newcomer"}


def test_a_suspended_user_is_refused_403_on_worker_and_admin_routes(admin, make_user):
    from tests.helpers import VERSION
    admin("PUT", "/fleethq/projects/p", {})
    token = make_user("wk", ["admin", "worker"])
    assert admin("PUT", "/admin/users/wk", {"status": "suspended", "roles": ["admin", "worker"]}) \
        .status_code == 204
    claim = requests.post(f"{admin.url}/api/v1/projects/p/jobs/claim", timeout=10,
                          json={"worker_id": "w1", "max_jobs": 1, "lease_seconds": 60},
                          headers={"Authorization": f"Bearer {token}", "X-Client-Version": VERSION})
    _refused(claim, 403, "permission_denied")
    _refused(Http(admin.url, token)("GET", "/admin/users"), 403, "permission_denied")
    # An unknown project is 404 before the user's standing is looked at, as SavewebHQ.
    missing = requests.get(f"{admin.url}/api/v1/projects/nowhere", timeout=10,
                           headers={"Authorization": f"Bearer {token}", "X-Client-Version": VERSION})
    _refused(missing, 404, "not_found")


# ---------------------------------------------- tokens imported by SavewebHQ digest

def test_a_token_imported_by_its_savewebhq_digest_authenticates_then_becomes_viewable(
        app, admin, make_user):
    from app.accounts import tokens
    from tests.helpers import VERSION, db_rows, sql
    token = "hq_kept-only-as-a-digest-in-savewebhq"
    saveweb = hashlib.sha256(b"saveweb-machine-token-v1\x00" + token.encode()).hexdigest()
    assert tokens.savewebhq_key(token) == "savewebhq-v1:" + saveweb  # the importer's key
    admin("PUT", "/fleethq/projects/p", {"client_versions": [VERSION]})
    with app.app_context():
        accounts.put_user("crawler", ["worker"])
    sql(app, "INSERT INTO machine_tokens (user_id, token_hash) VALUES ('crawler', :k)",
        k=tokens.savewebhq_key(token))
    _refused(admin("GET", "/admin/users/crawler/machine-token"), 404, "not_found")

    claim = requests.post(f"{admin.url}/api/v1/projects/p/jobs/claim", timeout=10,
                          json={"worker_id": "w1", "max_jobs": 1, "lease_seconds": 60},
                          headers={"Authorization": f"Bearer {token}", "X-Client-Version": VERSION})
    assert claim.status_code == 200, claim.text
    # Its first use revealed it: now under FleetHQ's digest, sealed, viewable.
    (row,) = db_rows(app, "SELECT token_hash, sealed IS NOT NULL AS sealed FROM machine_tokens "
                          "WHERE user_id = 'crawler'")
    assert row == {"token_hash": tokens.digest(token), "sealed": True}
    assert admin("GET", "/admin/users/crawler/machine-token").json()["token"] == token
    assert Http(admin.url, token)("GET", "/whoami").json() == {"user_id": "crawler"}
    # Another token whose SavewebHQ digest is unknown stays refused.
    _refused(Http(admin.url, "hq_other")("GET", "/whoami"), 401, "invalid_machine_token")

    # whoami finds one as well (the lookup outside the worker routes).
    with app.app_context():
        accounts.put_user("crawler-2", ["worker"], "pending")
    sql(app, "INSERT INTO machine_tokens (user_id, token_hash) VALUES ('crawler-2', :k)",
        k=tokens.savewebhq_key("hq_second"))
    assert Http(admin.url, "hq_second")("GET", "/whoami").json() == {"user_id": "crawler-2"}
    with app.app_context():
        assert accounts.view_token("crawler-2") == "hq_second"


# ------------------------------------------------ a switched installation's prefix

def test_a_switched_installation_keeps_issuing_hq_tokens(app, database_url):
    """MACHINE_TOKEN_PREFIX=hq_: rotated and bootstrapped tokens start with
    SavewebHQ's hq_ (its scripts assert it) and work like any other."""
    with _app_on(database_url, MACHINE_TOKEN_PREFIX="hq_") as switched:
        accounts.put_user("carried", ["worker"])
        token = accounts.rotate_token("carried")
        assert token.startswith("hq_") and len(token) == len("hq_") + 43
        answer = switched.test_client().get("/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200 and answer.get_json()["user_id"] == "carried"
    with _app_on(database_url) as default:
        assert accounts.rotate_token("carried").startswith("fhq_")
        assert default.config["MACHINE_TOKEN_PREFIX"] == "fhq_"


@pytest.mark.parametrize("prefix", ["fhqn_", "hq", "hq-", "a-b_", ""])
def test_a_prefix_that_could_pass_for_something_else_is_refused_at_start(prefix):
    from app.config import ConfigError, load
    with pytest.raises(ConfigError, match="MACHINE_TOKEN_PREFIX"):
        load({"MACHINE_TOKEN_PREFIX": prefix, "DATABASE_URL": "postgresql://localhost/x",
              "SECRET_KEY": "k" * 32})
