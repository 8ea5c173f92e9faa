"""Fleet nodes and token workers (DESIGN §7, §11, §12; issue 3): enrollment
credentials, registration replay, the node state machine through the CLI,
pending/draining/revoked behaviour on every route, fleet actions refused to
machine tokens and node secrets, the worker list (API and CLI), heartbeats
renewing leases, token workers, and the read-only remote-jobs progress view."""
from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid

import psycopg
import pytest
import requests

from tests.fleet_helpers import Node, decide, new_identity
from tests.helpers import API_CACHE_CONTROL, Api, body, sql, values
from tests.support.cli import (assert_cli_error, cli, cli_json, cli_text)  # noqa: F401

NODE_LEASE_S = 60
STALE_AFTER_S = 90


# ------------------------------------------------------------------ helpers


def error_code(response) -> str:
    return body(response)["error"]["code"]


def enroll(app) -> str:
    result = cli(app, "fleet", "enroll")
    assert result.exit_code == 0, cli_text(result)
    credential = result.stdout.strip()
    assert credential.startswith("fhqe_"), credential
    assert "\n" not in credential
    return credential


def register(client, node_id, secret, credential, name="node"):
    return client.post("/api/v1/fleet/register", json={
        "id": node_id, "name": name, "enrollment_token": credential, "secret": secret})


def node_status(app, node_id: str) -> str:
    return sql(app, "SELECT status FROM fleet_nodes WHERE id = :i", i=node_id)[0][0]


def generic_project(api: Api, project_id: str = "gen", n: int = 0, **fields):
    api.put_project(project_id, **fields)
    if n:
        response = api.enqueue(project_id, values(n))
        assert response.status_code == 200, body(response)


def node_call(node: Node, method: str, path: str, payload=None):
    return node._call(method, path, json=payload)


def claimed(response, n: int | None = None) -> list[dict]:
    assert response.status_code == 200, body(response)
    jobs = body(response)["jobs"]
    if n is not None:
        assert len(jobs) == n, jobs
    return jobs


def item_results(response) -> list[dict]:
    assert response.status_code == 200, body(response)
    return body(response)["results"]


def node_extend(node: Node, project: str, jobs, seconds=60):
    return node_call(node, "POST", f"/api/v1/projects/{project}/jobs/extend-lease", {
        "worker_id": node.node_id, "extend_seconds": seconds,
        "items": [{"job_id": j["job_id"], "attempt_id": j["attempt_id"]} for j in jobs]})


def node_complete(node: Node, project: str, jobs):
    return node_call(node, "POST", f"/api/v1/projects/{project}/jobs/complete", {
        "worker_id": node.node_id,
        "items": [{"job_id": j["job_id"], "attempt_id": j["attempt_id"],
                   "outcome": {"kind": "success"}} for j in jobs]})


def attempt_row(app, attempt_id: str):
    return sql(app, "SELECT state, worker_id, worker_owner, floor(extract(epoch FROM lease_expires_at)) "
                    "FROM attempts WHERE id = :a", a=int(attempt_id))[0]


def job_row(app, job_id: str):
    return sql(app, "SELECT state, current_attempt_id, worker_id, "
                    "floor(extract(epoch FROM lease_expires_at)), floor(extract(epoch FROM deadline_at)) "
                    "FROM jobs WHERE id = :j", j=int(job_id))[0]


# --------------------------------------------------------------- enrollment

def test_enroll_cli_prints_a_one_time_credential_stored_hashed(app):
    credential = enroll(app)
    rows = sql(app, "SELECT token_hash, extract(epoch FROM expires_at - created_at), used_at, "
                    "row_to_json(e)::text FROM enrollment_credentials e")
    assert len(rows) == 1
    token_hash, validity, used_at, whole_row = rows[0]
    assert token_hash == hashlib.sha256(credential.encode()).hexdigest()
    assert credential not in whole_row
    assert credential[len("fhqe_"):] not in whole_row
    assert abs(float(validity) - 15 * 60) < 5  # DESIGN §12: 15 minutes by default
    assert used_at is None

    # 256-bit random: 32 bytes in unpadded base64url after the prefix.
    assert len(credential) == len("fhqe_") + 43
    assert enroll(app) != credential

    result = cli(app, "fleet", "enroll", "--valid-minutes", "5")
    assert result.exit_code == 0, cli_text(result)
    short = result.stdout.strip()
    validity = sql(app, "SELECT extract(epoch FROM expires_at - created_at) FROM enrollment_credentials "
                        "WHERE token_hash = :h", h=hashlib.sha256(short.encode()).hexdigest())[0][0]
    assert abs(float(validity) - 5 * 60) < 5


