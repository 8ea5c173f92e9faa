"""Enrollment is rate-limited per client address (DESIGN §11, issue: pages)."""
from __future__ import annotations

from tests.fleet_helpers import enrollment_credential, new_identity
from tests.helpers import body


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
    assert limited.headers["Cache-Control"] == "no-store"


def test_guessing_credentials_is_limited_too(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "ENROLL_RATE_LIMIT", 2)
    codes = []
    for _ in range(3):
        node_id, secret = new_identity()
        codes.append(client.post("/api/v1/fleet/register", json={
            "id": node_id, "name": "n", "enrollment_token": "fhqe_guess", "secret": secret}).status_code)
    assert codes == [403, 403, 429]
