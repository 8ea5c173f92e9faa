"""User machine tokens as SavewebHQ has them: any well-formed token can be
installed and authenticates (T3)."""
from __future__ import annotations

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