def test_register_is_pending_and_a_lost_response_may_be_replayed(app, client):
    credential = enroll(app)
    node_id, secret = new_identity()
    first = register(client, node_id, secret, credential, name="lab-box-1")
    assert first.status_code == 201, body(first)
    record = body(first)
    assert record["worker_id"] == node_id
    assert record["name"] == "lab-box-1"
    assert record["status"] == "pending"
    assert "secret" not in json.dumps(record)

    # The response was lost: the worker retries with the same identity.
    again = register(client, node_id, secret, credential, name="lab-box-1")
    assert again.status_code in (200, 201), body(again)
    assert body(again)["worker_id"] == node_id
    assert body(again)["status"] == "pending"
    assert sql(app, "SELECT count(*) FROM fleet_nodes")[0][0] == 1

    # The consumed credential cannot register a different identity ...
    other_id, other_secret = new_identity()
    stolen = register(client, other_id, other_secret, credential)
    assert stolen.status_code == 403, body(stolen)
    assert error_code(stolen) == "permission_denied"
    # ... nor the same id with another secret.
    _, wrong_secret = new_identity()
    hijack = register(client, node_id, wrong_secret, credential)
    assert hijack.status_code == 403, body(hijack)
    assert error_code(hijack) == "permission_denied"
    assert sql(app, "SELECT id FROM fleet_nodes") == [(node_id,)]

    # The secret is stored hashed only.
    secret_hash, whole_row = sql(app, "SELECT secret_hash, row_to_json(n)::text FROM fleet_nodes n")[0]
    assert secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in whole_row
    assert secret[len("fhqn_"):] not in whole_row
    used = sql(app, "SELECT used_at IS NOT NULL, node_id FROM enrollment_credentials")
    assert used == [(True, node_id)]


def test_expired_and_unknown_credentials_are_refused(app, client):
    credential = enroll(app)
    sql(app, "UPDATE enrollment_credentials SET expires_at = now() - interval '1 second'")
    node_id, secret = new_identity()
    expired = register(client, node_id, secret, credential)
    assert expired.status_code == 403, body(expired)
    assert error_code(expired) == "permission_denied"

    for bogus in ("fhqe_" + "A" * 43, "not-a-credential", secret):
        response = register(client, node_id, secret, bogus)
        assert response.status_code == 403, (bogus, body(response))
        assert error_code(response) == "permission_denied"
    assert sql(app, "SELECT count(*) FROM fleet_nodes")[0][0] == 0
    assert sql(app, "SELECT used_at FROM enrollment_credentials") == [(None,)]


def test_a_short_lived_credential_expires_after_its_minutes(app, client):
    result = cli(app, "fleet", "enroll", "--valid-minutes", "1")
    credential = result.stdout.strip()
    sql(app, "UPDATE enrollment_credentials SET created_at = created_at - interval '2 minutes', "
             "expires_at = expires_at - interval '2 minutes'")
    node_id, secret = new_identity()
    response = register(client, node_id, secret, credential)
    assert response.status_code == 403, body(response)


@pytest.mark.parametrize("field,bad", [
    ("id", "short"),                                   # < 16 characters
    ("id", "a" * 129),                                 # > 128 characters
    ("id", "has spaces in it!!"),                      # not url-safe
    ("id", "dots.are.not.url.safe"),
    ("secret", "no-prefix-" + "A" * 43),
    ("secret", "fhqn_" + "A" * 42),                    # 31.5 bytes
    ("secret", "fhqn_" + "A" * 44),
    ("secret", "fhqn_" + "A" * 42 + "="),              # padded
    ("secret", "fhq_" + "A" * 43),                     # a user-token prefix
    ("secret", "fhqn_" + "A" * 41 + "+/"),             # not base64url
])
def test_malformed_identity_is_400_and_keeps_the_credential(app, client, field, bad):
    credential = enroll(app)
    node_id, secret = new_identity()
    payload = {"id": node_id, "name": "n", "enrollment_token": credential, "secret": secret, field: bad}
    response = client.post("/api/v1/fleet/register", json=payload)
    assert response.status_code == 400, body(response)
    assert error_code(response) == "invalid_request"
    assert sql(app, "SELECT count(*) FROM fleet_nodes")[0][0] == 0
    # The refused request did not consume the credential.
    ok = register(client, node_id, secret, credential)
    assert ok.status_code == 201, body(ok)


def test_register_rejects_missing_and_unknown_fields(app, client):
    credential = enroll(app)
    node_id, secret = new_identity()
    full = {"id": node_id, "name": "n", "enrollment_token": credential, "secret": secret}
    for missing in full:
        payload = {k: v for k, v in full.items() if k != missing}
        response = client.post("/api/v1/fleet/register", json=payload)
        assert response.status_code == 400, (missing, body(response))
    response = client.post("/api/v1/fleet/register", json={**full, "status": "active"})
    assert response.status_code == 400, body(response)
    assert sql(app, "SELECT count(*) FROM fleet_nodes")[0][0] == 0


def test_a_registered_identity_cannot_enroll_again(app, client):
    node = Node(client, app)
    decide(app, node.node_id, "revoke")
    credential = enroll(app)
    # Re-enrollment needs a fresh identity (DESIGN §7): neither the old secret
    # nor a new one brings the revoked id back.
    _, new_secret = new_identity()
    for secret in (node.secret, new_secret):
        response = register(client, node.node_id, secret, credential)
        assert response.status_code in (403, 409), body(response)
    assert node_status(app, node.node_id) == "revoked"
    assert sql(app, "SELECT secret_hash FROM fleet_nodes")[0][0] == \
        hashlib.sha256(node.secret.encode()).hexdigest()
    # The refused attempts did not use up the credential: a fresh identity may.
    fresh_id, fresh_secret = new_identity()
    assert register(client, fresh_id, fresh_secret, credential).status_code == 201


# ---------------------------------------------------------- node lifecycle

