"""Enrollment is rate-limited per client address (DESIGN §11, issue: pages)."""
from __future__ import annotations

from tests.fleet_helpers import enrollment_credential, new_identity
from tests.helpers import API_CACHE_CONTROL, body


def test_register_answers_429_after_the_enrollment_limit(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "ENROLL_RATE_LIMIT", 3)
    answers = []
    for _ in range(4):
        node_id, secret = new_identity()
        answers.append(client.post("/api/v1/fleet/register", json={
            "id": node_id, "name": "n", "enrollment_token": enrollment_credential(app),
            "secret": secret}))
    assert [r.status_code for r in answers] == [201, 201, 201, 429]
    limited = answers[-1]
    assert body(limited)["error"]["retryable"] is True
    assert int(limited.headers["Retry-After"]) >= 1
    assert limited.headers["Cache-Control"] == API_CACHE_CONTROL


def test_guessing_credentials_is_limited_too(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "ENROLL_RATE_LIMIT", 2)
    codes = []
    for _ in range(3):
        node_id, secret = new_identity()
        codes.append(client.post("/api/v1/fleet/register", json={
            "id": node_id, "name": "n", "enrollment_token": "fhqe_guess", "secret": secret}).status_code)
    assert codes == [403, 403, 429]


def test_behind_a_trusted_proxy_each_client_has_its_own_enrollment_budget(app, database_url):
    """TRUSTED_PROXIES=1: the address is the client's from X-Forwarded-For, not the proxy's."""
    from app import create_app

    def registrar(**settings):
        other = create_app({"DATABASE_URL": database_url, "TESTING": True, "LOG_JSON": False,
                            "OUTBOX_SENDER": "recording", "ENROLL_RATE_LIMIT": 1, **settings})
        client = other.test_client()

        def register(forwarded_for):
            node_id, secret = new_identity()
            return client.post("/api/v1/fleet/register", headers={"X-Forwarded-For": forwarded_for},
                               json={"id": node_id, "name": "n", "enrollment_token": "fhqe_guess",
                                     "secret": secret}).status_code
        return register

    behind_proxy = registrar(TRUSTED_PROXIES=1)
    assert [behind_proxy("203.0.113.7"), behind_proxy("203.0.113.7")] == [403, 429]
    assert behind_proxy("198.51.100.9") == 403          # another client, a budget of its own
    # Without the setting the header is not believed: every caller is the proxy.
    direct = registrar()
    assert [direct("192.0.2.1"), direct("192.0.2.2")] == [403, 429]
