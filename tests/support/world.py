"""What was accepted before a hostile request, and a snapshot of it: the
world of tests/test_hostile_inputs.py and tests/test_input_property.py."""
from __future__ import annotations

import pytest

from tests.fleet_helpers import Node, decide, pdf_project
from tests.helpers import Api, body, db_rows, values


class World:
    """What was accepted before each hostile request: a generic project with
    jobs (one in flight), a pdf project with an approved node holding an
    attempt, a worker-only user, a revoked user and a revoked node."""

    def __init__(self, app, client, admin_token, make_user):
        self.app, self.client = app, client
        self.admin = admin_token
        self.api = Api(client, admin_token)
        self.api.put_project("p")
        self.api.enqueue("p", values(3))
        [self.job] = body(self.api.claim("p", max_jobs=1))["jobs"]
        self.worker = make_user("wk", ["worker"])
        self.revoked = make_user("gone", ["worker"])
        assert self.api.call("DELETE", "/api/v1/admin/users/gone/machine-token").status_code == 204
        pdf_project(self.api, "papers")
        self.api.enqueue("papers", [{"value": "10.1234/hostile"}])
        self.node = Node(client, app)
        assert self.node.heartbeat().status_code == 200
        [self.attempt] = body(self.node.claim("papers"))["jobs"]
        self.revoked_node = Node(client, app)
        decide(app, self.revoked_node.node_id, "revoke")

    def token(self, who: str) -> str | None:
        return {"admin": self.admin, "worker": self.worker, "revoked": self.revoked,
                "node": self.node.secret, "revoked-node": self.revoked_node.secret,
                "none": None}[who]

    def snapshot(self) -> dict:
        queries = {
            "jobs": "SELECT id, state, attempts_count, resets FROM jobs ORDER BY id",
            "attempts": "SELECT id, state FROM attempts ORDER BY id",
            "uploads": "SELECT attempt_id, state, generation FROM uploads ORDER BY attempt_id",
            "assets": "SELECT canonical_key FROM assets ORDER BY canonical_key",
            "users": "SELECT id, roles, status FROM users ORDER BY id",
            "tokens": "SELECT user_id, token_hash FROM machine_tokens ORDER BY user_id, token_hash",
            "nodes": "SELECT id, status FROM fleet_nodes ORDER BY id",
            "projects": "SELECT id, status, policy_version FROM projects ORDER BY id",
        }
        return {name: db_rows(self.app, sql) for name, sql in queries.items()}


@pytest.fixture
def world(app, client, admin_token, make_user):
    return World(app, client, admin_token, make_user)