def test_pending_node_sees_status_but_no_job_route(app, client, api):
    generic_project(api, "gen", 3)
    node = Node(client, app, name="pending-box", approve=False)
    status = node_call(node, "GET", "/api/v1/fleet/status")
    assert status.status_code == 200, body(status)
    assert body(status)["status"] == "pending"
    assert body(status)["worker_id"] == node.node_id
    assert body(status)["name"] == "pending-box"

    fake = {"job_id": 1, "attempt_id": "1"}
    denied = {
        "claim": node.claim("gen"),
        "complete": node_complete(node, "gen", [fake]),
        "fail": node.fail("gen", fake),
        "extend": node_extend(node, "gen", [fake]),
        "policy": node_call(node, "GET", "/api/v1/projects/gen"),
        "receipt": node.receipt("1"),
        "upload": node.upload("1", b"%PDF-1.4\n" + b"x" * 20000),
    }
    for route, response in denied.items():
        assert response.status_code == 403, (route, body(response))
        assert error_code(response) == "permission_denied", route
    assert sql(app, "SELECT count(*) FROM attempts")[0][0] == 0

    result = cli(app, "fleet", "worker", "approve", node.node_id)
    assert cli_json(result)["status"] == "active"
    assert node_status(app, node.node_id) == "active"
    assert body(node_call(node, "GET", "/api/v1/fleet/status"))["status"] == "active"
    assert len(claimed(node.claim("gen", max_jobs=2), 2)) == 2


def test_invalid_transitions_are_clear_cli_errors(app, client):
    node = Node(client, app, approve=False)
    for action in ("drain", "enable"):
        assert_cli_error(cli(app, "fleet", "worker", action, node.node_id), "invalid_transition")
    assert node_status(app, node.node_id) == "pending"

    assert cli_json(cli(app, "fleet", "worker", "approve", node.node_id))["status"] == "active"
    for action in ("approve", "reject", "enable"):
        result = cli(app, "fleet", "worker", action, node.node_id)
        assert_cli_error(result, "invalid_transition")
        assert "active" in cli_text(result)
    assert node_status(app, node.node_id) == "active"

    assert_cli_error(cli(app, "fleet", "worker", "approve", "no-such-node-0123456789"), "not_found")
    result = cli(app, "fleet", "worker", "explode", node.node_id)
    assert result.exit_code != 0 and "Traceback" not in cli_text(result)
    assert node_status(app, node.node_id) == "active"


def test_generated_worker_ids_never_look_like_cli_options(app, client):
    from workers.runner.volume import new_worker_id
    ids = [new_worker_id() for _ in range(2000)]  # ~31 would start with "-" if unfiltered
    assert all(len(i) == 32 and not i.startswith("-") for i in ids)
    # An id that does start with a dash (another SDK's) is still reachable after "--".
    node = Node(client, app, approve=False)
    sql(app, "UPDATE fleet_nodes SET id = :new WHERE id = :old", new="-dash-first-0123456789",
        old=node.node_id)
    assert cli(app, "fleet", "worker", "approve", "-dash-first-0123456789").exit_code == 2
    result = cli(app, "fleet", "worker", "approve", "--", "-dash-first-0123456789")
    assert cli_json(result)["status"] == "active"


def test_rejected_node_is_terminal_and_its_secret_is_dead(app, client):
    node = Node(client, app, approve=False)
    assert cli_json(cli(app, "fleet", "worker", "reject", node.node_id))["status"] == "rejected"
    for action in ("approve", "reject", "drain", "enable", "revoke"):
        assert_cli_error(cli(app, "fleet", "worker", action, node.node_id), "invalid_transition")
    assert node_status(app, node.node_id) == "rejected"
    response = node_call(node, "GET", "/api/v1/fleet/status")
    assert response.status_code == 401, body(response)
    assert error_code(response) == "invalid_machine_token"


def test_draining_node_gets_no_new_work_but_finishes_what_it_holds(app, client, api):
    generic_project(api, "gen", 5)
    node = Node(client, app)
    jobs = claimed(node.claim("gen", max_jobs=3), 3)

    assert cli_json(cli(app, "fleet", "worker", "drain", node.node_id))["status"] == "draining"
    empty = node.claim("gen", max_jobs=5)
    assert empty.status_code == 200, body(empty)
    assert body(empty) == {"project_id": "gen", "jobs": [], "retry_after_ms": 1000,
                           "policy_version": body(empty)["policy_version"]}
    assert claimed(node.claim("gen", max_jobs=5, wait_ms=200), 0) == []
    assert sql(app, "SELECT count(*) FROM attempts")[0][0] == 3

    hb = node.heartbeat(running=[jobs[0]["attempt_id"]])
    assert hb.status_code == 200, body(hb)
    assert body(hb)["status"] == "draining"
    assert jobs[0]["attempt_id"] in body(hb)["lease_expires"]

    [ext] = item_results(node_extend(node, "gen", [jobs[0]], seconds=120))
    assert ext["status"] == "applied", ext
    [done] = item_results(node_complete(node, "gen", [jobs[1]]))
    assert done["status"] == "applied", done
    [failed] = item_results(node.fail("gen", jobs[2], retryable=False))
    assert failed["status"] == "applied", failed
    assert body(node_call(node, "GET", "/api/v1/fleet/status"))["status"] == "draining"

    assert cli_json(cli(app, "fleet", "worker", "enable", node.node_id))["status"] == "active"
    again = claimed(node.claim("gen", max_jobs=5))
    assert len(again) == 2
    assert {j["job_id"] for j in again}.isdisjoint({j["job_id"] for j in jobs})


def test_revoke_kills_the_secret_at_once_and_requeues_its_work(app, client, api):
    generic_project(api, "gen", 4)
    node = Node(client, app, name="to-revoke")
    other = Node(client, app, name="keeps-working")
    mine = claimed(node.claim("gen", max_jobs=2), 2)
    theirs = claimed(other.claim("gen", max_jobs=1), 1)

    assert cli_json(cli(app, "fleet", "worker", "revoke", node.node_id))["status"] == "revoked"
    # Every route refuses the secret now.
    responses = {
        "status": node_call(node, "GET", "/api/v1/fleet/status"),
        "heartbeat": node.heartbeat(running=[j["attempt_id"] for j in mine]),
        "whoami": node_call(node, "GET", "/api/v1/whoami"),
        "policy": node_call(node, "GET", "/api/v1/projects/gen"),
        "claim": node.claim("gen"),
        "complete": node_complete(node, "gen", mine),
        "fail": node.fail("gen", mine[0]),
        "extend": node_extend(node, "gen", mine),
        "receipt": node.receipt(mine[0]["attempt_id"]),
        "upload": node.upload(mine[0]["attempt_id"], b"%PDF-1.4\n" + b"x" * 20000),
    }
    for route, response in responses.items():
        assert response.status_code == 401, (route, body(response))
        assert error_code(response) == "invalid_machine_token", route

    for job in mine:
        assert attempt_row(app, job["attempt_id"])[0] == "cancelled"
        state, current, *_ = job_row(app, job["job_id"])
        assert state == "todo"
    # The other node's attempt is untouched.
    assert attempt_row(app, theirs[0]["attempt_id"])[0] == "running"
    assert job_row(app, theirs[0]["job_id"])[0] == "wip"

    # The requeued jobs are claimable again right away.
    retaken = claimed(other.claim("gen", max_jobs=5))
    assert {j["job_id"] for j in mine} <= {j["job_id"] for j in retaken}

    # Revoked is terminal.
    for action in ("approve", "enable", "drain", "revoke", "reject"):
        assert_cli_error(cli(app, "fleet", "worker", action, node.node_id), "invalid_transition")
    assert node_status(app, node.node_id) == "revoked"


def _wait_for_lock_waiter(database_url: str, needle: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query ILIKE %s", (f"%{needle}%",)).fetchone()[0]
            if waiting:
                return
            time.sleep(0.02)
    raise AssertionError(f"no session waited on a lock for {needle!r}")


def test_a_claim_racing_a_revoke_leaves_the_node_no_running_attempt(app, live_server, database_url,
                                                                      admin_token):
    """DESIGN §4.1/§7: every claim is guarded by "worker allowed" and revoking
    cancels the node's running attempts — also one that a claim authenticated
    just before the revoke was still inserting."""
    api = Api(requests.Session(), admin_token, base=live_server.url)
    generic_project(api, "gen", 3, max_in_flight=10)   # a capped project takes the dispatch lock
    node = Node(requests.Session(), app, base=live_server.url)

    blocker = psycopg.connect(database_url)
    blocker.execute("SELECT 1 FROM project_dispatch WHERE project_id = 'gen' FOR UPDATE")
    out: dict = {}

    def claim():
        out["response"] = requests.post(
            f"{live_server.url}/api/v1/projects/gen/jobs/claim", headers=node.headers,
            json={"worker_id": node.node_id, "max_jobs": 2, "lease_seconds": 300}, timeout=60)

    thread = threading.Thread(target=claim)
    thread.start()
    try:
        # The claim is authenticated (the node is still active) and now waits
        # for the dispatch lock; meanwhile an admin revokes the node.
        _wait_for_lock_waiter(database_url, "project_dispatch")
        assert cli_json(cli(app, "fleet", "worker", "revoke", node.node_id))["status"] == "revoked"
    finally:
        blocker.rollback()
        blocker.close()
        thread.join(timeout=60)
    assert out["response"].status_code in (200, 401), out["response"].text

    running = sql(app, "SELECT id FROM attempts WHERE worker_id = :w AND state = 'running'",
                  w=node.node_id)
    assert running == [], "a revoked node holds running attempts"
    assert sql(app, "SELECT count(*) FROM jobs WHERE state = 'todo'")[0][0] == 3


def test_revoking_a_draining_node_also_cancels_its_attempts(app, client, api):
    generic_project(api, "gen", 2)
    node = Node(client, app)
    [job] = claimed(node.claim("gen", max_jobs=1), 1)
    decide(app, node.node_id, "drain")
    assert cli_json(cli(app, "fleet", "worker", "revoke", node.node_id))["status"] == "revoked"
    assert attempt_row(app, job["attempt_id"])[0] == "cancelled"
    assert job_row(app, job["job_id"])[0] == "todo"


# ------------------------------------------- fleet actions need a human

FLEET_ACTIONS = [
    ("POST", "/api/v1/fleet/enroll"),
    ("POST", "/api/v1/admin/fleet/enrollments"),
    ("POST", "/api/v1/admin/fleet/workers/{target}/approve"),
    ("POST", "/api/v1/admin/fleet/workers/{target}/reject"),
    ("POST", "/api/v1/admin/fleet/workers/{target}/drain"),
    ("POST", "/api/v1/admin/fleet/workers/{target}/enable"),
    ("POST", "/api/v1/admin/fleet/workers/{target}/revoke"),
]


@pytest.mark.parametrize("method,path", FLEET_ACTIONS)
def test_fleet_actions_are_refused_to_machine_tokens_and_node_secrets(app, client, admin_token,
                                                                       method, path):
    pending = Node(client, app, approve=False)
    active = Node(client, app)
    credentials_before = sql(app, "SELECT count(*) FROM enrollment_credentials")[0][0]
    callers = {"admin token": admin_token, "node secret": active.secret,
               "pending node secret": pending.secret}
    for target in (pending.node_id, active.node_id):
        url = path.format(target=target)
        for who, token in callers.items():
            response = client.open(url, method=method, json={},
                                   headers={"Authorization": f"Bearer {token}"})
            assert response.status_code == 403, (who, url, body(response))
            assert error_code(response) == "permission_denied", (who, url)
        anonymous = client.open(url, method=method, json={})
        assert anonymous.status_code == 401, body(anonymous)
    assert node_status(app, pending.node_id) == "pending"
    assert node_status(app, active.node_id) == "active"
    assert sql(app, "SELECT count(*) FROM enrollment_credentials")[0][0] == credentials_before


# ------------------------------------------------------------- worker list

def test_worker_list_shows_nodes_and_token_workers(app, client, api, make_user):
    generic_project(api, "gen", 3)
    busy = Node(client, app, name="campus-box")
    hb = busy.heartbeat(capacity=3, browser_ok=False, disk_free_bytes=123456789, spool_bytes=4242,
                        last_error="chromium crashed")
    assert hb.status_code == 200, body(hb)
    claimed(busy.claim("gen", max_jobs=1), 1)
    old = Node(client, app, name="old-box")
    assert old.heartbeat().status_code == 200
    sql(app, "UPDATE fleet_nodes SET last_heartbeat_at = now() - interval '2 minutes' WHERE id = :i",
        i=old.node_id)
    waiting = Node(client, app, name="waiting-box", approve=False)

    alice = make_user("alice", ["worker"])
    tw_id = f"tw-{uuid.uuid4().hex[:8]}"
    tw = Api(client, alice)
    response = tw.call("POST", "/api/v1/fleet/heartbeat", {
        "worker_id": tw_id, "capacity": 1, "browser_ok": True, "disk_free_bytes": 77,
        "spool_bytes": 5, "running_attempt_ids": []})
    assert response.status_code == 200, body(response)
    claimed(tw.claim("gen", worker_id=tw_id, max_jobs=2), 2)

    listed = api.call("GET", "/api/v1/admin/fleet/workers")
    assert listed.status_code == 200, body(listed)
    rows = body(listed)["workers"]
    assert len(rows) == 4
    by_id = {r["worker_id"]: r for r in rows}
    b = by_id[busy.node_id]
    assert b["kind"] == "node" and b["status"] == "active" and b["name"] == "campus-box"
    assert b["capacity"] == 3
    assert b["running"] == 1
    assert b["browser_ok"] is False
    assert b["disk_free_bytes"] == 123456789 and b["spool_bytes"] == 4242
    assert b["last_error"] == "chromium crashed"
    assert 0 <= b["heartbeat_age_s"] < 30 and b["stale"] is False

    o = by_id[old.node_id]
    assert o["heartbeat_age_s"] >= 119 and o["stale"] is True and o["running"] == 0

    w = by_id[waiting.node_id]
    assert w["status"] == "pending" and w["stale"] is True and w["heartbeat_age_s"] is None

    t = by_id[tw_id]
    assert t["kind"] == "token" and t["user_id"] == "alice" and t["status"] == "active"
    assert t["capacity"] == 1 and t["running"] == 2 and t["disk_free_bytes"] == 77
    assert t["stale"] is False

    text_out = json.dumps(body(listed))
    for secret in (busy.secret, old.secret, waiting.secret, alice):
        assert secret not in text_out
    assert "secret" not in text_out and "fhqn_" not in text_out

    # Heartbeat age just past the stale limit (DESIGN §12: 90 s).
    sql(app, "UPDATE fleet_nodes SET last_heartbeat_at = now() - interval '95 seconds' WHERE id = :i",
        i=busy.node_id)
    sql(app, "UPDATE fleet_nodes SET last_heartbeat_at = now() - interval '80 seconds' WHERE id = :i",
        i=old.node_id)
    rows = {r["worker_id"]: r for r in body(api.call("GET", "/api/v1/admin/fleet/workers"))["workers"]}
    assert rows[busy.node_id]["stale"] is True
    assert rows[old.node_id]["stale"] is False

    # The CLI lists the same fleet.
    cli_rows = {r["worker_id"]: r for r in cli_json(cli(app, "fleet", "workers"))}
    assert set(cli_rows) == {busy.node_id, old.node_id, waiting.node_id, tw_id}
    assert cli_rows[busy.node_id]["capacity"] == 3 and cli_rows[busy.node_id]["running"] == 1
    assert cli_rows[busy.node_id]["last_error"] == "chromium crashed"
    assert cli_rows[tw_id]["kind"] == "token" and cli_rows[tw_id]["running"] == 2

    # A lease that ran out is no longer counted as running (the reaper requeues it).
    sql(app, "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE worker_id = :w",
        w=busy.node_id)
    rows = {r["worker_id"]: r for r in body(api.call("GET", "/api/v1/admin/fleet/workers"))["workers"]}
    assert rows[busy.node_id]["running"] == 0 and rows[tw_id]["running"] == 2


def test_worker_list_is_for_admin_tokens_only(app, client, make_user):
    node = Node(client, app)
    for roles in (["reader"], ["worker"], ["worker", "reader"]):
        token = make_user(f"u-{'-'.join(roles)}", roles)
        response = Api(client, token).call("GET", "/api/v1/admin/fleet/workers")
        assert response.status_code == 403, (roles, body(response))
        assert error_code(response) == "permission_denied"
    response = node_call(node, "GET", "/api/v1/admin/fleet/workers")
    assert response.status_code == 403, body(response)
    assert client.get("/api/v1/admin/fleet/workers").status_code == 401


def test_worker_list_is_bounded_to_500_rows(app, client, admin_token):
    sql(app, "INSERT INTO fleet_nodes (id, name, secret_hash, status) "
             "SELECT 'node-' || lpad(i::text, 16, '0'), 'n' || i, md5(i::text), 'active' "
             "FROM generate_series(1, 520) i")
    response = Api(client, admin_token).call("GET", "/api/v1/admin/fleet/workers")
    assert response.status_code == 200, body(response)
    assert len(body(response)["workers"]) == 500


# -------------------------------------------------------------- heartbeats

def test_heartbeat_records_the_node_state(app, client):
    node = Node(client, app)
    response = node.heartbeat(capacity=7, browser_ok=False, disk_free_bytes=5, spool_bytes=6,
                              last_error="disk nearly full")
    assert response.status_code == 200, body(response)
    assert body(response) == {"status": "active", "lease_expires": {}}
    row = sql(app, "SELECT capacity, browser_ok, disk_free_bytes, spool_bytes, last_error, "
                   "extract(epoch FROM now() - last_heartbeat_at) FROM fleet_nodes WHERE id = :i",
              i=node.node_id)[0]
    assert row[:5] == (7, False, 5, 6, "disk nearly full")
    assert 0 <= float(row[5]) < 30

    response = node.heartbeat(last_error=None)
    assert response.status_code == 200
    assert sql(app, "SELECT capacity, last_error FROM fleet_nodes WHERE id = :i",
               i=node.node_id)[0] == (2, None)


@pytest.mark.parametrize("bad", [
    {"capacity": -1}, {"capacity": "2"}, {"browser_ok": "yes"}, {"disk_free_bytes": -5},
    {"running_attempt_ids": "1"}, {"running_attempt_ids": [1]}, {"surprise": True},
])
def test_heartbeat_validates_its_body(app, client, bad):
    node = Node(client, app)
    response = node.heartbeat(**bad)
    assert response.status_code == 400, body(response)
    assert error_code(response) == "invalid_request"


def test_heartbeat_renews_listed_leases_within_deadlines(app, client, api):
    generic_project(api, "gen", 6, task_timeout_seconds=3600)
    node = Node(client, app)
    other = Node(client, app)
    jobs = claimed(node.claim("gen", max_jobs=4, lease_seconds=5), 4)
    [foreign] = claimed(other.claim("gen", max_jobs=1, lease_seconds=5), 1)
    fresh, near_deadline, expired, unlisted = jobs

    # The job was enqueued long ago: its task deadline is 20 s away.
    sql(app, "UPDATE jobs SET deadline_at = now() + interval '20 seconds' WHERE id = :j",
        j=int(near_deadline["job_id"]))
    # This lease already ran out (say the worker was cut off).
    sql(app, "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = :j",
        j=int(expired["job_id"]))
    sql(app, "UPDATE attempts SET lease_expires_at = now() - interval '1 second' WHERE id = :a",
        a=int(expired["attempt_id"]))
    expired_lease_before = job_row(app, expired["job_id"])[3]
    unlisted_before = job_row(app, unlisted["job_id"])[3]
    foreign_before = job_row(app, foreign["job_id"])[3]

    before = int(time.time())
    listed = [fresh["attempt_id"], near_deadline["attempt_id"], expired["attempt_id"],
              foreign["attempt_id"], "999999999", "not-a-number"]
    response = node.heartbeat(running=listed)
    after = int(time.time())
    assert response.status_code == 200, body(response)
    leases = body(response)["lease_expires"]
    assert set(leases) == {fresh["attempt_id"], near_deadline["attempt_id"]}

    # Renewed by one node lease (60 s) ...
    assert before + NODE_LEASE_S - 1 <= leases[fresh["attempt_id"]] <= after + NODE_LEASE_S
    assert job_row(app, fresh["job_id"])[3] == leases[fresh["attempt_id"]]
    assert attempt_row(app, fresh["attempt_id"])[3] == leases[fresh["attempt_id"]]
    # ... but never past the task deadline.
    deadline = job_row(app, near_deadline["job_id"])[4]
    assert leases[near_deadline["attempt_id"]] == deadline
    assert job_row(app, near_deadline["job_id"])[3] == deadline
    # An expired lease is not revived; another worker's is not touched.
    assert job_row(app, expired["job_id"])[3] == expired_lease_before
    assert attempt_row(app, expired["attempt_id"])[3] < time.time()
    assert job_row(app, foreign["job_id"])[3] == foreign_before
    assert job_row(app, unlisted["job_id"])[3] == unlisted_before

    # The expired attempt cannot be extended back to life either.
    [ext] = item_results(node_extend(node, "gen", [expired]))
    assert ext["status"] == "rejected" and ext["error"]["code"] == "stale_attempt"


def test_heartbeat_lists_at_most_128_attempts(app, client):
    node = Node(client, app)
    ok = node.heartbeat(running=[str(i) for i in range(1, 129)])
    assert ok.status_code == 200, body(ok)
    assert body(ok)["lease_expires"] == {}
    too_many = node.heartbeat(running=[str(i) for i in range(1, 130)])
    assert too_many.status_code == 400, body(too_many)
    assert error_code(too_many) == "invalid_request"


def test_token_workers_heartbeat_with_their_worker_id(app, client, api, make_user):
    generic_project(api, "gen", 3)
    token = make_user("bob", ["worker"])
    bob = Api(client, token)
    beat = {"capacity": 4, "browser_ok": True, "disk_free_bytes": 1, "spool_bytes": 2,
            "running_attempt_ids": []}
    missing = bob.call("POST", "/api/v1/fleet/heartbeat", beat)
    assert missing.status_code == 400, body(missing)
    assert error_code(missing) == "invalid_request"
    bad_id = bob.call("POST", "/api/v1/fleet/heartbeat", {**beat, "worker_id": "not valid!"})
    assert bad_id.status_code == 400, body(bad_id)

    wid, other_wid = f"bob-a-{uuid.uuid4().hex[:6]}", f"bob-b-{uuid.uuid4().hex[:6]}"
    [job] = claimed(bob.claim("gen", worker_id=wid, max_jobs=1, lease_seconds=5), 1)
    [job2] = claimed(bob.claim("gen", worker_id=other_wid, max_jobs=1, lease_seconds=5), 1)
    response = bob.call("POST", "/api/v1/fleet/heartbeat",
                        {**beat, "worker_id": wid, "running_attempt_ids": [job["attempt_id"],
                                                                           job2["attempt_id"]]})
    assert response.status_code == 200, body(response)
    out = body(response)
    assert out["status"] == "active"
    # Only this worker id's attempt is renewed.
    assert set(out["lease_expires"]) == {job["attempt_id"]}
    assert out["lease_expires"][job["attempt_id"]] >= int(time.time()) + NODE_LEASE_S - 2
    row = sql(app, "SELECT capacity, spool_bytes, last_heartbeat_at IS NOT NULL FROM token_workers "
                   "WHERE user_id = 'bob' AND worker_id = :w", w=wid)
    assert row == [(4, 2, True)]

    # A reader-only user is no worker.
    reader = Api(client, make_user("rita", ["reader"]))
    response = reader.call("POST", "/api/v1/fleet/heartbeat", {**beat, "worker_id": "r1"})
    assert response.status_code == 403, body(response)


# ------------------------------------------------------------ token workers

def test_revoking_a_token_worker_ends_its_token_so_no_new_worker_id_takes_the_jobs_back(
        app, client, api, make_user):
    """SDKs pick a fresh worker id at every start: a revoke that left the
    token working would let the same program claim at once under a new id
    and take back the very jobs the revoke cancelled."""
    generic_project(api, "gen", 4)
    dave = Api(client, make_user("dave", ["worker"]))
    held = claimed(dave.claim("gen", worker_id="dave-1", max_jobs=2), 2)
    revoked = cli_json(cli(app, "fleet", "worker", "revoke", "dave-1", "--user", "dave"))
    assert (revoked["status"], revoked["token_ended"], revoked["cancelled_attempts"]) == ("revoked", True, 2)
    again = dave.claim("gen", worker_id="dave-2", max_jobs=4)
    assert again.status_code == 401 and error_code(again) == "invalid_machine_token", body(again)
    assert {job_row(app, j["job_id"])[0] for j in held} == {"todo"}
    assert sql(app, "SELECT count(*) FROM machine_tokens WHERE user_id = 'dave'") == [(0,)]
    # Ended in the audit log too, beside the revoke.
    actions = [r[0] for r in sql(app, "SELECT action FROM audit_log WHERE object_id IN ('dave', 'dave/dave-1') "
                                      "ORDER BY id")]
    assert actions[-2:] == ["token.revoke", "token_worker.revoke"], actions


def test_token_workers_can_be_drained_enabled_and_revoked(app, client, api, make_user):
    generic_project(api, "gen", 8)
    carol = Api(client, make_user("carol", ["worker"]))
    suffix = uuid.uuid4().hex[:6]
    wa, wb = f"carol-a-{suffix}", f"carol-b-{suffix}"
    held = claimed(carol.claim("gen", worker_id=wa, max_jobs=2), 2)

    result = cli(app, "fleet", "worker", "drain", wa, "--user", "carol")
    assert cli_json(result) == {"worker_id": wa, "user_id": "carol", "status": "draining"}
    assert claimed(carol.claim("gen", worker_id=wa, max_jobs=3), 0) == []
    assert len(claimed(carol.claim("gen", worker_id=wb, max_jobs=1), 1)) == 1
    # A draining worker still finishes its work.
    [ext] = item_results(carol.extend("gen", [held[0]], worker_id=wa))
    assert ext["status"] == "applied", ext

    assert cli_json(cli(app, "fleet", "worker", "enable", wa, "--user", "carol"))["status"] == "active"
    more = claimed(carol.claim("gen", worker_id=wa, max_jobs=1), 1)
    held += more

    revoked = cli_json(cli(app, "fleet", "worker", "revoke", wa, "--user", "carol", "--keep-token"))
    assert (revoked["status"], revoked["token_ended"], revoked["cancelled_attempts"]) == ("revoked", False, 3)
    for job in held:
        assert attempt_row(app, job["attempt_id"])[0] == "cancelled"
        assert job_row(app, job["job_id"])[0] == "todo"

    refused = carol.claim("gen", worker_id=wa, max_jobs=1)
    assert refused.status_code == 403, body(refused)
    assert error_code(refused) == "permission_denied"
    for response in (carol.complete("gen", held[:1], worker_id=wa),
                     carol.extend("gen", held[:1], worker_id=wa),
                     carol.fail("gen", held[:1], worker_id=wa)):
        assert response.status_code == 403, body(response)
    hb = carol.call("POST", "/api/v1/fleet/heartbeat", {
        "worker_id": wa, "capacity": 1, "browser_ok": True, "disk_free_bytes": 1, "spool_bytes": 0,
        "running_attempt_ids": [j["attempt_id"] for j in held]})
    assert hb.status_code == 403 or (hb.status_code == 200 and body(hb)["status"] == "revoked"
                                     and body(hb)["lease_expires"] == {}), body(hb)
    # The user's other worker id still works, and gets the requeued jobs.
    retaken = claimed(carol.claim("gen", worker_id=wb, max_jobs=10))
    assert {j["job_id"] for j in held} <= {j["job_id"] for j in retaken}

    # Revoked is terminal; unknown token workers are a clear error.
    for action in ("enable", "drain", "revoke"):
        assert_cli_error(cli(app, "fleet", "worker", action, wa, "--user", "carol"), "invalid_transition")
    assert_cli_error(cli(app, "fleet", "worker", "drain", "nobody", "--user", "carol"), "not_found")
    assert_cli_error(cli(app, "fleet", "worker", "approve", wb, "--user", "carol"), "invalid_request")
    statuses = dict(sql(app, "SELECT worker_id, status FROM token_workers WHERE user_id = 'carol'"))
    assert statuses == {wa: "revoked", wb: "active"}


# -------------------------------------------------------------- remote jobs

def test_remote_jobs_show_progress_to_readers_without_topology(app, client, api, make_user):
    generic_project(api, "rj", 7)
    node = Node(client, app, name="secret-lab-host.campus.example")
    jobs = {j["id"]: j for j in claimed(node.claim("rj", max_jobs=5), 5)}
    item_results(node_complete(node, "rj", [jobs["v1"]]))
    item_results(node.fail("rj", jobs["v2"], retryable=False, code="paywall"))
    # Upload states are written by the upload pipeline; set them directly here.
    sql(app, "UPDATE attempts SET state = 'uploading' WHERE id = :a", a=int(jobs["v3"]["attempt_id"]))
    sql(app, "UPDATE attempts SET state = 'staged' WHERE id = :a", a=int(jobs["v4"]["attempt_id"]))
    sql(app, "UPDATE jobs SET state = 'staged' WHERE id = :j", j=int(jobs["v4"]["job_id"]))
    api.put_project("other")
    api.enqueue("other", values(2, prefix="o"))

    reader = Api(client, make_user("rita", ["reader"]), version=None)
    response = reader.call("GET", "/api/v1/remote-jobs?project=rj")
    assert response.status_code == 200, body(response)
    assert response.headers.get("Cache-Control") == API_CACHE_CONTROL
    rows = {r["id"]: r for r in body(response)["jobs"]}
    assert set(rows) == {f"v{i}" for i in range(7)}
    expected = {"v0": "running", "v1": "done", "v2": "failed", "v3": "uploading", "v4": "staged",
                "v5": "queued", "v6": "queued"}
    assert {k: r["state"] for k, r in rows.items()} == expected
    for key in ("v0", "v1", "v3", "v4"):
        assert rows[key]["worker_id"] == node.node_id, rows[key]
    assert rows["v2"]["error"]["code"] == "paywall"
    assert rows["v0"]["error"] is None
    now = time.time()
    for r in rows.values():
        assert isinstance(r["updated_at"], int) and now - 120 < r["updated_at"] <= now + 5

    raw = response.get_data(as_text=True)
    for forbidden in (node.secret, "secret-lab-host", "fhqn_", "secret_hash", "capacity",
                      "disk_free", "spool_bytes", "browser_ok", "worker_owner", "heartbeat"):
        assert forbidden not in raw, forbidden

    everything = reader.call("GET", "/api/v1/remote-jobs?limit=500")
    assert everything.status_code == 200
    assert {r["project_id"] for r in body(everything)["jobs"]} == {"rj", "other"}
    assert len(body(reader.call("GET", "/api/v1/remote-jobs?limit=3"))["jobs"]) == 3
    assert api.call("GET", "/api/v1/remote-jobs?project=rj").status_code == 200

    for bad in ("501", "0", "-1", "ten", "1e3"):
        response = reader.call("GET", f"/api/v1/remote-jobs?limit={bad}")
        assert response.status_code == 400, (bad, body(response))
        assert error_code(response) == "invalid_request"


def test_remote_jobs_need_reader_or_admin(app, client, make_user):
    worker = Api(client, make_user("wendy", ["worker"]))
    response = worker.call("GET", "/api/v1/remote-jobs")
    assert response.status_code == 403, body(response)
    assert error_code(response) == "permission_denied"
    node = Node(client, app)
    response = node_call(node, "GET", "/api/v1/remote-jobs")
    assert response.status_code == 403, body(response)
    assert client.get("/api/v1/remote-jobs").status_code == 401


def test_fleet_control_bodies_over_64_kib_are_413(client, app):
    """DESIGN §6/§7: fleet control bodies stay at 64 KiB while the SavewebHQ
    operations take 8 MiB; the refusal names the limit and changes nothing."""
    node = Node(client, app)
    padded = node.heartbeat(last_error="x" * (64 * 1024))
    assert padded.status_code == 413, body(padded)
    err = body(padded)["error"]
    assert err["code"] == "too_large" and err["details"]["limit"] == 64 * 1024
    assert sql(app, "SELECT last_error FROM fleet_nodes WHERE id = :n", n=node.node_id) == [(None,)]
    assert node.heartbeat().status_code == 200
